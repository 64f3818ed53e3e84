#include "kproxy/nftables/renderer.h"
#include "kproxy/plan/options.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kproxy/backends/common/chain_names.h"

namespace kproxy::nftables {
namespace {

std::string plainBase(const sdk::ServicePort& p) {
  return fmt::format("{}/{}/{}/{}", p.ns, p.serviceName, sdk::protocolName(p.protocol), p.portName);
}

std::uint8_t ipProto(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kTCP: return 6;
    case sdk::Protocol::kUDP: return 17;
    case sdk::Protocol::kSCTP: return 132;
  }
  return 6;
}

Verdict goTo(std::string chain) { return Verdict{VerdictKind::kGoto, std::move(chain)}; }
Verdict jump(std::string chain) { return Verdict{VerdictKind::kJump, std::move(chain)}; }

Rule rule(std::vector<Statement> statements) { return Rule{std::move(statements)}; }
/// A rule that drops or rejects (or looks up a map that does) for `reason`: the tracer reports it.
Rule rule(std::vector<Statement> statements, plan::DropReason reason) {
  return Rule{std::move(statements), reason};
}

std::optional<net::Prefix> parseHostOf(std::string_view ip, net::Family family) {
  auto a = net::Prefix::parse(ip);
  if (!a || a->family != family || !a->isHost()) return std::nullopt;
  return a;
}

}  // namespace

std::string servicePortChainBase(const sdk::ServicePort& port) {
  return backends::nftablesHashAndTruncate(plainBase(port));
}
std::string serviceChainName(const sdk::ServicePort& port) {
  return "service-" + servicePortChainBase(port);
}
std::string externalChainName(const sdk::ServicePort& port) {
  return "external-" + servicePortChainBase(port);
}
std::string localChainName(const sdk::ServicePort& port) {
  return "local-" + servicePortChainBase(port);
}
std::string firewallChainName(const sdk::ServicePort& port) {
  return "firewall-" + servicePortChainBase(port);
}
std::string serviceEndpointsMap(std::uint32_t base) {
  return fmt::format("{}-{}", names::kServiceEndpointsMap, (base >> 16) % kEndpointMapShards);
}

bool inSlotLayout(std::uint32_t offset, bool end, std::uint32_t k) {
  if (k == 0 || offset > kSlotsPerRange) return false;
  // The interval whose start is at or after `offset`: i = ceil(offset · K / slots).
  const std::uint64_t i = (static_cast<std::uint64_t>(offset) * k + kSlotsPerRange - 1) / kSlotsPerRange;
  if (end ? (i < 1 || i > k) : i >= k) return false;
  return slotOffset(i, k) == offset;
}

std::string affinityChainName(const sdk::ServicePort& port) {
  return "affinity-" + servicePortChainBase(port);
}
std::string externalAffinityChainName(const sdk::ServicePort& port) {
  return "affinity-external-" + servicePortChainBase(port);
}
std::uint32_t affinityPoolId(std::uint32_t base, const sdk::ServicePort& port, plan::Pool pool) {
  // FNV-1a over the port's name and the pool, folded to 16 bits.
  std::uint32_t h = 2166136261u;
  for (unsigned char c : plainBase(port) + (pool == plan::Pool::kCluster ? "/cluster" : "/local")) {
    h ^= c;
    h *= 16777619u;
  }
  return (base & 0xffff0000u) | ((h ^ (h >> 16)) & 0xffffu);
}
std::string endpointChainName(const sdk::ServicePort& port, const sdk::Endpoint& endpoint) {
  std::string ip = endpoint.ip;
  std::replace(ip.begin(), ip.end(), ':', '.');  // ':' is not allowed in a chain name
  return "endpoint-" + backends::nftablesHashAndTruncate(fmt::format("{}__{}/{}", plainBase(port), ip, endpoint.port));
}

std::optional<std::uint32_t> SlotRanges::baseOf(const std::string& chain) {
  if (auto it = byChain_.find(chain); it != byChain_.end()) return it->second << 16;
  std::optional<std::uint32_t> index;
  while (!free_.empty() && !index) {
    std::uint32_t i = free_.back();
    free_.pop_back();
    if (!used_[i]) index = i;
  }
  while (!index && next_ < kRanges) {
    if (!used_[next_]) index = next_;
    ++next_;
  }
  if (!index) return std::nullopt;
  used_[*index] = true;
  byChain_.emplace(chain, *index);
  return *index << 16;
}

