#include "kproxy/iptables/renderer.h"

#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kproxy/backends/common/address.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_rule.h"
#include "kproxy/plan/options.h"

namespace kproxy::iptables {
namespace {

using backends::IPPrefix;
namespace names = backends::iptables_chains;

constexpr std::string_view kMarkMasq = names::kMarkMasq;

bool isV6(sdk::Family family) { return family == sdk::Family::kIPv6; }

/// An address or prefix as iptables-save prints it: always with its length ("10.0.0.1/32").
std::optional<std::string> savedPrefix(std::string_view text, sdk::Family family) {
  auto p = IPPrefix::parse(text);
  if (!p || p->v6 != isV6(family)) return std::nullopt;
  std::string out = p->toString();
  if (p->isHost()) out += isV6(family) ? "/128" : "/32";
  return out;
}

std::string_view protoName(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kUDP: return "udp";
    case sdk::Protocol::kSCTP: return "sctp";
    case sdk::Protocol::kTCP: break;
  }
  return "tcp";
}

using Spec = backends::IptablesRuleSpec;

std::string rejectTarget(sdk::Family family) {
  return isV6(family) ? "REJECT --reject-with icmp6-port-unreachable" : "REJECT --reject-with icmp-port-unreachable";
}

std::string recentMask(sdk::Family family) {
  return isV6(family) ? "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" : "255.255.255.255";
}

constexpr std::pair<Table, std::string_view> kDispatchChains[] = {
    {Table::kFilter, names::kServices},     {Table::kFilter, names::kExternalServices},
    {Table::kFilter, names::kNodePorts},    {Table::kFilter, names::kProxyFirewall},
    {Table::kNat, names::kServices},        {Table::kNat, names::kNodePorts},
};

}  // namespace

std::string_view tableName(Table table) {
  switch (table) {
    case Table::kNat: return "nat";
    case Table::kMangle: return "mangle";
    case Table::kFilter: break;
  }
  return "filter";
}

std::optional<Table> tableNamed(std::string_view name) {
  for (Table t : kTables)
    if (tableName(t) == name) return t;
  return std::nullopt;
}

std::string RenderConfig::markHex() const { return fmt::format("{:#x}", mark()); }

std::span<const std::pair<Table, std::string_view>> dispatchChainNames() { return kDispatchChains; }

bool isOwnedChain(Table table, std::string_view chain) {
  if (chain == names::kProxyCanary) return true;
  switch (table) {
    case Table::kNat:
      return chain == names::kServices || chain == names::kNodePorts || chain == names::kPostrouting ||
             chain == names::kMarkMasq || backends::isServiceChainName(chain);
    case Table::kFilter:
      return chain == names::kServices || chain == names::kExternalServices || chain == names::kNodePorts ||
             chain == names::kProxyFirewall || chain == names::kForward;
    case Table::kMangle: return false;
  }
  return false;
}

std::string probabilityText(std::size_t n) {
  // Upstream writes fmt.Sprintf("%0.10f", 1/n); xt_statistic keeps lround(2^31 · p); save
  // prints that fraction with eleven decimals.
  const std::string written = fmt::format("{:.10f}", 1.0 / static_cast<double>(n));
  const double parsed = std::strtod(written.c_str(), nullptr);
  const long kept = std::lround(2147483648.0 * parsed);
  return fmt::format("{:.11f}", static_cast<double>(kept) / 2147483648.0);
}

IptablesRenderer::IptablesRenderer(RenderConfig config)
    : config_(std::move(config)),
      planConfig_(plan::planConfigOf(config_.masqueradeAll, config_.detectLocalMode, config_.clusterCIDRs,
                                     config_.bridgeInterface, config_.interfaceNamePrefix, config_.nodeIPs)) {}

