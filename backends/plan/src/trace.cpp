#include "kproxy/plan/trace.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "kproxy/net/ip.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/net/host_port.h"

namespace kproxy::plan {

using net::Prefix;

std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string endpointText(std::string_view ip, std::uint16_t port) { return net::joinHostPort(ip, port); }

std::string_view verdictName(TraceVerdict verdict) {
  switch (verdict) {
    case TraceVerdict::kAccepted: return "accept";
    case TraceVerdict::kDnat: return "dnat";
    case TraceVerdict::kDropped: return "drop";
    case TraceVerdict::kRejected: return "reject";
  }
  return "accept";
}

std::string TraceOutcome::toText() const {
  switch (verdict) {
    case TraceVerdict::kAccepted: return "";
    case TraceVerdict::kDropped: return "DROP";
    case TraceVerdict::kRejected: return "REJECT";
    case TraceVerdict::kDnat: break;
  }
  std::string out;
  for (const auto& e : endpoints) {
    if (!out.empty()) out += ", ";
    out += e;
  }
  return out;
}

std::string TraceOutcome::toJson() const {
  std::string eps;
  for (const auto& e : endpoints) {
    if (!eps.empty()) eps += ',';
    eps += jsonString(e);
  }
  return fmt::format(R"({{"verdict":{},"endpoints":[{}],"masqueraded":{},"mixed":{},"chain":{},"rule":{}}})",
                     jsonString(verdictName(verdict)), eps, masqueraded, mixed, jsonString(chain),
                     jsonString(rule));
}

std::size_t ChoiceExplorer::choose(std::size_t alternatives) {
  if (position_ == taken_.size()) {
    taken_.push_back(0);
    limits_.push_back(alternatives);
  }
  return taken_[position_++];
}

bool ChoiceExplorer::next() {
  position_ = 0;
  while (!taken_.empty()) {
    if (taken_.back() + 1 < limits_.back()) {
      ++taken_.back();
      return true;
    }
    taken_.pop_back();
    limits_.pop_back();
  }
  return false;
}

std::string_view dropReasonName(DropReason reason) {
  switch (reason) {
    case DropReason::kNone: break;
    case DropReason::kUnallocatedClusterIP: return "unallocated-cluster-ip";
    case DropReason::kNoEndpoints: return "no-endpoints";
    case DropReason::kNoLocalEndpoints: return "no-local-endpoints";
    case DropReason::kSourceRange: return "source-range";
    case DropReason::kClusterIPPort: return "cluster-ip-port";
    case DropReason::kServiceAddressPort: return "service-address-port";
    case DropReason::kInvalidConnection: return "invalid-connection";
    case DropReason::kLocalnet: return "localnet";
  }
  return "";
}

TraceOutcome mergePaths(std::span<const TracePath> paths) {
  TraceOutcome out;
  if (paths.empty()) return out;
  const auto dnat = [](const TracePath& p) { return p.outcome.verdict == TraceVerdict::kDnat; };
  const auto firstDnat = std::find_if(paths.begin(), paths.end(), dnat);
  const TracePath& lead = firstDnat != paths.end() ? *firstDnat : paths.front();
  out.verdict = lead.outcome.verdict;
  out.chain = lead.outcome.chain;
  out.rule = lead.outcome.rule;
  out.reason = lead.outcome.reason;
  out.redirectPort = lead.outcome.redirectPort;
  for (const auto& p : paths) {
    out.masqueraded = out.masqueraded || p.outcome.masqueraded;
    if (p.outcome.verdict != out.verdict) out.mixed = true;
  }
  if (out.verdict == TraceVerdict::kDnat) {
    // Sort numerically (10.0.1.2 before 10.0.1.10), then print.
    std::vector<std::tuple<std::array<std::uint8_t, 16>, int, std::string>> eps;
    for (const auto& p : paths)
      if (dnat(p))
        for (const auto& e : p.outcome.endpoints) {
          auto colon = e.rfind(':');
          std::string ip = e.substr(0, colon);
          if (!ip.empty() && ip.front() == '[') ip = ip.substr(1, ip.size() - 2);
          auto a = net::Prefix::parse(ip);
          eps.emplace_back(a ? a->bytes : std::array<std::uint8_t, 16>{}, std::stoi(e.substr(colon + 1)), e);
        }
    std::sort(eps.begin(), eps.end());
    eps.erase(std::unique(eps.begin(), eps.end()), eps.end());
    for (auto& e : eps) out.endpoints.push_back(std::get<2>(e));
  }
  return out;
}

std::string traceText(std::string_view packetText, std::span<const TracePath> paths,
                      std::span<const std::string> warnings, const TraceOutcome& outcome) {
  std::string out = fmt::format("packet {}\n", packetText);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const auto& path = paths[i];
    if (paths.size() > 1) out += fmt::format("path {} of {}\n", i + 1, paths.size());
    for (const auto& step : path.steps) {
      if (step.rule.empty()) {
        out += fmt::format("  [{}] {}\n", step.chain, step.detail);
      } else if (step.detail.empty()) {
        out += fmt::format("  {}: {}\n", step.chain, step.rule);
      } else {
        out += fmt::format("  {}: {}\n      {}\n", step.chain, step.rule, step.detail);
      }
    }
  }
  for (const auto& w : warnings) out += "warning: " + w + "\n";
  std::string result = outcome.toText();
  if (result.empty()) result = "ACCEPT (untouched)";
  out += fmt::format("outcome: {}{}{}\n", result, outcome.masqueraded ? ", masqueraded" : "",
                     outcome.mixed ? " (paths disagree)" : "");
  return out;
}

