#include "kproxy/net/host_port.h"

namespace kproxy::net {

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

std::string joinHostPort(std::string_view host, std::string_view port) {
  std::string out;
  out.reserve(host.size() + port.size() + 3);
  const bool bracket = host.find(':') != std::string_view::npos;
  if (bracket) out.push_back('[');
  out.append(host);
  if (bracket) out.push_back(']');
  out.push_back(':');
  out.append(port);
  return out;
}

std::string joinHostPort(std::string_view host, std::uint16_t port) {
  return joinHostPort(host, std::to_string(port));
}

}  // namespace kproxy::net