void SlotRanges::reserve(const std::string& chain, std::uint32_t base) {
  std::uint32_t index = base >> 16;
  if ((base & 0xffff) != 0 || used_[index] || byChain_.contains(chain)) return;
  used_[index] = true;
  byChain_.emplace(chain, index);
}

void SlotRanges::release(const std::string& chain) {
  auto it = byChain_.find(chain);
  if (it == byChain_.end()) return;
  released_.push_back(it->second);
  byChain_.erase(it);
}

void SlotRanges::settle() {
  for (std::uint32_t i : released_) {
    used_[i] = false;
    free_.push_back(i);
  }
  released_.clear();
}

void SlotRanges::clear() {
  byChain_.clear();
  used_.assign(kRanges, false);
  free_.clear();
  released_.clear();
  next_ = 0;
}

std::vector<SetSpec> NftablesRenderer::buildSetSpecs(net::Family family) const {
  DataType addr = family == net::Family::kIPv4 ? DataType::kIPv4Addr : DataType::kIPv6Addr;
  using DT = DataType;
  std::vector<SetSpec> out;
  out.push_back(SetSpec{names::kClusterIPsSet, {addr}, {}, false, 0, 0});
  out.push_back(SetSpec{names::kNodePortIPsSet, {addr}, {}, false, 0, 0});
  for (const char* map : {names::kServiceIPsMap, names::kNoEndpointServicesMap, names::kFirewallIPsMap})
    out.push_back(SetSpec{map, {addr, DT::kInetProto, DT::kInetService}, {DT::kVerdict}, false, 0, 0});
  for (const char* map : {names::kServiceNodePortsMap, names::kNoEndpointNodePortsMap})
    out.push_back(SetSpec{map, {DT::kInetProto, DT::kInetService}, {DT::kVerdict}, false, 0, 0});
  // Session affinity: (client, endpoint pool ID) → endpoint, filled by the data path. One map
  // per family whatever the number of services (see the class comment).
  out.push_back(SetSpec{names::kAffinityMap,
                        {addr, DT::kPoolId},
                        {addr, DT::kInetService},
                        true,
                        10800,
                        config_.affinityMapSize});
  out.push_back(SetSpec{names::kAffinityServicesMap, {addr, DT::kInetProto, DT::kInetService}, {DT::kVerdict}, false, 0, 0});
  out.push_back(SetSpec{names::kAffinityNodePortsMap, {DT::kInetProto, DT::kInetService}, {DT::kVerdict}, false, 0, 0});
  out.push_back(SetSpec{names::kHairpinSet, {addr, addr}, {}, false, 0, 0});
  for (std::uint32_t shard = 0; shard < kEndpointMapShards; ++shard) {
    SetSpec slots{serviceEndpointsMap(shard << 16), {DT::kSlot}, {addr, DT::kInetService}, false, 0, 0};
    slots.interval = true;
    out.push_back(std::move(slots));
  }
  return out;
}