void IptablesRenderer::setNode(const sdk::NodeInfo& node) {
  plan::applyNode(planConfig_, config_.detectLocalMode, node, config_.nodeIPs);
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node, config_.nodePortAddresses, config_.nodeIPs);
  for (sdk::Family fam : {sdk::Family::kIPv4, sdk::Family::kIPv6}) {
    NodePorts& out = nodePorts_[isV6(fam) ? 1 : 0];
    out = NodePorts{};
    // Loopback NodePorts: IPv4 only, with --iptables-localhost-nodeports (route_localnet).
    auto usable = [&](const IPPrefix& a) {
      const auto loopback = *IPPrefix::parse(isV6(fam) ? "::1/128" : "127.0.0.0/8");
      return !loopback.contains(a) || (!isV6(fam) && config_.localhostNodePorts);
    };
    out.allLocal = nodePorts.allLocal(fam);
    if (out.allLocal) continue;
    for (const auto& ip : nodePorts.addresses)
      if (auto a = IPPrefix::parse(ip); a && a->isHost() && a->v6 == isV6(fam) && usable(*a))
        out.addresses.push_back(ip);
  }
}

std::string IptablesRenderer::podSource(sdk::Family family, bool negate) const {
  const auto& detector = planConfig_.localDetector;
  if (!detector.implemented(family)) return {};
  using Mode = plan::LocalTrafficDetector::Mode;
  if (detector.mode == Mode::kCIDRs) {
    // Upstream's detector takes one CIDR per family; the first one is used.
    for (const auto& cidr : detector.cidrsOf(family))
      if (auto saved = savedPrefix(cidr, family)) return fmt::format("{}-s {}", negate ? "! " : "", *saved);
    return {};
  }
  const std::string iface =
      detector.mode == Mode::kInterfaceNamePrefix ? detector.interface + "+" : detector.interface;
  return fmt::format("{}-i {}", negate ? "! " : "", iface);
}

