#pragma once
/// The Kubernetes objects kproxy consumes, as plain C++ value types.
/// They are decoded by apiwatch (from the API server or a manifest directory) and never
/// refer to JSON or HTTP. Equality is member-wise, so a change tracker can drop no-op updates.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/net/ip.h"

namespace kproxy::core {

enum class Protocol : std::uint8_t { kTCP, kUDP, kSCTP };
enum class ServiceType : std::uint8_t { kClusterIP, kNodePort, kLoadBalancer, kExternalName };
enum class TrafficPolicy : std::uint8_t { kCluster, kLocal };
enum class SessionAffinity : std::uint8_t { kNone, kClientIP };
enum class LoadBalancerIPMode : std::uint8_t { kVIP, kProxy };
enum class AddressType : std::uint8_t { kIPv4, kIPv6, kFQDN };

const char* toString(Protocol protocol);
const char* toString(ServiceType type);

using Labels = std::map<std::string, std::string>;

/// An optional value kept on the heap, for fields that nearly every object leaves unset: as
/// small as a pointer when absent, where a std::optional<T> holds room for a T in every object
/// (a cluster has hundreds of thousands of endpoints). Reads and assigns like std::optional;
/// copies copy the value.
template <typename T>
class OptionalBox {
 public:
  OptionalBox() = default;
  OptionalBox(std::nullopt_t) {}
  OptionalBox(T value) : value_(std::make_unique<T>(std::move(value))) {}
  OptionalBox(std::optional<T> value) {
    if (value) value_ = std::make_unique<T>(std::move(*value));
  }
  OptionalBox(const OptionalBox& other)
      : value_(other.value_ ? std::make_unique<T>(*other.value_) : nullptr) {}
  OptionalBox(OptionalBox&&) noexcept = default;
  OptionalBox& operator=(const OptionalBox& other) {
    if (this != &other) value_ = other.value_ ? std::make_unique<T>(*other.value_) : nullptr;
    return *this;
  }
  OptionalBox& operator=(OptionalBox&&) noexcept = default;
  ~OptionalBox() = default;

  bool has_value() const { return value_ != nullptr; }
  explicit operator bool() const { return has_value(); }
  const T& value() const {
    if (!value_) throw std::bad_optional_access();
    return *value_;
  }
  const T& operator*() const { return *value_; }
  const T* operator->() const { return value_.get(); }
  T& operator*() { return *value_; }
  T* operator->() { return value_.get(); }
  void reset() { value_.reset(); }

  friend bool operator==(const OptionalBox& a, const OptionalBox& b) {
    if (!a.value_ || !b.value_) return a.value_ == b.value_;
    return *a.value_ == *b.value_;
  }
  friend bool operator==(const OptionalBox& a, const std::optional<T>& b) {
    if (!a.value_ || !b) return !a.value_ && !b;
    return *a.value_ == *b;
  }

 private:
  std::unique_ptr<T> value_;
};

/// Kubernetes' default ClientIP affinity timeout (3 hours).
inline constexpr std::int32_t kDefaultStickyMaxAgeSeconds = 10800;

/// A Service's target port: a number or a named container port.
struct TargetPort {
  std::int32_t number = 0;  ///< used when name is empty
  std::string name;
  bool operator==(const TargetPort&) const = default;
};

struct ServicePortSpec {
  std::string name;
  Protocol protocol = Protocol::kTCP;
  std::int32_t port = 0;
  TargetPort targetPort;
  std::int32_t nodePort = 0;  ///< 0 when none
  OptionalBox<std::string> appProtocol;
  bool operator==(const ServicePortSpec&) const = default;
};

struct LoadBalancerIngress {
  std::string ip;
  std::string hostname;
  std::optional<LoadBalancerIPMode> ipMode;
  bool operator==(const LoadBalancerIngress&) const = default;
};

struct Service {
  std::string ns;
  std::string name;
  Labels labels;
  std::string resourceVersion;
  ServiceType type = ServiceType::kClusterIP;
  std::vector<std::string> clusterIPs;  ///< first is .spec.clusterIP; "None" means headless
  std::vector<net::Family> ipFamilies;
  std::vector<ServicePortSpec> ports;
  std::vector<std::string> externalIPs;
  std::vector<LoadBalancerIngress> loadBalancerIngress;   ///< from .status.loadBalancer
  std::vector<std::string> loadBalancerSourceRanges;      ///< CIDRs
  TrafficPolicy externalTrafficPolicy = TrafficPolicy::kCluster;
  TrafficPolicy internalTrafficPolicy = TrafficPolicy::kCluster;
  std::int32_t healthCheckNodePort = 0;
  SessionAffinity sessionAffinity = SessionAffinity::kNone;
  std::int32_t sessionAffinityTimeoutSeconds = kDefaultStickyMaxAgeSeconds;
  OptionalBox<std::string> trafficDistribution;  ///< e.g. "PreferClose", "PreferSameZone"
  std::string externalName;

