#pragma once
/// `host:port` as Go's net package reads and writes it: IPv6 hosts go in brackets.
/// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kproxy::net {

struct HostPort {
  std::string host;  ///< without brackets
  std::string port;
};

/// Splits "host:port" / "[v6]:port" like Go's net.SplitHostPort; nullopt when malformed.
std::optional<HostPort> splitHostPort(std::string_view text);

/// "10.0.0.1:80", "[fd00::1]:80": brackets when the host has a colon, as Go's
/// net.JoinHostPort.
std::string joinHostPort(std::string_view host, std::uint16_t port);
std::string joinHostPort(std::string_view host, std::string_view port);

}  // namespace kproxy::net
