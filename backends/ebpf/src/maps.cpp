#include "kproxy/ebpf/maps.h"

#include <fmt/format.h>

namespace kproxy::ebpf {

std::optional<SocketAddress> SocketAddress::of(std::string_view ip, std::uint16_t port) {
  auto prefix = net::Prefix::parse(ip);
  if (!prefix || !prefix->isHost()) return std::nullopt;
  SocketAddress a;
  a.family = prefix->family;
  a.address = prefix->bytes;
  a.port = port;
  return a;
}

std::string SocketAddress::ipText() const {
  net::Prefix p;
  p.family = family;
  p.bytes = address;
  p.length = static_cast<std::uint8_t>(net::bitsOf(family));
  return p.addressText();
}

std::string SocketAddress::toText() const {
  return family == net::Family::kIPv6 ? fmt::format("[{}]:{}", ipText(), port) : fmt::format("{}:{}", ipText(), port);
}

std::string ServiceKey::toText() const {
  return fmt::format("{} {}", protocol == kProtoUDP ? "udp" : protocol == kProtoTCP ? "tcp" : "proto-" + std::to_string(protocol),
                     address.toText());
}

std::string ServiceValue::toText() const {
  std::string flagText;
  if ((flags & kFlagLocalPool) != 0) flagText += "local";
  if ((flags & kFlagAffinity) != 0) flagText += flagText.empty() ? "affinity" : ",affinity";
  std::string out = fmt::format("id={} count={} local={}", id, count, localCount);
  if (!flagText.empty()) out += " flags=" + flagText;
  if ((flags & kFlagAffinity) != 0) out += fmt::format(" timeout={}", affinityTimeout);
  return out;
}

std::string SlotKey::toText() const {
  return slot >= kLocalSlotBase ? fmt::format("{}/local+{}", serviceId, slot - kLocalSlotBase)
                                : fmt::format("{}/{}", serviceId, slot);
}

std::string MapOp::toText() const {
  switch (kind) {
    case MapOpKind::kUpdateSlot: return fmt::format("update slots {} {}", slot.toText(), endpoint.toText());
    case MapOpKind::kUpdateService: return fmt::format("update services {} {}", service.toText(), value.toText());
    case MapOpKind::kDeleteService: return fmt::format("delete services {}", service.toText());
    case MapOpKind::kDeleteSlot: return fmt::format("delete slots {}", slot.toText());
  }
  return "?";
}

}  // namespace kproxy::ebpf
