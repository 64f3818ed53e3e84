#pragma once
/// Applies the logging options (-v, --vmodule, --logging-format) to kproxy's logger, and the
/// run-time verbosity change upstream serves at PUT /debug/flags/v.

#include <expected>
#include <string>
#include <string_view>

#include "proxy_config.h"

namespace kproxy::cli {

/// Sets the logger's format, verbosity and --vmodule patterns from `logging` (already
/// validated). The split-stream and info-buffer options are not applied: every line goes to
/// stderr unbuffered (README, "Logging").
std::expected<void, std::string> applyLogging(const LoggingConfig& logging);

/// component-base's GlogSetter: `body` is a base-10 unsigned 32-bit verbosity; on success the
/// verbosity is set and the answer is upstream's text, "successfully set
/// klog.logging.verbosity to N". Any thread.
std::expected<std::string, std::string> setVerbosityFromText(std::string_view body);

}  // namespace kproxy::cli