Fragment IptablesRenderer::renderServicePort(const sdk::ServicePort& p) const {
  const plan::ServicePortPlan plan = plan::planServicePort(p, planConfig_);
  Fragment f;
  f.family = p.family;
  f.key = p.key;
  const sdk::Family fam = p.family;
  const std::string name = backends::servicePortNameString(p.ns, p.serviceName, p.portName);
  const std::string proto(protoName(p.protocol));
  const std::string svcChain = backends::servicePortPolicyClusterChain(name, proto);
  const std::string svlChain = backends::servicePortPolicyLocalChain(name, proto);
  const std::string extChain = backends::serviceExternalChain(name, proto);
  const std::string fwChain = backends::serviceFirewallChain(name, proto);
  const bool comments = !largeCluster_;

  auto dispatch = [&](Table table, std::string_view chain, const Spec& spec,
                      Section section = Section::kServicePort) {
    f.dispatch.push_back(DispatchRule{table, std::string(chain), section, spec.str()});
  };
  // A rule whose source condition comes from the local-traffic detector ("-s CIDR" or
  // "-i IF"), placed where iptables-save prints it.
  auto withPodSource = [&](Spec& spec, const std::string& condition) {
    if (condition.empty()) return;
    const bool negate = condition.starts_with("! ");
    std::string_view rest(condition);
    if (negate) rest.remove_prefix(2);
    if (rest.starts_with("-s "))
      spec.src(rest.substr(3), negate);
    else
      spec.in(rest.substr(3), negate);
  };

  // ---- endpoint chains ----
  std::map<std::string, std::string> sepOf;  // "ip:port" → KUBE-SEP chain
  std::vector<ChainRules> endpointChains;
  auto sepChain = [&](const sdk::Endpoint& ep) -> std::optional<std::string> {
    auto addr = savedPrefix(ep.ip, fam);
    if (!addr) return std::nullopt;  // another family or malformed: the core should not send it
    const std::string hostPort = backends::endpointHostPort(ep.ip, ep.port);
    if (auto it = sepOf.find(hostPort); it != sepOf.end()) return it->second;
    std::string chain = backends::servicePortEndpointChain(name, proto, hostPort);
    ChainRules c{Table::kNat, chain, {}};
    c.rules.push_back(Spec().src(*addr).comment(comments ? name : "").jump(kMarkMasq).str());
    Spec dnat;
    dnat.proto(proto).comment(comments ? name : "").match("-m " + proto).jump("DNAT --to-destination " + hostPort);
    c.rules.push_back(dnat.str());
    endpointChains.push_back(std::move(c));
    sepOf.emplace(hostPort, chain);
    return chain;
  };

  // A policy chain: the internal masquerade (for the internal pool's chain), affinity, then
  // one rule per endpoint with upstream's probabilities.
  //
  // Session affinity is kept per endpoint pool, as the service plan means it: a client's entry
  // names the endpoint its pool chose, and another pool's choice never overrides it (eTP=Local
  // NodePort traffic to a local endpoint must not pull the same client's ClusterIP connections
  // away from the remote endpoint they stick to). So the recent lists are named per pool and
  // endpoint (the cluster pool's as upstream's, the endpoint chain's name; the local pool's
  // with "-L"), recorded by the policy chain's rules that choose the endpoint
  // (`-m recent --set` after the statistic match), and refreshed on every hit (`--update`).
  // Upstream records in the endpoint chain, which both pools share.
  auto policyChain = [&](const std::string& chainName, std::span<const sdk::Endpoint> endpoints, bool internal,
                         bool localPool) {
    ChainRules c{Table::kNat, chainName, {}};
    if (internal && !plan.clusterIP.empty()) {
      auto cip = savedPrefix(plan.clusterIP, fam);
      Spec masq;
      masq.dst(*cip).proto(proto).comment(name + " cluster IP").dport(p.port).jump(kMarkMasq);
      if (plan.internalMasquerade == plan::InternalMasquerade::kAll) {
        c.rules.push_back(masq.str());
      } else if (plan.internalMasquerade == plan::InternalMasquerade::kNotLocal) {
        withPodSource(masq, podSource(fam, true));
        c.rules.push_back(masq.str());
      }
    }
    std::vector<std::pair<std::string, std::string>> targets;  // (sep chain, "ip:port")
    for (const auto& ep : endpoints)
      if (auto sep = sepChain(ep)) targets.emplace_back(*sep, backends::endpointHostPort(ep.ip, ep.port));
    auto list = [&](const std::string& sep) { return localPool ? sep + "-L" : sep; };
    if (plan.affinity) {
      f.recentLists += targets.size();
      for (const auto& [sep, hostPort] : targets)
        c.rules.push_back(Spec()
                              .comment(comments ? name + " -> " + hostPort : "")
                              .match(fmt::format("-m recent --update --seconds {} --reap --name {} --mask {} --rsource",
                                                 plan.affinityTimeoutSeconds, list(sep), recentMask(fam)))
                              .jump(sep)
                              .str());
    }
    for (std::size_t i = 0; i < targets.size(); ++i) {
      Spec s;
      s.comment(comments ? name + " -> " + targets[i].second : "");
      if (i + 1 < targets.size())
        s.match("-m statistic --mode random --probability " + probabilityText(targets.size() - i));
      if (plan.affinity)
        s.match(fmt::format("-m recent --set --name {} --mask {} --rsource", list(targets[i].first), recentMask(fam)));
      c.rules.push_back(s.jump(targets[i].first).str());
    }
    f.chains.push_back(std::move(c));
  };

  if (plan.usesClusterPool)
    policyChain(svcChain, plan.clusterEndpoints, plan.internalPool == plan::Pool::kCluster, false);
  if (plan.usesLocalPool)
    policyChain(svlChain, plan.localEndpoints, plan.internalPool == plan::Pool::kLocal, true);
  f.endpointChains = endpointChains.size();

  auto noEndpointComment = [&](plan::NoEndpoints what) {
    return what == plan::NoEndpoints::kReject ? name + " has no endpoints" : name + " has no local endpoints";
  };
  auto noEndpointTarget = [&](plan::NoEndpoints what) {
    return what == plan::NoEndpoints::kReject ? rejectTarget(fam) : std::string("DROP");
  };

  // ---- internal traffic: the ClusterIP ----
  if (auto cip = plan.clusterIP.empty() ? std::nullopt : savedPrefix(plan.clusterIP, fam)) {
    const std::string& internalChain = plan.internalPool == plan::Pool::kCluster ? svcChain : svlChain;
    if (plan.hasInternalEndpoints) {
      dispatch(Table::kNat, names::kServices,
               Spec().dst(*cip).proto(proto).comment(name + " cluster IP").dport(p.port).jump(internalChain));
    } else {
      dispatch(Table::kFilter, names::kServices,
               Spec()
                   .dst(*cip)
                   .proto(proto)
                   .comment(noEndpointComment(plan.internalNoEndpoints))
                   .dport(p.port)
                   .jump(noEndpointTarget(plan.internalNoEndpoints)));
    }
    // The ClusterIP's other ports are refused (as upstream's nftables mode): after every port
    // rule, one rule per ClusterIP, shared by the service's ports.
    dispatch(Table::kFilter, names::kServices,
             Spec().dst(*cip).comment("ClusterIP without a service on this port").jump(rejectTarget(fam)),
             Section::kClusterIP);
  }

  if (!plan.externallyAccessible) {
    f.chains.insert(f.chains.end(), std::make_move_iterator(endpointChains.begin()),
                    std::make_move_iterator(endpointChains.end()));
    return f;
  }

  // ---- external traffic: NodePort, externalIPs, LoadBalancer IPs ----
  const bool usesFW = plan.capturesExternal && plan.usesFirewall;
  if (plan.capturesExternal) {
    ChainRules c{Table::kNat, extChain, {}};
    if (plan.externalMasqueradeAll) {
      c.rules.push_back(
          Spec().comment("masquerade traffic for " + name + " external destinations").jump(kMarkMasq).str());
    } else if (plan.usesClusterPool) {
      if (plan.shortCircuitPods) {
        Spec pods;
        withPodSource(pods, podSource(fam, false));
        c.rules.push_back(pods.comment("pod traffic for " + name + " external destinations").jump(svcChain).str());
      }
      if (plan.shortCircuitNode) {
        c.rules.push_back(Spec()
                              .comment("masquerade LOCAL traffic for " + name + " external destinations")
                              .match("-m addrtype --src-type LOCAL")
                              .jump(kMarkMasq)
                              .str());
        c.rules.push_back(Spec()
                              .comment("route LOCAL traffic for " + name + " external destinations")
                              .match("-m addrtype --src-type LOCAL")
                              .jump(svcChain)
                              .str());
      }
    }
    if (plan.hasExternalEndpoints)
      c.rules.push_back(Spec().jump(plan.externalPool == plan::Pool::kCluster ? svcChain : svlChain).str());
    f.chains.push_back(std::move(c));
  }

  if (usesFW) {
    ChainRules c{Table::kNat, fwChain, {}};
    for (const auto& source : plan.firewallAllowedSources)
      if (auto s = savedPrefix(source, fam))
        c.rules.push_back(Spec().src(*s).comment(name + " loadbalancer IP").jump(extChain).str());
    c.rules.push_back(Spec().comment("other traffic to " + name + " will be dropped by KUBE-PROXY-FIREWALL").str());
    f.chains.push_back(std::move(c));
  }

  auto externalAddress = [&](const std::string& ip, const std::string& what, const std::string& capture) {
    auto addr = savedPrefix(ip, fam);
    if (!addr) return;
    if (plan.capturesExternal)
      dispatch(Table::kNat, names::kServices,
               Spec().dst(*addr).proto(proto).comment(name + " " + what).dport(p.port).jump(capture));
    if (!plan.hasExternalEndpoints)
      dispatch(Table::kFilter, names::kExternalServices,
               Spec()
                   .dst(*addr)
                   .proto(proto)
                   .comment(noEndpointComment(plan.externalNoEndpoints))
                   .dport(p.port)
                   .jump(noEndpointTarget(plan.externalNoEndpoints)));
  };
  for (const auto& ip : plan.externalIPs) externalAddress(ip, "external IP", extChain);
  for (const auto& ip : plan.loadBalancerIPs) {
    externalAddress(ip, "loadbalancer IP", usesFW ? fwChain : extChain);
    if (usesFW)
      if (auto addr = savedPrefix(ip, fam))
        dispatch(Table::kFilter, names::kProxyFirewall,
                 Spec()
                     .dst(*addr)
                     .proto(proto)
                     .comment(name + " traffic not accepted by " + fwChain)
                     .dport(p.port)
                     .jump("DROP"));
  }

  if (plan.nodePort != 0) {
    if (plan.capturesExternal)
      dispatch(Table::kNat, names::kNodePorts, Spec().proto(proto).comment(name).dport(plan.nodePort).jump(extChain));
    if (!plan.hasExternalEndpoints) {
      // Where NodePorts answer: any local address, or the NodePort addresses (renderGlobal's
      // decision, repeated here so the reject meets exactly the packets the capture would).
      const std::string comment = noEndpointComment(plan.externalNoEndpoints);
      const std::string target = noEndpointTarget(plan.externalNoEndpoints);
      if (nodePortsOf(fam).allLocal) {
        dispatch(Table::kFilter, names::kExternalServices,
                 Spec()
                     .proto(proto)
                     .comment(comment)
                     .match("-m addrtype --dst-type LOCAL")
                     .dport(plan.nodePort)
                     .jump(target));
      } else {
        for (const auto& a : nodePortsOf(fam).addresses)
          if (auto addr = savedPrefix(a, fam))
            dispatch(Table::kFilter, names::kExternalServices,
                     Spec().dst(*addr).proto(proto).comment(comment).dport(plan.nodePort).jump(target));
      }
    }
  }

  if (p.healthCheckNodePort != 0)
    dispatch(Table::kFilter, names::kNodePorts,
             Spec().proto("tcp").comment(name + " health check node port").dport(p.healthCheckNodePort).jump("ACCEPT"));

  f.chains.insert(f.chains.end(), std::make_move_iterator(endpointChains.begin()),
                  std::make_move_iterator(endpointChains.end()));
  return f;
}

