#include "kproxy/iptables/renderer.h"

#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kproxy/net/ip.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_rule.h"
#include "kproxy/plan/options.h"

namespace kproxy::iptables {
namespace {

using net::Prefix;
namespace names = backends::iptables_chains;

constexpr std::string_view kMarkMasq = names::kMarkMasq;

bool isV6(net::Family family) { return family == net::Family::kIPv6; }

/// An address or prefix as iptables-save prints it: always with its length ("10.0.0.1/32").
std::optional<std::string> savedPrefix(std::string_view text, net::Family family) {
  auto p = net::Prefix::parse(text);
  if (!p || p->v6() != isV6(family)) return std::nullopt;
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

std::string rejectTarget(net::Family family) {
  return isV6(family) ? "REJECT --reject-with icmp6-port-unreachable" : "REJECT --reject-with icmp-port-unreachable";
}

std::string recentMask(net::Family family) {
  return isV6(family) ? "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" : "255.255.255.255";
}

constexpr std::pair<Table, std::string_view> kDispatchChains[] = {
    {Table::kFilter, names::kServices},     {Table::kFilter, names::kExternalServices},
    {Table::kFilter, names::kNodePorts},    {Table::kFilter, names::kProxyFirewall},
    {Table::kNat, names::kServices},        {Table::kNat, names::kNodePorts},
};

/// `-m nfacct --nfacct-name NAME` as iptables-save prints it (libxt_nfacct writes two spaces
/// before the name), so that a full sync finds the rule it wrote.
std::string nfacctMatch(std::string_view object) { return fmt::format("-m nfacct --nfacct-name  {}", object); }

/// One service port's chains and dispatch rules, rendered part by part: its policy and endpoint
/// chains, its ClusterIP, and when it is externally accessible its external and firewall
/// chains, external addresses, NodePort and health-check node port.
class ServicePortRules {
 public:
  /// What the renderer knows of the node that shapes a port's rules.
  struct Node {
    std::string podSource;     ///< "-s CIDR" / "-i IF" of pod traffic; empty when unknown
    std::string notPodSource;  ///< the same, negated
    bool nodePortsAllLocal = true;
    std::span<const std::string> nodePortAddresses;
    /// IPv4 NodePorts answer on loopback and the nfacct object counting them exists.
    bool countLocalhostNodePorts = false;
  };

  ServicePortRules(const sdk::ServicePort& port, const plan::ServicePortPlan& plan, bool comments, Node node)
      : p_(port),
        plan_(plan),
        fam_(port.family),
        name_(backends::servicePortNameString(port.ns, port.serviceName, port.portName)),
        proto_(protoName(port.protocol)),
        svcChain_(backends::servicePortPolicyClusterChain(name_, proto_)),
        svlChain_(backends::servicePortPolicyLocalChain(name_, proto_)),
        extChain_(backends::serviceExternalChain(name_, proto_)),
        fwChain_(backends::serviceFirewallChain(name_, proto_)),
        comments_(comments),
        node_(std::move(node)) {
    f_.family = port.family;
    f_.key = port.key;
  }

  /// The cluster and local pools' chains (KUBE-SVC-, KUBE-SVL-) and their endpoint chains.
  void addPolicyChains() {
    if (plan_.usesClusterPool)
      policyChain(svcChain_, plan_.clusterEndpoints, plan_.internalPool == plan::Pool::kCluster, false);
    if (plan_.usesLocalPool)
      policyChain(svlChain_, plan_.localEndpoints, plan_.internalPool == plan::Pool::kLocal, true);
    f_.endpointChains = endpointChains_.size();
  }

  /// Internal traffic: the ClusterIP's capture (or its reject or drop without endpoints) and the
  /// refusal of its other ports.
  void addClusterIP() {
    auto cip = plan_.clusterIP.empty() ? std::nullopt : savedPrefix(plan_.clusterIP, fam_);
    if (!cip) return;
    const std::string& internalChain = plan_.internalPool == plan::Pool::kCluster ? svcChain_ : svlChain_;
    if (plan_.hasInternalEndpoints) {
      dispatch(Table::kNat, names::kServices,
               Spec().dst(*cip).proto(proto_).comment(name_ + " cluster IP").dport(p_.port).jump(internalChain));
    } else {
      dispatch(Table::kFilter, names::kServices,
               Spec()
                   .dst(*cip)
                   .proto(proto_)
                   .comment(noEndpointComment(plan_.internalNoEndpoints))
                   .dport(p_.port)
                   .jump(noEndpointTarget(plan_.internalNoEndpoints)),
               noEndpointReason(plan_.internalNoEndpoints));
    }
    // The ClusterIP's other ports are refused (as upstream's nftables mode): after every port
    // rule, one rule per ClusterIP, shared by the service's ports.
    dispatch(Table::kFilter, names::kServices,
             Spec().dst(*cip).comment("ClusterIP without a service on this port").jump(rejectTarget(fam_)),
             plan::DropReason::kClusterIPPort, Section::kClusterIP);
  }

  /// KUBE-EXT-: masquerade, the short-circuits of pod and node traffic, the external pool.
  void addExternalChain() {
    if (!plan_.capturesExternal) return;
    ChainRules c{Table::kNat, extChain_, {}};
    if (plan_.externalMasqueradeAll) {
      c.rules.push_back(
          Spec().comment("masquerade traffic for " + name_ + " external destinations").jump(kMarkMasq).str());
    } else if (plan_.usesClusterPool) {
      if (plan_.shortCircuitPods) {
        Spec pods;
        withPodSource(pods, node_.podSource);
        c.rules.push_back(pods.comment("pod traffic for " + name_ + " external destinations").jump(svcChain_).str());
      }
      if (plan_.shortCircuitNode) {
        c.rules.push_back(Spec()
                              .comment("masquerade LOCAL traffic for " + name_ + " external destinations")
                              .match("-m addrtype --src-type LOCAL")
                              .jump(kMarkMasq)
                              .str());
        c.rules.push_back(Spec()
                              .comment("route LOCAL traffic for " + name_ + " external destinations")
                              .match("-m addrtype --src-type LOCAL")
                              .jump(svcChain_)
                              .str());
      }
    }
    if (plan_.hasExternalEndpoints)
      c.rules.push_back(Spec().jump(plan_.externalPool == plan::Pool::kCluster ? svcChain_ : svlChain_).str());
    f_.chains.push_back(std::move(c));
  }

  /// KUBE-FW-: loadBalancerSourceRanges.
  void addFirewallChain() {
    if (!usesFirewall()) return;
    ChainRules c{Table::kNat, fwChain_, {}};
    for (const auto& source : plan_.firewallAllowedSources)
      if (auto s = savedPrefix(source, fam_))
        c.rules.push_back(Spec().src(*s).comment(name_ + " loadbalancer IP").jump(extChain_).str());
    c.rules.push_back(
        Spec().comment("other traffic to " + name_ + " will be dropped by KUBE-PROXY-FIREWALL").str());
    f_.chains.push_back(std::move(c));
  }

  /// externalIPs and LoadBalancer IPs: captured, rejected or dropped without endpoints, and
  /// dropped when the source-range firewall did not accept them.
  void addExternalAddresses() {
    for (const auto& ip : plan_.externalIPs) externalAddress(ip, "external IP", extChain_);
    for (const auto& ip : plan_.loadBalancerIPs) {
      externalAddress(ip, "loadbalancer IP", usesFirewall() ? fwChain_ : extChain_);
      if (usesFirewall())
        if (auto addr = savedPrefix(ip, fam_))
          dispatch(Table::kFilter, names::kProxyFirewall,
                   Spec()
                       .dst(*addr)
                       .proto(proto_)
                       .comment(name_ + " traffic not accepted by " + fwChain_)
                       .dport(p_.port)
                       .jump("DROP"),
                   plan::DropReason::kSourceRange);
    }
  }

  /// The NodePort: captured in nat KUBE-NODEPORTS, rejected or dropped without endpoints where
  /// NodePorts answer.
  void addNodePort() {
    if (plan_.nodePort == 0) return;
    if (plan_.capturesExternal) {
      // Upstream's count of NodePort packets to 127.0.0.0/8: a rule of their own that jumps
      // where the next one would (it sorts before it: "-d" before "-p").
      if (node_.countLocalhostNodePorts)
        dispatch(Table::kNat, names::kNodePorts,
                 Spec()
                     .dst("127.0.0.0/8")
                     .proto(proto_)
                     .comment(name_)
                     .dport(plan_.nodePort)
                     .match(nfacctMatch(backends::kNfacctLocalhostNodePorts))
                     .jump(extChain_));
      dispatch(Table::kNat, names::kNodePorts,
               Spec().proto(proto_).comment(name_).dport(plan_.nodePort).jump(extChain_));
    }
    if (plan_.hasExternalEndpoints) return;
    // Where NodePorts answer: any local address, or the NodePort addresses (renderGlobal's
    // decision, repeated here so the reject meets exactly the packets the capture would).
    const std::string comment = noEndpointComment(plan_.externalNoEndpoints);
    const std::string target = noEndpointTarget(plan_.externalNoEndpoints);
    if (node_.nodePortsAllLocal) {
      dispatch(Table::kFilter, names::kExternalServices,
               Spec()
                   .proto(proto_)
                   .comment(comment)
                   .match("-m addrtype --dst-type LOCAL")
                   .dport(plan_.nodePort)
                   .jump(target),
               noEndpointReason(plan_.externalNoEndpoints));
      return;
    }
    for (const auto& a : node_.nodePortAddresses)
      if (auto addr = savedPrefix(a, fam_))
        dispatch(Table::kFilter, names::kExternalServices,
                 Spec().dst(*addr).proto(proto_).comment(comment).dport(plan_.nodePort).jump(target),
                 noEndpointReason(plan_.externalNoEndpoints));
  }

  /// The health-check node port, accepted in filter KUBE-NODEPORTS.
  void addHealthCheck() {
    if (p_.healthCheckNodePort == 0) return;
    dispatch(Table::kFilter, names::kNodePorts,
             Spec()
                 .proto("tcp")
                 .comment(name_ + " health check node port")
                 .dport(p_.healthCheckNodePort)
                 .jump("ACCEPT"));
  }

  /// The fragment, endpoint chains last.
  Fragment finish() && {
    f_.chains.insert(f_.chains.end(), std::make_move_iterator(endpointChains_.begin()),
                     std::make_move_iterator(endpointChains_.end()));
    return std::move(f_);
  }

 private:
  bool usesFirewall() const { return plan_.capturesExternal && plan_.usesFirewall; }

  void dispatch(Table table, std::string_view chain, const Spec& spec, Section section = Section::kServicePort) {
    f_.dispatch.push_back(DispatchRule{table, std::string(chain), section, spec.str()});
  }
  /// A dispatch rule that drops or rejects for `reason`.
  void dispatch(Table table, std::string_view chain, const Spec& spec, plan::DropReason reason,
                Section section = Section::kServicePort) {
    dispatch(table, chain, spec, section);
    f_.tags.push_back(RuleTag{table, std::string(chain), f_.dispatch.back().spec, reason});
  }

  /// Adds a source condition from the local-traffic detector ("-s CIDR" or "-i IF") where
  /// iptables-save prints it.
  static void withPodSource(Spec& spec, const std::string& condition) {
    if (condition.empty()) return;
    const bool negate = condition.starts_with("! ");
    std::string_view rest(condition);
    if (negate) rest.remove_prefix(2);
    if (rest.starts_with("-s "))
      spec.src(rest.substr(3), negate);
    else
      spec.in(rest.substr(3), negate);
  }

  std::string noEndpointComment(plan::NoEndpoints what) const {
    return what == plan::NoEndpoints::kReject ? name_ + " has no endpoints" : name_ + " has no local endpoints";
  }
  std::string noEndpointTarget(plan::NoEndpoints what) const {
    return what == plan::NoEndpoints::kReject ? rejectTarget(fam_) : std::string("DROP");
  }
  static plan::DropReason noEndpointReason(plan::NoEndpoints what) {
    return what == plan::NoEndpoints::kReject ? plan::DropReason::kNoEndpoints : plan::DropReason::kNoLocalEndpoints;
  }

  /// The KUBE-SEP- chain of `ep`, rendered the first time it is named.
  std::optional<std::string> sepChain(const sdk::Endpoint& ep) {
    auto addr = savedPrefix(ep.ip, fam_);
    if (!addr) return std::nullopt;  // another family or malformed: the core should not send it
    const std::string hostPort = backends::endpointHostPort(ep.ip, ep.port);
    if (auto it = sepOf_.find(hostPort); it != sepOf_.end()) return it->second;
    std::string chain = backends::servicePortEndpointChain(name_, proto_, hostPort);
    ChainRules c{Table::kNat, chain, {}};
    c.rules.push_back(Spec().src(*addr).comment(comments_ ? name_ : "").jump(kMarkMasq).str());
    Spec dnat;
    dnat.proto(proto_)
        .comment(comments_ ? name_ : "")
        .match("-m " + proto_)
        .jump("DNAT --to-destination " + hostPort);
    c.rules.push_back(dnat.str());
    endpointChains_.push_back(std::move(c));
    sepOf_.emplace(hostPort, chain);
    return chain;
  }

  /// A policy chain: the internal masquerade (for the internal pool's chain), affinity, then
  /// one rule per endpoint with upstream's probabilities.
  ///
  /// Session affinity is kept per endpoint pool, as the service plan means it: a client's entry
  /// names the endpoint its pool chose, and another pool's choice never overrides it (eTP=Local
  /// NodePort traffic to a local endpoint must not pull the same client's ClusterIP connections
  /// away from the remote endpoint they stick to). So the recent lists are named per pool and
  /// endpoint (the cluster pool's as upstream's, the endpoint chain's name; the local pool's
  /// with "-L"), recorded by the policy chain's rules that choose the endpoint
  /// (`-m recent --set` after the statistic match), and refreshed on every hit (`--update`).
  /// Upstream records in the endpoint chain, which both pools share.
  void policyChain(const std::string& chainName, std::span<const sdk::Endpoint> endpoints, bool internal,
                   bool localPool) {
    ChainRules c{Table::kNat, chainName, {}};
    if (internal && !plan_.clusterIP.empty()) internalMasquerade(c);
    std::vector<std::pair<std::string, std::string>> targets;  // (sep chain, "ip:port")
    for (const auto& ep : endpoints)
      if (auto sep = sepChain(ep)) targets.emplace_back(*sep, backends::endpointHostPort(ep.ip, ep.port));
    auto list = [&](const std::string& sep) { return localPool ? sep + "-L" : sep; };
    if (plan_.affinity) {
      f_.recentLists += targets.size();
      for (const auto& [sep, hostPort] : targets)
        c.rules.push_back(
            Spec()
                .comment(comments_ ? name_ + " -> " + hostPort : "")
                .match(fmt::format("-m recent --update --seconds {} --reap --name {} --mask {} --rsource",
                                   plan_.affinityTimeoutSeconds, list(sep), recentMask(fam_)))
                .jump(sep)
                .str());
    }
    for (std::size_t i = 0; i < targets.size(); ++i) {
      Spec s;
      s.comment(comments_ ? name_ + " -> " + targets[i].second : "");
      if (i + 1 < targets.size())
        s.match("-m statistic --mode random --probability " + probabilityText(targets.size() - i));
      if (plan_.affinity)
        s.match(fmt::format("-m recent --set --name {} --mask {} --rsource", list(targets[i].first),
                            recentMask(fam_)));
      c.rules.push_back(s.jump(targets[i].first).str());
    }
    f_.chains.push_back(std::move(c));
  }

  /// The masquerade of ClusterIP traffic at the head of the internal pool's chain.
  void internalMasquerade(ChainRules& c) const {
    auto cip = savedPrefix(plan_.clusterIP, fam_);
    Spec masq;
    masq.dst(*cip).proto(proto_).comment(name_ + " cluster IP").dport(p_.port).jump(kMarkMasq);
    if (plan_.internalMasquerade == plan::InternalMasquerade::kAll) {
      c.rules.push_back(masq.str());
    } else if (plan_.internalMasquerade == plan::InternalMasquerade::kNotLocal) {
      withPodSource(masq, node_.notPodSource);
      c.rules.push_back(masq.str());
    }
  }

  void externalAddress(const std::string& ip, const std::string& what, const std::string& capture) {
    auto addr = savedPrefix(ip, fam_);
    if (!addr) return;
    if (plan_.capturesExternal)
      dispatch(Table::kNat, names::kServices,
               Spec().dst(*addr).proto(proto_).comment(name_ + " " + what).dport(p_.port).jump(capture));
    if (!plan_.hasExternalEndpoints)
      dispatch(Table::kFilter, names::kExternalServices,
               Spec()
                   .dst(*addr)
                   .proto(proto_)
                   .comment(noEndpointComment(plan_.externalNoEndpoints))
                   .dport(p_.port)
                   .jump(noEndpointTarget(plan_.externalNoEndpoints)),
               noEndpointReason(plan_.externalNoEndpoints));
  }

  const sdk::ServicePort& p_;
  const plan::ServicePortPlan& plan_;
  const net::Family fam_;
  const std::string name_;
  const std::string proto_;
  const std::string svcChain_, svlChain_, extChain_, fwChain_;
  const bool comments_;
  const Node node_;
  Fragment f_;
  std::map<std::string, std::string> sepOf_;  ///< "ip:port" → KUBE-SEP chain
  std::vector<ChainRules> endpointChains_;
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
      planConfig_(plan::planConfigOf(config_.common)) {}

void IptablesRenderer::setNode(const sdk::NodeInfo& node) {
  plan::applyNode(planConfig_, config_.common.detectLocalMode, node, config_.common.nodeIPs);
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node, config_.common.nodePortAddresses, config_.common.nodeIPs);
  for (net::Family fam : {net::Family::kIPv4, net::Family::kIPv6}) {
    NodePorts& out = nodePorts_[isV6(fam) ? 1 : 0];
    out = NodePorts{};
    // Loopback NodePorts: IPv4 only, with --iptables-localhost-nodeports (route_localnet).
    auto usable = [&](const net::Prefix& a) {
      const auto loopback = *net::Prefix::parse(isV6(fam) ? "::1/128" : "127.0.0.0/8");
      return !loopback.contains(a) || (!isV6(fam) && config_.localhostNodePorts);
    };
    out.allLocal = nodePorts.allLocal(fam);
    if (out.allLocal) continue;
    for (const auto& ip : nodePorts.addresses)
      if (auto a = net::Prefix::parse(ip); a && a->isHost() && a->v6() == isV6(fam) && usable(*a))
        out.addresses.push_back(ip);
  }
}

std::string IptablesRenderer::podSource(net::Family family, bool negate) const {
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
  const NodePorts& nodePorts = nodePortsOf(p.family);
  const bool countLocalhost = nfacct_.localhostNodePorts && p.family == net::Family::kIPv4 && localhostNodePorts();
  ServicePortRules rules(p, plan, !largeCluster_,
                         {podSource(p.family, false), podSource(p.family, true), nodePorts.allLocal,
                          nodePorts.addresses, countLocalhost});
  rules.addPolicyChains();
  rules.addClusterIP();
  if (plan.externallyAccessible) {
    rules.addExternalChain();
    rules.addFirewallChain();
    rules.addExternalAddresses();
    rules.addNodePort();
    rules.addHealthCheck();
  }
  return std::move(rules).finish();
}

bool IptablesRenderer::localhostNodePorts() const {
  if (!config_.localhostNodePorts) return false;
  const NodePorts& nodePorts = nodePortsOf(net::Family::kIPv4);
  const auto loopback = *net::Prefix::parse("127.0.0.0/8");
  return nodePorts.allLocal || std::any_of(nodePorts.addresses.begin(), nodePorts.addresses.end(), [&](const auto& ip) {
           auto a = net::Prefix::parse(ip);
           return a && loopback.contains(*a);
         });
}

GlobalObjects IptablesRenderer::renderGlobal(net::Family family, const sdk::NodeInfo& node) const {
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
    if (!config_.conntrackTCPLiberal) {
      Spec drop;
      drop.match("-m conntrack --ctstate INVALID");
      if (nfacct_.invalidDropped) drop.match(nfacctMatch(backends::kNfacctInvalidDropped));
      forward.rules.push_back(drop.jump("DROP").str());
      g.tags.push_back(
          RuleTag{Table::kFilter, forward.name, forward.rules.back(), plan::DropReason::kInvalidConnection});
    }
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
    g.tags.push_back(RuleTag{Table::kFilter, std::string(names::kServices), g.dispatch.back().spec,
                             plan::DropReason::kUnallocatedClusterIP});
  }
  // route_localnet lets packets from 127.0.0.0/8 be routed: block martians that are not
  // DNAT'ed (upstream puts this rule in kubelet's KUBE-FIREWALL, which kproxy leaves alone).
  // Only where NodePorts answer on loopback: upstream turns localhost NodePorts off when the
  // nodeport-addresses hold no IPv4 loopback address.
  if (!isV6(family) && localhostNodePorts()) {
    g.dispatch.push_back(DispatchRule{Table::kFilter, std::string(names::kProxyFirewall), Section::kTail,
                                      Spec()
                                          .src("127.0.0.0/8", true)
                                          .dst("127.0.0.0/8")
                                          .comment("block incoming localnet connections")
                                          .match("-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT")
                                          .jump("DROP")
                                          .str()});
    g.tags.push_back(RuleTag{Table::kFilter, std::string(names::kProxyFirewall), g.dispatch.back().spec,
                             plan::DropReason::kLocalnet});
  }

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

std::string renderRuleset(const IptablesRenderer& renderer, net::Family family,
                          std::span<const sdk::ServicePort> ports, const sdk::NodeInfo& node) {
  return renderTaggedRuleset(renderer, family, ports, node).text;
}

TaggedRuleset renderTaggedRuleset(const IptablesRenderer& renderer, net::Family family,
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
  TaggedRuleset rendered{std::move(out), g.tags};
  for (const auto& f : fragments) rendered.tags.insert(rendered.tags.end(), f.tags.begin(), f.tags.end());
  return rendered;
}

sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, "iptables");
  if (!common) return std::unexpected(common.error());
  RenderConfig cfg;
  cfg.common = std::move(*common);
  if (auto it = options.find("localhost-nodeports"); it != options.end() && !it->second.empty())
    cfg.localhostNodePorts = it->second != "false";
  return cfg;
}

}  // namespace kproxy::iptables
