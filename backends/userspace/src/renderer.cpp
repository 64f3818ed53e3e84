#include "kproxy/userspace/renderer.h"

#include <map>
#include <set>
#include <string>

#include <fmt/format.h>

#include "kproxy/nftables/renderer.h"

namespace kproxy::userspace {

using namespace nftables;

namespace {

constexpr std::string_view kServices = "services";
constexpr std::string_view kNodePorts = "nodeports";
constexpr std::string_view kShortCircuit = "shortcircuit";
constexpr std::string_view kShortCircuitNodePorts = "shortcircuit-nodeports";
constexpr std::string_view kRejectChain = "reject-chain";
constexpr std::string_view kClusterIPs = "cluster-ips";
constexpr std::string_view kNodePortIPs = "nodeport-ips";
/// nft's dstnat priority: after conntrack, where DNAT belongs.
constexpr std::int32_t kDstNat = -100;

Statement notLoopback(net::Family family) {
  return MatchAddress{false, true, *net::Prefix::parse(family == net::Family::kIPv4 ? "127.0.0.0/8" : "::1")};
}

}  // namespace

std::string redirectChainName(std::uint8_t proto, std::uint16_t listenerPort) {
  return fmt::format("redirect-{}-{}", protoName(proto), listenerPort);
}

std::vector<SetSpec> userspaceSetSpecs(net::Family family) {
  const DataType addr = family == net::Family::kIPv4 ? DataType::kIPv4Addr : DataType::kIPv6Addr;
  std::vector<SetSpec> out;
  for (auto name : {kServices, kShortCircuit})
    out.push_back(SetSpec{std::string(name), {addr, DataType::kInetProto, DataType::kInetService}, {DataType::kVerdict}});
  for (auto name : {kNodePorts, kShortCircuitNodePorts})
    out.push_back(SetSpec{std::string(name), {DataType::kInetProto, DataType::kInetService}, {DataType::kVerdict}});
  out.push_back(SetSpec{std::string(kClusterIPs), {addr}, {}});
  out.push_back(SetSpec{std::string(kNodePortIPs), {addr}, {}});
  return out;
}

RenderedTable renderUserspaceTable(net::Family family, const std::vector<RedirectEntry>& entries,
                                   const std::vector<std::vector<Statement>>& podMatches,
                                   const std::optional<std::vector<net::Prefix>>& nodePortAddresses,
                                   const std::vector<net::Prefix>& serviceCIDRs) {
  RenderedTable t;
  t.sets = userspaceSetSpecs(family);

  auto lookups = [&](std::vector<Statement> prefix, bool shortCircuit) {
    std::vector<Rule> rules;
    std::vector<Statement> address = prefix;
    address.push_back(VmapLookup{true, std::string(shortCircuit ? kShortCircuit : kServices)});
    rules.push_back(Rule{std::move(address)});
    std::vector<Statement> nodePort = std::move(prefix);
    if (nodePortAddresses) {
      nodePort.push_back(MatchDestInSet{std::string(kNodePortIPs)});
    } else {
      nodePort.push_back(notLoopback(family));
      nodePort.push_back(MatchFibDestLocal{});
    }
    nodePort.push_back(VmapLookup{false, std::string(shortCircuit ? kShortCircuitNodePorts : kNodePorts)});
    rules.push_back(Rule{std::move(nodePort)});
    return rules;
  };

  Chain prerouting{"prerouting", BaseHook{"nat", "prerouting", kDstNat}, {}};
  for (const auto& m : podMatches)
    for (auto& r : lookups(m, true)) prerouting.rules.push_back(std::move(r));
  for (auto& r : lookups({}, false)) prerouting.rules.push_back(std::move(r));
  Chain output{"output", BaseHook{"nat", "output", kDstNat}, {}};
  for (auto& r : lookups({}, true)) output.rules.push_back(std::move(r));
  for (auto& r : lookups({}, false)) output.rules.push_back(std::move(r));
  // The reject chain is shared: its own tags say why the services map sends a port there (no
  // endpoints); this goto's tag, which wins over them, says why a ClusterIP's other port is.
  const Rule otherPorts{{MatchDestInSet{std::string(kClusterIPs)}, Verdict{VerdictKind::kGoto, std::string(kRejectChain)}},
                        plan::DropReason::kClusterIPPort};
  const Rule check{{Verdict{VerdictKind::kJump, names::kClusterIPsCheckChain}}};
  for (Chain* base : {&prerouting, &output}) {
    base->rules.push_back(otherPorts);
    base->rules.push_back(check);
  }
  Chain clusterIPsCheck{names::kClusterIPsCheckChain, std::nullopt, {}};
  for (const auto& cidr : serviceCIDRs)
    if (cidr.family == family) clusterIPsCheck.rules.push_back(Rule{{MatchAddress{false, false, cidr}, Verdict{VerdictKind::kDrop, {}}},
                                            plan::DropReason::kUnallocatedClusterIP});
  Chain reject{std::string(kRejectChain), std::nullopt,
               {Rule{{MatchL4Proto{6}, Reject{true}}, plan::DropReason::kNoEndpoints},
                Rule{{Reject{false}}, plan::DropReason::kNoEndpoints}}};
  t.chains.push_back(std::move(prerouting));
  t.chains.push_back(std::move(output));
  t.chains.push_back(std::move(reject));
  t.chains.push_back(std::move(clusterIPsCheck));

  std::set<std::pair<std::uint8_t, std::uint16_t>> listeners;
  std::set<std::string> seen;
  std::set<std::string> firewalls;
  if (nodePortAddresses)
    for (const auto& a : *nodePortAddresses) {
      if (a.family != family || !a.isHost()) continue;
      KeyBuilder ip;
      ip.address(a);
      if (seen.insert(std::string(kNodePortIPs) + '\0' + ip.bytes).second)
        t.elements.push_back(Element{std::string(kNodePortIPs), std::move(ip.bytes), std::move(ip.text), std::nullopt});
    }
  for (const auto& e : entries) {
    if (e.address && e.address->family != family) continue;
    if (e.address && e.clusterIP) {
      KeyBuilder ip;
      ip.address(*e.address);
      if (seen.insert(std::string(kClusterIPs) + '\0' + ip.bytes).second)
        t.elements.push_back(Element{std::string(kClusterIPs), std::move(ip.bytes), std::move(ip.text), std::nullopt});
    }
    const std::string_view set = e.address ? (e.shortCircuit ? kShortCircuit : kServices)
                                           : (e.shortCircuit ? kShortCircuitNodePorts : kNodePorts);
    KeyBuilder key;
    if (e.address) key.address(*e.address);
    key.proto(e.proto).port(e.port);
    if (!seen.insert(std::string(set) + '\0' + key.bytes).second) continue;
    Verdict verdict;
    plan::DropReason reason = plan::DropReason::kNone;
    switch (e.action.kind) {
      case RedirectAction::Kind::kListener:
        verdict = Verdict{VerdictKind::kGoto, redirectChainName(e.proto, e.action.listenerPort)};
        listeners.emplace(e.proto, e.action.listenerPort);
        if (!e.allowedSources.empty()) {
          // One firewall per listener: a service port's LoadBalancer IPs share its ranges.
          const std::string name = fmt::format("firewall-{}-{}", protoName(e.proto), e.action.listenerPort);
          if (firewalls.insert(name).second) {
            Chain fw{name, std::nullopt, {}};
            for (const auto& source : e.allowedSources)
              if (source.family == family) fw.rules.push_back(Rule{{MatchAddress{true, false, source}, verdict}});
            fw.rules.push_back(Rule{{Verdict{VerdictKind::kDrop, {}}}, plan::DropReason::kSourceRange});
            t.chains.push_back(std::move(fw));
          }
          verdict = Verdict{VerdictKind::kGoto, name};
        }
        break;
      case RedirectAction::Kind::kReject: verdict = Verdict{VerdictKind::kGoto, std::string(kRejectChain)}; break;
      case RedirectAction::Kind::kDrop:
        // The plan drops only traffic of a Local policy that has no local endpoint.
        verdict = Verdict{VerdictKind::kDrop, {}};
        reason = plan::DropReason::kNoLocalEndpoints;
        break;
    }
    Element element{std::string(set), std::move(key.bytes), std::move(key.text), verdict};
    element.reason = reason;
    t.elements.push_back(std::move(element));
  }
  for (const auto& [proto, port] : listeners)
    t.chains.push_back(Chain{redirectChainName(proto, port), std::nullopt, {Rule{{MatchL4Proto{proto}, RedirectTo{port}}}}});
  return t;
}

}  // namespace kproxy::userspace
