#pragma once
/// The contents of ebpf mode's maps as values: what the renderer plans, what the differ
/// compares and what the kernel adapters read and write. The kernel's layout is
/// bpf/map_layout.h (shared with the BPF programs); these types hold the same fields with host
/// order ports, compare and sort, and print for --dry-run and errors.
///
/// Two maps are the plugin's to write: services ((address, port, protocol) → the service
/// port's id, pool sizes and flags) and slots ((id, slot) → endpoint). The affinity and
/// reverse maps belong to the data path: the plugin never reads or writes their elements.
///
/// Thread-safety: plain values.

#include <array>
#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "kproxy/net/ip.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ebpf {

/// Flags of a service element (map_layout.h's KPROXY_SERVICE_*).
inline constexpr std::uint32_t kFlagLocalPool = 0x1;
inline constexpr std::uint32_t kFlagAffinity = 0x2;
/// The first slot of the local pool (KPROXY_LOCAL_SLOT_BASE); the cluster pool starts at 0.
inline constexpr std::uint32_t kLocalSlotBase = 0x10000;
/// Endpoints a pool holds at most (its count is 16 bits).
inline constexpr std::size_t kMaxPool = 0xffff;

/// The protocol numbers the data path translates.
inline constexpr std::uint8_t kProtoTCP = 6;
inline constexpr std::uint8_t kProtoUDP = 17;

/// An address and port: a service address as the client asks for it, or an endpoint.
struct SocketAddress {
  net::Family family = net::Family::kIPv4;
  std::array<std::uint8_t, 16> address{};  ///< network order; IPv4 in the first 4 bytes
  std::uint16_t port = 0;                  ///< host order
  auto operator<=>(const SocketAddress&) const = default;
  /// "10.96.0.10:80", "[fd00::1]:80".
  std::string toText() const;
  /// The address alone, in inet_ntop form: "10.96.0.10", "fd00::1".
  std::string ipText() const;
  /// From a numeric address; nullopt when `ip` is not one host address.
  static std::optional<SocketAddress> of(std::string_view ip, std::uint16_t port);
};

struct ServiceKey {
  SocketAddress address;
  std::uint8_t protocol = kProtoTCP;
  auto operator<=>(const ServiceKey&) const = default;
  /// "tcp 10.96.0.10:80".
  std::string toText() const;
};

struct ServiceValue {
  std::uint32_t id = 0;
  std::uint16_t count = 0;       ///< cluster pool slots: 0 .. count-1
  std::uint16_t localCount = 0;  ///< local pool slots: kLocalSlotBase .. + localCount-1
  std::uint32_t flags = 0;
  std::uint32_t affinityTimeout = 0;  ///< seconds, with kFlagAffinity
  bool operator==(const ServiceValue&) const = default;
  /// "id=7 count=2 local=1 flags=local,affinity timeout=10800".
  std::string toText() const;
};

struct SlotKey {
  std::uint32_t serviceId = 0;
  std::uint32_t slot = 0;
  auto operator<=>(const SlotKey&) const = default;
  /// "7/0", "7/local+0".
  std::string toText() const;
};

/// What the plugin's two maps hold.
struct MapContents {
  std::map<ServiceKey, ServiceValue> services;
  std::map<SlotKey, SocketAddress> slots;
  bool operator==(const MapContents&) const = default;
};

/// One element write. The differ orders them (differ.h); the kernel applies them one by one.
enum class MapOpKind : std::uint8_t { kUpdateSlot, kUpdateService, kDeleteService, kDeleteSlot };

struct MapOp {
  MapOpKind kind = MapOpKind::kUpdateSlot;
  ServiceKey service;     ///< kUpdateService, kDeleteService
  ServiceValue value;     ///< kUpdateService
  SlotKey slot;           ///< kUpdateSlot, kDeleteSlot
  SocketAddress endpoint; ///< kUpdateSlot
  bool operator==(const MapOp&) const = default;

  static MapOp updateSlot(SlotKey key, SocketAddress endpoint) {
    MapOp op;
    op.kind = MapOpKind::kUpdateSlot;
    op.slot = key;
    op.endpoint = endpoint;
    return op;
  }
  static MapOp updateService(ServiceKey key, ServiceValue value) {
    MapOp op;
    op.kind = MapOpKind::kUpdateService;
    op.service = key;
    op.value = value;
    return op;
  }
  static MapOp deleteService(ServiceKey key) {
    MapOp op;
    op.kind = MapOpKind::kDeleteService;
    op.service = key;
    return op;
  }
  static MapOp deleteSlot(SlotKey key) {
    MapOp op;
    op.kind = MapOpKind::kDeleteSlot;
    op.slot = key;
    return op;
  }
  /// As --dry-run prints it: "update services tcp 10.96.0.10:80 id=7 count=2 local=0",
  /// "update slots 7/0 10.244.1.5:8080", "delete services …", "delete slots 7/1".
  std::string toText() const;
};

}  // namespace kproxy::ebpf
