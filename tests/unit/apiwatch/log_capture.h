#pragma once
// Log lines captured for a test, for the apiwatch tests that check what was logged.
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/log.h"

namespace kproxy::testing {

/// Captures log lines for the lifetime of the object (and restores the previous sink after).
/// Lines may be logged from any thread.
class LogCapture {
 public:
  LogCapture() {
    previous_ = log::setSink([this](log::Severity, std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() { log::setSink(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> linesContaining(std::string_view needle) const {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (const auto& l : lines_)
      if (l.find(needle) != std::string::npos) out.push_back(l);
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  log::Sink previous_;
};

}  // namespace kproxy::testing
