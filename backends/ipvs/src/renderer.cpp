#include "kproxy/ipvs/renderer.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "kproxy/backends/common/address.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_rule.h"
#include "kproxy/plan/options.h"

namespace kproxy::ipvs {
namespace {

using backends::IPPrefix;
using Spec = backends::IptablesRuleSpec;

// Upstream IPVS mode's chains (pkg/proxy/ipvs/proxier.go).
constexpr std::string_view kServices = "KUBE-SERVICES";
constexpr std::string_view kPostrouting = "KUBE-POSTROUTING";
constexpr std::string_view kMarkMasq = "KUBE-MARK-MASQ";
constexpr std::string_view kNodePort = "KUBE-NODE-PORT";
constexpr std::string_view kLoadBalancer = "KUBE-LOAD-BALANCER";
constexpr std::string_view kForward = "KUBE-FORWARD";
constexpr std::string_view kProxyFirewall = "KUBE-PROXY-FIREWALL";
constexpr std::string_view kSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL";
constexpr std::string_view kIpvsFilter = "KUBE-IPVS-FILTER";
constexpr std::string_view kIpvsOutFilter = "KUBE-IPVS-OUT-FILTER";
// kproxy's: the ports of firewall-marked connections (ClientIP affinity), changed to the
// endpoints' before IPVS.
constexpr std::string_view kFwmarkPorts = "KUBE-IPVS-FWMARK-PORTS";

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

// Upstream's ipsetInfo: names, types and comments.
constexpr SetInfo kSets[] = {
    {SetId::kLoopBack, "KUBE-LOOP-BACK", "hash:ip,port,ip",
     "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
    {SetId::kClusterIP, "KUBE-CLUSTER-IP", "hash:ip,port", "Kubernetes service cluster ip + port for masquerade purpose"},
    {SetId::kExternalIP, "KUBE-EXTERNAL-IP", "hash:ip,port",
     "Kubernetes service external ip + port for masquerade and filter purpose"},
    {SetId::kExternalIPLocal, "KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port",
     "Kubernetes service external ip + port with externalTrafficPolicy=local"},
    {SetId::kLoadBalancer, "KUBE-LOAD-BALANCER", "hash:ip,port", "Kubernetes service lb portal"},
    {SetId::kLoadBalancerFW, "KUBE-LOAD-BALANCER-FW", "hash:ip,port",
     "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
    {SetId::kLoadBalancerLocal, "KUBE-LOAD-BALANCER-LOCAL", "hash:ip,port",
     "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
    {SetId::kLoadBalancerSourceIP, "KUBE-LOAD-BALANCER-SOURCE-IP", "hash:ip,port,ip",
     "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
    {SetId::kLoadBalancerSourceCIDR, "KUBE-LOAD-BALANCER-SOURCE-CIDR", "hash:ip,port,net",
     "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
    {SetId::kNodePortTCP, "KUBE-NODE-PORT-TCP", "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"},
    {SetId::kNodePortLocalTCP, "KUBE-NODE-PORT-LOCAL-TCP", "bitmap:port",
     "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
    {SetId::kNodePortUDP, "KUBE-NODE-PORT-UDP", "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"},
    {SetId::kNodePortLocalUDP, "KUBE-NODE-PORT-LOCAL-UDP", "bitmap:port",
     "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
    {SetId::kNodePortSCTP, "KUBE-NODE-PORT-SCTP-HASH", "hash:ip,port",
     "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
    {SetId::kNodePortLocalSCTP, "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "hash:ip,port",
     "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
    {SetId::kHealthCheckNodePort, "KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port", "Kubernetes health check node port"},
    {SetId::kIPVSIPs, "KUBE-IPVS-IPS", "hash:ip", "Addresses on the ipvs interface"},
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

bool isV6(sdk::Family family) { return family == sdk::Family::kIPv6; }

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
std::optional<std::string> hostOf(std::string_view text, sdk::Family family) {
  auto p = IPPrefix::parse(text);
  if (!p || !p->isHost() || p->v6 != isV6(family)) return std::nullopt;
  return p->toString();
}

/// An address as iptables-save prints it ("10.0.0.1/32").
std::string saved(const std::string& host, sdk::Family family) { return host + (isV6(family) ? "/128" : "/32"); }

/// "10.0.0.1:80", "[fd00::1]:80".
std::string hostPort(std::string_view ip, int port) { return backends::endpointHostPort(ip, port); }

/// A prefix with its length always written, as upstream writes source ranges into ipset.
std::string withLength(const IPPrefix& p) {
  std::string out = p.toString();
  if (p.isHost()) out += p.v6 ? "/128" : "/32";
  return out;
}

constexpr std::string_view kSchedulers[] = {"rr", "wrr", "lc",  "wlc", "lblc", "lblcr", "dh",
                                            "sh", "sed", "nq",  "fo",  "ovf",  "mh",    "twos"};

}  // namespace

std::string RenderConfig::markHex() const { return fmt::format("{:#x}", mark()); }

sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, "ipvs");
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
  if (auto it = options.find("ipvs-scheduler"); it != options.end() && !it->second.empty()) {
    if (std::find(std::begin(kSchedulers), std::end(kSchedulers), it->second) == std::end(kSchedulers))
      return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                       fmt::format("ipvs: invalid ipvs-scheduler \"{}\" ({})", it->second, fmt::join(kSchedulers, ", ")));
    cfg.scheduler = it->second;
  }
  return cfg;
}

std::uint32_t RenderConfig::fwmarkOf(sdk::Family family, std::string_view portKey, std::string_view pool) const {
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
    auto x = IPPrefix::parse(a);
    auto y = IPPrefix::parse(ip);
    return x && y && *x == *y;
  };
  if (fwmark == 0) return port == p && same(address);
  return std::any_of(marked.begin(), marked.end(),
                     [&](const MarkedAddress& m) { return m.port == p && same(m.address); });
}

std::span<const SetId> allSets() { return kSetIds; }

std::string setName(SetId set, sdk::Family family) {
  std::string name(infoOf(set).name);
  if (isV6(family)) {
    // Upstream's dual-stack naming: "KUBE-" becomes "KUBE-6-", cut to ipset's 31 characters.
    name.replace(0, 5, "KUBE-6-");
    if (name.size() > 31) name.resize(31);
  }
  return name;
}

std::string IpsetDefinition::createText() const {
  if (type == "bitmap:port") return fmt::format("create {} {} range 0-65535", name, type);
  return fmt::format("create {} {} family {} hashsize 1024 maxelem 65536", name, type, family);
}

IpsetDefinition setDefinition(SetId set, sdk::Family family) {
  const SetInfo& info = infoOf(set);
  return IpsetDefinition{setName(set, family), std::string(info.type), isV6(family) ? "inet6" : "inet",
                         std::string(info.comment)};
}

std::string_view tableName(Table table) { return table == Table::kNat ? "nat" : "filter"; }

bool isOwnedChain(Table table, std::string_view chain) {
  return std::any_of(std::begin(kOwnedChains), std::end(kOwnedChains),
                     [&](const auto& c) { return c.first == table && c.second == chain; });
}

IpvsRenderer::IpvsRenderer(RenderConfig config) : config_(std::move(config)) {
  if (config_.scheduler.empty()) config_.scheduler = std::string(kDefaultScheduler);
  planConfig_ = plan::planConfigOf(config_.masqueradeAll, config_.detectLocalMode, config_.clusterCIDRs,
                                   config_.bridgeInterface, config_.interfaceNamePrefix, config_.nodeIPs);
  resolveNodePortAddresses();
}

void IpvsRenderer::setNode(const sdk::NodeInfo& node) {
  node_ = node;
  plan::applyNode(planConfig_, config_.detectLocalMode, node, config_.nodeIPs);
  resolveNodePortAddresses();
}

void IpvsRenderer::setDummyInterfaceAddresses(std::vector<std::string> addresses) {
  dummyAddresses_.clear();
  for (const auto& a : addresses)
    if (auto p = IPPrefix::parse(a)) dummyAddresses_.push_back(p->toString());
  // Sorted: every render looks addresses up in it, and it holds every ClusterIP.
  std::sort(dummyAddresses_.begin(), dummyAddresses_.end());
  dummyAddresses_.erase(std::unique(dummyAddresses_.begin(), dummyAddresses_.end()), dummyAddresses_.end());
  resolveNodePortAddresses();
}

bool IpvsRenderer::isNodeAddress(std::string_view ip) const {
  auto p = IPPrefix::parse(ip);
  if (!p) return false;
  const std::string canonical = p->toString();
  if (std::binary_search(dummyAddresses_.begin(), dummyAddresses_.end(), canonical)) return false;
  auto in = [&](const std::vector<std::string>& list) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& a) {
      auto q = IPPrefix::parse(a);
      return q && *q == *p;
    });
  };
  return in(planConfig_.nodeIPs) || in(node_.nodePortAddresses.addresses);
}

void IpvsRenderer::resolveNodePortAddresses() {
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node_, config_.nodePortAddresses, config_.nodeIPs);
  for (sdk::Family fam : {sdk::Family::kIPv4, sdk::Family::kIPv6}) {
    std::vector<std::string>& out = nodePortAddresses_[isV6(fam) ? 1 : 0];
    out.clear();
    // As upstream's isValidForSet: of the family, not loopback, not IPv6 link-local; and not
    // an address of kube-ipvs0.
    const auto loopback = *IPPrefix::parse(isV6(fam) ? "::1/128" : "127.0.0.0/8");
    const auto linkLocal = *IPPrefix::parse("fe80::/10");
    auto add = [&](const std::string& ip) {
      auto a = IPPrefix::parse(ip);
      if (!a || !a->isHost() || a->v6 != isV6(fam) || loopback.contains(*a) || linkLocal.contains(*a)) return;
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
  const sdk::Family fam = p.family;
  Fragment f;
  f.family = fam;
  f.key = p.key;
  const std::string name = backends::servicePortNameString(p.ns, p.serviceName, p.portName);
  const std::string proto(protoLower(p.protocol));
  const bool externalLocal = plan.externallyAccessible && !plan.externalMasqueradeAll;

  auto entry = [&](SetId set, std::string text) { f.ipsetEntries.push_back(IpsetEntry{setName(set, fam), std::move(text)}); };
  auto ipPort = [&](const std::string& ip, int port) { return fmt::format("{},{}:{}", ip, proto, port); };
  auto rule = [&](Table table, std::string_view chain, const Spec& spec) {
    f.rules.push_back(PortRule{table, std::string(chain), spec.str()});
  };
  auto bind = [&](const std::string& ip) {
    if (std::find(f.boundAddresses.begin(), f.boundAddresses.end(), ip) == f.boundAddresses.end())
      f.boundAddresses.push_back(ip);
  };
  // The local endpoints among the real servers: KUBE-LOOP-BACK masquerades a pod reaching
  // itself through a service address (upstream's hairpin set).
  std::vector<const sdk::Endpoint*> hairpin;
  // The real servers of a pool: sorted, each once.
  auto serversOf = [&](std::span<const sdk::Endpoint> endpoints) {
    std::vector<PlannedRealServer> out;
    for (const auto& ep : endpoints)
      if (auto ip = hostOf(ep.ip, fam)) out.push_back(PlannedRealServer{*ip, static_cast<std::uint16_t>(ep.port), 1});
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  };
  auto addVirtualServer = [&](const std::string& address, int port, Traffic traffic,
                              std::span<const sdk::Endpoint> endpoints) {
    PlannedVirtualServer vs;
    vs.family = fam;
    vs.protocol = p.protocol;
    vs.address = address;
    vs.port = static_cast<std::uint16_t>(port);
    vs.scheduler = config_.scheduler;
    vs.persistent = plan.affinity;
    vs.timeoutSeconds = plan.affinity ? plan.affinityTimeoutSeconds : 0;
    vs.sourceHashFallback = config_.scheduler == "mh";
    vs.traffic = traffic;
    // Another family or malformed (the core should not send it): left out.
    vs.realServers = serversOf(endpoints);
    for (const auto& ep : endpoints)
      if (ep.isLocal && hostOf(ep.ip, fam)) hairpin.push_back(&ep);
    f.virtualServers.push_back(std::move(vs));
  };
  // plan: ClientIP affinity across the port's addresses (docs/upstream-differences.md, IPVS
  // note 8): the marks of the ClusterIP's pool and of the external addresses' (the same one
  // when they share it).
  // A persistent firewall-mark service keeps the packet's port, so the endpoints' one port
  // (`targetPort`, 0 without endpoints) is put in before IPVS; endpoints on several ports
  // cannot share it, and keep one virtual server per address.
  std::uint16_t targetPort = 0;
  bool fwmarks = plan.affinity;
  if (plan.affinity) {
    std::vector<std::uint16_t> ports;
    for (auto pool : {plan.clusterEndpoints, plan.localEndpoints})
      for (const auto& rs : serversOf(pool)) ports.push_back(rs.port);
    std::sort(ports.begin(), ports.end());
    ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
    if (ports.size() > 1) {
      fwmarks = false;
      f.problems.push_back(fmt::format("{}: ClientIP affinity holds per address only: its endpoints listen on {} ports",
                                       name, ports.size()));
    } else if (ports.size() == 1) {
      targetPort = ports.front();
    }
  }
  const std::uint32_t clusterMark = fwmarks ? config_.fwmarkOf(fam, p.key, "cluster") : 0;
  std::uint32_t externalMark = clusterMark;
  auto markTarget = [](std::uint32_t mark) { return fmt::format("MARK --set-xmark {:#x}/0xffffffff", mark); };
  // The port marked traffic to `port` meets IPVS with.
  auto ipvsPort = [&](int port) { return fwmarks && targetPort != 0 ? int(targetPort) : port; };

  // How pod traffic is told apart (--detect-local-mode), as a source condition; false when the
  // detector cannot tell for this family.
  auto podSource = [&](Spec& spec, bool negate) {
    const auto& detector = planConfig_.localDetector;
    if (!detector.implemented(fam)) return false;
    using Mode = plan::LocalTrafficDetector::Mode;
    if (detector.mode == Mode::kCIDRs) {
      // Upstream's detector takes one CIDR per family; the first one is used.
      for (const auto& cidr : detector.cidrsOf(fam))
        if (auto c = IPPrefix::parse(cidr)) {
          spec.src(withLength(*c), negate);
          return true;
        }
      return false;
    }
    spec.in(detector.mode == Mode::kInterfaceNamePrefix ? detector.interface + "+" : detector.interface, negate);
    return true;
  };
  const std::string noLocal = name + " has no local endpoints";

  // ---- internal traffic: the ClusterIP ----
  std::optional<std::string> clusterIP = plan.clusterIP.empty() ? std::nullopt : hostOf(plan.clusterIP, fam);
  if (clusterIP) {
    entry(SetId::kClusterIP, ipPort(*clusterIP, p.port));
    bind(*clusterIP);
    if (plan.hasInternalEndpoints) {
      addVirtualServer(*clusterIP, p.port, Traffic::kClusterIP, plan.endpointsOf(plan.internalPool));
    } else if (plan.internalNoEndpoints == plan::NoEndpoints::kReject) {
      // No endpoints anywhere: IPVS refuses a virtual server's new connections when it has
      // no real server (ICMP port unreachable), as upstream.
      addVirtualServer(*clusterIP, p.port, Traffic::kClusterIP, {});
    } else {
      // plan: the policy's pool is empty: drop. No virtual server, so the node's own packets
      // (IPVS schedules them before filter OUTPUT) meet the OUTPUT rule too.
      Spec drop;
      drop.dst(saved(*clusterIP, fam)).proto(proto).comment(noLocal).dport(p.port).jump("DROP");
      rule(Table::kFilter, kIpvsFilter, drop);
      rule(Table::kFilter, kIpvsOutFilter, drop);
    }
  }

  // ---- external traffic: externalIPs, LoadBalancer IPs, NodePorts ----
  if (plan.externallyAccessible) {
    // The pool of the external virtual servers.
    std::span<const sdk::Endpoint> externalEndpoints;
    bool externalServers = true;
    if (plan.hasExternalEndpoints) {
      externalEndpoints = plan.endpointsOf(plan.externalPool);
    } else if (plan.externalNoEndpoints == plan::NoEndpoints::kDrop) {
      // plan: eTP=Local without a local endpoint. The node and its pods still reach the
      // cluster pool (upstream's fallback too); everyone else is dropped below.
      if (plan.shortCircuitNode)
        externalEndpoints = plan.clusterEndpoints;
      else
        externalServers = false;
    }
    const bool dropOthers = plan.externalNoEndpoints == plan::NoEndpoints::kDrop;
    // plan: the short-circuit to the cluster pool, needed when the local pool is not it.
    const bool shortCircuit = plan.shortCircuitNode && plan.hasExternalEndpoints && !plan.poolsEqual();
    const bool clusterIPHoldsClusterPool =
        clusterIP && plan.internalPool == plan::Pool::kCluster && plan.hasInternalEndpoints;
    if (shortCircuit && !clusterIPHoldsClusterPool)
      f.problems.push_back(fmt::format(
          "{}: the node's and pods' connections to its external addresses go to the local endpoints: "
          "no virtual server holds the cluster-wide endpoints (internalTrafficPolicy Local)",
          name));
    const std::string clusterTarget =
        clusterIP ? "DNAT --to-destination " + hostPort(*clusterIP, ipvsPort(p.port)) : "";
    if (fwmarks) {
      const auto clusterVS =
          std::find_if(f.virtualServers.begin(), f.virtualServers.end(),
                       [](const PlannedVirtualServer& vs) { return vs.traffic == Traffic::kClusterIP; });
      const bool sharesPool =
          clusterVS != f.virtualServers.end() && clusterVS->realServers == serversOf(externalEndpoints);
      if (!sharesPool) externalMark = config_.fwmarkOf(fam, p.key, "external");
    }
    // A short-circuit DNAT to the ClusterIP carries the ClusterIP's mark (it was marked for
    // the external address before).
    auto shortCircuitMark = [&](const Spec& match) {
      if (externalMark != clusterMark) rule(Table::kNat, kServices, Spec(match).jump(markTarget(clusterMark)));
    };

    // Whether the source ranges admit `source` (the node connects to a VIP it holds from it).
    std::vector<IPPrefix> allowed;
    for (const auto& s : plan.firewallAllowedSources)
      if (auto a = IPPrefix::parse(s)) allowed.push_back(*a);
    auto admitted = [&](const std::string& source) {
      auto a = IPPrefix::parse(source);
      return a && std::any_of(allowed.begin(), allowed.end(), [&](const IPPrefix& r) { return r.contains(*a); });
    };

    // The rules of one external address (`port`: the port it answers on).
    auto externalRules = [&](const std::string& address, int port, bool firewalled) {
      const std::string dst = saved(address, fam);
      const bool nodeShortCircuit = plan.shortCircuitNode && (!firewalled || admitted(address));
      if (nodeShortCircuit)
        rule(Table::kNat, kServices,
             Spec()
                 .dst(dst)
                 .proto(proto)
                 .comment("masquerade LOCAL traffic for " + name + " external destinations")
                 .dport(port)
                 .match("-m addrtype --src-type LOCAL")
                 .jump(kMarkMasq));
      if (shortCircuit && clusterIPHoldsClusterPool) {
        if (plan.shortCircuitPods) {
          Spec pods;
          podSource(pods, false);
          pods.dst(dst).proto(proto).comment("pod traffic for " + name + " external destinations").dport(port);
          // A firewalled LB IP: only pods the source ranges admit (the DNAT would take the
          // packet past KUBE-PROXY-FIREWALL, which matches the LB IP).
          if (firewalled)
            pods.match("-m set --match-set " + setName(SetId::kLoadBalancerSourceCIDR, fam) + " dst,dst,src");
          shortCircuitMark(pods);
          rule(Table::kNat, kServices, pods.jump(clusterTarget));
        }
        if (nodeShortCircuit) {
          Spec node;
          node.dst(dst)
              .proto(proto)
              .comment("route LOCAL traffic for " + name + " external destinations")
              .dport(port)
              .match("-m addrtype --src-type LOCAL");
          shortCircuitMark(node);
          rule(Table::kNat, kServices, node.jump(clusterTarget));
        }
      }
      if (dropOthers) {
        // plan: no local endpoint: what is not short-circuited is dropped. Marked traffic had
        // its port changed in nat: the mark says which port it was for.
        Spec drop;
        drop.dst(dst);
        if (plan.shortCircuitPods) podSource(drop, true);
        drop.proto(proto).comment(noLocal);
        if (fwmarks && externalServers)
          drop.match(fmt::format("-m mark --mark {:#x}", externalMark));
        else
          drop.dport(port);
        if (plan.shortCircuitNode) drop.match("-m addrtype ! --src-type LOCAL");
        rule(Table::kFilter, kIpvsFilter, drop.jump("DROP"));
        if (!externalServers)
          rule(Table::kFilter, kIpvsOutFilter,
               Spec().dst(dst).proto(proto).comment(noLocal).dport(port).jump("DROP"));
      }
    };

    for (const auto& raw : plan.externalIPs) {
      auto ip = hostOf(raw, fam);
      if (!ip) continue;
      entry(externalLocal ? SetId::kExternalIPLocal : SetId::kExternalIP, ipPort(*ip, p.port));
      if (externalServers) addVirtualServer(*ip, p.port, Traffic::kExternalIP, externalEndpoints);
      // An address the node already holds elsewhere is not bound again (upstream).
      if (!isNodeAddress(*ip)) bind(*ip);
      externalRules(*ip, p.port, false);
    }

    std::vector<std::string> lbIPs;
    for (const auto& raw : plan.loadBalancerIPs)
      if (auto ip = hostOf(raw, fam)) lbIPs.push_back(*ip);
    for (const auto& ip : lbIPs) {
      const std::string ipp = ipPort(ip, p.port);
      entry(SetId::kLoadBalancer, ipp);
      if (externalLocal) entry(SetId::kLoadBalancerLocal, ipp);
      if (plan.usesFirewall) {
        // Marked traffic meets the firewall with its port changed: the entries hold both.
        std::vector<std::string> firewalled{ipp};
        if (ipvsPort(p.port) != p.port) firewalled.push_back(ipPort(ip, ipvsPort(p.port)));
        for (const auto& fw : firewalled) {
          entry(SetId::kLoadBalancerFW, fw);
          for (const auto& source : allowed) {
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
                   .src(saved(ip, fam))
                   .match(fmt::format("-m ipvs --vproto {} --vaddr {} --vport {}", protoNumber(p.protocol),
                                      ip, ipvsPort(p.port)))
                   .jump("DROP"));
      }
      if (externalServers) addVirtualServer(ip, p.port, Traffic::kLoadBalancer, externalEndpoints);
      if (!isNodeAddress(ip)) bind(ip);
      externalRules(ip, p.port, plan.usesFirewall);
    }

    const auto& nodeAddresses = nodePortAddresses(fam);
    if (plan.nodePort != 0 && !nodeAddresses.empty()) {
      switch (p.protocol) {
        case sdk::Protocol::kTCP:
          entry(SetId::kNodePortTCP, std::to_string(plan.nodePort));
          if (externalLocal) entry(SetId::kNodePortLocalTCP, std::to_string(plan.nodePort));
          break;
        case sdk::Protocol::kUDP:
          entry(SetId::kNodePortUDP, std::to_string(plan.nodePort));
          if (externalLocal) entry(SetId::kNodePortLocalUDP, std::to_string(plan.nodePort));
          break;
        case sdk::Protocol::kSCTP:
          // SCTP's sets are hash:ip,port: one entry per NodePort address.
          for (const auto& ip : nodeAddresses) {
            entry(SetId::kNodePortSCTP, ipPort(ip, plan.nodePort));
            if (externalLocal) entry(SetId::kNodePortLocalSCTP, ipPort(ip, plan.nodePort));
          }
          break;
      }
      // One virtual server per NodePort address; node addresses are not bound.
      for (const auto& ip : nodeAddresses) {
        if (externalServers) addVirtualServer(ip, plan.nodePort, Traffic::kNodePort, externalEndpoints);
        externalRules(ip, plan.nodePort, false);
        // Marked NodePort traffic has its port changed before KUBE-NODE-PORT would mark it
        // for masquerade: the port marks it here.
        if (fwmarks && externalServers && !externalLocal && ipvsPort(plan.nodePort) != plan.nodePort)
          rule(Table::kNat, kServices,
               Spec()
                   .dst(saved(ip, fam))
                   .proto(proto)
                   .comment(name + " NodePort")
                   .dport(plan.nodePort)
                   .jump(kMarkMasq));
      }
    }
  }

  if (fwmarks && !f.virtualServers.empty()) {
    // One firewall-mark virtual server per pool; each address is marked first in nat
    // KUBE-SERVICES, before any of the port's rules (a KUBE-MARK-MASQ must see the mark),
    // and its port changed to the endpoints' in KUBE-IPVS-FWMARK-PORTS, last (after the
    // masquerade decisions, which look at the service's port).
    std::vector<PlannedVirtualServer> marked;
    std::vector<PortRule> markRules;
    for (auto& vs : f.virtualServers) {
      const std::uint32_t mark = vs.traffic == Traffic::kClusterIP ? clusterMark : externalMark;
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
                                       .dst(saved(vs.address, fam))
                                       .proto(proto)
                                       .comment(name + " sessionAffinity ClientIP")
                                       .dport(vs.port)
                                       .jump(markTarget(mark))
                                       .str()});
      if (targetPort != 0 && vs.port != targetPort)
        rule(Table::kNat, kFwmarkPorts,
             Spec()
                 .dst(saved(vs.address, fam))
                 .proto(proto)
                 .comment(name + " sessionAffinity ClientIP")
                 .dport(vs.port)
                 .jump(fmt::format("DNAT --to-destination :{}", targetPort)));
    }
    f.virtualServers = std::move(marked);
    f.rules.insert(f.rules.begin(), markRules.begin(), markRules.end());
  }

  if (p.healthCheckNodePort != 0) entry(SetId::kHealthCheckNodePort, std::to_string(p.healthCheckNodePort));

  for (const sdk::Endpoint* ep : hairpin)
    if (auto ip = hostOf(ep->ip, fam)) entry(SetId::kLoopBack, fmt::format("{},{}:{},{}", *ip, proto, ep->port, *ip));
  for (const auto& ip : f.boundAddresses) entry(SetId::kIPVSIPs, ip);

  std::sort(f.ipsetEntries.begin(), f.ipsetEntries.end());
  f.ipsetEntries.erase(std::unique(f.ipsetEntries.begin(), f.ipsetEntries.end()), f.ipsetEntries.end());
  return f;
}

GlobalObjects IpvsRenderer::renderGlobal(sdk::Family family) const {
  GlobalObjects g;
  g.family = family;
  for (SetId id : kSetIds) g.sets.push_back(setDefinition(id, family));
  const std::string mark = config_.markHex();
  auto set = [&](SetId id) { return setName(id, family); };
  auto comment = [&](SetId id) { return std::string(infoOf(id).comment); };
  // `-m comment --comment "<the set's comment>" -m set --match-set NAME FLAGS`.
  auto matchSet = [&](Spec& spec, SetId id, std::string_view flags, bool withComment = true) -> Spec& {
    if (withComment) spec.comment(comment(id));
    return spec.match(fmt::format("-m set --match-set {} {}", set(id), flags));
  };
  std::map<std::pair<Table, std::string_view>, GlobalChain> chains;
  for (const auto& [table, name] : kOwnedChains) chains[{table, name}] = GlobalChain{table, std::string(name), {}, {}};
  auto tail = [&](Table table, std::string_view chain, const Spec& spec) {
    chains[{table, chain}].tail.push_back(spec.str());
  };

  // nat KUBE-SERVICES: connections from localhost are left alone, first; the ports' rules
  // (kproxy's) come next; then upstream's set rules.
  chains[{Table::kNat, kServices}].head.push_back(
      Spec().src(isV6(family) ? "::1/128" : "127.0.0.0/8").jump("RETURN").str());

  // Upstream's ipsetWithIptablesChain, in its order.
  {
    Spec s;
    tail(Table::kNat, kPostrouting, matchSet(s, SetId::kLoopBack, "dst,dst,src").jump("MASQUERADE"));
  }
  {
    Spec s;
    tail(Table::kNat, kServices, matchSet(s, SetId::kLoadBalancer, "dst,dst").jump(kLoadBalancer));
  }
  {
    Spec s;
    tail(Table::kNat, kLoadBalancer, matchSet(s, SetId::kLoadBalancerLocal, "dst,dst").jump("RETURN"));
  }
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
  {
    Spec s;
    tail(Table::kFilter, kProxyFirewall, matchSet(s, SetId::kLoadBalancerFW, "dst,dst").jump(kSourceRangesFirewall));
  }
  for (SetId id : {SetId::kLoadBalancerSourceCIDR, SetId::kLoadBalancerSourceIP}) {
    Spec s;
    tail(Table::kFilter, kSourceRangesFirewall, matchSet(s, id, "dst,dst,src").jump("RETURN"));
  }

  // Masquerade of ClusterIP traffic: everything (masquerade-all), what does not come from the
  // node's pods, or (no pod detector) the node's connections, which leave from a VIP.
  {
    Spec s;
    if (config_.masqueradeAll) {
      matchSet(s, SetId::kClusterIP, "dst,dst");
    } else if (planConfig_.localDetector.implemented(family)) {
      const auto& detector = planConfig_.localDetector;
      using Mode = plan::LocalTrafficDetector::Mode;
      if (detector.mode == Mode::kCIDRs) {
        if (auto c = IPPrefix::parse(detector.cidrsOf(family).front())) s.src(withLength(*c), true);
      } else {
        s.in(detector.mode == Mode::kInterfaceNamePrefix ? detector.interface + "+" : detector.interface, true);
      }
      matchSet(s, SetId::kClusterIP, "dst,dst");
    } else {
      matchSet(s, SetId::kClusterIP, "src,dst");
    }
    tail(Table::kNat, kServices, s.jump(kMarkMasq));
  }
  // externalIPs: masquerade (Cluster policy), then accept what comes from off the node or is
  // for a local address.
  const std::string tag = fmt::format("{:#x}", config_.fwmarkTag());
  for (SetId id : {SetId::kExternalIP, SetId::kExternalIPLocal}) {
    if (id == SetId::kExternalIP) {
      Spec s;
      tail(Table::kNat, kServices, matchSet(s, id, "dst,dst").jump(kMarkMasq));
      // Firewall-marked connections have been marked for masquerade above (or by their
      // port's rules): their port is changed now, before the ACCEPTs below end the chain.
      tail(Table::kNat, kServices, Spec().match(fmt::format("-m mark --mark {0}/{0}", tag)).jump(kFwmarkPorts));
    }
    Spec offNode, local;
    tail(Table::kNat, kServices,
         matchSet(offNode, id, "dst,dst")
             .match("-m physdev ! --physdev-is-in")
             .match("-m addrtype ! --src-type LOCAL")
             .jump("ACCEPT"));
    tail(Table::kNat, kServices, matchSet(local, id, "dst,dst").match("-m addrtype --dst-type LOCAL").jump("ACCEPT"));
  }
  tail(Table::kNat, kServices, Spec().match("-m addrtype --dst-type LOCAL").jump(kNodePort));
  tail(Table::kNat, kLoadBalancer, Spec().jump(kMarkMasq));
  tail(Table::kFilter, kSourceRangesFirewall, Spec().jump("DROP"));
  // Upstream's acceptIPVSTraffic, last in KUBE-SERVICES.
  for (SetId id : {SetId::kClusterIP, SetId::kLoadBalancer}) {
    Spec s;
    tail(Table::kNat, kServices, matchSet(s, id, "dst,dst", false).jump("ACCEPT"));
  }

  // filter KUBE-FORWARD: forward what is marked for masquerade, and its connections.
  tail(Table::kFilter, kForward,
       Spec().comment("kubernetes forwarding rules").match(fmt::format("-m mark --mark {0}/{0}", mark)).jump("ACCEPT"));
  tail(Table::kFilter, kForward,
       Spec()
           .comment("kubernetes forwarding conntrack rule")
           .match("-m conntrack --ctstate RELATED,ESTABLISHED")
           .jump("ACCEPT"));
  {
    Spec s;
    tail(Table::kFilter, kNodePort, matchSet(s, SetId::kHealthCheckNodePort, "dst").jump("ACCEPT"));
  }
  // KUBE-IPVS-FILTER: a VIP's other ports are not the host's (upstream issue 72236).
  for (auto [id, flags] : {std::pair{SetId::kLoadBalancer, "dst,dst"}, std::pair{SetId::kClusterIP, "dst,dst"},
                           std::pair{SetId::kExternalIP, "dst,dst"}, std::pair{SetId::kExternalIPLocal, "dst,dst"},
                           std::pair{SetId::kHealthCheckNodePort, "dst"}}) {
    Spec s;
    tail(Table::kFilter, kIpvsFilter, matchSet(s, id, flags, false).jump("RETURN"));
  }
  // A firewall-marked connection was for a service port (its port was changed in nat).
  tail(Table::kFilter, kIpvsFilter, Spec().match(fmt::format("-m mark --mark {0}/{0}", tag)).jump("RETURN"));
  {
    Spec s;
    s.match("-m conntrack --ctstate NEW");
    tail(Table::kFilter, kIpvsFilter,
         matchSet(s, SetId::kIPVSIPs, "dst", false)
             .jump(isV6(family) ? "REJECT --reject-with icmp6-port-unreachable"
                                : "REJECT --reject-with icmp-port-unreachable"));
  }

  // nat KUBE-POSTROUTING / KUBE-MARK-MASQ (MARK --xor-mark / --or-mark as save prints them).
  // A packet with one of kproxy's IPVS firewall marks keeps its masquerade in the connection
  // mark (IPVS compares the whole packet mark): it comes back here.
  tail(Table::kNat, kPostrouting,
       Spec()
           .match(fmt::format("-m connmark --mark {0}/{0}", mark))
           .jump(fmt::format("MARK --set-xmark {0}/{0}", mark)));
  tail(Table::kNat, kPostrouting, Spec().match(fmt::format("-m mark ! --mark {0}/{0}", mark)).jump("RETURN"));
  tail(Table::kNat, kPostrouting, Spec().jump(fmt::format("MARK --set-xmark {}/0x0", mark)));
  tail(Table::kNat, kPostrouting,
       Spec()
           .comment("kubernetes service traffic requiring SNAT")
           .jump(config_.randomFully ? "MASQUERADE --random-fully" : "MASQUERADE"));
  tail(Table::kNat, kMarkMasq,
       Spec()
           .match(fmt::format("-m mark --mark {0}/{0}", tag))
           .jump(fmt::format("CONNMARK --set-xmark {0}/{0}", mark)));
  tail(Table::kNat, kMarkMasq, Spec().match(fmt::format("-m mark --mark {0}/{0}", tag)).jump("RETURN"));
  tail(Table::kNat, kMarkMasq, Spec().jump(fmt::format("MARK --set-xmark {0}/{0}", mark)));

  // Unallocated ClusterIPs: an address of a ServiceCIDR that no Service holds is not bound to
  // kube-ipvs0, so it is not local; new connections to it are dropped where pods' (FORWARD)
  // and the node's (OUTPUT) packets pass. A ClusterIP's unused port stays refused by the
  // kernel (the address is local, nothing listens).
  for (const auto& range : plan::serviceCIDRRanges(serviceCIDRs_, family)) {
    std::string names;
    for (const auto& n : range.names) names += (names.empty() ? "" : ",") + n;
    std::string text = "unallocated ClusterIPs of ServiceCIDR " + names;
    if (text.size() > 250) text = text.substr(0, 247) + "...";
    for (std::string_view chain : {kProxyFirewall, kIpvsOutFilter})
      tail(Table::kFilter, chain,
           Spec().dst(range.cidr).comment(text).match("-m addrtype ! --dst-type LOCAL").jump("DROP"));
  }

  for (const auto& [table, name] : kOwnedChains) g.chains.push_back(std::move(chains[{table, name}]));

  // Upstream's iptablesJumpChain, each prepended to its built-in chain.
  auto jump = [&](Table table, std::string_view builtin, std::string_view target, std::string_view text) {
    g.jumps.push_back(JumpRule{table, std::string(builtin), Spec().comment(text).jump(target).str()});
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
  return g;
}

std::string renderIptables(const IpvsRenderer& renderer, sdk::Family family, std::span<const sdk::ServicePort> ports) {
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

std::string renderIpsets(const IpvsRenderer& renderer, sdk::Family family, std::span<const sdk::ServicePort> ports) {
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
