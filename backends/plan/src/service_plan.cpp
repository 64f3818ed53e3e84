#include "kproxy/plan/service_plan.h"

#include <algorithm>
#include <tuple>

#include "kproxy/net/ip.h"

namespace kproxy::plan {
namespace {

using net::Prefix;

bool ofFamily(const net::Prefix& p, net::Family family) { return p.v6() == (family == net::Family::kIPv6); }

/// The host addresses of `family` among `ips`, in order, each once, as written.
std::vector<std::string> hostsOf(const std::vector<std::string>& ips, net::Family family) {
  std::vector<std::string> out;
  for (const auto& ip : ips) {
    auto p = net::Prefix::parse(ip);
    if (!p || !p->isHost() || !ofFamily(*p, family)) continue;
    if (std::find(out.begin(), out.end(), ip) == out.end()) out.push_back(ip);
  }
  return out;
}

}  // namespace

bool LocalTrafficDetector::implemented(net::Family family) const {
  switch (mode) {
    case Mode::kNone: return false;
    case Mode::kCIDRs: return !cidrsOf(family).empty();
    case Mode::kBridgeInterface:
    case Mode::kInterfaceNamePrefix: return !interface.empty();
  }
  return false;
}

std::vector<std::string> LocalTrafficDetector::cidrsOf(net::Family family) const {
  std::vector<std::string> out;
  if (mode != Mode::kCIDRs) return out;
  for (const auto& c : cidrs)
    if (auto p = net::Prefix::parse(c); p && ofFamily(*p, family)) out.push_back(c);
  return out;
}

bool ServicePortPlan::poolsEqual() const {
  return std::equal(clusterEndpoints.begin(), clusterEndpoints.end(), localEndpoints.begin(),
                    localEndpoints.end());
}

ServicePortPlan planServicePort(const sdk::ServicePort& port, const PlanConfig& config) {
  ServicePortPlan plan;
  const net::Family family = port.family;
  plan.externalIPs = hostsOf(port.externalIPs, family);
  plan.loadBalancerIPs = hostsOf(port.loadBalancerIPs, family);
  plan.nodePort = port.nodePort;
  if (auto cip = hostsOf({port.clusterIP}, family); !cip.empty()) plan.clusterIP = cip.front();
  plan.externallyAccessible = plan.nodePort != 0 || !plan.externalIPs.empty() || !plan.loadBalancerIPs.empty();

  // The pools, as upstream's CategorizeEndpoints leaves them: cluster endpoints are needed
  // by Cluster policy and, for any externally reachable port, by the short-circuit.
  const bool internalLocal = port.internalPolicyLocal;
  const bool externalLocal = port.externalPolicyLocal && plan.externallyAccessible;
  const bool usesCluster = !internalLocal || plan.externallyAccessible;
  const bool usesLocal = internalLocal || externalLocal;
  if (usesCluster) plan.clusterEndpoints = port.clusterEndpoints;
  if (usesLocal) plan.localEndpoints = port.localEndpoints;
  plan.usesClusterPool = usesCluster && !plan.clusterEndpoints.empty();
  plan.usesLocalPool = usesLocal && !plan.localEndpoints.empty();
  plan.hasEndpoints = port.hasAnyEndpoints;

  // Internal traffic.
  plan.internalPool = internalLocal ? Pool::kLocal : Pool::kCluster;
  plan.hasInternalEndpoints = plan.hasEndpoints && !plan.endpointsOf(plan.internalPool).empty();
  if (!plan.hasInternalEndpoints)
    plan.internalNoEndpoints = plan.hasEndpoints ? NoEndpoints::kDrop : NoEndpoints::kReject;
  if (config.masqueradeAll)
    plan.internalMasquerade = InternalMasquerade::kAll;
  else if (config.localDetector.implemented(family))
    plan.internalMasquerade = InternalMasquerade::kNotLocal;

  // External traffic.
  if (plan.externallyAccessible) {
    plan.capturesExternal = plan.hasEndpoints;
    plan.externalPool = externalLocal ? Pool::kLocal : Pool::kCluster;
    plan.hasExternalEndpoints = plan.hasEndpoints && !plan.endpointsOf(plan.externalPool).empty();
    if (!plan.hasExternalEndpoints)
      plan.externalNoEndpoints = plan.hasEndpoints ? NoEndpoints::kDrop : NoEndpoints::kReject;
    plan.externalMasqueradeAll = !externalLocal;
    plan.shortCircuitPods = externalLocal && plan.usesClusterPool && config.localDetector.implemented(family);
    plan.shortCircuitNode = externalLocal && plan.usesClusterPool;
  }

  // loadBalancerSourceRanges: only LoadBalancer IPs are filtered, NodePorts never (upstream).
  std::vector<net::Prefix> ranges;
  for (const auto& r : port.loadBalancerSourceRanges)
    if (auto p = net::Prefix::parse(r); p && ofFamily(*p, family)) {
      ranges.push_back(*p);
      plan.firewallAllowedSources.push_back(p->toString());
    }
  plan.usesFirewall = !ranges.empty() && !plan.loadBalancerIPs.empty();
  if (!plan.usesFirewall) {
    plan.firewallAllowedSources.clear();
  } else {
    bool allowNode = false;
    for (const auto& ip : config.nodeIPs)
      if (auto host = net::Prefix::parse(ip); host && host->isHost())
        for (const auto& r : ranges) allowNode = allowNode || r.contains(*host);
    if (allowNode)
      for (const auto& lb : plan.loadBalancerIPs) plan.firewallAllowedSources.push_back(lb);
  }

  plan.affinity = port.sessionAffinityClientIP;
  if (plan.affinity)
    plan.affinityTimeoutSeconds = port.stickyMaxAgeSeconds > 0
                                      ? static_cast<std::uint32_t>(port.stickyMaxAgeSeconds)
                                      : kDefaultAffinityTimeoutSeconds;
  return plan;
}

std::vector<ServiceCIDRRange> serviceCIDRRanges(std::span<const sdk::ServiceCIDR> cidrs, net::Family family) {
  std::vector<std::pair<net::Prefix, std::string>> parsed;
  for (const auto& c : cidrs)
    if (auto p = net::Prefix::parse(c.cidr); p && ofFamily(*p, family)) parsed.emplace_back(*p, c.name);
  // Wider prefixes first, so a range is known before the ranges inside it.
  std::sort(parsed.begin(), parsed.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.length, a.first.bytes, a.second) < std::tie(b.first.length, b.first.bytes, b.second);
  });
  std::vector<std::pair<net::Prefix, ServiceCIDRRange>> out;
  for (auto& [prefix, name] : parsed) {
    auto outer = std::find_if(out.begin(), out.end(), [&](const auto& o) { return o.first.contains(prefix); });
    if (outer == out.end()) outer = out.insert(out.end(), {prefix, ServiceCIDRRange{prefix.toString(), {}}});
    auto& names = outer->second.names;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first.bytes < b.first.bytes; });
  std::vector<ServiceCIDRRange> ranges;
  for (auto& [prefix, range] : out) ranges.push_back(std::move(range));
  return ranges;
}

}  // namespace kproxy::plan
