#include "resolve.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstring>
#include <map>

#include "kproxy/core/log.h"

namespace kproxy::core::resolve {
namespace {

std::string serviceName(const Service& service) { return service.ns + "/" + service.name; }

// Process-wide: "family X is disabled" is said once at v=0, then per service only at v=4.
std::atomic<bool> gLoggedFamilyDisabled[2];

bool familyEnabled(net::Family family, const TrackerConfig& config) {
  return family == net::Family::kIPv4 ? config.ipv4 : config.ipv6;
}

void logFamilyDisabled(const Service& service, net::Family family) {
  auto& once = gLoggedFamilyDisabled[family == net::Family::kIPv4 ? 0 : 1];
  if (!once.exchange(true)) {
    log::info(0, "IP family disabled on this node; its service ports are not programmed",
              {{"family", toString(family)}});
  }
  log::info(4, "Skipping service cluster IP of a disabled family",
            {{"service", serviceName(service)}, {"family", toString(family)}});
}

bool externallyAccessibleService(const Service& service) {
  return service.type == ServiceType::kLoadBalancer || service.type == ServiceType::kNodePort ||
         (service.type == ServiceType::kClusterIP && !service.externalIPs.empty());
}

bool hasHint(const std::vector<std::string>& hints, const std::string& value) {
  return std::find(hints.begin(), hints.end(), value) != hints.end();
}

bool endpointLess(const Endpoint& a, const Endpoint& b) {
  if (a.ip != b.ip) return a.ip < b.ip;
  return a.port < b.port;
}

enum class TopologyMode { kNone, kPreferSameZone, kPreferSameNode };

TopologyMode topologyModeFromHints(const ServicePortState& port,
                                   const std::vector<EndpointCandidate>& endpoints,
                                   const std::string& nodeName, const std::string& zone) {
  bool hasReady = false;
  bool hasForNode = false;
  bool allHaveNodeHints = true;
  bool hasForZone = false;
  bool allHaveZoneHints = true;
  for (const auto& c : endpoints) {
    if (!c.endpoint.ready) continue;
    hasReady = true;
    if (c.nodeHints.empty()) {
      allHaveNodeHints = false;
    } else if (hasHint(c.nodeHints, nodeName)) {
      hasForNode = true;
    }
    if (c.zoneHints.empty()) {
      allHaveZoneHints = false;
    } else if (hasHint(c.zoneHints, zone)) {
      hasForZone = true;
    }
  }
  if (!hasReady) return TopologyMode::kNone;
  // Node hints are here only with PreferSameTrafficDistribution on (gatherEndpoints).
  if (allHaveNodeHints) {
    if (hasForNode) return TopologyMode::kPreferSameNode;
    log::info(2, "Ignoring same-node topology hints for service since no hints were provided for node",
              {{"servicePort", port.key.name}, {"node", nodeName}});
  }
  if (allHaveZoneHints) {
    if (hasForZone) return TopologyMode::kPreferSameZone;
    if (zone.empty()) {
      log::info(2, "Ignoring same-zone topology hints for service since node is missing label",
                {{"servicePort", port.key.name}, {"label", kLabelTopologyZone}});
    } else {
      log::info(2, "Ignoring same-zone topology hints for service since no hints were provided for zone",
                {{"servicePort", port.key.name}, {"zone", zone}});
    }
  }
  return TopologyMode::kNone;
}

bool availableForTopology(const EndpointCandidate& c, TopologyMode mode,
                          const std::string& nodeName, const std::string& zone) {
  switch (mode) {
    case TopologyMode::kNone: return true;
    case TopologyMode::kPreferSameNode: return hasHint(c.nodeHints, nodeName);
    case TopologyMode::kPreferSameZone: return hasHint(c.zoneHints, zone);
  }
  return false;
}

// The result is kept in the snapshot for as long as the service is unchanged: it is sized
// exactly (push_back alone would leave up to twice the room, per endpoint set of every port).
template <typename Predicate>
std::vector<Endpoint> filterEndpoints(const std::vector<EndpointCandidate>& endpoints,
                                      Predicate predicate) {
  std::vector<Endpoint> out;
  out.reserve(
      static_cast<std::size_t>(std::count_if(endpoints.begin(), endpoints.end(), predicate)));
  for (const auto& c : endpoints) {
    if (predicate(c)) out.push_back(c.endpoint);
  }
  return out;
}

bool servingTerminating(const Endpoint& e) { return e.serving && e.terminating; }

}  // namespace

std::optional<std::string> skipReason(const Service& service, const TrackerConfig& config) {
  if (auto it = service.labels.find(kLabelServiceProxyName); it != service.labels.end()) {
    if (config.serviceProxyName.empty() || it->second != config.serviceProxyName) {
      return "handled by another proxy (" + std::string(kLabelServiceProxyName) + "=" +
             it->second + ")";
    }
  }
  const std::string primary = service.clusterIPs.empty() ? "" : service.clusterIPs.front();
  if (primary.empty() || primary == "None") return "headless (no cluster IP)";
  if (service.type == ServiceType::kExternalName) return "type ExternalName";
  return std::nullopt;
}

std::vector<ServicePortState> servicePorts(const Service& service, const TrackerConfig& config) {
  std::vector<ServicePortState> out;
  if (auto reason = skipReason(service, config)) {
    log::info(3, "Skipping service", {{"service", serviceName(service)}, {"reason", *reason}});
    return out;
  }
  const std::string svcName = serviceName(service);

  bool seen[2] = {false, false};
  for (std::size_t i = 0; i < service.clusterIPs.size(); ++i) {
    const std::string& raw = service.clusterIPs[i];
    if (raw.empty() || raw == "None") continue;
    auto clusterIP = net::parseIPSloppy(raw);
    if (!clusterIP) {
      log::error("Skipping invalid cluster IP of service", {{"service", svcName}, {"clusterIP", raw}});
      continue;
    }
    const net::Family family = clusterIP->family;
    if (i < service.ipFamilies.size() && service.ipFamilies[i] != family) {
      log::error("Skipping cluster IP whose family does not match spec.ipFamilies",
                 {{"service", svcName}, {"clusterIP", raw}, {"ipFamily", toString(service.ipFamilies[i])}});
      continue;
    }
    bool& familySeen = seen[family == net::Family::kIPv4 ? 0 : 1];
    if (familySeen) {
      log::error("Skipping second cluster IP of the same family",
                 {{"service", svcName}, {"clusterIP", raw}});
      continue;
    }
    familySeen = true;
    if (!familyEnabled(family, config)) {
      logFamilyDisabled(service, family);
      continue;
    }

    // Family-filtered addresses shared by every port of this family.
    std::vector<std::string> externalIPs;
    for (const auto& ip : service.externalIPs) {
      auto parsed = net::parseIPSloppy(ip);
      if (!parsed) {
        log::error("Ignoring invalid external IP of service", {{"service", svcName}, {"externalIP", ip}});
        continue;
      }
      if (parsed->family == family) externalIPs.push_back(parsed->addressText());
    }
    std::vector<std::string> lbVIPs;
    for (const auto& ingress : service.loadBalancerIngress) {
      if (ingress.ip.empty()) continue;
      // Proxy-mode load balancers deliver traffic to the node, not to the VIP.
      if (ingress.ipMode == LoadBalancerIPMode::kProxy) continue;
      auto parsed = net::parseIPSloppy(ingress.ip);
      if (!parsed) {
        log::error("Ignoring invalid load balancer ingress IP of service",
                   {{"service", svcName}, {"ip", ingress.ip}});
        continue;
      }
      if (parsed->family == family) lbVIPs.push_back(parsed->addressText());
    }
    std::vector<std::string> sourceRanges;
    for (const auto& range : service.loadBalancerSourceRanges) {
      // Validation upstream tolerates whitespace padding.
      const auto first = range.find_first_not_of(" \t\r\n");
      const auto last = range.find_last_not_of(" \t\r\n");
      const std::string trimmed =
          first == std::string::npos ? std::string() : range.substr(first, last - first + 1);
      auto parsed = net::parseCIDRSloppy(trimmed);
      if (!parsed) {
        log::error("Ignoring invalid loadBalancerSourceRange of service",
                   {{"service", svcName}, {"range", range}});
        continue;
      }
      if (parsed->family == family) sourceRanges.push_back(parsed->cidrText());
    }

    const bool externalLocal = externallyAccessibleService(service) &&
                               service.externalTrafficPolicy == TrafficPolicy::kLocal;
    std::int32_t healthCheckNodePort = 0;
    if (service.type == ServiceType::kLoadBalancer && externalLocal) {
      if (service.healthCheckNodePort <= 0 || service.healthCheckNodePort > 65535) {
        log::error("Service has no valid healthcheck nodeport",
                   {{"service", svcName}, {"healthCheckNodePort", std::to_string(service.healthCheckNodePort)}});
      } else {
        healthCheckNodePort = service.healthCheckNodePort;
      }
    }

    for (const auto& spec : service.ports) {
      if (spec.port < 1 || spec.port > 65535) {
        log::error("Skipping service port out of range",
                   {{"service", svcName}, {"portName", spec.name}, {"port", std::to_string(spec.port)}});
        continue;
      }
      if (spec.nodePort < 0 || spec.nodePort > 65535) {
        log::error("Skipping service port with nodePort out of range",
                   {{"service", svcName}, {"portName", spec.name}, {"nodePort", std::to_string(spec.nodePort)}});
        continue;
      }
      ServicePortState state;
      state.key.family = family;
      state.key.name = spec.name.empty() ? svcName : svcName + ":" + spec.name;
      state.ns = service.ns;
      state.serviceName = service.name;
      state.portName = spec.name;
      state.type = service.type;
      state.protocol = spec.protocol;
      state.clusterIP = clusterIP->addressText();
      state.port = spec.port;
      state.nodePort = spec.nodePort;
      state.externalIPs = externalIPs;
      state.loadBalancerVIPs = lbVIPs;
      state.loadBalancerSourceRanges = sourceRanges;
      state.externalPolicy = externalLocal ? TrafficPolicy::kLocal : TrafficPolicy::kCluster;
      state.internalPolicy = service.internalTrafficPolicy;
      state.healthCheckNodePort = healthCheckNodePort;
      state.sessionAffinityClientIP = service.sessionAffinity == SessionAffinity::kClientIP;
      state.stickyMaxAgeSeconds =
          state.sessionAffinityClientIP ? service.sessionAffinityTimeoutSeconds : 0;
      out.push_back(std::move(state));
    }
  }
  return out;
}

std::vector<EndpointCandidate> gatherEndpoints(const ServicePortState& port,
                                               std::span<const EndpointSlice* const> slices,
                                               const std::string& nodeName, bool useNodeHints) {
  const AddressType wanted =
      port.key.family == net::Family::kIPv4 ? AddressType::kIPv4 : AddressType::kIPv6;
  std::map<std::string, EndpointCandidate> byAddress;  // key: ip:port
  for (const EndpointSlice* slice : slices) {
    if (slice->addressType != wanted) continue;  // other family, or FQDN (never proxied)
    for (const auto& slicePort : slice->ports) {
      if (!slicePort.name) {
        log::info(2, "Ignoring EndpointSlice port with nil name",
                  {{"endpointSlice", slice->ns + "/" + slice->name}});
        continue;
      }
      if (!slicePort.port || *slicePort.port <= 0 || *slicePort.port > 65535) {
        log::info(2, "Ignoring invalid EndpointSlice port",
                  {{"endpointSlice", slice->ns + "/" + slice->name}, {"portName", *slicePort.name}});
        continue;
      }
      if (*slicePort.name != port.portName ||
          slicePort.protocol.value_or(Protocol::kTCP) != port.protocol) {
        continue;
      }
      for (const auto& se : slice->endpoints) {
        if (se.addresses.empty()) continue;
        auto ip = net::parseIPSloppy(se.addresses.front());
        if (!ip || ip->family != port.key.family) {
          log::info(2, "Ignoring endpoint with an invalid address or one of the wrong family",
                    {{"endpointSlice", slice->ns + "/" + slice->name}, {"address", se.addresses.front()}});
          continue;
        }
        EndpointCandidate c;
        c.endpoint.ip = ip->addressText();
        c.endpoint.port = *slicePort.port;
        c.endpoint.nodeName = se.nodeName.value_or("");
        c.endpoint.isLocal = !nodeName.empty() && se.nodeName && *se.nodeName == nodeName;
        c.endpoint.zone = se.zone.value_or("");
        c.endpoint.ready = se.conditions.ready.value_or(true);
        c.endpoint.serving = se.conditions.serving.value_or(true);
        c.endpoint.terminating = se.conditions.terminating.value_or(false);
        if (se.hints) {
          c.zoneHints = se.hints->forZones;
          if (useNodeHints) c.nodeHints = se.hints->forNodes;
        }
        // An endpoint seen in two slices (moving between slices, or an IP reused by a new pod
        // before the old one is gone): prefer the non-terminating one, else the later slice.
        std::string key = c.endpoint.str();
        auto it = byAddress.find(key);
        if (it == byAddress.end()) {
          byAddress.emplace(std::move(key), std::move(c));
        } else if (!c.endpoint.terminating) {
          it->second = std::move(c);
        }
      }
    }
  }
  std::vector<EndpointCandidate> out;
  out.reserve(byAddress.size());
  for (auto& [key, c] : byAddress) out.push_back(std::move(c));
  std::sort(out.begin(), out.end(), [](const EndpointCandidate& a, const EndpointCandidate& b) {
    return endpointLess(a.endpoint, b.endpoint);
  });
  return out;
}

CategorizedEndpoints categorizeEndpoints(const std::vector<EndpointCandidate>& endpoints,
                                         const ServicePortState& port,
                                         const std::string& nodeName, const std::string& zone) {
  CategorizedEndpoints out;
  if (endpoints.empty()) return out;

  TopologyMode mode = TopologyMode::kNone;
  bool useServingTerminating = false;
  if (port.usesClusterEndpoints()) {
    mode = topologyModeFromHints(port, endpoints, nodeName, zone);
    out.clusterEndpoints = filterEndpoints(endpoints, [&](const EndpointCandidate& c) {
      return c.endpoint.ready && availableForTopology(c, mode, nodeName, zone);
    });
    // No ready endpoint anywhere (topology already fell back when none was in reach):
    // keep serving terminating endpoints so connections drain gracefully.
    if (out.clusterEndpoints.empty()) {
      out.clusterEndpoints = filterEndpoints(
          endpoints, [](const EndpointCandidate& c) { return servingTerminating(c.endpoint); });
    }
    if (!out.clusterEndpoints.empty()) out.hasAnyEndpoints = true;
  }

  if (!port.usesLocalEndpoints()) {
    out.allReachableEndpoints = out.clusterEndpoints;
    return out;
  }

  bool hasLocalReady = false;
  bool hasLocalServingTerminating = false;
  for (const auto& c : endpoints) {
    if (c.endpoint.ready) {
      out.hasAnyEndpoints = true;
      if (c.endpoint.isLocal) hasLocalReady = true;
    } else if (servingTerminating(c.endpoint)) {
      out.hasAnyEndpoints = true;
      if (c.endpoint.isLocal) hasLocalServingTerminating = true;
    }
  }
  if (hasLocalReady) {
    out.localEndpoints = filterEndpoints(endpoints, [](const EndpointCandidate& c) {
      return c.endpoint.isLocal && c.endpoint.ready;
    });
  } else if (hasLocalServingTerminating) {
    useServingTerminating = true;
    out.localEndpoints = filterEndpoints(endpoints, [](const EndpointCandidate& c) {
      return c.endpoint.isLocal && servingTerminating(c.endpoint);
    });
  }

  if (!port.usesClusterEndpoints()) {
    out.allReachableEndpoints = out.localEndpoints;
    return out;
  }
  if (mode == TopologyMode::kNone && !useServingTerminating) {
    // Cluster endpoints are then every ready endpoint, a superset of the local ready ones.
    out.allReachableEndpoints = out.clusterEndpoints;
    return out;
  }
  std::map<std::string, Endpoint> merged;
  for (const auto& e : out.clusterEndpoints) merged[e.str()] = e;
  for (const auto& e : out.localEndpoints) merged[e.str()] = e;
  out.allReachableEndpoints.reserve(merged.size());
  for (auto& [key, e] : merged) out.allReachableEndpoints.push_back(std::move(e));
  std::sort(out.allReachableEndpoints.begin(), out.allReachableEndpoints.end(), endpointLess);
  return out;
}

namespace {

// Snapshots keep every port's endpoint sets for as long as the service is unchanged, and most
// ports have the same endpoints in several of them (all ready, no topology: cluster, reachable
// and complete sets are equal), so equal sets share one list.
EndpointList shareIfEqual(std::vector<Endpoint> endpoints,
                          std::initializer_list<const EndpointList*> earlier) {
  for (const EndpointList* list : earlier) {
    if (!list->empty() && *list == endpoints) return *list;
  }
  return EndpointList(std::move(endpoints));
}

}  // namespace

std::vector<std::shared_ptr<const ServicePortState>> resolveService(
    const Service& service, std::span<const EndpointSlice* const> slices,
    const TrackerConfig& config, const NodeInfo& node) {
  std::vector<std::shared_ptr<const ServicePortState>> out;
  for (auto& state : servicePorts(service, config)) {
    auto candidates = gatherEndpoints(state, slices, config.nodeName, config.preferSameTrafficDistribution);
    auto categorized = categorizeEndpoints(candidates, state, config.nodeName, node.zone);
    std::vector<Endpoint> all;
    all.reserve(candidates.size());
    for (auto& c : candidates) all.push_back(std::move(c.endpoint));
    state.allEndpoints = std::move(all);
    state.clusterEndpoints =
        shareIfEqual(std::move(categorized.clusterEndpoints), {&state.allEndpoints});
    state.localEndpoints = shareIfEqual(std::move(categorized.localEndpoints),
                                        {&state.allEndpoints, &state.clusterEndpoints});
    state.allReachableEndpoints =
        shareIfEqual(std::move(categorized.allReachableEndpoints),
                     {&state.allEndpoints, &state.clusterEndpoints, &state.localEndpoints});
    state.hasAnyEndpoints = categorized.hasAnyEndpoints;
    out.push_back(std::make_shared<const ServicePortState>(std::move(state)));
  }
  return out;
}

NodeInfo nodeInfoFrom(const Node& node) {
  NodeInfo info;
  info.name = node.name;
  if (auto it = node.labels.find(kLabelTopologyZone); it != node.labels.end()) {
    info.zone = it->second;
  }
  info.labels = node.labels;
  for (const auto& address : node.addresses) {
    if (address.type == "InternalIP" || address.type == "ExternalIP") {
      info.addresses.push_back(address.address);
    }
  }
  info.podCIDRs = node.podCIDRs;
  info.deleting = node.beingDeleted();
  info.known = true;
  return info;
}

}  // namespace kproxy::core::resolve
