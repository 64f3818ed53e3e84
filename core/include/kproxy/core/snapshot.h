#pragma once
/// The node-local desired state handed to backends: an immutable snapshot of every service
/// port (per IP family) with its endpoint sets already resolved for this node (topology,
/// traffic policies and the terminating-endpoint fallback applied).
///
/// Snapshots are immutable and thread-safe to read. Snapshot N+1 shares every unchanged
/// ServicePortState (and most of the index structure) with snapshot N, so producing it costs
/// O(changes), not O(cluster).

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/core/model.h"
#include "kproxy/core/nodeport_addresses.h"

namespace kproxy::core {

/// Identifies one service port in one IP family. `name` is upstream's ServicePortName string:
/// "namespace/service:portname" ("namespace/service" when the port has no name).
struct ServicePortKey {
  net::Family family = net::Family::kIPv4;
  std::string name;
  auto operator<=>(const ServicePortKey&) const = default;
  bool operator==(const ServicePortKey&) const = default;
};

struct ServicePortKeyHash {
  std::size_t operator()(const ServicePortKey& key) const noexcept;
};

/// One endpoint of a service port, as the backend programs it.
struct Endpoint {
  std::string ip;
  std::int32_t port = 0;
  bool isLocal = false;  ///< on this node
  bool ready = false;
  bool serving = false;
  bool terminating = false;
  std::string nodeName;
  std::string zone;
  /// "ip:port", or "[ip]:port" for IPv6.
  std::string str() const;
  bool operator==(const Endpoint&) const = default;
};

/// An endpoint set of a service port. It reads like a `const std::vector<Endpoint>` (and converts
/// to one); equal sets may share one storage, so the common case of a port whose cluster,
/// reachable and complete sets hold the same endpoints keeps them once. Copying shares the
/// storage; modifying a list (building a state by hand) copies the storage first when it is
/// shared, so a list never changes under another one. Reading is thread-safe, like the state
/// that holds it.
class EndpointList {
 public:
  using value_type = Endpoint;
  using size_type = std::size_t;
  using const_iterator = std::vector<Endpoint>::const_iterator;
  using iterator = const_iterator;

  EndpointList() = default;
  // Implicit conversions both ways, so code that builds or reads an endpoint set as a
  // std::vector<Endpoint> works with it unchanged.
  EndpointList(std::vector<Endpoint> endpoints);
  EndpointList(std::initializer_list<Endpoint> endpoints);
  EndpointList& operator=(std::vector<Endpoint> endpoints);
  EndpointList& operator=(std::initializer_list<Endpoint> endpoints);

  const std::vector<Endpoint>& vector() const;
  operator const std::vector<Endpoint>&() const { return vector(); }

  const_iterator begin() const { return vector().begin(); }
  const_iterator end() const { return vector().end(); }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }
  size_type size() const { return vector().size(); }
  bool empty() const { return vector().empty(); }
  const Endpoint& operator[](size_type i) const { return vector()[i]; }
  const Endpoint& at(size_type i) const { return vector().at(i); }
  const Endpoint& front() const { return vector().front(); }
  const Endpoint& back() const { return vector().back(); }

  void push_back(Endpoint endpoint);
  void clear();

  /// True when both lists use the same storage (cheap identity check).
  bool sharesStorage(const EndpointList& other) const {
    return items_ != nullptr && items_ == other.items_;
  }
  bool operator==(const EndpointList& other) const {
    return items_ == other.items_ || vector() == other.vector();
  }
  bool operator==(const std::vector<Endpoint>& other) const { return vector() == other; }

 private:
  std::vector<Endpoint>& mutableVector();
  std::shared_ptr<std::vector<Endpoint>> items_;  // null when empty
};

/// The resolved, node-local state of one service port in one family.
struct ServicePortState {
  ServicePortKey key;
  std::string ns;
  std::string serviceName;
  std::string portName;
  ServiceType type = ServiceType::kClusterIP;
  Protocol protocol = Protocol::kTCP;
  std::string clusterIP;  ///< of this family
  std::int32_t port = 0;
  std::int32_t nodePort = 0;  ///< 0 when none
  std::vector<std::string> externalIPs;               ///< of this family
  std::vector<std::string> loadBalancerVIPs;          ///< of this family, ipMode != Proxy
  std::vector<std::string> loadBalancerSourceRanges;  ///< CIDRs of this family
  TrafficPolicy externalPolicy = TrafficPolicy::kCluster;  ///< only meaningful when externally reachable
  TrafficPolicy internalPolicy = TrafficPolicy::kCluster;
  std::int32_t healthCheckNodePort = 0;
  bool sessionAffinityClientIP = false;
  std::int32_t stickyMaxAgeSeconds = 0;