bool IptablesRenderer::localhostNodePorts() const {
  if (!config_.localhostNodePorts) return false;
  const NodePorts& nodePorts = nodePortsOf(sdk::Family::kIPv4);
  const auto loopback = *IPPrefix::parse("127.0.0.0/8");
  return nodePorts.allLocal || std::any_of(nodePorts.addresses.begin(), nodePorts.addresses.end(), [&](const auto& ip) {
           auto a = IPPrefix::parse(ip);
           return a && loopback.contains(*a);
         });
}

GlobalObjects IptablesRenderer::renderGlobal(sdk::Family family, const sdk::NodeInfo& node) const {
  (void)node;  // what it decides came with setNode
  GlobalObjects g;
  g.family = family;
  const std::string mark = config_.markHex();
  for (const auto& [table, chain] : kDispatchChains) g.dispatchChains.emplace_back(table, std::string(chain));

  g.chains.push_back(ChainRules{
      Table::kNat,
      std::string(names::kPostrouting),
      {Spec().match(fmt::format("-m mark ! --mark {0}/{0}", mark)).jump("RETURN").str(),
       Spec().jump(fmt::format("MARK --set-xmark {}/0x0", mark)).str(),
       Spec()
           .comment("kubernetes service traffic requiring SNAT")
           .jump(config_.randomFully ? "MASQUERADE --random-fully" : "MASQUERADE")
           .str()}});
  g.chains.push_back(
      ChainRules{Table::kNat, std::string(kMarkMasq), {Spec().jump(fmt::format("MARK --set-xmark {0}/{0}", mark)).str()}});
  {
    ChainRules forward{Table::kFilter, std::string(names::kForward), {}};
    // Without liberal TCP conntrack, out-of-window packets are INVALID and would reach a pod
    // un-NATed: drop them (upstream's issue 74839).
    if (!config_.conntrackTCPLiberal)
      forward.rules.push_back(Spec().match("-m conntrack --ctstate INVALID").jump("DROP").str());
    forward.rules.push_back(Spec()
                                .comment("kubernetes forwarding rules")
                                .match(fmt::format("-m mark --mark {0}/{0}", mark))
                                .jump("ACCEPT")
                                .str());
    forward.rules.push_back(Spec()
                                .comment("kubernetes forwarding conntrack rule")
                                .match("-m conntrack --ctstate RELATED,ESTABLISHED")
                                .jump("ACCEPT")
                                .str());
    g.chains.push_back(std::move(forward));
  }
  for (Table t : kTables) g.chains.push_back(ChainRules{t, std::string(names::kProxyCanary), {}});

  // The NodePorts jump, last in nat KUBE-SERVICES.
  const std::string nodePortsComment = "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
  const NodePorts& nodePorts = nodePortsOf(family);
  if (nodePorts.allLocal) {
    Spec s;
    if (isV6(family))
      s.dst("::1/128", true);
    else if (!config_.localhostNodePorts)
      s.dst("127.0.0.0/8", true);
    s.comment(nodePortsComment).match("-m addrtype --dst-type LOCAL").jump(names::kNodePorts);
    g.dispatch.push_back(DispatchRule{Table::kNat, std::string(names::kServices), Section::kTail, s.str()});
  } else {
    for (const auto& ip : nodePorts.addresses)
      if (auto a = savedPrefix(ip, family))
        g.dispatch.push_back(DispatchRule{Table::kNat, std::string(names::kServices), Section::kTail,
                                          Spec().dst(*a).comment(nodePortsComment).jump(names::kNodePorts).str()});
  }
  // Traffic to an address inside a ServiceCIDR that no Service holds (after the ClusterIPs'
  // own rules) is dropped, as upstream's nftables mode.
  for (const auto& range : plan::serviceCIDRRanges(serviceCIDRs_, family)) {
    auto prefix = savedPrefix(range.cidr, family);
    if (!prefix) continue;
    std::string names;
    for (const auto& n : range.names) names += (names.empty() ? "" : ",") + n;
    std::string comment = "unallocated ClusterIPs of ServiceCIDR " + names;
    if (comment.size() > 250) comment = comment.substr(0, 247) + "...";
    g.dispatch.push_back(DispatchRule{Table::kFilter, std::string(names::kServices), Section::kTail,
                                      Spec().dst(*prefix).comment(comment).jump("DROP").str()});
  }
  // route_localnet lets packets from 127.0.0.0/8 be routed: block martians that are not
  // DNAT'ed (upstream puts this rule in kubelet's KUBE-FIREWALL, which kproxy leaves alone).
  // Only where NodePorts answer on loopback: upstream turns localhost NodePorts off when the
  // nodeport-addresses hold no IPv4 loopback address.
  if (!isV6(family) && localhostNodePorts())
    g.dispatch.push_back(DispatchRule{Table::kFilter, std::string(names::kProxyFirewall), Section::kTail,
                                      Spec()
                                          .src("127.0.0.0/8", true)
                                          .dst("127.0.0.0/8")
                                          .comment("block incoming localnet connections")
                                          .match("-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT")
                                          .jump("DROP")
                                          .str()});

  // Jumps from the built-in chains, in upstream's order (each is inserted first when missing).
  const std::string ctNew = "-m conntrack --ctstate NEW";
  auto jump = [&](Table table, std::string_view builtin, std::string_view target, std::string_view comment,
                  bool newOnly) {
    Spec s;
    if (newOnly) s.match(ctNew);
    s.comment(comment).jump(target);
    g.jumps.push_back(JumpRule{table, std::string(builtin), s.str()});
  };
  jump(Table::kFilter, "INPUT", names::kExternalServices, "kubernetes externally-visible service portals", true);
  jump(Table::kFilter, "FORWARD", names::kExternalServices, "kubernetes externally-visible service portals", true);
  jump(Table::kFilter, "INPUT", names::kNodePorts, "kubernetes health check service ports", false);
  jump(Table::kFilter, "FORWARD", names::kServices, "kubernetes service portals", true);
  jump(Table::kFilter, "OUTPUT", names::kServices, "kubernetes service portals", true);
  jump(Table::kFilter, "FORWARD", names::kForward, "kubernetes forwarding rules", false);
  jump(Table::kFilter, "INPUT", names::kProxyFirewall, "kubernetes load balancer firewall", true);
  jump(Table::kFilter, "OUTPUT", names::kProxyFirewall, "kubernetes load balancer firewall", true);
  jump(Table::kFilter, "FORWARD", names::kProxyFirewall, "kubernetes load balancer firewall", true);
  jump(Table::kNat, "OUTPUT", names::kServices, "kubernetes service portals", false);
  jump(Table::kNat, "PREROUTING", names::kServices, "kubernetes service portals", false);
  jump(Table::kNat, "POSTROUTING", names::kPostrouting, "kubernetes postrouting rules", false);
  return g;
}