GlobalObjects NftablesRenderer::renderGlobal(net::Family family, const sdk::NodeInfo& node) const {
  using namespace names;
  GlobalObjects g;
  g.family = family;
  g.sets = setSpecs(family);

  auto base = [&](const char* name, const char* type, const char* hook, int prio,
                  std::vector<Rule> rules) {
    g.chains.push_back(Chain{name, BaseHook{type, hook, prio}, std::move(rules)});
  };
  auto chain = [&](const char* name, std::vector<Rule> rules) {
    g.chains.push_back(Chain{name, std::nullopt, std::move(rules)});
  };
  auto newJump = [](const char* target) { return rule({MatchCtStateNew{}, jump(target)}); };

  // Priorities as upstream: filter chains around dstnat (-100), nat at dstnat / srcnat (100).
  // After DNAT (input, forward, output after nat-output): record session affinity.
  auto recordAffinity = rule({MatchCtStateNew{}, MatchCtStatusDnat{}, jump(kAffinityRecordChain)});
  base("filter-prerouting", "filter", "prerouting", -110, {newJump(kFirewallCheckChain)});
  base("filter-input", "filter", "input", -110,
       {newJump(kNodePortEndpointsCheckChain), newJump(kServiceEndpointsCheckChain), recordAffinity});
  base("filter-forward", "filter", "forward", -110,
       {newJump(kServiceEndpointsCheckChain), newJump(kClusterIPsCheckChain), recordAffinity});
  base("filter-output", "filter", "output", -110,
       {newJump(kServiceEndpointsCheckChain), newJump(kFirewallCheckChain)});
  base("filter-output-post-dnat", "filter", "output", -90,
       {newJump(kClusterIPsCheckChain), recordAffinity});
  base("nat-prerouting", "nat", "prerouting", -100, {rule({jump(kServicesChain)})});
  base("nat-output", "nat", "output", -100, {rule({jump(kServicesChain)})});
  // Hairpin: a pod DNAT'ed back to itself must be masqueraded, or it would answer itself.
  base("nat-postrouting", "nat", "postrouting", 100,
       {rule({MatchHairpin{kHairpinSet}, jump(kMarkMasqChain)}), rule({jump(kMasqueradingChain)})});
  {
    std::vector<Rule> rules;
    for (bool nodePorts : {false, true})
      for (std::uint8_t proto : {6, 17, 132})
        rules.push_back(rule({VmapLookupOriginal{proto, nodePorts,
                                                 nodePorts ? kAffinityNodePortsMap : kAffinityServicesMap}}));
    chain(kAffinityRecordChain, std::move(rules));
  }

  std::uint32_t mark = config_.mark();
  chain(kMasqueradingChain, {rule({MatchMarkClear{mark}, Verdict{VerdictKind::kReturn, {}}}),
                             rule({SetMark{mark, true}}), rule({Masquerade{}})});
  chain(kMarkMasqChain, {rule({SetMark{mark, false}})});
  // Where NodePorts answer: the addresses in nodeport-ips, or, when --nodeport-addresses
  // matches every local address of the family (upstream's MatchAll), any local destination
  // but loopback, as upstream.
  const sdk::NodePortAddresses nodePorts = nodePortAddresses(node);
  const net::Family sdkFamily = family == net::Family::kIPv6 ? net::Family::kIPv6 : net::Family::kIPv4;
  const bool allLocal = nodePorts.allLocal(sdkFamily);
  const net::Prefix loopback = *net::Prefix::parse(family == net::Family::kIPv4 ? "127.0.0.0/8" : "::1");
  auto nodePortDestination = [&](Statement then, plan::DropReason reason = plan::DropReason::kNone) {
    if (allLocal)
      return rule({MatchFibDestLocal{}, MatchAddress{false, true, loopback}, std::move(then)}, reason);
    return rule({MatchDestInSet{kNodePortIPsSet}, std::move(then)}, reason);
  };
  chain(kServicesChain,
        {rule({VmapLookup{true, kServiceIPsMap}}), nodePortDestination(jump(kNodePortsChain))});
  chain(kNodePortsChain, {rule({VmapLookup{false, kServiceNodePortsMap}})});
  {
    // Upstream: "Reject traffic to invalid ports of ClusterIPs", then "Drop traffic to
    // unallocated ClusterIPs" (anything else inside the family's service CIDRs).
    std::vector<Rule> rules{rule({MatchDestInSet{kClusterIPsSet}, Reject{false}}, plan::DropReason::kClusterIPPort)};
    for (const auto& range : plan::serviceCIDRRanges(serviceCIDRs_, sdkFamily))
      if (auto a = net::Prefix::parse(range.cidr); a && a->family == family)
        rules.push_back(rule({MatchAddress{false, false, *a}, Verdict{VerdictKind::kDrop, {}}},
                             plan::DropReason::kUnallocatedClusterIP));
    chain(kClusterIPsCheckChain, std::move(rules));
  }
  // The no-endpoint maps hold only the verdicts of service ports without endpoints (a drop, or
  // a goto to the reject chain, which only they go to).
  chain(kNodePortEndpointsCheckChain,
        {nodePortDestination(VmapLookup{false, kNoEndpointNodePortsMap}, plan::DropReason::kNoEndpoints)});
  chain(kServiceEndpointsCheckChain,
        {rule({VmapLookup{true, kNoEndpointServicesMap}}, plan::DropReason::kNoEndpoints)});
  chain(kFirewallCheckChain, {rule({VmapLookup{true, kFirewallIPsMap}})});
  // TCP clients get a reset, everyone else ICMP port unreachable: "connection refused" at once.
  chain(kRejectChain, {rule({MatchL4Proto{6}, Reject{true}}, plan::DropReason::kNoEndpoints),
                       rule({Reject{false}}, plan::DropReason::kNoEndpoints)});

  // nodeport-ips: the addresses NodePorts answer on (with all-local, every local address known
  // now, which session affinity's record chain looks up). No NodePorts on loopback addresses,
  // as upstream's nftables mode.
  std::set<std::string> seen;
  for (const auto& ip : nodePorts.addresses) {
    auto a = parseHostOf(ip, family);
    if (!a || loopback.contains(*a)) continue;
    KeyBuilder k;
    k.address(*a);
    if (!seen.insert(k.bytes).second) continue;
    g.elements.push_back(Element{kNodePortIPsSet, k.bytes, k.text, std::nullopt});
  }
  return g;
}

