#pragma once
// The framing of a watch response body: one JSON event per line (the API server streams
// newline-delimited JSON; HTTP chunk boundaries fall anywhere, also inside a line).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kproxy::apiwatch::detail {

/// Collects the bytes of a watch body as they arrive and hands out complete lines.
/// Usage: append received bytes to data(), take lines with nextLine() until it returns
/// nothing, then call compact(). Not thread-safe.
class WatchLineSplitter {
 public:
  /// `maxPendingBytes`: an incomplete line longer than this is a broken stream (compact()
  /// returns false), not an object.
  explicit WatchLineSplitter(std::size_t maxPendingBytes) : maxPending_(maxPendingBytes) {}

  /// The receive buffer; append what was read to it.
  std::string& data() { return data_; }

  /// The next complete line that is not blank (spaces, tabs, CR), without its newline.
  /// Valid until the next call to compact().
  std::optional<std::string_view> nextLine();

  /// Drops the lines already handed out. Returns false when what is left (the incomplete
  /// line) exceeds the limit.
  bool compact();

 private:
  std::string data_;
  std::size_t start_ = 0;    // first byte not handed out yet
  std::size_t scanned_ = 0;  // data_ before this holds no newline after start_
  std::size_t maxPending_;
};

}  // namespace kproxy::apiwatch::detail