  /// Endpoints for traffic with Cluster policy (ready, topology-filtered, else serving+terminating).
  EndpointList clusterEndpoints;
  /// Endpoints for traffic with Local policy (local ready, else local serving+terminating).
  EndpointList localEndpoints;
  /// Union of the two, each endpoint once (what the backend needs chains for).
  EndpointList allReachableEndpoints;
  /// Whether any endpoint anywhere can serve (decides reject vs. drop).
  bool hasAnyEndpoints = false;
  /// Every endpoint of the service port regardless of state (conntrack cleanup, health checks).
  EndpointList allEndpoints;

  /// NodePort, externalIPs or LoadBalancer VIPs.
  bool externallyAccessible() const;
  bool usesClusterEndpoints() const;  ///< some traffic uses Cluster policy
  bool usesLocalEndpoints() const;    ///< some traffic uses Local policy
  bool operator==(const ServicePortState&) const = default;
};

/// What the snapshot knows about the node it was resolved for.
struct NodeInfo {
  std::string name;
  std::string zone;
  Labels labels;
  std::vector<std::string> addresses;  ///< InternalIP / ExternalIP, in the node's order
  std::vector<std::string> podCIDRs;
  bool deleting = false;
  bool known = false;  ///< a Node object has been seen
  /// Where NodePorts answer, decided by the tracker (core/nodeport_addresses.h).
  NodePortAddresses nodePortAddresses;
  bool operator==(const NodeInfo&) const = default;
};

/// One CIDR of a ServiceCIDR object, as backends see it.
struct ServiceCIDRRange {
  std::string name;  ///< the ServiceCIDR object's name
  std::string cidr;  ///< one of its spec.cidrs, e.g. "10.96.0.0/12"
  auto operator<=>(const ServiceCIDRRange&) const = default;
  bool operator==(const ServiceCIDRRange&) const = default;
};

namespace detail {
struct SnapshotTrie;
}

/// An immutable, persistent map ServicePortKey -> ServicePortState plus the node view.
class Snapshot {
 public:
  Snapshot();
  ~Snapshot();
  Snapshot(const Snapshot&);
  Snapshot& operator=(const Snapshot&);

  /// Monotonic number, 1 for the first published snapshot.
  std::uint64_t generation() const { return generation_; }
  const NodeInfo& node() const { return *node_; }
  /// Every CIDR of every ServiceCIDR object (both families), sorted by name, then CIDR.
  /// Cluster-wide: the same on every node.
  const std::vector<ServiceCIDRRange>& serviceCIDRs() const { return *serviceCIDRs_; }
  std::size_t size() const;

  /// O(1) in the number of services.
  std::shared_ptr<const ServicePortState> find(const ServicePortKey& key) const;
  /// Visits every service port, in an unspecified but stable order. Stop by returning false.
  void forEach(const std::function<bool(const ServicePortState&)>& visit) const;
  /// All service ports sorted by key (O(n log n); for full syncs and printing).
  std::vector<std::shared_ptr<const ServicePortState>> sorted() const;

  /// Returns a new snapshot with `key` set to `state` (nullptr removes it); `this` is unchanged.
  /// Cost is independent of the snapshot's size.
  Snapshot with(const ServicePortKey& key, std::shared_ptr<const ServicePortState> state) const;
  Snapshot withNode(NodeInfo node) const;
  Snapshot withServiceCIDRs(std::vector<ServiceCIDRRange> cidrs) const;
  Snapshot withGeneration(std::uint64_t generation) const;

  /// True when both snapshots share the same storage for `key` (cheap identity check).
  bool sharesEntry(const Snapshot& other, const ServicePortKey& key) const;

 private:
  std::shared_ptr<const detail::SnapshotTrie> trie_;
  std::shared_ptr<const NodeInfo> node_;
  std::shared_ptr<const std::vector<ServiceCIDRRange>> serviceCIDRs_;
  std::uint64_t generation_ = 0;
};

}  // namespace kproxy::core