std::string renderRuleset(const IptablesRenderer& renderer, sdk::Family family,
                          std::span<const sdk::ServicePort> ports, const sdk::NodeInfo& node) {
  const GlobalObjects g = renderer.renderGlobal(family, node);
  std::vector<Fragment> fragments;
  for (const auto& p : ports)
    if (p.family == family) fragments.push_back(renderer.renderServicePort(p));
  std::string out;
  for (Table t : kTables) {
    out += fmt::format("*{}\n", tableName(t));
    // Built-in chains the jumps live in; each jump list is reversed (each was inserted first).
    std::map<std::string, std::vector<std::string>> builtin;
    for (const auto& j : g.jumps)
      if (j.table == t) builtin[j.chain].insert(builtin[j.chain].begin(), j.spec);
    for (const auto& [chain, rules] : builtin) out += fmt::format(":{} ACCEPT [0:0]\n", chain);
    std::vector<ChainRules> chains;
    for (const auto& c : g.chains)
      if (c.table == t) chains.push_back(c);
    for (const auto& [table, name] : g.dispatchChains) {
      if (table != t) continue;
      ChainRules c{t, name, {}};
      for (std::size_t s = 0; s < kSections; ++s) {
        auto add = [&](const DispatchRule& r) {
          if (r.table == t && r.chain == name && static_cast<std::size_t>(r.section) == s &&
              std::find(c.rules.begin(), c.rules.end(), r.spec) == c.rules.end())
            c.rules.push_back(r.spec);
        };
        for (const auto& f : fragments)
          for (const auto& r : f.dispatch) add(r);
        for (const auto& r : g.dispatch) add(r);
      }
      chains.push_back(std::move(c));
    }
    for (const auto& f : fragments)
      for (const auto& c : f.chains)
        if (c.table == t) chains.push_back(c);
    for (const auto& c : chains) out += fmt::format(":{} - [0:0]\n", c.name);
    for (const auto& [chain, rules] : builtin)
      for (const auto& r : rules) out += fmt::format("-A {} {}\n", chain, r);
    for (const auto& c : chains)
      for (const auto& r : c.rules) out += fmt::format("-A {} {}\n", c.name, r);
    out += "COMMIT\n";
  }
  return out;
}

sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, "iptables");
  if (!common) return std::unexpected(common.error());
  RenderConfig cfg;
  cfg.clusterCIDRs = std::move(common->clusterCIDRs);
  cfg.detectLocalMode = std::move(common->detectLocalMode);
  cfg.bridgeInterface = std::move(common->bridgeInterface);
  cfg.interfaceNamePrefix = std::move(common->interfaceNamePrefix);
  cfg.masqueradeAll = common->masqueradeAll;
  cfg.masqueradeBit = common->masqueradeBit;
  cfg.nodePortAddresses = std::move(common->nodePortAddresses);
  cfg.nodeIPs = std::move(common->nodeIPs);
  if (auto it = options.find("localhost-nodeports"); it != options.end() && !it->second.empty())
    cfg.localhostNodePorts = it->second != "false";
  return cfg;
}

}  // namespace kproxy::iptables
