#include "kproxy/nftables/explain.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "kproxy/nftables/tracer.h"
#include "kproxy/plan/service_plan.h"

namespace kproxy::nftables {
namespace {


std::string jsonBool(bool b) { return b ? "true" : "false"; }

template <typename T, typename Fn>
std::string jsonArray(const std::vector<T>& items, Fn&& fn) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ",";
    out += fn(items[i]);
  }
  return out + "]";
}

// As the tracer writes endpoints: "ip:port", "[ip]:port" for IPv6.
std::string endpointText(const sdk::Endpoint& e) {
  bool v6 = e.ip.find(':') != std::string::npos;
  return (v6 ? "[" + e.ip + "]" : e.ip) + ":" + std::to_string(e.port);
}

bool sameIP(const std::string& text, const Address& address) {
  auto parsed = Address::parse(text);
  return parsed && *parsed == address;
}

// How the packet's destination reaches a service port.
struct Hit {
  const sdk::ServicePort* port = nullptr;
  std::string via;  ///< "cluster IP", "external IP", "load balancer IP", "node port"
  bool external = false;
};

std::optional<Hit> findServicePort(std::span<const sdk::ServicePort* const> ports,
                                   const Packet& packet, sdk::Protocol protocol,
                                   const std::vector<Address>& localAddresses,
                                   const RenderConfig& config) {
  const Address& dst = packet.destination;
  for (const auto* p : ports) {
    if (p->protocol != protocol || p->port != packet.destinationPort) continue;
    if (!p->clusterIP.empty() && sameIP(p->clusterIP, dst)) return Hit{p, "cluster IP", false};
    for (const auto& ip : p->externalIPs)
      if (sameIP(ip, dst)) return Hit{p, "external IP", true};
    for (const auto& ip : p->loadBalancerIPs)
      if (sameIP(ip, dst)) return Hit{p, "load balancer IP", true};
  }
  bool local = std::any_of(localAddresses.begin(), localAddresses.end(),
                           [&](const Address& a) { return a == dst; }) ||
               std::any_of(config.nodePortCIDRs.begin(), config.nodePortCIDRs.end(),
                           [&](const Address& c) { return c.contains(dst); });
  auto loopback = Address::parse(dst.family == Family::kIPv4 ? "127.0.0.0/8" : "::1");
  if (loopback && loopback->contains(dst)) local = true;
  if (!local) return std::nullopt;
  for (const auto* p : ports) {
    if (p->protocol == protocol && p->nodePort != 0 && p->nodePort == packet.destinationPort)
      return Hit{p, "node port", true};
  }
  return std::nullopt;
}

struct Candidate {
  sdk::Endpoint endpoint;
  bool selected = false;
  std::string reason;
};

