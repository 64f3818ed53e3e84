// The ebpf differ (differ.h): four phases, slots first, counts after them, deletions last.
#include "kproxy/ebpf/differ.h"

namespace kproxy::ebpf {

std::vector<MapOp> diffMaps(const MapContents& current, const MapContents& desired) {
  std::vector<MapOp> ops;
  for (const auto& [key, endpoint] : desired.slots)
    if (auto it = current.slots.find(key); it == current.slots.end() || it->second != endpoint)
      ops.push_back(MapOp::updateSlot(key, endpoint));
  for (const auto& [key, value] : desired.services)
    if (auto it = current.services.find(key); it == current.services.end() || it->second != value)
      ops.push_back(MapOp::updateService(key, value));
  for (const auto& [key, value] : current.services)
    if (!desired.services.contains(key)) ops.push_back(MapOp::deleteService(key));
  for (const auto& [key, endpoint] : current.slots)
    if (!desired.slots.contains(key)) ops.push_back(MapOp::deleteSlot(key));
  return ops;
}

std::vector<MapOp> fillEmptyMaps(const std::vector<const PortMaps*>& ports) {
  std::size_t slots = 0, services = 0;
  for (const PortMaps* port : ports) {
    slots += port->slots.size();
    services += port->services.size();
  }
  std::vector<MapOp> ops;
  ops.reserve(slots + services);
  for (const PortMaps* port : ports)
    for (const auto& [key, endpoint] : port->slots) ops.push_back(MapOp::updateSlot(key, endpoint));
  for (const PortMaps* port : ports)
    for (const auto& [key, value] : port->services) ops.push_back(MapOp::updateService(key, value));
  return ops;
}

void addPortMaps(MapContents& contents, const PortMaps& port) {
  for (const auto& [key, value] : port.services) contents.services[key] = value;
  for (const auto& [key, endpoint] : port.slots) contents.slots[key] = endpoint;
}

void applyOps(MapContents& contents, const std::vector<MapOp>& ops) {
  for (const auto& op : ops) {
    switch (op.kind) {
      case MapOpKind::kUpdateSlot: contents.slots[op.slot] = op.endpoint; break;
      case MapOpKind::kUpdateService: contents.services[op.service] = op.value; break;
      case MapOpKind::kDeleteService: contents.services.erase(op.service); break;
      case MapOpKind::kDeleteSlot: contents.slots.erase(op.slot); break;
    }
  }
}

}  // namespace kproxy::ebpf
