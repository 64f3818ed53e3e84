#include "kproxy/nftables/explain.h"

#include <algorithm>
#include <vector>

#include "kproxy/nftables/tracer.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/trace.h"

namespace kproxy::nftables {

NftablesTracer plannedTracer(const RenderConfig& config, net::Family family,
                             std::span<const sdk::ServicePort> ports, const sdk::NodeInfo& node,
                             std::span<const sdk::ServiceCIDR> serviceCIDRs) {
  NftablesRenderer renderer(config);
  renderer.setServiceCIDRs({serviceCIDRs.begin(), serviceCIDRs.end()});
  return NftablesTracer::fromServicePorts(renderer, family, ports, node);
}

sdk::Expected<std::string> explainPacket(const RenderConfig& config,
                                         std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node,
                                         const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs) {
  auto packet = plan::packetOf(request);
  if (!packet) return std::unexpected(packet.error());
  const net::Family family = packet->destination.family;
  const net::Family sdkFamily = family == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6;

  const NftablesTracer tracer = plannedTracer(config, family, ports, node, serviceCIDRs);
  const Trace trace = tracer.trace(*packet);

  plan::Explanation x = plan::explanationOf(*packet, request.protocol, ports, sdkFamily, trace);
  std::vector<std::string> local;
  for (const auto& a : tracer.localAddresses()) local.push_back(a.toString());
  x.destinationLocal =
      plan::nodePortAnswersOn(NftablesRenderer(config).nodePortAddresses(node), local, x.destination,
                              /*loopback=*/true);
  x.reason = plan::dropReasonText(trace.outcome, serviceCIDRs, sdkFamily, x.destination);
  return plan::explanationText(x, request.json);
}

}  // namespace kproxy::nftables
