#include "net_util.h"

#include "kproxy/backends/common/address.h"

namespace kproxy::cli {

IPKind parseIP(std::string_view text) {
  if (text.find('/') != std::string_view::npos) return IPKind::kNone;
  const auto ip = backends::IPPrefix::parse(text);
  if (!ip) return IPKind::kNone;
  return ip->v6 ? IPKind::kIPv6 : IPKind::kIPv4;
}

bool isCIDR(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return false;
  // At most three digits of prefix length, as before ("/0008" is not a CIDR).
  if (text.size() - slash - 1 > 3) return false;
  return backends::IPPrefix::parse(text).has_value();
}

std::optional<HostPort> splitHostPort(std::string_view text) {
  if (text.empty()) return std::nullopt;
  if (text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    return HostPort{std::string(text.substr(1, close - 1)), std::string(text.substr(close + 2))};
  }
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  // An unbracketed host must not itself contain a colon (Go: "too many colons").
  if (text.substr(0, colon).find(':') != std::string_view::npos) return std::nullopt;
  return HostPort{std::string(text.substr(0, colon)), std::string(text.substr(colon + 1))};
}

}  // namespace kproxy::cli
