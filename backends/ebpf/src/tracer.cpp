// The data path's decision in C++ and the ebpf tracer (tracer.h).
#include "kproxy/ebpf/tracer.h"

#include <linux/types.h>

#include <cerrno>

#include <fmt/format.h>

#include "map_layout.h"

namespace kproxy::ebpf {

// The program and this mirror read the same layout: maps.h's names are map_layout.h's values.
static_assert(kFlagLocalPool == KPROXY_SERVICE_LOCAL_POOL);
static_assert(kFlagAffinity == KPROXY_SERVICE_AFFINITY);
static_assert(kLocalSlotBase == KPROXY_LOCAL_SLOT_BASE);
static_assert(kMaxPool == KPROXY_MAX_POOL);
static_assert(kRefusedErrno == KPROXY_ECONNREFUSED && kRefusedErrno == ECONNREFUSED);

namespace {

std::string hookOf(const plan::Packet& packet) {
  const char* v = packet.destination.family == net::Family::kIPv6 ? "6" : "4";
  // An unconnected datagram meets sendmsg; a connected one, connect: the same lookup.
  return packet.protocol == kProtoUDP ? fmt::format("cgroup/connect{0}, cgroup/sendmsg{0}", v)
                                      : fmt::format("cgroup/connect{}", v);
}

ServiceKey keyOf(const plan::Packet& packet) {
  ServiceKey key;
  key.address.family = packet.destination.family;
  key.address.address = packet.destination.bytes;
  key.address.port = packet.destinationPort;
  key.protocol = packet.protocol;
  return key;
}

plan::TracePath onePath(std::vector<plan::TraceStep> steps, plan::TraceOutcome outcome) {
  plan::TracePath path;
  path.steps = std::move(steps);
  path.outcome = std::move(outcome);
  return path;
}

plan::Trace finished(const plan::Packet& packet, std::vector<plan::TracePath> paths) {
  plan::Trace t;
  t.packet = packet;
  t.paths = std::move(paths);
  t.outcome = plan::mergePaths(t.paths);
  return t;
}

}  // namespace

ConnectDecision decideConnect(const MapContents& maps, const ServiceKey& key) {
  ConnectDecision d;
  if (key.protocol != kProtoTCP && key.protocol != kProtoUDP) {
    d.decision = Decision::kNotTranslated;
    return d;
  }
  auto svc = maps.services.find(key);
  if (svc == maps.services.end()) {
    d.decision = Decision::kNotAService;
    return d;
  }
  const ServiceValue& value = svc->second;
  d.service = value;
  d.localPool = (value.flags & kFlagLocalPool) != 0;
  d.count = d.localPool ? value.localCount : value.count;
  d.base = d.localPool ? kLocalSlotBase : 0;
  if (d.count == 0) {
    d.decision = Decision::kRefused;
    return d;
  }
  d.decision = Decision::kSteered;
  for (std::uint32_t i = 0; i < d.count; ++i) {
    SlotChoice choice{SlotKey{value.id, d.base + i}, std::nullopt};
    if (auto ep = maps.slots.find(choice.slot); ep != maps.slots.end()) choice.endpoint = ep->second;
    d.slots.push_back(choice);
  }
  return d;
}

EbpfTracer::EbpfTracer(MapContents maps, plan::LocalTrafficDetector detector, Unhooked unhooked)
    : maps_(std::move(maps)), detector_(std::move(detector)), unhooked_(std::move(unhooked)) {}

std::string EbpfTracer::hookedBecause(const plan::Packet& packet) const {
  if (packet.fromNode) return "sent by a process of the node";
  const net::Family family = packet.source.family;
  if (!detector_.implemented(family)) return "";
  using Mode = plan::LocalTrafficDetector::Mode;
  switch (detector_.mode) {
    case Mode::kNone: return "";
    case Mode::kCIDRs:
      for (const auto& cidr : detector_.cidrsOf(family))
        if (auto p = net::Prefix::parse(cidr); p && p->contains(packet.source))
          return fmt::format("from a pod of the node (source in {})", cidr);
      return "";
    case Mode::kBridgeInterface:
      if (!packet.inputInterface.empty() && packet.inputInterface == detector_.interface)
        return fmt::format("from a pod of the node (in on bridge {})", detector_.interface);
      return "";
    case Mode::kInterfaceNamePrefix:
      if (!detector_.interface.empty() && packet.inputInterface.starts_with(detector_.interface))
        return fmt::format("from a pod of the node (in on {}, prefix {})", packet.inputInterface, detector_.interface);
      return "";
  }
  return "";
}

bool EbpfTracer::hooked(const plan::Packet& packet) const { return !hookedBecause(packet).empty(); }

std::string notSteeredNote(const plan::Packet& packet) {
  return fmt::format(
      "not steered by the socket hooks: {} -> {} is not a socket of this node (neither sent by the node nor from "
      "one of its pods), so no cgroup hook sees it",
      packet.source.addressText(), plan::endpointText(packet.destination.addressText(), packet.destinationPort));
}

plan::Trace EbpfTracer::notSteered(const plan::Packet& packet) {
  return finished(packet, {onePath({plan::TraceStep{"socket hooks", "", notSteeredNote(packet)}}, {})});
}

plan::Trace EbpfTracer::goesOut(const plan::Packet& packet, std::vector<plan::TraceStep> steps) const {
  if (!unhooked_) return finished(packet, {onePath(std::move(steps), {})});
  // Its packets meet what programs unhooked traffic, after the hook's steps.
  plan::Trace t = unhooked_(packet);
  for (auto& path : t.paths) path.steps.insert(path.steps.begin(), steps.begin(), steps.end());
  return t;
}

plan::Trace EbpfTracer::trace(const plan::Packet& packet) const {
  const std::string because = hookedBecause(packet);
  // The one branch point for traffic the socket hooks never see.
  if (because.empty()) return unhooked_ ? unhooked_(packet) : notSteered(packet);

  const std::string hook = hookOf(packet);
  const ServiceKey key = keyOf(packet);
  std::vector<plan::TraceStep> steps{plan::TraceStep{hook, "", because}};
  const ConnectDecision d = decideConnect(maps_, key);
  switch (d.decision) {
    case Decision::kNotTranslated:
      steps.push_back({hook, "", fmt::format("protocol {}: the hooks steer TCP and UDP only; the connect goes out "
                                             "unchanged", packet.protocol)});
      return goesOut(packet, std::move(steps));
    case Decision::kNotAService:
      steps.push_back({hook, "lookup kproxy_services " + key.toText(),
                       "no element: not a service address of this node's maps; the connect goes out unchanged"});
      return goesOut(packet, std::move(steps));
    case Decision::kRefused:
    case Decision::kSteered: break;
  }
  const std::string lookup = "lookup kproxy_services " + key.toText();
  const std::string pool = d.localPool ? "local" : "cluster";
  steps.push_back({hook, lookup, fmt::format("{}: the {} pool, {} slot{}", d.service->toText(), pool, d.count,
                                             d.count == 1 ? "" : "s")});
  if (d.decision == Decision::kRefused) {
    plan::TraceOutcome refused;
    refused.verdict = plan::TraceVerdict::kRejected;
    refused.chain = hook;
    refused.rule = fmt::format("{}: {} pool count 0: return ECONNREFUSED ({})", lookup, pool, kRefusedErrno);
    // The pool the flags name is the reason: the ClusterIP's local pool under
    // internalTrafficPolicy Local, else the service port has no endpoint at all.
    refused.reason = d.localPool ? plan::DropReason::kNoLocalEndpoints : plan::DropReason::kNoEndpoints;
    return finished(packet, {onePath(std::move(steps), std::move(refused))});
  }
  std::string affinity;
  if ((d.service->flags & kFlagAffinity) != 0)
    affinity = fmt::format("; ClientIP affinity: the client's network namespace keeps this endpoint for {}s "
                           "(kproxy_affinity)",
                           d.service->affinityTimeout);
  std::vector<plan::TracePath> paths;
  for (std::size_t i = 0; i < d.slots.size(); ++i) {
    const SlotChoice& choice = d.slots[i];
    plan::TracePath path;
    path.steps = steps;
    path.choices.push_back(fmt::format("slot {} ({} of {})", choice.slot.toText(), i + 1, d.slots.size()));
    if (!choice.endpoint) {
      path.steps.push_back({hook, "lookup kproxy_slots " + choice.slot.toText(), "missing: return ECONNREFUSED"});
      path.outcome.verdict = plan::TraceVerdict::kRejected;
      path.outcome.chain = hook;
      path.outcome.rule = "lookup kproxy_slots " + choice.slot.toText() + ": missing";
      paths.push_back(std::move(path));
      continue;
    }
    const std::string endpoint = choice.endpoint->toText();
    path.steps.push_back({hook, "lookup kproxy_slots " + choice.slot.toText(),
                          fmt::format("{}: the socket connects to it directly (no NAT, no conntrack entry for the "
                                      "service); getpeername and recvmsg answer {}{}",
                                      endpoint, key.address.toText(), affinity)});
    path.outcome.verdict = plan::TraceVerdict::kDnat;
    path.outcome.endpoints = {endpoint};
    paths.push_back(std::move(path));
  }
  return finished(packet, std::move(paths));
}

}  // namespace kproxy::ebpf