sdk::NodePortAddresses NftablesRenderer::nodePortAddresses(const sdk::NodeInfo& node) const {
  return plan::nodePortAddressesOf(node, config_.common.nodePortAddresses, config_.common.nodeIPs);
}

void NftablesRenderer::setNode(const sdk::NodeInfo& node) {
  plan::applyNode(planConfig_, config_.common.detectLocalMode, node, config_.common.nodeIPs);
}

plan::PlanConfig NftablesRenderer::planConfigOf(const RenderConfig& config) {
  return plan::planConfigOf(config.common);
}

std::vector<std::vector<Statement>> podTrafficMatches(const plan::LocalTrafficDetector& detector,
                                                      net::Family family, bool negate) {
  std::vector<std::vector<Statement>> out;
  if (!detector.implemented(family)) return out;
  using Mode = plan::LocalTrafficDetector::Mode;
  if (detector.mode != Mode::kCIDRs) {
    out.push_back({MatchInputInterface{detector.interface, detector.mode == Mode::kInterfaceNamePrefix, negate}});
    return out;
  }
  // Pod traffic is from any of the CIDRs (a rule each); other traffic is from none (one rule).
  std::vector<Statement> none;
  for (const auto& cidr : detector.cidrsOf(family)) {
    auto a = net::Prefix::parse(cidr);
    if (!a) continue;
    if (negate)
      none.push_back(MatchAddress{true, true, *a});
    else
      out.push_back({MatchAddress{true, false, *a}});
  }
  if (negate && !none.empty()) out.push_back(std::move(none));
  return out;
}

namespace {

/// One renderServicePort call: the port's plan, the fragment it fills and what the steps
/// share (its balancing chains, their affinity pool IDs, the record chains).
class ServicePortRender {
 public:
  ServicePortRender(const NftablesRenderer& renderer, const sdk::ServicePort& port)
      : renderer_(renderer),
        p_(port),
        plan_(plan::planServicePort(port, renderer.planConfig())),
        fam_(port.family),
        proto_(ipProto(port.protocol)),
        port_(static_cast<std::uint16_t>(port.port)),
        slotRanges_(renderer.slots(fam_)) {
    f_.family = fam_;
    f_.key = port.key;
  }

  /// Whether this table dispatches the port's ClusterIP (RenderConfig::clusterIPSteeredElsewhere).
  bool dispatch() const { return renderer_.config().dispatchesClusterIP(p_.protocol); }

  Fragment render() {
    addHairpins();
    renderBalancingChains();
    renderClusterIP();
    if (!plan_.externallyAccessible) {
      slotRanges_.release(named("external-"));
      return std::move(f_);
    }
    renderExternalChain();
    renderExternalRecordChain();
    addExternalAddresses();
    addNodePort();
    renderFirewall();
    return std::move(f_);
  }

 private:
  /// The port's chain name with `prefix`: every name of the port shares one hashed base, made
  /// once per render (a hash per name was a tenth of a 100,000-service render).
  std::string named(const char* prefix) {
    if (base_.empty()) base_ = servicePortChainBase(p_);
    return prefix + base_;
  }

