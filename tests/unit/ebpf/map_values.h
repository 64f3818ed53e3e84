#pragma once
// Map keys and endpoints from text, for the ebpf unit tests.

#include <cstdint>

#include "kproxy/ebpf/maps.h"

namespace kproxy::ebpf::testing {

/// The services key of `ip`:`port` (an address the test knows to parse).
inline ServiceKey key(const char* ip, std::uint16_t port, std::uint8_t protocol = kProtoTCP) {
  return ServiceKey{*SocketAddress::of(ip, port), protocol};
}

/// An endpoint `ip`:`port`.
inline SocketAddress at(const char* ip, std::uint16_t port) { return *SocketAddress::of(ip, port); }

}  // namespace kproxy::ebpf::testing
