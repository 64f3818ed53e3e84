#include "kproxy/ipvs/renderer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "kproxy/net/ip.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_rule.h"
#include "kproxy/plan/options.h"

namespace kproxy::ipvs {
namespace {

using net::Prefix;
using Spec = backends::IptablesRuleSpec;

// Upstream IPVS mode's chains (pkg/proxy/ipvs/proxier.go), from the catalogue.
using backends::iptables_chains::kForward;
using backends::iptables_chains::kIpvsFilter;
using backends::iptables_chains::kIpvsOutFilter;
using backends::iptables_chains::kLoadBalancer;
using backends::iptables_chains::kMarkMasq;
using backends::iptables_chains::kNodePort;
using backends::iptables_chains::kPostrouting;
using backends::iptables_chains::kProxyFirewall;
using backends::iptables_chains::kServices;
using backends::iptables_chains::kSourceRangesFirewall;
constexpr std::string_view kFwmarkPorts = backends::iptables_chains::kIpvsFwmarkPorts;

/// Upstream's iptablesChains, in its order.
constexpr std::pair<Table, std::string_view> kOwnedChains[] = {
    {Table::kNat, kServices},         {Table::kNat, kPostrouting},     {Table::kNat, kNodePort},
    {Table::kNat, kLoadBalancer},     {Table::kNat, kMarkMasq},        {Table::kFilter, kForward},
    {Table::kFilter, kNodePort},      {Table::kFilter, kProxyFirewall}, {Table::kFilter, kSourceRangesFirewall},
    {Table::kFilter, kIpvsFilter},    {Table::kFilter, kIpvsOutFilter}, {Table::kNat, kFwmarkPorts},
};

struct SetInfo {
  SetId id;
  std::string_view name;
  std::string_view type;
  std::string_view comment;
};

// Upstream's ipsetInfo: names (the catalogue's), types and comments.
namespace ipsets = backends::ipsets;
constexpr SetInfo kSets[] = {
    {SetId::kLoopBack, ipsets::kLoopBack, "hash:ip,port,ip",
     "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
    {SetId::kClusterIP, ipsets::kClusterIP, "hash:ip,port",
     "Kubernetes service cluster ip + port for masquerade purpose"},
    {SetId::kExternalIP, ipsets::kExternalIP, "hash:ip,port",
     "Kubernetes service external ip + port for masquerade and filter purpose"},
    {SetId::kExternalIPLocal, ipsets::kExternalIPLocal, "hash:ip,port",
     "Kubernetes service external ip + port with externalTrafficPolicy=local"},
    {SetId::kLoadBalancer, ipsets::kLoadBalancer, "hash:ip,port",
     "Kubernetes service lb portal"},
    {SetId::kLoadBalancerFW, ipsets::kLoadBalancerFW, "hash:ip,port",
     "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
    {SetId::kLoadBalancerLocal, ipsets::kLoadBalancerLocal, "hash:ip,port",
     "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
    {SetId::kLoadBalancerSourceIP, ipsets::kLoadBalancerSourceIP, "hash:ip,port,ip",
     "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
    {SetId::kLoadBalancerSourceCIDR, ipsets::kLoadBalancerSourceCIDR, "hash:ip,port,net",
     "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
    {SetId::kNodePortTCP, ipsets::kNodePortTCP, "bitmap:port",
     "Kubernetes nodeport TCP port for masquerade purpose"},
    {SetId::kNodePortLocalTCP, ipsets::kNodePortLocalTCP, "bitmap:port",
     "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
    {SetId::kNodePortUDP, ipsets::kNodePortUDP, "bitmap:port",
     "Kubernetes nodeport UDP port for masquerade purpose"},
    {SetId::kNodePortLocalUDP, ipsets::kNodePortLocalUDP, "bitmap:port",
     "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
    {SetId::kNodePortSCTP, ipsets::kNodePortSCTP, "hash:ip,port",
     "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
    {SetId::kNodePortLocalSCTP, ipsets::kNodePortLocalSCTP, "hash:ip,port",
     "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
    {SetId::kHealthCheckNodePort, ipsets::kHealthCheckNodePort, "bitmap:port",
     "Kubernetes health check node port"},
    {SetId::kIPVSIPs, ipsets::kIPVSIPs, "hash:ip",
     "Addresses on the ipvs interface"},
};

constexpr std::array<SetId, std::size(kSets)> kSetIds = [] {
  std::array<SetId, std::size(kSets)> ids{};
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = kSets[i].id;
  return ids;
}();

const SetInfo& infoOf(SetId id) {
  for (const auto& s : kSets)
    if (s.id == id) return s;
  return kSets[0];  // unreachable: every SetId is listed
}

bool isV6(net::Family family) { return family == net::Family::kIPv6; }

std::string_view protoLower(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kUDP: return "udp";
    case sdk::Protocol::kSCTP: return "sctp";
    case sdk::Protocol::kTCP: break;
  }
  return "tcp";
}

std::string_view protoUpper(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kUDP: return "UDP";
    case sdk::Protocol::kSCTP: return "SCTP";
    case sdk::Protocol::kTCP: break;
  }
  return "TCP";
}

/// The IP protocol number, as `-m ipvs --vproto` is saved.
int protoNumber(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kUDP: return 17;
    case sdk::Protocol::kSCTP: return 132;
    case sdk::Protocol::kTCP: break;
  }
  return 6;
}

/// A host address of `family` in canonical text, or nullopt.
std::optional<std::string> hostOf(std::string_view text, net::Family family) {
  auto p = net::Prefix::parse(text);
  if (!p || !p->isHost() || p->v6() != isV6(family)) return std::nullopt;
  return p->toString();
}

/// An address as iptables-save prints it ("10.0.0.1/32").
std::string saved(const std::string& host, net::Family family) { return host + (isV6(family) ? "/128" : "/32"); }

/// "10.0.0.1:80", "[fd00::1]:80".
std::string hostPort(std::string_view ip, int port) { return backends::endpointHostPort(ip, port); }

/// A prefix with its length always written, as upstream writes source ranges into ipset.
std::string withLength(const net::Prefix& p) {
  std::string out = p.toString();
  if (p.isHost()) out += p.v6() ? "/128" : "/32";
  return out;
}

/// One service port's IPVS objects, rendered part by part: its ClusterIP, then (externally
/// accessible) its external IPs, LoadBalancer IPs and NodePorts, then the firewall-mark virtual
/// servers of ClientIP affinity and the sets every port has.
class ServicePortObjects {
 public:
  ServicePortObjects(const RenderConfig& config, const plan::PlanConfig& planConfig, const sdk::ServicePort& port,
                     const plan::ServicePortPlan& plan, std::span<const std::string> nodePortAddresses,
                     std::function<bool(std::string_view)> isNodeAddress)
      : config_(config),
        planConfig_(planConfig),
        p_(port),
        plan_(plan),
        fam_(port.family),
        name_(backends::servicePortNameString(port.ns, port.serviceName, port.portName)),
        proto_(protoLower(port.protocol)),
        externalLocal_(plan.externallyAccessible && !plan.externalMasqueradeAll),
        noLocal_(name_ + " has no local endpoints"),
        nodePortAddresses_(nodePortAddresses),
        isNodeAddress_(std::move(isNodeAddress)) {
    f_.family = fam_;
    f_.key = port.key;
    decideFirewallMarks();
  }

  /// Internal traffic: the ClusterIP's set entry, address, and virtual server (or drop).
  void addClusterIP() {
    clusterIP_ = plan_.clusterIP.empty() ? std::nullopt : hostOf(plan_.clusterIP, fam_);
    if (!clusterIP_) return;
    entry(SetId::kClusterIP, ipPort(*clusterIP_, p_.port));
    bind(*clusterIP_);
    if (plan_.hasInternalEndpoints) {
      addVirtualServer(*clusterIP_, p_.port, Traffic::kClusterIP, plan_.endpointsOf(plan_.internalPool));
    } else if (plan_.internalNoEndpoints == plan::NoEndpoints::kReject) {
      // No endpoints anywhere: IPVS refuses a virtual server's new connections when it has
      // no real server (ICMP port unreachable), as upstream.
      addVirtualServer(*clusterIP_, p_.port, Traffic::kClusterIP, {});
    } else {
      // plan: the policy's pool is empty: drop. No virtual server, so the node's own packets
      // (IPVS schedules them before filter OUTPUT) meet the OUTPUT rule too.
      Spec drop;
      drop.dst(saved(*clusterIP_, fam_)).proto(proto_).comment(noLocal_).dport(p_.port).jump("DROP");
      rule(Table::kFilter, kIpvsFilter, drop, plan::DropReason::kNoLocalEndpoints);
      rule(Table::kFilter, kIpvsOutFilter, drop, plan::DropReason::kNoLocalEndpoints);
    }
  }

  /// External traffic: externalIPs, LoadBalancer IPs, NodePorts.
  void addExternal() {
    if (!plan_.externallyAccessible) return;
    decideExternalPool();
    for (const auto& raw : plan_.externalIPs) {
      auto ip = hostOf(raw, fam_);
      if (!ip) continue;
      entry(externalLocal_ ? SetId::kExternalIPLocal : SetId::kExternalIP, ipPort(*ip, p_.port));
      if (externalServers_) addVirtualServer(*ip, p_.port, Traffic::kExternalIP, externalEndpoints_);
      // An address the node already holds elsewhere is not bound again (upstream).
      if (!isNodeAddress_(*ip)) bind(*ip);
      externalRules(*ip, p_.port, false);
    }
    std::vector<std::string> lbIPs;
    for (const auto& raw : plan_.loadBalancerIPs)
      if (auto ip = hostOf(raw, fam_)) lbIPs.push_back(*ip);
    for (const auto& ip : lbIPs) addLoadBalancerIP(ip, lbIPs);
    addNodePorts();
  }

  /// plan: ClientIP affinity across the port's addresses (note 8 in renderer.h). One
  /// firewall-mark virtual server per pool; each address is marked first in nat
  /// KUBE-SERVICES, before any of the port's rules (a KUBE-MARK-MASQ must see the mark), and
  /// its port changed to the endpoints' in KUBE-IPVS-FWMARK-PORTS, last (after the masquerade
  /// decisions, which look at the service's port).
  void markVirtualServers() {
    if (!fwmarks_ || f_.virtualServers.empty()) return;
    std::vector<PlannedVirtualServer> marked;
    std::vector<PortRule> markRules;
    for (auto& vs : f_.virtualServers) {
      const std::uint32_t mark = vs.traffic == Traffic::kClusterIP ? clusterMark_ : externalMark_;
      auto it = std::find_if(marked.begin(), marked.end(),
                             [&](const PlannedVirtualServer& m) { return m.fwmark == mark; });
      if (it == marked.end()) {
        PlannedVirtualServer m = vs;
        m.address.clear();
        m.port = 0;
        m.fwmark = mark;
        marked.push_back(std::move(m));
        it = std::prev(marked.end());
      }
      it->marked.push_back(MarkedAddress{vs.address, vs.port, vs.traffic});
      markRules.push_back(PortRule{Table::kNat, std::string(kServices),
                                   Spec()
                                       .dst(saved(vs.address, fam_))
                                       .proto(proto_)
                                       .comment(name_ + " sessionAffinity ClientIP")
                                       .dport(vs.port)
                                       .jump(markTarget(mark))
                                       .str()});
      if (targetPort_ != 0 && vs.port != targetPort_)
        rule(Table::kNat, kFwmarkPorts,
             Spec()
                 .dst(saved(vs.address, fam_))
                 .proto(proto_)
                 .comment(name_ + " sessionAffinity ClientIP")
                 .dport(vs.port)
                 .jump(fmt::format("DNAT --to-destination :{}", targetPort_)));
    }
    f_.virtualServers = std::move(marked);
    f_.rules.insert(f_.rules.begin(), markRules.begin(), markRules.end());
  }

  /// The health-check node port, the hairpin entries and the bound addresses' entries; the
  /// entries sorted, each once.
  Fragment finish() && {
    if (p_.healthCheckNodePort != 0) entry(SetId::kHealthCheckNodePort, std::to_string(p_.healthCheckNodePort));
    for (const sdk::Endpoint* ep : hairpin_)
      if (auto ip = hostOf(ep->ip, fam_))
        entry(SetId::kLoopBack, fmt::format("{},{}:{},{}", *ip, proto_, ep->port, *ip));
    for (const auto& ip : f_.boundAddresses) entry(SetId::kIPVSIPs, ip);
    std::sort(f_.ipsetEntries.begin(), f_.ipsetEntries.end());
    f_.ipsetEntries.erase(std::unique(f_.ipsetEntries.begin(), f_.ipsetEntries.end()), f_.ipsetEntries.end());
    return std::move(f_);
  }

 private:
  static std::string markTarget(std::uint32_t mark) { return fmt::format("MARK --set-xmark {:#x}/0xffffffff", mark); }

  void entry(SetId set, std::string text) {
    f_.ipsetEntries.push_back(IpsetEntry{setName(set, fam_), std::move(text)});
  }
  std::string ipPort(const std::string& ip, int port) const { return fmt::format("{},{}:{}", ip, proto_, port); }
  void rule(Table table, std::string_view chain, const Spec& spec) {
    f_.rules.push_back(PortRule{table, std::string(chain), spec.str()});
  }
  /// A rule that drops for `reason`.
  void rule(Table table, std::string_view chain, const Spec& spec, plan::DropReason reason) {
    rule(table, chain, spec);
    f_.tags.push_back(iptables::RuleTag{table, std::string(chain), f_.rules.back().spec, reason});
  }
  void bind(const std::string& ip) {
    if (std::find(f_.boundAddresses.begin(), f_.boundAddresses.end(), ip) == f_.boundAddresses.end())
      f_.boundAddresses.push_back(ip);
  }
  /// The port marked traffic to `port` meets IPVS with.
  int ipvsPort(int port) const { return fwmarks_ && targetPort_ != 0 ? int(targetPort_) : port; }

  /// The real servers of a pool: sorted, each once.
  std::vector<PlannedRealServer> serversOf(std::span<const sdk::Endpoint> endpoints) const {
    std::vector<PlannedRealServer> out;
    for (const auto& ep : endpoints)
      if (auto ip = hostOf(ep.ip, fam_)) out.push_back(PlannedRealServer{*ip, static_cast<std::uint16_t>(ep.port), 1});
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  void addVirtualServer(const std::string& address, int port, Traffic traffic,
                        std::span<const sdk::Endpoint> endpoints) {
    PlannedVirtualServer vs;
    vs.family = fam_;
    vs.protocol = p_.protocol;
    vs.address = address;
    vs.port = static_cast<std::uint16_t>(port);
    vs.scheduler = config_.scheduler;
    vs.persistent = plan_.affinity;
    vs.timeoutSeconds = plan_.affinity ? plan_.affinityTimeoutSeconds : 0;
    vs.sourceHashFallback = config_.scheduler == "mh";
    vs.traffic = traffic;
    // Another family or malformed (the core should not send it): left out.
    vs.realServers = serversOf(endpoints);
    // The local endpoints among the real servers: KUBE-LOOP-BACK masquerades a pod reaching
    // itself through a service address (upstream's hairpin set).
    for (const auto& ep : endpoints)
      if (ep.isLocal && hostOf(ep.ip, fam_)) hairpin_.push_back(&ep);
    f_.virtualServers.push_back(std::move(vs));
  }

  /// plan: ClientIP affinity across the port's addresses (note 8 in renderer.h): the marks of
  /// the ClusterIP's pool and of the external addresses' (the same one until the external pool
  /// is known to differ). A persistent firewall-mark service keeps the packet's port, so the
  /// endpoints' one port (`targetPort_`, 0 without endpoints) is put in before IPVS; endpoints
  /// on several ports cannot share it, and keep one virtual server per address.
  void decideFirewallMarks() {
    fwmarks_ = plan_.affinity;
    if (plan_.affinity) {
      std::vector<std::uint16_t> ports;
      for (auto pool : {plan_.clusterEndpoints, plan_.localEndpoints})
        for (const auto& rs : serversOf(pool)) ports.push_back(rs.port);
      std::sort(ports.begin(), ports.end());
      ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
      if (ports.size() > 1) {
        fwmarks_ = false;
        f_.problems.push_back(fmt::format(
            "{}: ClientIP affinity holds per address only: its endpoints listen on {} ports", name_, ports.size()));
      } else if (ports.size() == 1) {
        targetPort_ = ports.front();
      }
    }
    clusterMark_ = fwmarks_ ? config_.fwmarkOf(fam_, p_.key, "cluster") : 0;
    externalMark_ = clusterMark_;
  }

  /// How pod traffic is told apart (--detect-local-mode), as a source condition; false when
  /// the detector cannot tell for this family.
  bool podSource(Spec& spec, bool negate) const {
    const auto& detector = planConfig_.localDetector;
    if (!detector.implemented(fam_)) return false;
    using Mode = plan::LocalTrafficDetector::Mode;
    if (detector.mode == Mode::kCIDRs) {
      // Upstream's detector takes one CIDR per family; the first one is used.
      for (const auto& cidr : detector.cidrsOf(fam_))
        if (auto c = net::Prefix::parse(cidr)) {
          spec.src(withLength(*c), negate);
          return true;
        }
      return false;
    }
    spec.in(detector.mode == Mode::kInterfaceNamePrefix ? detector.interface + "+" : detector.interface, negate);
    return true;
  }

  /// The pool of the external virtual servers, the short-circuit, the external addresses'
  /// mark and the admitted source ranges.
  void decideExternalPool() {
    if (plan_.hasExternalEndpoints) {
      externalEndpoints_ = plan_.endpointsOf(plan_.externalPool);
    } else if (plan_.externalNoEndpoints == plan::NoEndpoints::kDrop) {
      // plan: eTP=Local without a local endpoint. The node and its pods still reach the
      // cluster pool (upstream's fallback too); everyone else is dropped below.
      if (plan_.shortCircuitNode)
        externalEndpoints_ = plan_.clusterEndpoints;
      else
        externalServers_ = false;
    }
    dropOthers_ = plan_.externalNoEndpoints == plan::NoEndpoints::kDrop;
    // plan: the short-circuit to the cluster pool, needed when the local pool is not it.
    shortCircuit_ = plan_.shortCircuitNode && plan_.hasExternalEndpoints && !plan_.poolsEqual();
    clusterIPHoldsClusterPool_ =
        clusterIP_ && plan_.internalPool == plan::Pool::kCluster && plan_.hasInternalEndpoints;
    if (shortCircuit_ && !clusterIPHoldsClusterPool_)
      f_.problems.push_back(fmt::format(
          "{}: the node's and pods' connections to its external addresses go to the local endpoints: "
          "no virtual server holds the cluster-wide endpoints (internalTrafficPolicy Local)",
          name_));
    clusterTarget_ = clusterIP_ ? "DNAT --to-destination " + hostPort(*clusterIP_, ipvsPort(p_.port)) : "";
    if (fwmarks_) {
      const auto clusterVS =
          std::find_if(f_.virtualServers.begin(), f_.virtualServers.end(),
                       [](const PlannedVirtualServer& vs) { return vs.traffic == Traffic::kClusterIP; });
      const bool sharesPool =
          clusterVS != f_.virtualServers.end() && clusterVS->realServers == serversOf(externalEndpoints_);
      if (!sharesPool) externalMark_ = config_.fwmarkOf(fam_, p_.key, "external");
    }
    for (const auto& s : plan_.firewallAllowedSources)
      if (auto a = net::Prefix::parse(s)) allowed_.push_back(*a);
  }

  /// Whether the source ranges admit `source` (the node connects to a VIP it holds from it).
  bool admitted(const std::string& source) const {
    auto a = net::Prefix::parse(source);
    return a && std::any_of(allowed_.begin(), allowed_.end(), [&](const net::Prefix& r) { return r.contains(*a); });
  }

  /// A short-circuit DNAT to the ClusterIP carries the ClusterIP's mark (it was marked for the
  /// external address before).
  void shortCircuitMark(const Spec& match) {
    if (externalMark_ != clusterMark_) rule(Table::kNat, kServices, Spec(match).jump(markTarget(clusterMark_)));
  }

  /// The rules of one external address (`port`: the port it answers on).
  void externalRules(const std::string& address, int port, bool firewalled) {
    const std::string dst = saved(address, fam_);
    const bool nodeShortCircuit = plan_.shortCircuitNode && (!firewalled || admitted(address));
    if (nodeShortCircuit)
      rule(Table::kNat, kServices,
           Spec()
               .dst(dst)
               .proto(proto_)
               .comment("masquerade LOCAL traffic for " + name_ + " external destinations")
               .dport(port)
               .match("-m addrtype --src-type LOCAL")
               .jump(kMarkMasq));
    if (shortCircuit_ && clusterIPHoldsClusterPool_) shortCircuitRules(dst, port, firewalled, nodeShortCircuit);
    if (dropOthers_) dropRules(dst, port);
  }

  /// The DNATs of the pods' and the node's connections to an external address to the ClusterIP.
  void shortCircuitRules(const std::string& dst, int port, bool firewalled, bool nodeShortCircuit) {
    if (plan_.shortCircuitPods) {
      Spec pods;
      podSource(pods, false);
      pods.dst(dst).proto(proto_).comment("pod traffic for " + name_ + " external destinations").dport(port);
      // A firewalled LB IP: only pods the source ranges admit (the DNAT would take the
      // packet past KUBE-PROXY-FIREWALL, which matches the LB IP).
      if (firewalled)
        pods.match("-m set --match-set " + setName(SetId::kLoadBalancerSourceCIDR, fam_) + " dst,dst,src");
      shortCircuitMark(pods);
      rule(Table::kNat, kServices, pods.jump(clusterTarget_));
    }
    if (nodeShortCircuit) {
      Spec node;
      node.dst(dst)
          .proto(proto_)
          .comment("route LOCAL traffic for " + name_ + " external destinations")
          .dport(port)
          .match("-m addrtype --src-type LOCAL");
      shortCircuitMark(node);
      rule(Table::kNat, kServices, node.jump(clusterTarget_));
    }
  }

  /// plan: no local endpoint: what is not short-circuited is dropped. Marked traffic had its
  /// port changed in nat: the mark says which port it was for.
  void dropRules(const std::string& dst, int port) {
    Spec drop;
    drop.dst(dst);
    if (plan_.shortCircuitPods) podSource(drop, true);
    drop.proto(proto_).comment(noLocal_);
    if (fwmarks_ && externalServers_)
      drop.match(fmt::format("-m mark --mark {:#x}", externalMark_));
    else
      drop.dport(port);
    if (plan_.shortCircuitNode) drop.match("-m addrtype ! --src-type LOCAL");
    rule(Table::kFilter, kIpvsFilter, drop.jump("DROP"), plan::DropReason::kNoLocalEndpoints);
    if (!externalServers_)
      rule(Table::kFilter, kIpvsOutFilter, Spec().dst(dst).proto(proto_).comment(noLocal_).dport(port).jump("DROP"),
           plan::DropReason::kNoLocalEndpoints);
  }

  void addLoadBalancerIP(const std::string& ip, const std::vector<std::string>& lbIPs) {
    const std::string ipp = ipPort(ip, p_.port);
    entry(SetId::kLoadBalancer, ipp);
    if (externalLocal_) entry(SetId::kLoadBalancerLocal, ipp);
    if (plan_.usesFirewall) loadBalancerFirewall(ip, lbIPs);
    if (externalServers_) addVirtualServer(ip, p_.port, Traffic::kLoadBalancer, externalEndpoints_);
    if (!isNodeAddress_(ip)) bind(ip);
    externalRules(ip, p_.port, plan_.usesFirewall);
  }

  /// loadBalancerSourceRanges: the LB IP's firewall and source entries, and the refusal of the
  /// node's own connections the ranges do not admit.
  void loadBalancerFirewall(const std::string& ip, const std::vector<std::string>& lbIPs) {
    const std::string ipp = ipPort(ip, p_.port);
    // Marked traffic meets the firewall with its port changed: the entries hold both.
    std::vector<std::string> firewalled{ipp};
    if (ipvsPort(p_.port) != p_.port) firewalled.push_back(ipPort(ip, ipvsPort(p_.port)));
    for (const auto& fw : firewalled) {
      entry(SetId::kLoadBalancerFW, fw);
      for (const auto& source : allowed_) {
        const std::string s = source.toString();
        // An LB IP among the admitted sources: the node connecting from the VIP it holds.
        if (source.isHost() && std::find(lbIPs.begin(), lbIPs.end(), s) != lbIPs.end())
          entry(SetId::kLoadBalancerSourceIP, fw + "," + s);
        else
          entry(SetId::kLoadBalancerSourceCIDR, fw + "," + withLength(source));
      }
    }
    // The node's connections to the VIP (with the VIP as source) never cross INPUT or
    // FORWARD: refuse them in OUTPUT, after IPVS, when the ranges do not admit them. The
    // ipvs match's address as iptables-save prints it: a host without its length (a
    // full sync compares the saved rules with these texts).
    if (!admitted(ip))
      rule(Table::kFilter, kIpvsOutFilter,
           Spec()
               .src(saved(ip, fam_))
               .match(fmt::format("-m ipvs --vproto {} --vaddr {} --vport {}", protoNumber(p_.protocol), ip,
                                  ipvsPort(p_.port)))
               .jump("DROP"));
  }

  /// The NodePort's set entries and one virtual server per NodePort address (node addresses
  /// are not bound).
  void addNodePorts() {
    if (plan_.nodePort == 0 || nodePortAddresses_.empty()) return;
    nodePortEntries();
    for (const auto& ip : nodePortAddresses_) {
      if (externalServers_) addVirtualServer(ip, plan_.nodePort, Traffic::kNodePort, externalEndpoints_);
      externalRules(ip, plan_.nodePort, false);
      // Marked NodePort traffic has its port changed before KUBE-NODE-PORT would mark it
      // for masquerade: the port marks it here.
      if (fwmarks_ && externalServers_ && !externalLocal_ && ipvsPort(plan_.nodePort) != plan_.nodePort)
        rule(Table::kNat, kServices,
             Spec()
                 .dst(saved(ip, fam_))
                 .proto(proto_)
                 .comment(name_ + " NodePort")
                 .dport(plan_.nodePort)
                 .jump(kMarkMasq));
    }
  }

  void nodePortEntries() {
    switch (p_.protocol) {
      case sdk::Protocol::kTCP:
        entry(SetId::kNodePortTCP, std::to_string(plan_.nodePort));
        if (externalLocal_) entry(SetId::kNodePortLocalTCP, std::to_string(plan_.nodePort));
        break;
      case sdk::Protocol::kUDP:
        entry(SetId::kNodePortUDP, std::to_string(plan_.nodePort));
        if (externalLocal_) entry(SetId::kNodePortLocalUDP, std::to_string(plan_.nodePort));
        break;
      case sdk::Protocol::kSCTP:
        // SCTP's sets are hash:ip,port: one entry per NodePort address.
        for (const auto& ip : nodePortAddresses_) {
          entry(SetId::kNodePortSCTP, ipPort(ip, plan_.nodePort));
          if (externalLocal_) entry(SetId::kNodePortLocalSCTP, ipPort(ip, plan_.nodePort));
        }
        break;
    }
  }

  const RenderConfig& config_;
  const plan::PlanConfig& planConfig_;
  const sdk::ServicePort& p_;
  const plan::ServicePortPlan& plan_;
  const net::Family fam_;
  const std::string name_;
  const std::string proto_;
  const bool externalLocal_;
  const std::string noLocal_;
  const std::span<const std::string> nodePortAddresses_;
  const std::function<bool(std::string_view)> isNodeAddress_;
  Fragment f_;
  std::vector<const sdk::Endpoint*> hairpin_;
  std::optional<std::string> clusterIP_;
  // ClientIP affinity (decideFirewallMarks).
  bool fwmarks_ = false;
  std::uint16_t targetPort_ = 0;
  std::uint32_t clusterMark_ = 0, externalMark_ = 0;
  // External traffic (decideExternalPool).
  std::span<const sdk::Endpoint> externalEndpoints_;
  bool externalServers_ = true;
  bool dropOthers_ = false;
  bool shortCircuit_ = false;
  bool clusterIPHoldsClusterPool_ = false;
  std::string clusterTarget_;
  std::vector<net::Prefix> allowed_;
};

/// IPVS mode's fixed chains of one family, rule by rule, in upstream's order within each chain
/// (renderGlobal).
class GlobalChains {
 public:
  GlobalChains(const RenderConfig& config, const plan::PlanConfig& planConfig, net::Family family)
      : config_(config),
        planConfig_(planConfig),
        family_(family),
        mark_(config.markHex()),
        tag_(fmt::format("{:#x}", config.fwmarkTag())) {
    for (const auto& [table, name] : kOwnedChains)
      chains_[{table, name}] = GlobalChain{table, std::string(name), {}, {}};
    // nat KUBE-SERVICES: connections from localhost are left alone, first; the ports' rules
    // (kproxy's) come next; then upstream's set rules.
    chains_[{Table::kNat, kServices}].head.push_back(
        Spec().src(isV6(family) ? "::1/128" : "127.0.0.0/8").jump("RETURN").str());
  }

  /// Upstream's ipsetWithIptablesChain, in its order.
  void addSetRules() {
    tail(Table::kNat, kPostrouting, matchSet(SetId::kLoopBack, "dst,dst,src").jump("MASQUERADE"));
    tail(Table::kNat, kServices, matchSet(SetId::kLoadBalancer, "dst,dst").jump(kLoadBalancer));
    tail(Table::kNat, kLoadBalancer, matchSet(SetId::kLoadBalancerLocal, "dst,dst").jump("RETURN"));
    struct NodePortSets {
      SetId local, all;
      std::string_view proto, flags;
    };
    for (const auto& np : {NodePortSets{SetId::kNodePortLocalTCP, SetId::kNodePortTCP, "tcp", "dst"},
                           NodePortSets{SetId::kNodePortLocalUDP, SetId::kNodePortUDP, "udp", "dst"},
                           NodePortSets{SetId::kNodePortLocalSCTP, SetId::kNodePortSCTP, "sctp", "dst,dst"}}) {
      Spec local, all;
      local.proto(np.proto);
      all.proto(np.proto);
      tail(Table::kNat, kNodePort, matchSet(local, np.local, np.flags).jump("RETURN"));
      tail(Table::kNat, kNodePort, matchSet(all, np.all, np.flags).jump(kMarkMasq));
    }
    tail(Table::kFilter, kProxyFirewall,
         matchSet(SetId::kLoadBalancerFW, "dst,dst").jump(kSourceRangesFirewall));
    for (SetId id : {SetId::kLoadBalancerSourceCIDR, SetId::kLoadBalancerSourceIP})
      tail(Table::kFilter, kSourceRangesFirewall, matchSet(id, "dst,dst,src").jump("RETURN"));
  }

  /// Masquerade of ClusterIP traffic: everything (masquerade-all), what does not come from the
  /// node's pods, or (no pod detector) the node's connections, which leave from a VIP.
  void addClusterIPMasquerade() {
    Spec s;
    if (config_.common.masqueradeAll) {
      matchSet(s, SetId::kClusterIP, "dst,dst");
    } else if (planConfig_.localDetector.implemented(family_)) {
      const auto& detector = planConfig_.localDetector;
      using Mode = plan::LocalTrafficDetector::Mode;
      if (detector.mode == Mode::kCIDRs) {
        if (auto c = net::Prefix::parse(detector.cidrsOf(family_).front())) s.src(withLength(*c), true);
      } else {
        s.in(detector.mode == Mode::kInterfaceNamePrefix ? detector.interface + "+" : detector.interface, true);
      }
      matchSet(s, SetId::kClusterIP, "dst,dst");
    } else {
      matchSet(s, SetId::kClusterIP, "src,dst");
    }
    tail(Table::kNat, kServices, s.jump(kMarkMasq));
  }

  /// externalIPs: masquerade (Cluster policy), then accept what comes from off the node or is
  /// for a local address; then the ends of KUBE-SERVICES, KUBE-LOAD-BALANCER and
  /// KUBE-SOURCE-RANGES-FIREWALL.
  void addExternalIPRules() {
    for (SetId id : {SetId::kExternalIP, SetId::kExternalIPLocal}) {
      if (id == SetId::kExternalIP) {
        tail(Table::kNat, kServices, matchSet(id, "dst,dst").jump(kMarkMasq));
        // Firewall-marked connections have been marked for masquerade above (or by their
        // port's rules): their port is changed now, before the ACCEPTs below end the chain.
        tail(Table::kNat, kServices, Spec().match(markMatch(tag_)).jump(kFwmarkPorts));
      }
      tail(Table::kNat, kServices,
           matchSet(id, "dst,dst")
               .match("-m physdev ! --physdev-is-in")
               .match("-m addrtype ! --src-type LOCAL")
               .jump("ACCEPT"));
      tail(Table::kNat, kServices, matchSet(id, "dst,dst").match("-m addrtype --dst-type LOCAL").jump("ACCEPT"));
    }
    tail(Table::kNat, kServices, Spec().match("-m addrtype --dst-type LOCAL").jump(kNodePort));
    tail(Table::kNat, kLoadBalancer, Spec().jump(kMarkMasq));
    tail(Table::kFilter, kSourceRangesFirewall, Spec().jump("DROP"), plan::DropReason::kSourceRange);
    // Upstream's acceptIPVSTraffic, last in KUBE-SERVICES.
    for (SetId id : {SetId::kClusterIP, SetId::kLoadBalancer})
      tail(Table::kNat, kServices, matchSet(id, "dst,dst", false).jump("ACCEPT"));
  }

  /// filter KUBE-FORWARD, KUBE-NODE-PORT and KUBE-IPVS-FILTER.
  void addFilterRules() {
    // KUBE-FORWARD: forward what is marked for masquerade, and its connections.
    tail(Table::kFilter, kForward,
         Spec().comment("kubernetes forwarding rules").match(markMatch(mark_)).jump("ACCEPT"));
    tail(Table::kFilter, kForward,
         Spec()
             .comment("kubernetes forwarding conntrack rule")
             .match("-m conntrack --ctstate RELATED,ESTABLISHED")
             .jump("ACCEPT"));
    tail(Table::kFilter, kNodePort, matchSet(SetId::kHealthCheckNodePort, "dst").jump("ACCEPT"));
    // KUBE-IPVS-FILTER: a VIP's other ports are not the host's (upstream issue 72236).
    for (auto [id, flags] : {std::pair{SetId::kLoadBalancer, "dst,dst"}, std::pair{SetId::kClusterIP, "dst,dst"},
                             std::pair{SetId::kExternalIP, "dst,dst"}, std::pair{SetId::kExternalIPLocal, "dst,dst"},
                             std::pair{SetId::kHealthCheckNodePort, "dst"}})
      tail(Table::kFilter, kIpvsFilter, matchSet(id, flags, false).jump("RETURN"));
    // A firewall-marked connection was for a service port (its port was changed in nat).
    tail(Table::kFilter, kIpvsFilter, Spec().match(markMatch(tag_)).jump("RETURN"));
    Spec s;
    s.match("-m conntrack --ctstate NEW");
    tail(Table::kFilter, kIpvsFilter,
         matchSet(s, SetId::kIPVSIPs, "dst", false)
             .jump(isV6(family_) ? "REJECT --reject-with icmp6-port-unreachable"
                                 : "REJECT --reject-with icmp-port-unreachable"),
         plan::DropReason::kServiceAddressPort);
  }

  /// nat KUBE-POSTROUTING / KUBE-MARK-MASQ (MARK --xor-mark / --or-mark as save prints them).
  /// A packet with one of kproxy's IPVS firewall marks keeps its masquerade in the connection
  /// mark (IPVS compares the whole packet mark): it comes back here.
  void addMasqueradeMarks() {
    tail(Table::kNat, kPostrouting,
         Spec()
             .match(fmt::format("-m connmark --mark {0}/{0}", mark_))
             .jump(fmt::format("MARK --set-xmark {0}/{0}", mark_)));
    tail(Table::kNat, kPostrouting, Spec().match(fmt::format("-m mark ! --mark {0}/{0}", mark_)).jump("RETURN"));
    tail(Table::kNat, kPostrouting, Spec().jump(fmt::format("MARK --set-xmark {}/0x0", mark_)));
    tail(Table::kNat, kPostrouting,
         Spec()
             .comment("kubernetes service traffic requiring SNAT")
             .jump(config_.randomFully ? "MASQUERADE --random-fully" : "MASQUERADE"));
    tail(Table::kNat, kMarkMasq,
         Spec().match(markMatch(tag_)).jump(fmt::format("CONNMARK --set-xmark {0}/{0}", mark_)));
    tail(Table::kNat, kMarkMasq, Spec().match(markMatch(tag_)).jump("RETURN"));
    tail(Table::kNat, kMarkMasq, Spec().jump(fmt::format("MARK --set-xmark {0}/{0}", mark_)));
  }

  /// Unallocated ClusterIPs: an address of a ServiceCIDR that no Service holds is not bound to
  /// kube-ipvs0, so it is not local; new connections to it are dropped where pods' (FORWARD)
  /// and the node's (OUTPUT) packets pass. A ClusterIP's unused port stays refused by the
  /// kernel (the address is local, nothing listens).
  void addUnallocatedClusterIPs(const std::vector<sdk::ServiceCIDR>& serviceCIDRs) {
    for (const auto& range : plan::serviceCIDRRanges(serviceCIDRs, family_)) {
      std::string names;
      for (const auto& n : range.names) names += (names.empty() ? "" : ",") + n;
      std::string text = "unallocated ClusterIPs of ServiceCIDR " + names;
      if (text.size() > 250) text = text.substr(0, 247) + "...";
      for (std::string_view chain : {kProxyFirewall, kIpvsOutFilter})
        tail(Table::kFilter, chain,
             Spec().dst(range.cidr).comment(text).match("-m addrtype ! --dst-type LOCAL").jump("DROP"),
             plan::DropReason::kUnallocatedClusterIP);
    }
  }

  /// The tags of the fixed rules that drop.
  const std::vector<iptables::RuleTag>& tags() const { return tags_; }

  /// The chains, in upstream's iptablesChains order.
  std::vector<GlobalChain> finish() && {
    std::vector<GlobalChain> out;
    for (const auto& [table, name] : kOwnedChains) out.push_back(std::move(chains_[{table, name}]));
    return out;
  }

 private:
  static std::string markMatch(const std::string& bits) { return fmt::format("-m mark --mark {0}/{0}", bits); }

  void tail(Table table, std::string_view chain, const Spec& spec) {
    chains_[{table, chain}].tail.push_back(spec.str());
  }
  /// A fixed rule that drops for `reason`.
  void tail(Table table, std::string_view chain, const Spec& spec, plan::DropReason reason) {
    tail(table, chain, spec);
    tags_.push_back(iptables::RuleTag{table, std::string(chain), chains_[{table, chain}].tail.back(), reason});
  }

  /// `-m comment --comment "<the set's comment>" -m set --match-set NAME FLAGS`.
  Spec& matchSet(Spec& spec, SetId id, std::string_view flags, bool withComment = true) const {
    if (withComment) spec.comment(std::string(infoOf(id).comment));
    return spec.match(fmt::format("-m set --match-set {} {}", setName(id, family_), flags));
  }
  /// The same on a new rule.
  Spec matchSet(SetId id, std::string_view flags, bool withComment = true) const {
    Spec spec;
    matchSet(spec, id, flags, withComment);
    return spec;
  }

  const RenderConfig& config_;
  const plan::PlanConfig& planConfig_;
  const net::Family family_;
  const std::string mark_;  ///< the masquerade bit, "0x4000"
  const std::string tag_;   ///< the bit of kproxy's firewall marks
  std::map<std::pair<Table, std::string_view>, GlobalChain> chains_;
  std::vector<iptables::RuleTag> tags_;
};

/// Upstream's iptablesJumpChain, each prepended to its built-in chain.
std::vector<JumpRule> ipvsJumps() {
  std::vector<JumpRule> jumps;
  auto jump = [&](Table table, std::string_view builtin, std::string_view target, std::string_view text) {
    jumps.push_back(JumpRule{table, std::string(builtin), Spec().comment(text).jump(target).str()});
  };
  jump(Table::kNat, "OUTPUT", kServices, "kubernetes service portals");
  jump(Table::kNat, "PREROUTING", kServices, "kubernetes service portals");
  jump(Table::kNat, "POSTROUTING", kPostrouting, "kubernetes postrouting rules");
  jump(Table::kFilter, "FORWARD", kForward, "kubernetes forwarding rules");
  jump(Table::kFilter, "INPUT", kNodePort, "kubernetes health check rules");
  jump(Table::kFilter, "INPUT", kProxyFirewall, "kube-proxy firewall rules");
  jump(Table::kFilter, "FORWARD", kProxyFirewall, "kube-proxy firewall rules");
  jump(Table::kFilter, "INPUT", kIpvsFilter, "kubernetes ipvs access filter");
  jump(Table::kFilter, "OUTPUT", kIpvsOutFilter, "kubernetes ipvs access filter");
  return jumps;
}

constexpr std::string_view kSchedulers[] = {"rr", "wrr", "lc",  "wlc", "lblc", "lblcr", "dh",
                                            "sh", "sed", "nq",  "fo",  "ovf",  "mh",    "twos"};

}  // namespace

std::string RenderConfig::markHex() const { return fmt::format("{:#x}", mark()); }

sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, "ipvs");
  if (!common) return std::unexpected(common.error());
  RenderConfig cfg;
  cfg.common = std::move(*common);
  if (auto it = options.find("ipvs-scheduler"); it != options.end() && !it->second.empty()) {
    if (std::find(std::begin(kSchedulers), std::end(kSchedulers), it->second) == std::end(kSchedulers))
      return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                       fmt::format("ipvs: invalid ipvs-scheduler \"{}\" ({})", it->second, fmt::join(kSchedulers, ", ")));
    cfg.scheduler = it->second;
  }
  return cfg;
}

std::uint32_t RenderConfig::fwmarkOf(net::Family family, std::string_view portKey, std::string_view pool) const {
  // FNV-1a: stable across builds and restarts (std::hash is neither promised).
  std::uint32_t h = 2166136261u;
  auto feed = [&](std::string_view text) {
    for (unsigned char c : text) h = (h ^ c) * 16777619u;
    h = (h ^ 0xffu) * 16777619u;  // a separator, so ("ab", "c") and ("a", "bc") differ
  };
  feed(isV6(family) ? "6" : "4");
  feed(portKey);
  feed(pool);
  const std::uint32_t tag = fwmarkTag();
  return tag | (h & (tag - 1) & ~mark() & ~0x8000u);
}

std::string PlannedVirtualServer::key() const {
  if (fwmark != 0) return fmt::format("FWM {} {}", fwmark, isV6(family) ? "IPv6" : "IPv4");
  return fmt::format("{}/{}", hostPort(address, port), protoUpper(protocol));
}

bool PlannedVirtualServer::answers(std::string_view ip, std::uint16_t p) const {
  auto same = [&](const std::string& a) {
    auto x = net::Prefix::parse(a);
    auto y = net::Prefix::parse(ip);
    return x && y && *x == *y;
  };
  if (fwmark == 0) return port == p && same(address);
  return std::any_of(marked.begin(), marked.end(),
                     [&](const MarkedAddress& m) { return m.port == p && same(m.address); });
}

std::span<const SetId> allSets() { return kSetIds; }

std::string setName(SetId set, net::Family family) {
  std::string name(infoOf(set).name);
  if (isV6(family)) {
    // Upstream's dual-stack naming: "KUBE-" becomes "KUBE-6-", cut to ipset's 31 characters.
    name.replace(0, backends::kKubePrefix.size(), backends::ipsets::kIPv6Prefix);
    if (name.size() > backends::ipsets::kMaxNameLength) name.resize(backends::ipsets::kMaxNameLength);
  }
  return name;
}

std::string IpsetDefinition::createText() const {
  if (type == "bitmap:port") return fmt::format("create {} {} range 0-65535", name, type);
  return fmt::format("create {} {} family {} hashsize 1024 maxelem 65536", name, type, family);
}

IpsetDefinition setDefinition(SetId set, net::Family family) {
  const SetInfo& info = infoOf(set);
  return IpsetDefinition{setName(set, family), std::string(info.type), isV6(family) ? "inet6" : "inet",
                         std::string(info.comment)};
}

bool isOwnedChain(Table table, std::string_view chain) {
  return std::any_of(std::begin(kOwnedChains), std::end(kOwnedChains),
                     [&](const auto& c) { return c.first == table && c.second == chain; });
}

IpvsRenderer::IpvsRenderer(RenderConfig config) : config_(std::move(config)) {
  if (config_.scheduler.empty()) config_.scheduler = std::string(kDefaultScheduler);
  planConfig_ = plan::planConfigOf(config_.common);
  resolveNodePortAddresses();
}

void IpvsRenderer::setNode(const sdk::NodeInfo& node) {
  node_ = node;
  plan::applyNode(planConfig_, config_.common.detectLocalMode, node, config_.common.nodeIPs);
  resolveNodePortAddresses();
}

void IpvsRenderer::setDummyInterfaceAddresses(std::vector<std::string> addresses) {
  dummyAddresses_.clear();
  for (const auto& a : addresses)
    if (auto p = net::Prefix::parse(a)) dummyAddresses_.push_back(p->toString());
  // Sorted: every render looks addresses up in it, and it holds every ClusterIP.
  std::sort(dummyAddresses_.begin(), dummyAddresses_.end());
  dummyAddresses_.erase(std::unique(dummyAddresses_.begin(), dummyAddresses_.end()), dummyAddresses_.end());
  resolveNodePortAddresses();
}

bool IpvsRenderer::isNodeAddress(std::string_view ip) const {
  auto p = net::Prefix::parse(ip);
  if (!p) return false;
  const std::string canonical = p->toString();
  if (std::binary_search(dummyAddresses_.begin(), dummyAddresses_.end(), canonical)) return false;
  auto in = [&](const std::vector<std::string>& list) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& a) {
      auto q = net::Prefix::parse(a);
      return q && *q == *p;
    });
  };
  return in(planConfig_.nodeIPs) || in(node_.nodePortAddresses.addresses);
}

void IpvsRenderer::resolveNodePortAddresses() {
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node_, config_.common.nodePortAddresses, config_.common.nodeIPs);
  for (net::Family fam : {net::Family::kIPv4, net::Family::kIPv6}) {
    std::vector<std::string>& out = nodePortAddresses_[isV6(fam) ? 1 : 0];
    out.clear();
    // As upstream's isValidForSet: of the family, not loopback, not IPv6 link-local; and not
    // an address of kube-ipvs0.
    const auto loopback = *net::Prefix::parse(isV6(fam) ? "::1/128" : "127.0.0.0/8");
    const auto linkLocal = *net::Prefix::parse("fe80::/10");
    auto add = [&](const std::string& ip) {
      auto a = net::Prefix::parse(ip);
      if (!a || !a->isHost() || a->v6() != isV6(fam) || loopback.contains(*a) || linkLocal.contains(*a)) return;
      std::string canonical = a->toString();
      if (std::binary_search(dummyAddresses_.begin(), dummyAddresses_.end(), canonical)) return;
      if (std::find(out.begin(), out.end(), canonical) == out.end()) out.push_back(std::move(canonical));
    };
    for (const auto& ip : nodePorts.addresses) add(ip);
    std::sort(out.begin(), out.end());
  }
}

Fragment IpvsRenderer::renderServicePort(const sdk::ServicePort& p) const {
  const plan::ServicePortPlan plan = plan::planServicePort(p, planConfig_);
  ServicePortObjects objects(config_, planConfig_, p, plan, nodePortAddresses(p.family),
                             [this](std::string_view ip) { return isNodeAddress(ip); });
  objects.addClusterIP();
  objects.addExternal();
  objects.markVirtualServers();
  return std::move(objects).finish();
}

GlobalObjects IpvsRenderer::renderGlobal(net::Family family) const {
  GlobalObjects g;
  g.family = family;
  for (SetId id : kSetIds) g.sets.push_back(setDefinition(id, family));
  GlobalChains chains(config_, planConfig_, family);
  chains.addSetRules();
  chains.addClusterIPMasquerade();
  chains.addExternalIPRules();
  chains.addFilterRules();
  chains.addMasqueradeMarks();
  chains.addUnallocatedClusterIPs(serviceCIDRs_);
  g.tags = chains.tags();
  g.chains = std::move(chains).finish();
  g.jumps = ipvsJumps();
  return g;
}

std::string renderIptables(const IpvsRenderer& renderer, net::Family family, std::span<const sdk::ServicePort> ports) {
  const GlobalObjects g = renderer.renderGlobal(family);
  std::vector<Fragment> fragments;
  for (const auto& p : ports)
    if (p.family == family) fragments.push_back(renderer.renderServicePort(p));
  std::string out;
  for (Table t : {Table::kNat, Table::kFilter}) {
    out += fmt::format("*{}\n", tableName(t));
    // Each jump was inserted first in its built-in chain: the last one ends up on top.
    std::map<std::string, std::vector<std::string>> builtin;
    for (const auto& j : g.jumps)
      if (j.table == t) builtin[j.chain].insert(builtin[j.chain].begin(), j.spec);
    for (const auto& [chain, rules] : builtin) out += fmt::format(":{} ACCEPT [0:0]\n", chain);
    for (const auto& c : g.chains)
      if (c.table == t) out += fmt::format(":{} - [0:0]\n", c.name);
    for (const auto& [chain, rules] : builtin)
      for (const auto& r : rules) out += fmt::format("-A {} {}\n", chain, r);
    for (const auto& c : g.chains) {
      if (c.table != t) continue;
      for (const auto& r : c.head) out += fmt::format("-A {} {}\n", c.name, r);
      for (const auto& f : fragments)
        for (const auto& r : f.rules)
          if (r.table == t && r.chain == c.name) out += fmt::format("-A {} {}\n", c.name, r.spec);
      for (const auto& r : c.tail) out += fmt::format("-A {} {}\n", c.name, r);
    }
    out += "COMMIT\n";
  }
  return out;
}

std::string renderIpsets(const IpvsRenderer& renderer, net::Family family, std::span<const sdk::ServicePort> ports) {
  std::string out;
  for (const auto& def : renderer.renderGlobal(family).sets) out += def.createText() + "\n";
  std::vector<IpsetEntry> entries;
  for (const auto& p : ports)
    if (p.family == family)
      for (auto& e : renderer.renderServicePort(p).ipsetEntries) entries.push_back(std::move(e));
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  for (const auto& e : entries) out += e.text() + "\n";
  return out;
}

std::string toIpvsadm(std::span<const PlannedVirtualServer> servers, IpvsadmStyle style) {
  std::string out;
  if (style == IpvsadmStyle::kList) {
    out += "Prot LocalAddress:Port Scheduler Flags\n";
    out += "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n";
  }
  for (const auto& vs : servers) {
    // ipvsadm names a firewall-mark service "-f MARK" (and "-6" for IPv6) / "FWM  MARK".
    const std::string vip = vs.fwmark != 0 ? fmt::format("{}{}", vs.fwmark, isV6(vs.family) ? " -6" : "")
                                           : hostPort(vs.address, vs.port);
    const std::string flags = vs.sourceHashFallback ? vs.scheduler + "-fallback" : "";
    if (style == IpvsadmStyle::kSave) {
      std::string_view opt = vs.fwmark != 0                        ? "-f"
                             : vs.protocol == sdk::Protocol::kUDP  ? "-u"
                             : vs.protocol == sdk::Protocol::kSCTP ? "--sctp-service"
                                                                  : "-t";
      out += fmt::format("-A {} {} -s {}", opt, vip, vs.scheduler);
      if (!flags.empty()) out += " -b " + flags;
      if (vs.persistent) out += fmt::format(" -p {}", vs.timeoutSeconds);
      out += '\n';
      for (const auto& rs : vs.realServers)
        out += fmt::format("-a {} {} -r {} -m -w {}\n", opt, vip, hostPort(rs.address, rs.port), rs.weight);
    } else {
      if (vs.fwmark != 0)
        out += fmt::format("FWM  {} {}{}", vs.fwmark, isV6(vs.family) ? "IPv6 " : "", vs.scheduler);
      else
        out += fmt::format("{}  {} {}", protoUpper(vs.protocol), vip, vs.scheduler);
      if (!flags.empty()) out += " (" + flags + ")";
      if (vs.persistent) out += fmt::format(" persistent {}", vs.timeoutSeconds);
      out += '\n';
      for (const auto& rs : vs.realServers)
        out += fmt::format("  -> {:<28} {:<7} {:<6} {:<10} {:<10}\n", hostPort(rs.address, rs.port), "Masq", rs.weight,
                           0, 0);
    }
  }
  return out;
}

}  // namespace kproxy::ipvs
