#pragma once
/// The service plan: what one service port means on this node, decided once for every backend.
///
/// A backend receives resolved service ports (sdk::ServicePort: addresses of one family, the
/// endpoint sets for Cluster and Local traffic policy) and must turn them into kernel objects.
/// Everything that is a decision about Kubernetes semantics rather than about a kernel API is
/// made here, so nftables, iptables, IPVS and the userspace proxy mean the same thing:
///   - which endpoint pools exist (cluster policy, local policy) and which traffic uses which;
///   - what happens without endpoints (reject when the service has none anywhere, drop when
///     only the policy's pool is empty);
///   - masquerade: masquerade-all, off-cluster clients of a ClusterIP, external traffic with
///     Cluster policy, the node's own connections to its external addresses;
///   - the externalTrafficPolicy=Local short-circuit: pods and the node reach the service's
///     external addresses through the cluster-wide endpoints, as upstream kube-proxy does;
///   - the loadBalancerSourceRanges firewall (with upstream's allowance for the node itself);
///   - session affinity.
/// The semantics follow upstream kube-proxy (pkg/proxy/{nftables,iptables}/proxier.go).
///
/// Thread-safety: pure functions of their inputs. A plan borrows the endpoint vectors of the
/// port it was made from (std::span): it must not outlive that port.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kproxy/plugin/sdk.h"

namespace kproxy::plan {

/// How traffic from this node's pods is recognised (--detect-local-mode). A backend that finds
/// the mode not implemented (kNone) renders no pod-specific rule, as upstream.
struct LocalTrafficDetector {
  enum class Mode : std::uint8_t { kNone, kCIDRs, kBridgeInterface, kInterfaceNamePrefix };
  Mode mode = Mode::kNone;
  /// kCIDRs: the pod CIDRs (ClusterCIDR mode: --cluster-cidr; NodeCIDR mode: the Node's
  /// spec.podCIDRs), of both families; a backend uses those of the port's family.
  std::vector<std::string> cidrs;
  /// kBridgeInterface: the bridge's name; kInterfaceNamePrefix: the pod interfaces' prefix.
  std::string interface;

  /// Whether this detector can recognise pod traffic of `family` (a CIDR mode needs a CIDR of
  /// that family).
  bool implemented(net::Family family) const;
  /// The CIDRs of `family` (kCIDRs mode).
  std::vector<std::string> cidrsOf(net::Family family) const;
};

/// Node-wide settings that change what a service port means.
struct PlanConfig {
  bool masqueradeAll = false;
  LocalTrafficDetector localDetector;
  /// The node's own addresses (any family): loadBalancerSourceRanges that contain one of them
  /// also admit the node's connections to the LoadBalancer IPs, as upstream.
  std::vector<std::string> nodeIPs;
};

/// What a kind of traffic meets when its endpoint pool is empty.
enum class NoEndpoints : std::uint8_t {
  kNone,    ///< the pool is not empty
  kDrop,    ///< the service has endpoints elsewhere, but none for this policy
  kReject,  ///< the service has no usable endpoint anywhere: refuse at once
};

/// An endpoint pool of the service port.
enum class Pool : std::uint8_t { kCluster, kLocal };

/// Masquerade of ClusterIP traffic.
enum class InternalMasquerade : std::uint8_t {
  kNone,
  kAll,       ///< --masquerade-all: every connection to the ClusterIP (not the short-circuit)
  kNotLocal,  ///< connections to the ClusterIP from outside the node's pods
};

struct ServicePortPlan {
  // ---- endpoint pools ----
  /// Endpoints for Cluster traffic policy, and for Local; empty spans when the pool is unused.
  std::span<const sdk::Endpoint> clusterEndpoints;
  std::span<const sdk::Endpoint> localEndpoints;
  /// A pool a backend must program (non-empty and used by some traffic).
  bool usesClusterPool = false;
  bool usesLocalPool = false;
  /// The service port has a usable endpoint somewhere in the cluster.
  bool hasEndpoints = false;

  // ---- internal traffic: the ClusterIP ----
  std::string clusterIP;  ///< empty when none
  Pool internalPool = Pool::kCluster;
  bool hasInternalEndpoints = false;
  NoEndpoints internalNoEndpoints = NoEndpoints::kNone;
  InternalMasquerade internalMasquerade = InternalMasquerade::kNone;

  // ---- external traffic: NodePort, externalIPs, LoadBalancer IPs ----
  std::vector<std::string> externalIPs;
  std::vector<std::string> loadBalancerIPs;  ///< ingress IPs with ipMode VIP
  std::int32_t nodePort = 0;
  bool externallyAccessible = false;
  /// External addresses are captured (and sent to the external dispatch) whenever the service
  /// has endpoints anywhere, even when the external pool is empty: the short-circuit still
  /// serves the node and its pods.
  bool capturesExternal = false;
  Pool externalPool = Pool::kCluster;
  bool hasExternalEndpoints = false;
  /// What external traffic that was not short-circuited meets when the external pool is empty.
  NoEndpoints externalNoEndpoints = NoEndpoints::kNone;
  /// externalTrafficPolicy Cluster: every external connection is masqueraded.
  bool externalMasqueradeAll = false;
  /// externalTrafficPolicy Local: connections from this node's pods (when the local detector
  /// is implemented) go to the cluster pool unmasqueraded; connections from the node itself
  /// are masqueraded and go to the cluster pool. Others keep their source and use the local
  /// pool.
  bool shortCircuitPods = false;
  bool shortCircuitNode = false;

  // ---- loadBalancerSourceRanges ----
  /// Whether LoadBalancer IP traffic is filtered by source (ranges and LB IPs exist).
  bool usesFirewall = false;
  /// Sources admitted by the firewall: the ranges of the port's family, plus the LoadBalancer
  /// IPs themselves when a range contains a node IP (the node reaches a VIP it holds with the
  /// VIP as source). Everything else is dropped.
  std::vector<std::string> firewallAllowedSources;

  // ---- session affinity ----
  bool affinity = false;
  std::uint32_t affinityTimeoutSeconds = 0;

  /// The endpoints of `pool`.
  std::span<const sdk::Endpoint> endpointsOf(Pool pool) const {
    return pool == Pool::kCluster ? clusterEndpoints : localEndpoints;
  }
  /// Whether both pools hold the same endpoints (a backend may then program one).
  bool poolsEqual() const;
};

/// Decides what `port` means on this node. Addresses of another family than the port's are
/// left out.
ServicePortPlan planServicePort(const sdk::ServicePort& port, const PlanConfig& config);

/// One range of unallocated-ClusterIP checking: a service CIDR of one family and the
/// ServiceCIDR objects that hold it.
struct ServiceCIDRRange {
  std::string cidr;                ///< canonical, e.g. "10.96.0.0/12"
  std::vector<std::string> names;  ///< ServiceCIDR objects holding it (or a CIDR inside it)
  bool operator==(const ServiceCIDRRange&) const = default;
};

/// The ranges in which new traffic to an address no Service holds is dropped, as upstream's
/// `cluster-ips-check` does: the service CIDRs of `family`, sorted by address, each once. A
/// CIDR inside another is folded into it (its object's name is added to the outer range's), so
/// the ranges never overlap. Unparsable CIDRs are left out.
std::vector<ServiceCIDRRange> serviceCIDRRanges(std::span<const sdk::ServiceCIDR> cidrs, net::Family family);

/// Upstream's default ClientIP affinity timeout, used when a port carries none.
inline constexpr std::uint32_t kDefaultAffinityTimeoutSeconds = 10800;

}  // namespace kproxy::plan