namespace {

std::optional<std::uint8_t> protocolNumber(std::string_view name) {
  if (name == "tcp") return 6;
  if (name == "udp") return 17;
  if (name == "sctp") return 132;
  return std::nullopt;
}

std::string_view protocolText(std::uint8_t protocol) {
  switch (protocol) {
    case 6: return "tcp";
    case 17: return "udp";
    case 132: return "sctp";
    default: return "unknown";
  }
}

}  // namespace

std::optional<Packet> Packet::make(std::string_view source, std::string_view destination, std::uint16_t port,
                                   std::string_view protocol, bool fromNode) {
  auto s = Prefix::parse(source);
  auto d = Prefix::parse(destination);
  auto proto = protocolNumber(protocol);
  if (!s || !d || !proto || !s->isHost() || !d->isHost() || s->family != d->family) return std::nullopt;
  return Packet{*s, *d, port, *proto, fromNode, {}};
}

std::string Packet::toString() const {
  return fmt::format("{} -> {}/{} ({})", source.toString(), endpointText(destination.addressText(), destinationPort),
                     protocolText(protocol), fromNode ? "from the node" : "arriving");
}

sdk::Expected<Packet> packetOf(const sdk::ExplainRequest& request) {
  auto packet = Packet::make(request.sourceIP, request.destinationIP, request.destinationPort,
                             sdk::protocolName(request.protocol), request.fromNode);
  if (!packet) {
    return sdk::fail("explain: cannot make a packet from " + request.sourceIP + " to " + request.destinationIP +
                     " (addresses must be numeric and of one family)");
  }
  if (!request.fromNode) packet->inputInterface = request.inputInterface;
  return *packet;
}

std::string Trace::toText() const { return traceText(packet.toString(), paths, warnings, outcome); }

std::vector<Prefix> nodeLocalAddresses(const sdk::NodeInfo& node, std::span<const std::string> nodeIPs,
                                       std::span<const std::string> nodePortAddresses) {
  std::vector<Prefix> local;
  auto add = [&](const std::string& ip) {
    if (auto a = Prefix::parse(ip); a && a->isHost()) local.push_back(*a);
  };
  for (const auto& ip : node.addresses) add(ip);
  if (local.empty())
    for (const auto& ip : nodeIPs) add(ip);
  for (const auto& ip : nodePortAddresses) add(ip);
  return local;
}

Explanation explanationOf(const Packet& packet, sdk::Protocol protocol, std::span<const sdk::ServicePort> ports,
                          net::Family family, const Trace& trace) {
  Explanation x;
  x.source = packet.source.toString();
  x.destination = packet.destination.toString();
  x.port = packet.destinationPort;
  x.protocol = protocol;
  x.fromNode = packet.fromNode;
  x.inputInterface = packet.inputInterface;
  x.packetText = packet.toString();
  for (const auto& p : ports)
    if (p.family == family) x.ports.push_back(&p);
  x.paths = trace.paths;
  x.outcome = trace.outcome;
  x.warnings = trace.warnings;
  x.traceText = trace.toText();
  return x;
}

