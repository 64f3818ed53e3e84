#pragma once
/// Small address helpers shared by the flag parser, the config decoder and validation.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kproxy::cli {

enum class IPKind { kNone, kIPv4, kIPv6 };

/// Which family `text` is as a plain IP literal (no brackets, no zone), or kNone.
IPKind parseIP(std::string_view text);

/// True for "a.b.c.d/n" and "x::/n" with n in range (like Go's net.ParseCIDR).
bool isCIDR(std::string_view text);

struct HostPort {
  std::string host;  ///< without brackets
  std::string port;
};

/// Splits "host:port" / "[v6]:port" like Go's net.SplitHostPort; nullopt when malformed.
std::optional<HostPort> splitHostPort(std::string_view text);

}  // namespace kproxy::cli
