#pragma once
/// IP addresses and prefixes as pure values: the one family enum and the one address/prefix
/// type of kproxy, used by core, the service plan, every backend and cli. Two parsers: the
/// strict one for text kproxy itself wrote, and Go's sloppy ones (ParseIPSloppy /
/// ParseCIDRSloppy, as kube-proxy reads API objects and flags) for text from users and the API.
/// Thread-safety: value types and pure functions.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kproxy::net {

/// The values are the plugin ABI's KPROXY_FAMILY_IPV4 / _IPV6, so a family crosses the ABI as
/// is.
enum class Family : std::uint8_t { kIPv4 = 4, kIPv6 = 6 };

/// "IPv4" / "IPv6", as Kubernetes spells them.
const char* toString(Family family);
/// The address width: 32 or 128 bits.
constexpr int bitsOf(Family family) { return family == Family::kIPv4 ? 32 : 128; }
/// The other family of a dual-stack node.
constexpr Family otherFamily(Family family) {
  return family == Family::kIPv4 ? Family::kIPv6 : Family::kIPv4;
}

/// An IPv4 or IPv6 address, or a prefix of one (host bits cleared).
struct Prefix {
  Family family = Family::kIPv4;
  std::array<std::uint8_t, 16> bytes{};
  std::uint8_t length = 32;  ///< prefix length; 32 / 128 for a host address

  bool v6() const { return family == Family::kIPv6; }
  std::size_t size() const { return family == Family::kIPv4 ? 4 : 16; }
  bool isHost() const { return length == size() * 8; }
  /// Whether `host` (an address) lies inside this prefix; false across families.
  bool contains(const Prefix& host) const;
  /// "10.0.0.1", "10.0.0.0/8", "fd00::1" (a host address has no "/len").
  std::string toString() const;
  /// The address part alone, without "/len".
  std::string addressText() const;
  /// Always with "/len" ("10.0.0.1/32"), as Go's IPNet.String().
  std::string cidrText() const;
  /// The same address as a host prefix (/32, /128).
  Prefix host() const;
  bool operator==(const Prefix&) const = default;

  /// Strict: "10.0.0.1", "fd00::1", "10.0.0.0/8" or "fd00::/64" as inet_pton reads them (host
  /// bits are cleared). IPv4-mapped IPv6 addresses stay IPv6. nullopt when malformed.
  static std::optional<Prefix> parse(std::string_view text);
};

/// Go's ParseIPSloppy: IPv4 parts may have leading zeros ("010.0.0.1" is 10.0.0.1), and an
/// IPv4-mapped IPv6 address is IPv4. A host prefix; nullopt when malformed or when `text` has
/// a "/len".
std::optional<Prefix> parseIPSloppy(std::string_view text);
/// Go's ParseCIDRSloppy: "addr/len" with the address read as parseIPSloppy does and the host
/// bits cleared ("10.1.2.3/8" is 10.0.0.0/8). nullopt when malformed or without "/len".
std::optional<Prefix> parseCIDRSloppy(std::string_view text);
/// parseCIDRSloppy for text with "/len", parseIPSloppy without.
std::optional<Prefix> parseSloppy(std::string_view text);

}  // namespace kproxy::net
