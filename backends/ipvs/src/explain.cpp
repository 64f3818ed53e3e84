// `kproxy explain` in IPVS mode: which planned virtual server a new connection meets and the
// pool IPVS balances it over. The iptables rules around IPVS (source-range firewall, drops of
// policy-less traffic, the eTP=Local short-circuit) are not traced; the answer says so.
#include <algorithm>

#include <fmt/format.h>

#include "kproxy/backends/common/address.h"
#include "kproxy/ipvs/backend.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plan/trace.h"

namespace kproxy::ipvs {
namespace {

/// Whether KUBE-SERVICES / KUBE-NODE-PORT / KUBE-LOAD-BALANCER mark the connection for
/// masquerade, as the plan decides it.
bool masqueraded(const sdk::ServicePort& port, Traffic traffic, const plan::PlanConfig& config,
                 const sdk::ExplainRequest& request, const backends::IPPrefix& source) {
  const plan::ServicePortPlan decided = plan::planServicePort(port, config);
  if (traffic != Traffic::kClusterIP) return decided.externalMasqueradeAll;
  switch (decided.internalMasquerade) {
    case plan::InternalMasquerade::kNone:
      return false;
    case plan::InternalMasquerade::kAll:
      return true;
    case plan::InternalMasquerade::kNotLocal:
      break;
  }
  using Mode = plan::LocalTrafficDetector::Mode;
  const auto& detector = config.localDetector;
  if (request.fromNode) return true;
  if (detector.mode == Mode::kCIDRs) {
    for (const auto& c : detector.cidrsOf(port.family))
      if (auto cidr = backends::IPPrefix::parse(c); cidr && cidr->contains(source)) return false;
    return true;
  }
  if (detector.mode == Mode::kBridgeInterface) return request.inputInterface != detector.interface;
  if (detector.mode == Mode::kInterfaceNamePrefix)
    return !request.inputInterface.starts_with(detector.interface);
  return true;
}

}  // namespace

sdk::Expected<std::string> IpvsBackend::explain(const sdk::SnapshotView& snapshot,
                                                const sdk::ExplainRequest& request) {
  auto src = backends::IPPrefix::parse(request.sourceIP);
  auto dst = backends::IPPrefix::parse(request.destinationIP);
  if (!src || !dst || !src->isHost() || !dst->isHost() || src->v6 != dst->v6)
    return sdk::fail("explain: cannot make a packet from " + request.sourceIP + " to " +
                     request.destinationIP + " (addresses must be numeric and of one family)");
  const sdk::Family family = dst->v6 ? sdk::Family::kIPv6 : sdk::Family::kIPv4;
  const std::vector<sdk::ServicePort> ports = snapshot.all();

  IpvsRenderer renderer(settings_.render);
  renderer.setNode(snapshot.node());
  plan::Explanation x;
  x.source = src->toString();
  x.destination = dst->toString();
  x.port = request.destinationPort;
  x.protocol = request.protocol;
  x.fromNode = request.fromNode;
  x.inputInterface = request.fromNode ? std::string() : request.inputInterface;
  x.packetText = fmt::format(
      "{} -> {}/{} ({})", x.source, plan::endpointText(x.destination, x.port),
      sdk::protocolName(request.protocol), request.fromNode ? "from the node" : "arriving");
  const auto& nodePort = renderer.nodePortAddresses(family);
  x.destinationLocal = std::find(nodePort.begin(), nodePort.end(), x.destination) != nodePort.end();

  plan::TracePath path;
  path.steps.push_back({"IPVS", "",
                        "virtual servers planned for " +
                            std::string(family == sdk::Family::kIPv6 ? "IPv6" : "IPv4")});
  std::vector<std::string> warnings{
      "IPVS mode: the trace follows the virtual servers only; the iptables filter rules around "
      "them "
      "(source ranges, drops without local endpoints) are not traced"};
  for (const auto& p : ports) {
    if (p.family != family) continue;
    x.ports.push_back(&p);
    if (p.protocol != request.protocol) continue;
    const Fragment f = renderer.renderServicePort(p);
    for (const auto& vs : f.virtualServers) {
      auto a = backends::IPPrefix::parse(vs.address);
      if (!a || *a != *dst || vs.port != request.destinationPort) continue;
      const VirtualServer k = kernelVirtualServer(vs);
      path.steps.push_back(
          {"IPVS", ipvsadmCommand('A', k), fmt::format("{} of {}", vs.key(), p.key)});
      path.outcome.masqueraded = masqueraded(p, vs.traffic, renderer.planConfig(), request, *src);
      if (vs.realServers.empty()) {
        path.outcome.verdict = plan::TraceVerdict::kRejected;
        path.outcome.chain = "IPVS";
        path.outcome.rule = "no real servers: ICMP port unreachable";
      } else {
        path.outcome.verdict = plan::TraceVerdict::kDnat;
        for (const auto& rs : vs.realServers) {
          path.outcome.endpoints.push_back(plan::endpointText(rs.address, rs.port));
          path.steps.push_back(
              {"IPVS",
               fmt::format("-> {} Masq {}", plan::endpointText(rs.address, rs.port), rs.weight),
               ""});
        }
        std::sort(path.outcome.endpoints.begin(), path.outcome.endpoints.end());
      }
      break;
    }
    if (path.outcome.verdict != plan::TraceVerdict::kAccepted) break;
  }
  std::vector<plan::TracePath> paths{path};
  x.outcome = plan::mergePaths(paths);
  x.paths = paths;
  x.warnings = warnings;
  x.traceText = plan::traceText(x.packetText, paths, warnings, x.outcome);
  return plan::explanationText(x, request.json);
}

}  // namespace kproxy::ipvs
