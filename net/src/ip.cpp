#include "kproxy/net/ip.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace kproxy::net {
namespace {

void clearHostBits(Prefix& p) {
  const int bits = bitsOf(p.family);
  for (int i = 0; i < bits / 8; ++i) {
    const int keep = std::clamp(static_cast<int>(p.length) - i * 8, 0, 8);
    p.bytes[static_cast<std::size_t>(i)] &= static_cast<std::uint8_t>(0xff00u >> keep);
  }
}

// "/len" after an address of `family`; nullopt unless all digits and in range.
std::optional<std::uint8_t> prefixLength(std::string_view digits, Family family) {
  int n = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size()) {
    return std::nullopt;
  }
  if (n < 0 || n > bitsOf(family)) return std::nullopt;
  return static_cast<std::uint8_t>(n);
}

std::optional<Prefix> parseIPv4Sloppy(std::string_view text) {
  Prefix out;
  std::size_t part = 0;
  std::size_t pos = 0;
  while (true) {
    const std::size_t start = pos;
    unsigned value = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      value = value * 10 + static_cast<unsigned>(text[pos] - '0');
      if (value > 255) return std::nullopt;
      ++pos;
    }
    if (pos == start) return std::nullopt;
    out.bytes[part++] = static_cast<std::uint8_t>(value);
    if (part == 4) break;
    if (pos >= text.size() || text[pos] != '.') return std::nullopt;
    ++pos;
  }
  if (pos != text.size()) return std::nullopt;
  return out;
}

std::optional<Prefix> parseIPv6Sloppy(std::string_view text) {
  if (text.find(':') == std::string_view::npos || text.size() >= INET6_ADDRSTRLEN) {
    return std::nullopt;
  }
  const std::string copy(text);
  Prefix out;
  out.family = Family::kIPv6;
  out.length = 128;
  if (inet_pton(AF_INET6, copy.c_str(), out.bytes.data()) != 1) return std::nullopt;
  // Go treats IPv4-mapped IPv6 addresses as IPv4.
  static constexpr std::uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(out.bytes.data(), kMapped, sizeof kMapped) == 0) {
    Prefix v4;
    std::copy_n(out.bytes.begin() + 12, 4, v4.bytes.begin());
    return v4;
  }
  return out;
}

}  // namespace

const char* toString(Family family) {
  switch (family) {
    case Family::kIPv4: return "IPv4";
    case Family::kIPv6: return "IPv6";
  }
  return "unknown";
}

std::optional<Prefix> Prefix::parse(std::string_view text) {
  std::string_view address = text;
  std::string_view digits;
  const bool hasLength = text.find('/') != std::string_view::npos;
  if (hasLength) {
    address = text.substr(0, text.find('/'));
    digits = text.substr(text.find('/') + 1);
  }
  if (address.empty() || address.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  Prefix out;
  const std::string copy(address);
  out.family = copy.find(':') != std::string::npos ? Family::kIPv6 : Family::kIPv4;
  if (inet_pton(out.v6() ? AF_INET6 : AF_INET, copy.c_str(), out.bytes.data()) != 1) {
    return std::nullopt;
  }
  out.length = static_cast<std::uint8_t>(bitsOf(out.family));
  if (hasLength) {
    const auto length = prefixLength(digits, out.family);
    if (!length) return std::nullopt;
    out.length = *length;
    clearHostBits(out);
  }
  return out;
}

bool Prefix::contains(const Prefix& host) const {
  if (host.family != family) return false;
  for (std::size_t i = 0; i < size(); ++i) {
    const int keep = std::clamp(static_cast<int>(length) - static_cast<int>(i) * 8, 0, 8);
    const auto mask = static_cast<std::uint8_t>(0xff00u >> keep);
    if ((host.bytes[i] & mask) != bytes[i]) return false;
  }
  return true;
}

std::string Prefix::addressText() const {
  char buf[INET6_ADDRSTRLEN];
  if (inet_ntop(v6() ? AF_INET6 : AF_INET, bytes.data(), buf, sizeof buf) == nullptr) return {};
  return buf;
}

std::string Prefix::cidrText() const {
  std::string out = addressText();
  out.push_back('/');
  out.append(std::to_string(length));
  return out;
}

std::string Prefix::toString() const { return isHost() ? addressText() : cidrText(); }

Prefix Prefix::host() const {
  Prefix out = *this;
  out.length = static_cast<std::uint8_t>(bitsOf(family));
  return out;
}

std::optional<Prefix> parseIPSloppy(std::string_view text) {
  if (auto v4 = parseIPv4Sloppy(text)) return v4;
  return parseIPv6Sloppy(text);
}

std::optional<Prefix> parseCIDRSloppy(std::string_view text) {
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto out = parseIPSloppy(text.substr(0, slash));
  if (!out) return std::nullopt;
  const auto length = prefixLength(text.substr(slash + 1), out->family);
  if (!length) return std::nullopt;
  out->length = *length;
  clearHostBits(*out);
  return out;
}

std::optional<Prefix> parseSloppy(std::string_view text) {
  return text.find('/') == std::string_view::npos ? parseIPSloppy(text) : parseCIDRSloppy(text);
}

}  // namespace kproxy::net
