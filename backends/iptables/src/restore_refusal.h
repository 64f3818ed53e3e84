#pragma once
// How a refused restore is reported, by the tool adapter and by FakeIptables alike: an error of
// category kKernel that quotes the line of the input the refusal names.

#include <string>
#include <string_view>

#include "kproxy/core/error.h"

namespace kproxy::iptables {

inline core::Result<void> refused(std::string message) {
  return core::makeError(core::ErrorCategory::kKernel, std::move(message));
}

/// The 1-based line `n` of `text` (empty when there is none).
inline std::string_view lineOf(std::string_view text, std::size_t n) {
  std::size_t start = 0;
  for (std::size_t i = 1; i < n; ++i) {
    auto nl = text.find('\n', start);
    if (nl == std::string_view::npos) return {};
    start = nl + 1;
  }
  auto nl = text.find('\n', start);
  return text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
}

}  // namespace kproxy::iptables
