#include "kproxy/iptables/explain.h"

#include <algorithm>
#include <vector>

#include "kproxy/net/ip.h"
#include "kproxy/iptables/tracer.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/trace.h"

namespace kproxy::iptables {
namespace {

using net::Prefix;

/// The node's own addresses as the kernel would see them: the Node's (or the configured node
/// IPs), and the interface addresses NodePorts answer on.
std::vector<net::Prefix> localAddresses(const RenderConfig& config, const sdk::NodeInfo& node) {
  std::vector<net::Prefix> out;
  auto add = [&](const std::string& ip) {
    if (auto a = net::Prefix::parse(ip); a && a->isHost()) out.push_back(*a);
  };
  for (const auto& ip : node.addresses) add(ip);
  if (out.empty())
    for (const auto& ip : config.common.nodeIPs) add(ip);
  for (const auto& ip : node.nodePortAddresses.addresses) add(ip);
  return out;
}

}  // namespace

sdk::Expected<std::string> explainPacket(const RenderConfig& config, std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node, const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs) {
  auto packet = Packet::make(request.sourceIP, request.destinationIP, request.destinationPort,
                             sdk::protocolName(request.protocol), request.fromNode);
  if (!packet) {
    return sdk::fail("explain: cannot make a packet from " + request.sourceIP + " to " + request.destinationIP +
                     " (addresses must be numeric and of one family)");
  }
  if (!request.fromNode) packet->inputInterface = request.inputInterface;
  const net::Family family = packet->destination.v6() ? net::Family::kIPv6 : net::Family::kIPv4;

  // As the backend renders a full sync.
  IptablesRenderer renderer(config);
  renderer.setNode(node);
  renderer.setServiceCIDRs({serviceCIDRs.begin(), serviceCIDRs.end()});
  std::size_t endpoints = 0;
  for (const auto& p : ports) endpoints += p.allEndpoints.size();
  renderer.setLargeCluster(endpoints > config.largeClusterEndpoints);
  const std::string rules = renderRuleset(renderer, family, ports, node);
  auto tracer = IptablesTracer::fromText(rules, localAddresses(config, node));
  if (!tracer) return sdk::fail("explain: the rendered rules do not parse: " + tracer.error().message());
  const Trace trace = tracer->trace(*packet);

  plan::Explanation x = plan::explanationOf(*packet, request.protocol, ports, family, trace);
  std::vector<std::string> local;
  for (const auto& a : tracer->localAddresses()) local.push_back(a.toString());
  x.destinationLocal = plan::nodePortAnswersOn(
      plan::nodePortAddressesOf(node, config.common.nodePortAddresses, config.common.nodeIPs), local, x.destination,
      /*loopback=*/true);
  // Why a drop happened, when the rules say more than the chain: an unallocated ClusterIP
  // (renderer.cpp's ServiceCIDR rule in filter KUBE-SERVICES).
  if (trace.outcome.verdict == plan::TraceVerdict::kDropped &&
      trace.outcome.rule.find("unallocated ClusterIPs of ServiceCIDR") != std::string::npos)
    x.reason = plan::unallocatedClusterIPReason(serviceCIDRs, family, x.destination);
  return plan::explanationText(x, request.json);
}

}  // namespace kproxy::iptables
