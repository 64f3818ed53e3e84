#include "watch_stream.h"

#include <algorithm>

namespace kproxy::apiwatch::detail {

std::optional<std::string_view> WatchLineSplitter::nextLine() {
  // Bytes before scanned_ are known to hold no newline: an event line of many megabytes
  // arrives in many reads, and searching it from its start after each one would cost the
  // square of its length.
  for (std::size_t nl; (nl = data_.find('\n', std::max(start_, scanned_))) != std::string::npos;) {
    std::string_view line(data_.data() + start_, nl - start_);
    start_ = nl + 1;
    if (line.find_first_not_of(" \r\t") != std::string_view::npos) return line;
  }
  scanned_ = data_.size();
  return std::nullopt;
}

bool WatchLineSplitter::compact() {
  data_.erase(0, start_);
  scanned_ = scanned_ > start_ ? scanned_ - start_ : 0;
  start_ = 0;
  return data_.size() <= maxPending_;
}

}  // namespace kproxy::apiwatch::detail