  /// Hairpin pairs: every endpoint a balancing chain of this port may pick. Without ClusterIP
  /// dispatch (ebpf mode's part) a port with no external entry point has no balancing chain
  /// here, so it has no pairs either: a steered socket is never DNAT'ed, and a pod that reaches
  /// itself keeps its own address.
  void addHairpins() {
    if (!dispatch() && !plan_.externallyAccessible) return;
    std::set<std::string> hairpins;
    for (auto pool : {plan::Pool::kCluster, plan::Pool::kLocal}) {
      if (!(pool == plan::Pool::kCluster ? plan_.usesClusterPool : plan_.usesLocalPool)) continue;
      for (const auto& ep : plan_.endpointsOf(pool)) {
        auto addr = parseHostOf(ep.ip, fam_);
        if (!addr) continue;  // another family or malformed: the core should not send it
        KeyBuilder k;
        k.address(*addr).address(*addr);
        if (hairpins.insert(k.bytes).second)
          f_.elements.push_back(Element{names::kHairpinSet, k.bytes, k.text, std::nullopt, {}, {}, false});
      }
    }
  }

  // Session affinity keys carry the ID of the endpoint pool that chose the endpoint: every
  // chain that balances a pool looks a client up under that pool's ID, so all the addresses
  // that lead to a pool share the client's endpoint (as upstream's per-endpoint sets do), and
  // a pool never hands out another pool's endpoint (eTP=Local: never a remote one). A pool's
  // ID comes from its first balancing chain's slot range (see affinityPoolId).

  /// Affinity hit first, then the endpoint by slot. False when there is nothing to balance
  /// over (or, beyond 65,536 balancing chains in a family, no range is left).
  bool appendBalancing(Chain& c, std::span<const sdk::Endpoint> eps, plan::Pool pool) {
    std::vector<std::pair<net::Prefix, std::uint16_t>> targets;
    for (const auto& ep : eps)
      if (auto addr = parseHostOf(ep.ip, fam_)) targets.emplace_back(*addr, static_cast<std::uint16_t>(ep.port));
    if (targets.empty()) {
      slotRanges_.release(c.name);  // a chain that no longer balances frees its range
      return false;
    }
    auto base = slotRanges_.baseOf(c.name);
    if (!base) {
      f_.problems.push_back(fmt::format(
          "all {} endpoint slot ranges of this family are in use; {} is treated as having no endpoints",
          SlotRanges::kRanges, c.name));
      return false;
    }
    if (plan_.affinity) {
      auto& id = poolIds_[pool == plan::Pool::kCluster ? 0 : 1];
      if (!id) id = affinityPoolId(*base, p_, pool);
      poolIdOfChain_[c.name] = *id;
      c.rules.push_back(rule({MatchL4Proto{proto_}, DnatFromAffinity{names::kAffinityMap, *id}}));
    }
    const std::string map = serviceEndpointsMap(*base);
    c.rules.push_back(rule({MatchL4Proto{proto_}, DnatFromSlots{map, *base}}));
    addSlotLayout(map, *base, targets);
    return true;
  }

  /// The K endpoints split the range at `base` into K intervals, each an element pair.
  void addSlotLayout(const std::string& map, std::uint32_t base,
                     const std::vector<std::pair<net::Prefix, std::uint16_t>>& targets) {
    const auto k = static_cast<std::uint64_t>(targets.size());
    auto slotKey = [&](std::uint64_t i) { return base + slotOffset(i, k); };
    for (std::uint64_t i = 0; i < k; ++i) {
      std::uint32_t first = slotKey(i);
      std::uint32_t end = i + 1 == k ? base + kSlotsPerRange : slotKey(i + 1);
      KeyBuilder start;
      start.slot(first);
      KeyBuilder data;
      data.address(targets[i].first).port(targets[i].second);
      f_.elements.push_back(Element{map,
                                    start.bytes + intervalIdentity(false, static_cast<std::uint32_t>(k)),
                                    fmt::format("{}-{}", first, end - 1), std::nullopt, data.bytes,
                                    data.text, false, kIntervalIdentitySize});
      KeyBuilder stop;
      stop.slot(end);
      f_.elements.push_back(Element{map,
                                    stop.bytes + intervalIdentity(true, static_cast<std::uint32_t>(k)),
                                    stop.text, std::nullopt, {}, {}, true, kIntervalIdentitySize});
    }
  }

