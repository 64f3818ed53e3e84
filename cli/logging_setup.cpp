#include "logging_setup.h"

#include <charconv>
#include <cstdint>
#include <system_error>

#include "kproxy/core/log.h"

namespace kproxy::cli {

std::expected<void, std::string> applyLogging(const LoggingConfig& logging) {
  if (auto vmodule = log::setVmodule(logging.vmodule); !vmodule) {
    return std::unexpected(vmodule.error());
  }
  log::setFormat(logging.format == "json" ? log::Format::kJson : log::Format::kText);
  log::setVerbosity(static_cast<int>(logging.verbosity));
  return {};
}

std::expected<std::string, std::string> setVerbosityFromText(std::string_view body) {
  std::uint32_t level = 0;
  const char* first = body.data();
  const char* last = body.data() + body.size();
  const auto [end, ec] = std::from_chars(first, last, level, 10);
  if (first == last || ec != std::errc{} || end != last) {
    // strconv.ParseUint's error text, as upstream answers it.
    const char* why = ec == std::errc::result_out_of_range ? "value out of range" : "invalid syntax";
    return std::unexpected("strconv.ParseUint: parsing \"" + std::string(body) + "\": " + why);
  }
  // klog's level is an int32: a uint32 above that is refused by level.Set.
  if (level > 0x7fffffffu) {
    return std::unexpected("failed set klog.logging.verbosity " + std::string(body) +
                           ": strconv.ParseInt: parsing \"" + std::string(body) +
                           "\": value out of range");
  }
  log::setVerbosity(static_cast<int>(level));
  return "successfully set klog.logging.verbosity to " + std::string(body);
}

}  // namespace kproxy::cli
