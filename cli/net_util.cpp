#include "net_util.h"

namespace kproxy::cli {

std::optional<net::Family> ipFamilyOf(std::string_view text) {
  if (text.find('/') != std::string_view::npos) return std::nullopt;
  const auto ip = net::Prefix::parse(text);
  if (!ip) return std::nullopt;
  return ip->family;
}

bool isCIDR(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return false;
  // At most three digits of prefix length, as before ("/0008" is not a CIDR).
  if (text.size() - slash - 1 > 3) return false;
  return net::Prefix::parse(text).has_value();
}

}  // namespace kproxy::cli