  void addMapElement(const char* map, const net::Prefix& a, Verdict v) {
    KeyBuilder k;
    k.address(a).proto(proto_).port(port_);
    f_.elements.push_back(Element{map, k.bytes, k.text, std::move(v)});
  }
  static Verdict noEndpointVerdict(plan::NoEndpoints what) {
    return what == plan::NoEndpoints::kReject ? goTo(names::kRejectChain) : Verdict{VerdictKind::kDrop, {}};
  }

  // The pools: `service-…` balances the cluster pool, `local-…` the local pool of internal
  // traffic (internalTrafficPolicy Local), as upstream names them. ClusterIP traffic from
  // outside the node's pods is masqueraded in the internal chain (masquerade-all: all traffic
  // to the ClusterIP, which leaves the eTP=Local short-circuit alone).
  void internalMasquerade(Chain& c) {
    switch (plan_.internalMasquerade) {
      case plan::InternalMasquerade::kNone: break;
      case plan::InternalMasquerade::kAll:
        if (auto cip = parseHostOf(plan_.clusterIP, fam_))
          c.rules.push_back(rule({MatchAddress{false, false, *cip}, jump(names::kMarkMasqChain)}));
        break;
      case plan::InternalMasquerade::kNotLocal:
        for (auto st : podTrafficMatches(renderer_.planConfig().localDetector, p_.family, true)) {
          st.push_back(jump(names::kMarkMasqChain));
          c.rules.push_back(rule(std::move(st)));
        }
        break;
    }
  }
  std::string balancingChain(std::string name, std::span<const sdk::Endpoint> eps, plan::Pool pool, bool internal) {
    Chain c{std::move(name), std::nullopt, {}};
    if (internal) internalMasquerade(c);
    if (!appendBalancing(c, eps, pool)) return std::string();
    std::string out = c.name;
    f_.chains.push_back(std::move(c));
    return out;
  }
  void renderBalancingChains() {
    const bool dispatch = this->dispatch();
    // Without ClusterIP dispatch, the cluster pool's chain serves the external chain only.
    if (plan_.usesClusterPool && (dispatch || plan_.externallyAccessible))
      clusterChain_ = balancingChain(named("service-"), plan_.clusterEndpoints, plan::Pool::kCluster,
                                     plan_.internalPool == plan::Pool::kCluster);
    else
      slotRanges_.release(named("service-"));
    if (dispatch && plan_.usesLocalPool && plan_.internalPool == plan::Pool::kLocal)
      localChain_ = balancingChain(named("local-"), plan_.localEndpoints, plan::Pool::kLocal, true);
    else
      slotRanges_.release(named("local-"));
  }

  /// Internal traffic: the ClusterIP, and its affinity record chain.
  void renderClusterIP() {
    const std::string& internalChain = plan_.internalPool == plan::Pool::kCluster ? clusterChain_ : localChain_;
    clusterIP_ = parseHostOf(plan_.clusterIP, fam_);
    if (clusterIP_) {
      KeyBuilder k;
      k.address(*clusterIP_);
      f_.elements.push_back(Element{names::kClusterIPsSet, k.bytes, k.text, std::nullopt});
      if (!dispatch()) return;
      if (!internalChain.empty())
        addMapElement(names::kServiceIPsMap, *clusterIP_, goTo(internalChain));
      else
        addMapElement(names::kNoEndpointServicesMap, *clusterIP_,
                      noEndpointVerdict(plan_.hasEndpoints ? plan::NoEndpoints::kDrop : plan::NoEndpoints::kReject));
    }
    if (clusterIP_ && !internalChain.empty()) internalRecord_ = recordRules(internalChain);
    if (!internalRecord_.empty()) {
      f_.chains.push_back(Chain{named("affinity-"), std::nullopt, internalRecord_});
      addMapElement(names::kAffinityServicesMap, *clusterIP_, goTo(named("affinity-")));
    }
  }

