#include "net_util.h"

#include <arpa/inet.h>

#include <charconv>

namespace kproxy::cli {

IPKind parseIP(std::string_view text) {
  if (text.empty() || text.size() > 64) return IPKind::kNone;
  const std::string s(text);
  unsigned char buf[16];
  if (inet_pton(AF_INET, s.c_str(), buf) == 1) return IPKind::kIPv4;
  if (inet_pton(AF_INET6, s.c_str(), buf) == 1) return IPKind::kIPv6;
  return IPKind::kNone;
}

bool isCIDR(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return false;
  const IPKind kind = parseIP(text.substr(0, slash));
  if (kind == IPKind::kNone) return false;
  const std::string_view bits = text.substr(slash + 1);
  if (bits.empty() || bits.size() > 3) return false;
  int n = -1;
  const auto [ptr, ec] = std::from_chars(bits.data(), bits.data() + bits.size(), n);
  if (ec != std::errc{} || ptr != bits.data() + bits.size()) return false;
  return n >= 0 && n <= (kind == IPKind::kIPv4 ? 32 : 128);
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