std::string unallocatedClusterIPReason(std::span<const sdk::ServiceCIDR> serviceCIDRs, net::Family family,
                                       std::string_view destination) {
  std::string reason;
  auto dst = net::Prefix::parse(destination);
  for (const auto& range : serviceCIDRRanges(serviceCIDRs, family)) {
    auto cidr = net::Prefix::parse(range.cidr);
    if (!cidr || !dst || !cidr->contains(*dst)) continue;
    reason = fmt::format("dropped: unallocated ClusterIP in ServiceCIDR {} ({})", fmt::join(range.names, ", "),
                         range.cidr);
  }
  if (reason.empty()) reason = "dropped: unallocated ClusterIP";
  return reason;
}

std::string dropReasonText(const TraceOutcome& outcome, std::span<const sdk::ServiceCIDR> serviceCIDRs,
                           net::Family family, std::string_view destination) {
  std::string_view verb;
  switch (outcome.verdict) {
    case TraceVerdict::kDropped: verb = "dropped"; break;
    case TraceVerdict::kRejected: verb = "rejected"; break;
    default: return "";
  }
  std::string_view why;
  switch (outcome.reason) {
    case DropReason::kNone: return "";
    case DropReason::kUnallocatedClusterIP:
      if (outcome.verdict == TraceVerdict::kDropped)
        return unallocatedClusterIPReason(serviceCIDRs, family, destination);
      why = "unallocated ClusterIP";
      break;
    case DropReason::kNoEndpoints: why = "the service port has no endpoints"; break;
    case DropReason::kNoLocalEndpoints:
      why = "the traffic policy is Local and this node has no endpoint of the service port";
      break;
    case DropReason::kSourceRange: why = "the source is not in the service's loadBalancerSourceRanges"; break;
    case DropReason::kClusterIPPort: why = "no service port of this ClusterIP has this port and protocol"; break;
    case DropReason::kServiceAddressPort:
      why = "no service port of this service address has this port and protocol";
      break;
    case DropReason::kInvalidConnection: why = "conntrack finds the packet INVALID"; break;
    case DropReason::kLocalnet: why = "to a loopback address from another host (route_localnet)"; break;
  }
  return fmt::format("{}: {}", verb, why);
}

// ---- explain ------------------------------------------------------------------------------

namespace {

std::string jsonBool(bool b) { return b ? "true" : "false"; }

template <typename Range, typename Fn>
std::string jsonArray(const Range& items, Fn&& fn) {
  std::string out = "[";
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += ",";
    first = false;
    out += fn(item);
  }
  return out + "]";
}

std::string endpointOf(const sdk::Endpoint& e) { return plan::endpointText(e.ip, static_cast<std::uint16_t>(e.port)); }

bool sameIP(const std::string& text, std::string_view address) {
  auto a = net::Prefix::parse(text);
  auto b = net::Prefix::parse(address);
  return a && b && *a == *b;
}

// How the packet's destination reaches a service port.
struct Hit {
  const sdk::ServicePort* port = nullptr;
  std::string via;  ///< "cluster IP", "external IP", "load balancer IP", "node port"
  bool external = false;
};

std::optional<Hit> findServicePort(const Explanation& x) {
  for (const auto* p : x.ports) {
    if (p->protocol != x.protocol || p->port != x.port) continue;
    if (!p->clusterIP.empty() && sameIP(p->clusterIP, x.destination)) return Hit{p, "cluster IP", false};
    for (const auto& ip : p->externalIPs)
      if (sameIP(ip, x.destination)) return Hit{p, "external IP", true};
    for (const auto& ip : p->loadBalancerIPs)
      if (sameIP(ip, x.destination)) return Hit{p, "load balancer IP", true};
  }
  if (!x.destinationLocal) return std::nullopt;
  for (const auto* p : x.ports) {
    if (p->protocol == x.protocol && p->nodePort != 0 && p->nodePort == x.port) return Hit{p, "node port", true};
  }
  return std::nullopt;
}

struct Candidate {
  sdk::Endpoint endpoint;
  bool selected = false;
  std::string reason;
};