  // Session affinity is recorded after DNAT (only then is the endpoint known) by a chain of
  // the service port's own, which knows its timeout; the filter hooks reach it through
  // affinity-services / affinity-nodeports by the address the connection was sent to. It must
  // record under the ID of the pool that chose the endpoint, so it replays the conditions of
  // the chain that address's dispatch goes to (the eTP=Local short-circuit: pods and the node
  // use the cluster pool). Those conditions look at the source only, which DNAT keeps.
  std::vector<Rule> recordRules(const std::string& dispatched) {
    std::vector<Rule> out;
    const Chain* c = nullptr;
    for (const auto& ch : f_.chains)
      if (ch.name == dispatched) c = &ch;
    if (c == nullptr || !plan_.affinity) return out;
    for (const auto& r : c->rules) {
      std::vector<Statement> conditions;
      std::optional<std::uint32_t> id;
      bool replayable = true;
      for (const auto& st : r.statements) {
        if (const auto* v = std::get_if<Verdict>(&st)) {
          if (auto it = poolIdOfChain_.find(v->chain); v->kind == VerdictKind::kGoto && it != poolIdOfChain_.end())
            id = it->second;
        } else if (std::holds_alternative<DnatFromSlots>(st)) {
          if (auto it = poolIdOfChain_.find(c->name); it != poolIdOfChain_.end()) id = it->second;
        } else if (const auto* a = std::get_if<MatchAddress>(&st); a != nullptr && a->source) {
          conditions.push_back(st);
        } else if (std::holds_alternative<MatchInputInterface>(st) || std::holds_alternative<MatchFibSourceLocal>(st)) {
          conditions.push_back(st);
        } else if (!std::holds_alternative<MatchL4Proto>(st)) {
          replayable = false;
        }
      }
      if (!id) continue;
      if (!replayable) {
        f_.problems.push_back(fmt::format("session affinity of {} is not recorded: a rule of it cannot be replayed "
                                          "after DNAT",
                                          c->name));
        break;
      }
      const bool unconditional = conditions.empty();
      conditions.push_back(RecordAffinity{proto_, names::kAffinityMap, plan_.affinityTimeoutSeconds, *id});
      if (!unconditional) conditions.push_back(Verdict{VerdictKind::kReturn, {}});
      out.push_back(rule(std::move(conditions)));
      if (unconditional) break;  // nothing after it is reached
    }
    return out;
  }

  // External traffic: NodePort, externalIPs, LoadBalancer ingress IPs. The external chain
  // exists whenever the service has endpoints somewhere: with eTP=Local and no local
  // endpoint it still sends the node and its pods to the cluster pool, and drops the rest.
  void renderExternalChain() {
    if (!plan_.capturesExternal) {
      slotRanges_.release(named("external-"));
      return;
    }
    Chain c{named("external-"), std::nullopt, {}};
    bool balanced = false;
    if (plan_.externalMasqueradeAll) {
      c.rules.push_back(rule({jump(names::kMarkMasqChain)}));
      if (!clusterChain_.empty()) c.rules.push_back(rule({goTo(clusterChain_)}));
      slotRanges_.release(c.name);
    } else {
      if (!clusterChain_.empty()) {
        if (plan_.shortCircuitPods)
          for (auto st : podTrafficMatches(renderer_.planConfig().localDetector, p_.family, false)) {
            st.push_back(goTo(clusterChain_));
            c.rules.push_back(rule(std::move(st)));
          }
        if (plan_.shortCircuitNode) {
          c.rules.push_back(rule({MatchFibSourceLocal{}, jump(names::kMarkMasqChain)}));
          c.rules.push_back(rule({MatchFibSourceLocal{}, goTo(clusterChain_)}));
        }
      }
      if (plan_.hasExternalEndpoints) balanced = appendBalancing(c, plan_.localEndpoints, plan::Pool::kLocal);
      else slotRanges_.release(c.name);
      // Anything not short-circuited meets the drop here, at DNAT: a filter-stage drop would
      // also catch the node's own connections before their short-circuit.
      if (!balanced) c.rules.push_back(rule({Verdict{VerdictKind::kDrop, {}}}, plan::DropReason::kNoLocalEndpoints));
    }
    extChain_ = c.name;
    f_.chains.push_back(std::move(c));
  }

