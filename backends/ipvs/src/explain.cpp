// `kproxy explain` in IPVS mode: the packet is traced through what a full sync would program,
// by the same tracer as iptables mode: the iptables rules (nat and filter, with the ipsets
// they match), and IPVS between the hooks: the tracer's scheduler is IPVS's
// (tracer_scheduler.h), over the planned virtual servers.
#include <algorithm>
#include <map>
#include <memory>

#include "kproxy/net/ip.h"
#include "kproxy/iptables/tracer.h"
#include "kproxy/ipvs/backend.h"
#include "kproxy/ipvs/tracer_scheduler.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plan/trace.h"

namespace kproxy::ipvs {

sdk::Expected<std::string> IpvsBackend::explain(const sdk::SnapshotView& snapshot,
                                                const sdk::ExplainRequest& request) {
  auto packet = plan::packetOf(request);
  if (!packet) return std::unexpected(packet.error());
  const net::Family family = packet->destination.v6() ? net::Family::kIPv6 : net::Family::kIPv4;
  const std::vector<sdk::ServicePort> ports = snapshot.all();
  const std::vector<sdk::ServiceCIDR> cidrs = snapshot.serviceCIDRs();
  const sdk::NodeInfo node = snapshot.node();

  // As a full sync renders: once to learn what kube-ipvs0 would hold (its addresses are not
  // node addresses), then with it.
  IpvsRenderer renderer(settings_.render);
  renderer.setNode(node);
  renderer.setServiceCIDRs(cidrs);
  std::vector<std::string> bound;
  for (const auto& p : ports)
    if (p.family == family)
      for (auto& a : renderer.renderServicePort(p).boundAddresses) bound.push_back(std::move(a));
  renderer.setDummyInterfaceAddresses(bound);
  std::vector<Fragment> fragments;
  for (const auto& p : ports)
    if (p.family == family) fragments.push_back(renderer.renderServicePort(p));

  // The node's own addresses: the Node's (or the configured node IPs), where IPVS mode's
  // NodePorts answer, and kube-ipvs0's.
  std::vector<net::Prefix> local =
      plan::nodeLocalAddresses(node, settings_.render.common.nodeIPs, renderer.nodePortAddresses(family));
  for (const auto& f : fragments)
    for (const auto& ip : f.boundAddresses)
      if (auto a = net::Prefix::parse(ip); a && a->isHost()) local.push_back(*a);

  auto tracer = iptables::IptablesTracer::fromText(renderIptables(renderer, family, ports), local);
  if (!tracer) return sdk::fail("explain: the rendered rules do not parse: " + tracer.error().message());
  const GlobalObjects global = renderer.renderGlobal(family);
  tracer->tagRules(global.tags);
  for (const auto& f : fragments) tracer->tagRules(f.tags);
  std::map<std::string, iptables::TracedIpset> sets;
  for (const auto& def : global.sets) sets[def.name].type = def.type;
  for (const auto& f : fragments)
    for (const auto& e : f.ipsetEntries) sets[e.set].members.push_back(e.entry);
  tracer->setIpsets({sets.begin(), sets.end()});
  // IPVS schedules between the hooks: the tracer is given IPVS's scheduler over the virtual
  // servers the sync would program.
  tracer->setScheduler(std::make_shared<const IpvsConnectionScheduler>(tracedVirtualServers(fragments)));
  const plan::Trace trace = tracer->trace(*packet);

  plan::Explanation x = plan::explanationOf(*packet, request.protocol, ports, family, trace);
  const auto& nodePort = renderer.nodePortAddresses(family);
  x.destinationLocal = std::find(nodePort.begin(), nodePort.end(), x.destination) != nodePort.end();
  x.reason = plan::dropReasonText(trace.outcome, cidrs, family, x.destination);
  return plan::explanationText(x, request.json);
}

}  // namespace kproxy::ipvs
