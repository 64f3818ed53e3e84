#include "watch_stream.h"

namespace kproxy::apiwatch::detail {

std::optional<std::string_view> WatchLineSplitter::nextLine() {
  for (std::size_t nl; (nl = data_.find('\n', start_)) != std::string::npos;) {
    std::string_view line(data_.data() + start_, nl - start_);
    start_ = nl + 1;
    if (line.find_first_not_of(" \r\t") != std::string_view::npos) return line;
  }
  return std::nullopt;
}

bool WatchLineSplitter::compact() {
  data_.erase(0, start_);
  start_ = 0;
  return data_.size() <= maxPending_;
}

}  // namespace kproxy::apiwatch::detail
