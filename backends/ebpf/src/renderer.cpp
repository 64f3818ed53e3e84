// EbpfRenderer (renderer.h): the plan's pools as service and slot elements.
#include "kproxy/ebpf/renderer.h"

#include <algorithm>

#include "kproxy/net/ip.h"

namespace kproxy::ebpf {
namespace {

std::uint8_t protocolNumber(sdk::Protocol protocol) {
  return protocol == sdk::Protocol::kUDP ? kProtoUDP : kProtoTCP;
}

/// The slots of one pool from `base`, at most kMaxPool; endpoints that are not one address of
/// the port's family are left out. Returns how many were written.
std::uint16_t addPool(PortMaps& out, std::span<const sdk::Endpoint> endpoints, std::uint32_t base,
                      net::Family family) {
  std::uint16_t n = 0;
  for (const auto& e : endpoints) {
    if (n == kMaxPool) break;
    auto address = SocketAddress::of(e.ip, static_cast<std::uint16_t>(e.port));
    if (!address || address->family != family || e.port <= 0 || e.port > 65535) continue;
    out.slots.emplace_back(SlotKey{0, base + n}, *address);
    ++n;
  }
  return n;
}

}  // namespace

sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, "ebpf");
  if (!common) return std::unexpected(common.error());
  return RenderConfig{std::move(*common)};
}

void PortMaps::setId(std::uint32_t id) {
  for (auto& [key, value] : services) value.id = id;
  for (auto& [key, endpoint] : slots) key.serviceId = id;
}

EbpfRenderer::EbpfRenderer(RenderConfig config)
    : config_(std::move(config)), planConfig_(plan::planConfigOf(config_.common)) {
  nodePorts_ = plan::nodePortAddressesOf(node_, config_.common.nodePortAddresses, config_.common.nodeIPs);
}

void EbpfRenderer::setNode(const sdk::NodeInfo& node) {
  node_ = node;
  planConfig_ = plan::planConfigOf(config_.common);
  plan::applyNode(planConfig_, config_.common.detectLocalMode, node, config_.common.nodeIPs);
  nodePorts_ = plan::nodePortAddressesOf(node_, config_.common.nodePortAddresses, config_.common.nodeIPs);
}

std::vector<std::string> EbpfRenderer::nodePortAddresses(net::Family family) const {
  // Every local address: the node's own, as far as the snapshot knows them. A socket hook
  // sees connects to loopback too, but upstream's nftables mode serves no NodePort there.
  const std::vector<std::string>& from = nodePorts_.allLocal(family) ? node_.addresses : nodePorts_.addresses;
  std::vector<std::string> out;
  for (const auto& a : from) {
    auto p = net::Prefix::parse(a);
    if (!p || !p->isHost() || p->family != family) continue;
    if (std::find(out.begin(), out.end(), p->addressText()) == out.end()) out.push_back(p->addressText());
  }
  return out;
}

PortMaps EbpfRenderer::render(const sdk::ServicePort& port) const {
  PortMaps out;
  if (!steered(port.protocol)) return out;
  const plan::ServicePortPlan plan = plan::planServicePort(port, planConfig_);
  const net::Family family = port.family;

  std::uint16_t cluster = 0, local = 0;
  if (plan.usesClusterPool) cluster = addPool(out, plan.clusterEndpoints, 0, family);
  // Only the ClusterIP under internalTrafficPolicy Local picks from the local pool: every
  // external address a socket hook sees uses the cluster pool, so eTP=Local alone writes none.
  if (plan.usesLocalPool && plan.internalPool == plan::Pool::kLocal)
    local = addPool(out, plan.localEndpoints, kLocalSlotBase, family);

  ServiceValue value;
  value.count = cluster;
  value.localCount = local;
  if (plan.affinity) {
    value.flags |= kFlagAffinity;
    value.affinityTimeout = plan.affinityTimeoutSeconds;
  }
  const std::uint8_t protocol = protocolNumber(port.protocol);
  auto add = [&](const std::string& ip, std::int32_t portNumber, ServiceValue v) {
    if (portNumber <= 0 || portNumber > 65535) return;
    auto address = SocketAddress::of(ip, static_cast<std::uint16_t>(portNumber));
    if (!address || address->family != family) return;
    ServiceKey key{*address, protocol};
    // The same address twice (an externalIP that is also a LoadBalancer IP) is one element.
    if (std::none_of(out.services.begin(), out.services.end(), [&](const auto& s) { return s.first == key; }))
      out.services.emplace_back(key, v);
  };

  // The ClusterIP: the internal pool. Without endpoints in it, count 0 refuses the connect.
  if (!plan.clusterIP.empty()) {
    ServiceValue internal = value;
    if (plan.internalPool == plan::Pool::kLocal) internal.flags |= kFlagLocalPool;
    add(plan.clusterIP, port.port, internal);
  }
  // External addresses, as the node and its pods reach them: the cluster pool (the plan's
  // short-circuit under externalTrafficPolicy Local; Cluster policy's own pool otherwise).
  if (plan.externallyAccessible) {
    ServiceValue external = value;
    if (!plan.capturesExternal) external.count = external.localCount = 0;
    for (const auto& ip : plan.externalIPs) add(ip, port.port, external);
    if (!plan.usesFirewall)
      for (const auto& ip : plan.loadBalancerIPs) add(ip, port.port, external);
    if (plan.nodePort != 0)
      for (const auto& ip : nodePortAddresses(family)) add(ip, plan.nodePort, external);
  }
  // Slots nobody can reach are not written.
  if (out.services.empty()) out.slots.clear();
  return out;
}

}  // namespace kproxy::ebpf
