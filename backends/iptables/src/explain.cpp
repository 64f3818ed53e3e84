#include "kproxy/iptables/explain.h"

#include <algorithm>
#include <vector>

#include "kproxy/net/ip.h"
#include "kproxy/iptables/tracer.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/trace.h"

namespace kproxy::iptables {
sdk::Expected<std::string> explainPacket(const RenderConfig& config, std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node, const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs, NfacctObjects nfacct) {
  auto packet = plan::packetOf(request);
  if (!packet) return std::unexpected(packet.error());
  const net::Family family = packet->destination.v6() ? net::Family::kIPv6 : net::Family::kIPv4;

  // As the backend renders a full sync.
  IptablesRenderer renderer(config);
  renderer.setNode(node);
  renderer.setServiceCIDRs({serviceCIDRs.begin(), serviceCIDRs.end()});
  std::size_t endpoints = 0;
  for (const auto& p : ports) endpoints += p.allEndpoints.size();
  renderer.setLargeCluster(endpoints > config.largeClusterEndpoints);
  renderer.setNfacct(nfacct);
  const TaggedRuleset rules = renderTaggedRuleset(renderer, family, ports, node);
  auto tracer = IptablesTracer::fromText(
      rules.text, plan::nodeLocalAddresses(node, config.common.nodeIPs, node.nodePortAddresses.addresses));
  if (!tracer) return sdk::fail("explain: the rendered rules do not parse: " + tracer.error().message());
  tracer->tagRules(rules.tags);
  const Trace trace = tracer->trace(*packet);

  plan::Explanation x = plan::explanationOf(*packet, request.protocol, ports, family, trace);
  std::vector<std::string> local;
  for (const auto& a : tracer->localAddresses()) local.push_back(a.toString());
  x.destinationLocal = plan::nodePortAnswersOn(
      plan::nodePortAddressesOf(node, config.common.nodePortAddresses, config.common.nodeIPs), local, x.destination,
      /*loopback=*/true);
  x.reason = plan::dropReasonText(trace.outcome, serviceCIDRs, family, x.destination);
  return plan::explanationText(x, request.json);
}

}  // namespace kproxy::iptables