  /// External addresses share the ClusterIP's record chain when they record the same way.
  void renderExternalRecordChain() {
    if (extChain_.empty()) return;
    std::vector<Rule> externalRecord = recordRules(extChain_);
    if (!externalRecord.empty() && externalRecord == internalRecord_) {
      externalRecordChain_ = named("affinity-");
    } else if (!externalRecord.empty()) {
      externalRecordChain_ = named("affinity-external-");
      f_.chains.push_back(Chain{externalRecordChain_, std::nullopt, std::move(externalRecord)});
    }
  }

  void addExternalAddresses() {
    std::vector<net::Prefix> externalAddrs;
    for (const auto* list : {&plan_.externalIPs, &plan_.loadBalancerIPs})
      for (const auto& ip : *list)
        if (auto a = parseHostOf(ip, fam_)) externalAddrs.push_back(*a);
    for (const auto& a : externalAddrs) {
      if (!extChain_.empty()) {
        addMapElement(names::kServiceIPsMap, a, goTo(extChain_));
        if (!externalRecordChain_.empty()) addMapElement(names::kAffinityServicesMap, a, goTo(externalRecordChain_));
      } else {
        addMapElement(names::kNoEndpointServicesMap, a, noEndpointVerdict(plan::NoEndpoints::kReject));
      }
    }
  }

  void addNodePort() {
    if (plan_.nodePort == 0) return;
    KeyBuilder k;
    k.proto(proto_).port(static_cast<std::uint16_t>(plan_.nodePort));
    if (!extChain_.empty()) {
      f_.elements.push_back(Element{names::kServiceNodePortsMap, k.bytes, k.text, goTo(extChain_)});
      if (!externalRecordChain_.empty())
        f_.elements.push_back(Element{names::kAffinityNodePortsMap, k.bytes, k.text, goTo(externalRecordChain_)});
    } else {
      f_.elements.push_back(Element{names::kNoEndpointNodePortsMap, k.bytes, k.text,
                                    noEndpointVerdict(plan::NoEndpoints::kReject)});
    }
  }

  /// loadBalancerSourceRanges: rules in one firewall chain per service port, no set.
  void renderFirewall() {
    if (!plan_.usesFirewall) return;
    Chain c{named("firewall-"), std::nullopt, {}};
    for (const auto& source : plan_.firewallAllowedSources)
      if (auto a = net::Prefix::parse(source); a && a->family == fam_)
        c.rules.push_back(rule({MatchAddress{true, false, *a}, Verdict{VerdictKind::kReturn, {}}}));
    c.rules.push_back(rule({Verdict{VerdictKind::kDrop, {}}}, plan::DropReason::kSourceRange));
    for (const auto& ip : plan_.loadBalancerIPs)
      if (auto a = parseHostOf(ip, fam_)) addMapElement(names::kFirewallIPsMap, *a, goTo(c.name));
    f_.chains.push_back(std::move(c));
  }

  const NftablesRenderer& renderer_;
  const sdk::ServicePort& p_;
  const plan::ServicePortPlan plan_;
  const net::Family fam_;
  const std::uint8_t proto_;
  const std::uint16_t port_;
  SlotRanges& slotRanges_;
  Fragment f_;
  std::optional<std::uint32_t> poolIds_[2];  ///< per pool (cluster, local), once it has a chain
  std::map<std::string, std::uint32_t> poolIdOfChain_;
  std::string clusterChain_, localChain_;  ///< the balancing chains ("": none)
  std::optional<net::Prefix> clusterIP_;
  std::vector<Rule> internalRecord_;  ///< the ClusterIP's affinity record rules
  std::string extChain_;              ///< "": external addresses have no chain
  std::string externalRecordChain_;   ///< "": external addresses record no affinity
  std::string base_;                  ///< named()'s hashed base, once made
};

}  // namespace

Fragment NftablesRenderer::renderServicePort(const sdk::ServicePort& p) const {
  return ServicePortRender(*this, p).render();
}

sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, "nftables");
  if (!common) return std::unexpected(common.error());
  RenderConfig cfg;
  cfg.common = std::move(*common);
  return cfg;
}

}  // namespace kproxy::nftables
