#include "kproxy/backends/common/address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>

namespace kproxy::backends {

std::optional<IPPrefix> IPPrefix::parse(std::string_view text) {
  IPPrefix out;
  std::string_view host = text;
  std::optional<int> length;
  if (auto slash = text.find('/'); slash != std::string_view::npos) {
    host = text.substr(0, slash);
    std::string_view digits = text.substr(slash + 1);
    int n = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
    length = n;
  }
  if (host.empty() || host.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  const std::string copy(host);
  out.v6 = copy.find(':') != std::string::npos;
  if (inet_pton(out.v6 ? AF_INET6 : AF_INET, copy.c_str(), out.bytes.data()) != 1) return std::nullopt;
  const int bits = static_cast<int>(out.size() * 8);
  const int prefix = length.value_or(bits);
  if (prefix < 0 || prefix > bits) return std::nullopt;
  out.length = static_cast<std::uint8_t>(prefix);
  for (int i = 0; i < bits / 8; ++i) {
    const int keep = std::clamp(prefix - i * 8, 0, 8);
    out.bytes[static_cast<std::size_t>(i)] &= static_cast<std::uint8_t>(0xff00u >> keep);
  }
  return out;
}

bool IPPrefix::contains(const IPPrefix& host) const {
  if (host.v6 != v6) return false;
  for (std::size_t i = 0; i < size(); ++i) {
    const int keep = std::clamp(static_cast<int>(length) - static_cast<int>(i) * 8, 0, 8);
    const auto mask = static_cast<std::uint8_t>(0xff00u >> keep);
    if ((host.bytes[i] & mask) != bytes[i]) return false;
  }
  return true;
}

std::string IPPrefix::toString() const {
  char buf[INET6_ADDRSTRLEN];
  if (inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), buf, sizeof buf) == nullptr) return {};
  std::string out(buf);
  if (!isHost()) {
    const std::string len = std::to_string(length);
    out.push_back('/');
    out.append(len);
  }
  return out;
}

}  // namespace kproxy::backends
