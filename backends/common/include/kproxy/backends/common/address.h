#pragma once
/// IP addresses and CIDR prefixes as backends need them: parsed once, compared and tested for
/// containment without string games. Shared by the service plan and every backend.
/// Thread-safety: value types.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kproxy::backends {

/// An IPv4 or IPv6 address, or a prefix of one (host bits cleared).
struct IPPrefix {
  bool v6 = false;
  std::array<std::uint8_t, 16> bytes{};
  std::uint8_t length = 32;  ///< prefix length; 32 / 128 for a host address

  std::size_t size() const { return v6 ? 16 : 4; }
  bool isHost() const { return length == size() * 8; }
  /// Whether `host` (an address) lies inside this prefix; false across families.
  bool contains(const IPPrefix& host) const;
  /// "10.0.0.1", "10.0.0.0/8", "fd00::1" (a host address has no "/len").
  std::string toString() const;
  bool operator==(const IPPrefix&) const = default;

  /// Parses "10.0.0.1", "fd00::1", "10.0.0.0/8" or "fd00::/64" (host bits are cleared).
  /// IPv4-mapped IPv6 addresses are IPv6 here. nullopt when malformed.
  static std::optional<IPPrefix> parse(std::string_view text);
};

}  // namespace kproxy::backends
