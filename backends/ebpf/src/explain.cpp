// `kproxy explain` in ebpf mode (explain.h), and the backend's explain entry point.
#include "kproxy/ebpf/explain.h"

#include <vector>

#include "kproxy/ebpf/backend.h"
#include "kproxy/ebpf/differ.h"
#include "kproxy/nftables/explain.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/trace.h"

namespace kproxy::ebpf {

MapContents plannedMaps(const EbpfRenderer& renderer, net::Family family, std::span<const sdk::ServicePort> ports) {
  MapContents out;
  std::uint32_t id = 0;
  for (const auto& port : ports) {
    if (port.family != family) continue;
    PortMaps maps = renderer.render(port);
    if (maps.services.empty()) continue;
    maps.setId(++id);
    addPortMaps(out, maps);
  }
  return out;
}

sdk::Expected<std::string> explainPacket(const RenderConfig& config, std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node, const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs) {
  auto packet = plan::packetOf(request);
  if (!packet) return std::unexpected(packet.error());
  const net::Family family = packet->destination.family;

  EbpfRenderer renderer(config);
  renderer.setNode(node);
  // The pod traffic the hooks see is what the plan calls pod traffic (the renderer's own).
  plan::PlanConfig planConfig = plan::planConfigOf(config.common);
  plan::applyNode(planConfig, config.common.detectLocalMode, node, config.common.nodeIPs);
  // What no socket hook sees meets the nftables part, as a sync renders it from the same ports.
  auto nftablesPart = [&](const plan::Packet& p) {
    return nftables::plannedTracer(nftablesPartConfig(config), family, ports, node, serviceCIDRs).trace(p);
  };
  const EbpfTracer tracer(plannedMaps(renderer, family, ports), planConfig.localDetector, nftablesPart);
  const plan::Trace trace = tracer.trace(*packet);

  plan::Explanation x = plan::explanationOf(*packet, request.protocol, ports, family, trace);
  std::vector<std::string> local;
  for (const auto& a : plan::nodeLocalAddresses(node, config.common.nodeIPs, node.nodePortAddresses.addresses))
    local.push_back(a.toString());
  // The renderer writes no NodePort on loopback.
  x.destinationLocal = plan::nodePortAnswersOn(
      plan::nodePortAddressesOf(node, config.common.nodePortAddresses, config.common.nodeIPs), local, x.destination,
      /*loopback=*/false);
  x.reason = plan::dropReasonText(trace.outcome, serviceCIDRs, family, x.destination);
  return plan::explanationText(x, request.json);
}

sdk::Expected<std::string> EbpfBackend::explain(const sdk::SnapshotView& snapshot, const sdk::ExplainRequest& request) {
  const std::vector<sdk::ServicePort> ports = snapshot.all();
  const std::vector<sdk::ServiceCIDR> cidrs = snapshot.serviceCIDRs();
  return explainPacket(settings_.render, ports, snapshot.node(), request, cidrs);
}

}  // namespace kproxy::ebpf
