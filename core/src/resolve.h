#pragma once
// Node-local resolution: turns one Service and its EndpointSlices into ServicePortStates with
// the endpoint sets a backend programs. Pure functions (apart from log lines); the tracker
// calls them only for services that changed. Semantics follow upstream kube-proxy's
// serviceport.go / servicechangetracker.go (service side), endpointslicecache.go (endpoint
// side) and topology.go (CategorizeEndpoints).

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kproxy/core/model.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/core/tracker.h"

namespace kproxy::core::resolve {

/// An endpoint with the topology hints CategorizeEndpoints needs.
struct EndpointCandidate {
  Endpoint endpoint;
  std::vector<std::string> zoneHints;
  std::vector<std::string> nodeHints;
};

/// Why a whole service produces no service ports; nullopt when it is proxied.
std::optional<std::string> skipReason(const Service& service, const TrackerConfig& config);

/// The service's ports in every enabled family it has a cluster IP of, without endpoints.
/// Malformed parts (an invalid IP, a port out of range) are skipped with a log line naming the
/// service; the rest of the service is still resolved.
std::vector<ServicePortState> servicePorts(const Service& service, const TrackerConfig& config);

/// The endpoints of one service port gathered from the service's slices of the port's family,
/// deduplicated by ip:port (a non-terminating endpoint wins over a terminating one, otherwise
/// the later slice in `slices` order wins) and sorted by (ip, port).
/// With `useNodeHints` false (the feature gate PreferSameTrafficDistribution off), node hints
/// are dropped as upstream's endpoint cache drops them.
std::vector<EndpointCandidate> gatherEndpoints(const ServicePortState& port,
                                               std::span<const EndpointSlice* const> slices,
                                               const std::string& nodeName, bool useNodeHints = true);

struct CategorizedEndpoints {
  std::vector<Endpoint> clusterEndpoints;
  std::vector<Endpoint> localEndpoints;
  std::vector<Endpoint> allReachableEndpoints;
  bool hasAnyEndpoints = false;
};

/// Upstream's CategorizeEndpoints: Cluster endpoints are the ready ones filtered by topology
/// hints (PreferSameNode / PreferSameZone when every ready endpoint carries hints and one
/// matches this node / zone), falling back to serving+terminating; Local endpoints are the
/// local ready ones, else local serving+terminating. Outputs are sorted by (ip, port).
CategorizedEndpoints categorizeEndpoints(const std::vector<EndpointCandidate>& endpoints,
                                         const ServicePortState& port,
                                         const std::string& nodeName, const std::string& zone);

/// Everything for one service: servicePorts + gatherEndpoints + categorizeEndpoints.
/// `slices` are the service's EndpointSlices in a stable order (by slice name).
std::vector<std::shared_ptr<const ServicePortState>> resolveService(
    const Service& service, std::span<const EndpointSlice* const> slices,
    const TrackerConfig& config, const NodeInfo& node);

/// The node view a snapshot carries.
NodeInfo nodeInfoFrom(const Node& node);

}  // namespace kproxy::core::resolve
