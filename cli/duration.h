#pragma once
/// Go-syntax durations ("30s", "1m30s", "500ms", "2h45m", "-1.5h"), as used by kube-proxy's
/// flags (time.ParseDuration) and by metav1.Duration fields in KubeProxyConfiguration.

#include <chrono>
#include <string>
#include <string_view>

#include "kproxy/core/error.h"

namespace kproxy::cli {

/// Go's time.Duration: a signed count of nanoseconds.
using Duration = std::chrono::nanoseconds;

/// Parses Go duration syntax: an optional sign, then one or more decimal numbers (with an
/// optional fraction) each followed by a unit (ns, us, µs, ms, s, m, h); "0" alone is zero.
/// The error's context is a short reason without the input (callers name the flag/field).
core::Result<Duration> parseGoDuration(std::string_view text);

/// Formats like Go's Duration.String(): "0s", "500ms", "1.5s", "1m30s", "24h0m0s".
/// parseGoDuration(formatGoDuration(d)) == d for every d.
std::string formatGoDuration(Duration d);

}  // namespace kproxy::cli