// Each endpoint of the port with the reason it is, or is not, where the packet may go.
std::vector<Candidate> candidates(const Hit& hit, const TraceOutcome& outcome, bool& policyLocal,
                                  bool& shortCircuit) {
  const sdk::ServicePort& p = *hit.port;
  const bool dnat = outcome.verdict == TraceVerdict::kDnat;
  auto chosen = [&](const sdk::Endpoint& e) {
    return dnat && std::find(outcome.endpoints.begin(), outcome.endpoints.end(), endpointOf(e)) !=
                       outcome.endpoints.end();
  };
  auto in = [](const std::vector<sdk::Endpoint>& v, const sdk::Endpoint& e) {
    return std::any_of(v.begin(), v.end(), [&](const sdk::Endpoint& x) { return x.ip == e.ip && x.port == e.port; });
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

}  // namespace

std::string explanationText(const Explanation& x, bool json) {
  auto hit = findServicePort(x);
  bool policyLocal = false, shortCircuit = false;
  std::vector<Candidate> cands;
  if (hit) cands = candidates(*hit, x.outcome, policyLocal, shortCircuit);
  const auto& o = x.outcome;

  if (json) {
    std::string out = "{";
    out += "\"packet\":{\"source\":" + jsonString(x.source) + ",\"destination\":" + jsonString(x.destination) +
           ",\"port\":" + std::to_string(x.port) + ",\"protocol\":" + jsonString(sdk::protocolName(x.protocol)) +
           ",\"fromNode\":" + jsonBool(x.fromNode) + ",\"inputInterface\":" + jsonString(x.inputInterface) + "}";
    if (hit) {
      const auto& p = *hit->port;
      out += ",\"service\":{\"key\":" + jsonString(p.key) + ",\"type\":" + jsonString(sdk::serviceTypeName(p.type)) +
             ",\"via\":" + jsonString(hit->via) + ",\"trafficPolicyLocal\":" + jsonBool(policyLocal) +
             ",\"shortCircuit\":" + jsonBool(shortCircuit) + "}";
    } else {
      out += ",\"service\":null";
    }
    out += ",\"verdict\":" + jsonString(verdictName(o.verdict));
    out += ",\"reason\":" + jsonString(x.reason);
    out += ",\"masqueraded\":" + jsonBool(o.masqueraded);
    out += ",\"outcome\":" + o.toJson();
    out += ",\"endpoints\":" + jsonArray(cands, [](const Candidate& c) {
      const auto& e = c.endpoint;
      return "{\"endpoint\":" + jsonString(endpointOf(e)) + ",\"selected\":" + jsonBool(c.selected) +
             ",\"reason\":" + jsonString(c.reason) + ",\"ready\":" + jsonBool(e.ready) +
             ",\"serving\":" + jsonBool(e.serving) + ",\"terminating\":" + jsonBool(e.terminating) +
             ",\"local\":" + jsonBool(e.isLocal) + ",\"node\":" + jsonString(e.nodeName) + "}";
    });
    out += ",\"paths\":" + jsonArray(x.paths, [](const TracePath& path) {
      return "{\"choices\":" + jsonArray(path.choices, [](const std::string& s) { return jsonString(s); }) +
             ",\"steps\":" + jsonArray(path.steps, [](const TraceStep& s) {
               return "{\"chain\":" + jsonString(s.chain) + ",\"rule\":" + jsonString(s.rule) +
                      ",\"detail\":" + jsonString(s.detail) + "}";
             }) +
             ",\"outcome\":" + path.outcome.toJson() + "}";
    });
    out += ",\"warnings\":" + jsonArray(x.warnings, [](const std::string& s) { return jsonString(s); });
    return out + "}\n";
  }

  std::string out = "packet:    " + x.packetText + "\n";
  if (hit) {
    const auto& p = *hit->port;
    out += fmt::format("service:   {} ({}), via its {} {}:{}/{}\n", p.key, sdk::serviceTypeName(p.type), hit->via,
                       x.destination, x.port, sdk::protocolName(p.protocol));
  } else {
    out += "service:   none of kproxy's matches the destination\n";
  }
  out += "outcome:   " + outcomeLine(o) + "\n";
  if (!x.reason.empty()) out += "reason:    " + x.reason + "\n";
  if (hit) {
    std::string policy = policyLocal ? "Local" : "Cluster";
    if (shortCircuit) policy += ", short-circuited to the cluster-wide endpoints";
    out += fmt::format("endpoints: ({} traffic policy {})\n", hit->external ? "external" : "internal", policy);
    if (cands.empty()) out += "  (none)\n";
    for (const auto& c : cands) {
      out += fmt::format("  {:<4} {:<24} {}\n", c.selected ? "in" : "out", endpointOf(c.endpoint), c.reason);
    }
  }
  out += "trace:\n";
  const std::string& text = x.traceText;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += "  " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

}  // namespace kproxy::plan