  bool operator==(const Service&) const = default;
};

struct EndpointConditions {
  std::optional<bool> ready;
  std::optional<bool> serving;
  std::optional<bool> terminating;
  bool operator==(const EndpointConditions&) const = default;
};

struct EndpointHints {
  std::vector<std::string> forZones;
  std::vector<std::string> forNodes;
  bool operator==(const EndpointHints&) const = default;
};

struct SliceEndpoint {
  std::vector<std::string> addresses;
  EndpointConditions conditions;
  std::optional<std::string> nodeName;
  std::optional<std::string> zone;
  OptionalBox<EndpointHints> hints;
  bool operator==(const SliceEndpoint&) const = default;
};

struct EndpointPort {
  std::optional<std::string> name;
  std::optional<Protocol> protocol;
  std::optional<std::int32_t> port;
  OptionalBox<std::string> appProtocol;
  bool operator==(const EndpointPort&) const = default;
};

struct EndpointSlice {
  std::string ns;
  std::string name;
  std::string serviceName;  ///< label kubernetes.io/service-name; empty = not a service's slice
  Labels labels;
  std::string resourceVersion;
  AddressType addressType = AddressType::kIPv4;
  std::vector<EndpointPort> ports;
  std::vector<SliceEndpoint> endpoints;
  /// Annotation endpoints.kubernetes.io/last-change-trigger-time, in wall seconds since the
  /// epoch: when the change that produced this slice happened (network programming latency).
  std::optional<double> lastChangeTriggerTime;
  bool operator==(const EndpointSlice&) const = default;
};

struct NodeAddress {
  std::string type;  ///< InternalIP, ExternalIP, Hostname, ...
  std::string address;
  bool operator==(const NodeAddress&) const = default;
};

struct Taint {
  std::string key;
  std::string value;
  std::string effect;  ///< NoSchedule, PreferNoSchedule, NoExecute
  bool operator==(const Taint&) const = default;
};

/// The taint the cluster autoscaler puts on a node before it deletes it (KEP-3836).
inline constexpr const char* kTaintToBeDeletedByClusterAutoscaler = "ToBeDeletedByClusterAutoscaler";

struct Node {
  std::string name;
  Labels labels;
  std::string resourceVersion;
  std::vector<NodeAddress> addresses;
  std::vector<std::string> podCIDRs;
  bool deleting = false;  ///< metadata.deletionTimestamp is set
  std::vector<Taint> taints;  ///< spec.taints
  bool operator==(const Node&) const = default;

  /// Whether the node is on its way out, as upstream's health server decides it (KEP-3836): a
  /// deletion timestamp, or the cluster autoscaler's ToBeDeletedByClusterAutoscaler taint
  /// (any value, any effect). /healthz then fails so that load balancers drain the node.
  bool beingDeleted() const {
    if (deleting) return true;
    for (const auto& taint : taints)
      if (taint.key == kTaintToBeDeletedByClusterAutoscaler) return true;
    return false;
  }
};

/// A networking.k8s.io/v1 ServiceCIDR: ranges the API server allocates ClusterIPs from. Cluster
/// scoped. Addresses inside them that no Service holds are "unallocated" (upstream drops new
/// traffic to them).
struct ServiceCIDR {
  std::string name;
  std::string resourceVersion;
  std::vector<std::string> cidrs;  ///< spec.cidrs, as given (at most one per family)
  bool operator==(const ServiceCIDR&) const = default;
};

/// Label naming the Service an EndpointSlice belongs to.
inline constexpr const char* kLabelServiceName = "kubernetes.io/service-name";
/// Services carrying this label are handled by another proxy.
inline constexpr const char* kLabelServiceProxyName = "service.kubernetes.io/service-proxy-name";
/// Headless marker label set by the endpoints controller.
inline constexpr const char* kLabelHeadless = "service.kubernetes.io/headless";
/// Node label holding its zone.
inline constexpr const char* kLabelTopologyZone = "topology.kubernetes.io/zone";
/// EndpointSlice annotation: when the change it reflects was triggered (RFC 3339).
inline constexpr const char* kAnnotationLastChangeTriggerTime =
    "endpoints.kubernetes.io/last-change-trigger-time";

}  // namespace kproxy::core
