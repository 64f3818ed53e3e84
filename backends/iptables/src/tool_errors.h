#pragma once
// How the iptables backend names the tools of a family and reports what they or the kernel
// refused (shared by the sync, the differ and cleanup).

#include <string_view>

#include <fmt/format.h>

#include "kproxy/core/error.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::iptables {

inline std::string_view familyName(net::Family f) { return f == net::Family::kIPv6 ? "ipv6" : "ipv4"; }
inline std::string_view toolName(net::Family f) { return f == net::Family::kIPv6 ? "ip6tables" : "iptables"; }

/// The plugin's error for `e`: "iptables: <e>", a refusal by the kernel or the tool as such.
inline sdk::Expected<void> failed(const core::Error& e) {
  const auto category = e.category == core::ErrorCategory::kKernel ? sdk::ErrorCategory::kKernelRefused
                                                                     : sdk::ErrorCategory::kUnknown;
  return sdk::fail(category, fmt::format("iptables: {}", e.message()), e.errnum);
}
/// The same, naming what failed: "iptables: <what>: <e>".
inline sdk::Expected<void> failed(const core::Error& e, std::string_view what) {
  return failed(core::Error{e.category, e.errnum, fmt::format("{}: {}", what, e.context)});
}

}  // namespace kproxy::iptables