// Each endpoint of the port with the reason it is, or is not, where the packet may go.
std::vector<Candidate> candidates(const Hit& hit, const TraceOutcome& outcome,
                                  bool& policyLocal, bool& shortCircuit) {
  const sdk::ServicePort& p = *hit.port;
  const bool dnat = outcome.verdict == TraceVerdict::kDnat;
  auto chosen = [&](const sdk::Endpoint& e) {
    return dnat && std::find(outcome.endpoints.begin(), outcome.endpoints.end(),
                             endpointText(e)) != outcome.endpoints.end();
  };
  auto in = [](const std::vector<sdk::Endpoint>& v, const sdk::Endpoint& e) {
    return std::any_of(v.begin(), v.end(),
                       [&](const sdk::Endpoint& x) { return x.ip == e.ip && x.port == e.port; });
  };
  policyLocal = hit.external ? p.externalPolicyLocal : p.internalPolicyLocal;
  // eTP=Local: the node's pods and the node itself reach the cluster-wide endpoints.
  shortCircuit = hit.external && policyLocal && dnat &&
                 std::any_of(p.allEndpoints.begin(), p.allEndpoints.end(),
                             [&](const sdk::Endpoint& e) { return !e.isLocal && chosen(e); });
  const bool localOnly = policyLocal && !shortCircuit;
  const std::string policy = hit.external ? "eTP=Local" : "iTP=Local";

  const auto& all = p.allEndpoints.empty() ? p.clusterEndpoints : p.allEndpoints;
  std::vector<Candidate> out;
  for (const auto& e : all) {
    Candidate c{e, chosen(e), {}};
    if (c.selected) {
      c.reason = e.ready ? "ready" : "terminating (fallback)";
      if (shortCircuit) c.reason += ", eTP=Local short-circuit for the node and its pods";
    } else if (!e.ready && !(e.serving && e.terminating)) {
      c.reason = "not ready";
    } else if (!e.ready) {
      c.reason = "terminating (ready endpoints exist)";
    } else if (localOnly && !e.isLocal) {
      c.reason = "not local (" + policy + ")";
    } else if (in(p.allReachableEndpoints, e) && !in(p.clusterEndpoints, e)) {
      c.reason = "not in topology hints";
    } else if (!dnat) {
      c.reason = std::string("unused: the packet is ") +
                 (outcome.verdict == TraceVerdict::kDropped    ? "dropped"
                  : outcome.verdict == TraceVerdict::kRejected ? "rejected"
                                                               : "not DNATed");
    } else {
      c.reason = "not reachable by this packet";
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::string outcomeLine(const TraceOutcome& o) {
  std::string line;
  switch (o.verdict) {
    case TraceVerdict::kDnat: line = "DNAT to " + fmt::format("{}", fmt::join(o.endpoints, ", ")); break;
    case TraceVerdict::kDropped: line = "dropped by chain " + o.chain + ": " + o.rule; break;
    case TraceVerdict::kRejected: line = "rejected by chain " + o.chain + ": " + o.rule; break;
    case TraceVerdict::kAccepted: line = "accepted untouched (no service of kproxy's)"; break;
  }
  line += o.masqueraded ? ", masqueraded" : ", not masqueraded";
  if (o.mixed) line += " (paths disagree)";
  return line;
}

const char* typeName(sdk::ServiceType t) {
  switch (t) {
    case sdk::ServiceType::kClusterIP: return "ClusterIP";
    case sdk::ServiceType::kNodePort: return "NodePort";
    case sdk::ServiceType::kLoadBalancer: return "LoadBalancer";
  }
  return "ClusterIP";
}

}  // namespace

sdk::Expected<std::string> explainPacket(const RenderConfig& config,
                                         std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node,
                                         const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs) {
  auto packet = Packet::make(request.sourceIP, request.destinationIP, request.destinationPort,
                             sdk::protocolName(request.protocol), request.fromNode);
  if (!packet) {
    return sdk::fail("explain: cannot make a packet from " + request.sourceIP + " to " +
                     request.destinationIP + " (addresses must be numeric and of one family)");
  }
  if (!request.fromNode) packet->inputInterface = request.inputInterface;
  const Family family = packet->destination.family;
  const sdk::Family sdkFamily = family == Family::kIPv4 ? sdk::Family::kIPv4 : sdk::Family::kIPv6;

  NftablesRenderer renderer(config);
  renderer.setServiceCIDRs({serviceCIDRs.begin(), serviceCIDRs.end()});
  const NftablesTracer tracer = NftablesTracer::fromServicePorts(renderer, family, ports, node);
  const Trace trace = tracer.trace(*packet);

  std::vector<const sdk::ServicePort*> familyPorts;
  for (const auto& p : ports)
    if (p.family == sdkFamily) familyPorts.push_back(&p);
  auto hit = findServicePort(familyPorts, *packet, request.protocol, tracer.localAddresses(), config);
  bool policyLocal = false, shortCircuit = false;
  std::vector<Candidate> cands;
  if (hit) cands = candidates(*hit, trace.outcome, policyLocal, shortCircuit);

  const auto& o = trace.outcome;
  // Why a drop happened, when the rules say more than the chain: an unallocated ClusterIP.
  std::string reason;
  if (o.verdict == TraceVerdict::kDropped && o.chain == names::kClusterIPsCheckChain) {
    for (const auto& range : plan::serviceCIDRRanges(serviceCIDRs, sdkFamily)) {
      auto cidr = Address::parse(range.cidr);
      if (!cidr || !cidr->contains(packet->destination)) continue;
      reason = fmt::format("dropped: unallocated ClusterIP in ServiceCIDR {} ({})", fmt::join(range.names, ", "),
                           range.cidr);
    }
    if (reason.empty()) reason = "dropped: unallocated ClusterIP";
  }
  if (request.json) {
    std::string out = "{";
    out += "\"packet\":{\"source\":" + jsonString(packet->source.toString()) +
           ",\"destination\":" + jsonString(packet->destination.toString()) +
           ",\"port\":" + std::to_string(packet->destinationPort) +
           ",\"protocol\":" + jsonString(sdk::protocolName(request.protocol)) +
           ",\"fromNode\":" + jsonBool(packet->fromNode) +
           ",\"inputInterface\":" + jsonString(packet->inputInterface) + "}";
    if (hit) {
      const auto& p = *hit->port;
      out += ",\"service\":{\"key\":" + jsonString(p.key) + ",\"type\":" + jsonString(typeName(p.type)) +
             ",\"via\":" + jsonString(hit->via) + ",\"trafficPolicyLocal\":" + jsonBool(policyLocal) +
             ",\"shortCircuit\":" + jsonBool(shortCircuit) + "}";
    } else {
      out += ",\"service\":null";
    }
    out += ",\"verdict\":" + jsonString(verdictName(o.verdict));
    out += ",\"reason\":" + jsonString(reason);
    out += ",\"masqueraded\":" + jsonBool(o.masqueraded);
    out += ",\"outcome\":" + o.toJson();
    out += ",\"endpoints\":" + jsonArray(cands, [](const Candidate& c) {
      const auto& e = c.endpoint;
      return "{\"endpoint\":" + jsonString(endpointText(e)) + ",\"selected\":" + jsonBool(c.selected) +
             ",\"reason\":" + jsonString(c.reason) + ",\"ready\":" + jsonBool(e.ready) +
             ",\"serving\":" + jsonBool(e.serving) + ",\"terminating\":" + jsonBool(e.terminating) +
             ",\"local\":" + jsonBool(e.isLocal) + ",\"node\":" + jsonString(e.nodeName) + "}";
    });
    out += ",\"paths\":" + jsonArray(trace.paths, [](const TracePath& path) {
      return "{\"choices\":" + jsonArray(path.choices, [](const std::string& s) { return jsonString(s); }) +
             ",\"steps\":" + jsonArray(path.steps, [](const TraceStep& s) {
               return "{\"chain\":" + jsonString(s.chain) + ",\"rule\":" + jsonString(s.rule) +
                      ",\"detail\":" + jsonString(s.detail) + "}";
             }) +
             ",\"outcome\":" + path.outcome.toJson() + "}";
    });
    out += ",\"warnings\":" + jsonArray(trace.warnings, [](const std::string& s) { return jsonString(s); });
    return out + "}\n";
  }

  std::string out = "packet:    " + packet->toString() + "\n";
  if (hit) {
    const auto& p = *hit->port;
    out += fmt::format("service:   {} ({}), via its {} {}:{}/{}\n", p.key, typeName(p.type),
                       hit->via, packet->destination.toString(), packet->destinationPort,
                       sdk::protocolName(p.protocol));
  } else {
    out += "service:   none of kproxy's matches the destination\n";
  }
  out += "outcome:   " + outcomeLine(o) + "\n";
  if (!reason.empty()) out += "reason:    " + reason + "\n";
  if (hit) {
    std::string policy = policyLocal ? "Local" : "Cluster";
    if (shortCircuit) policy += ", short-circuited to the cluster-wide endpoints";
    out += fmt::format("endpoints: ({} traffic policy {})\n", hit->external ? "external" : "internal",
                       policy);
    if (cands.empty()) out += "  (none)\n";
    for (const auto& c : cands) {
      out += fmt::format("  {:<4} {:<24} {}\n", c.selected ? "in" : "out",
                         endpointText(c.endpoint), c.reason);
    }
  }
  out += "trace:\n";
  std::string text = trace.toText();
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += "  " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

}  // namespace kproxy::nftables
