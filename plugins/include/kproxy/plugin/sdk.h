#pragma once
/// Header-only C++ SDK for backend plugin authors. It turns the C ABI (kproxy/plugin/abi.h)
/// into value types and a small abstract class, and defines the exported entry point:
///
///   class MyBackend : public kproxy::sdk::BackendPlugin { ... };
///   static kproxy::sdk::Expected<std::unique_ptr<kproxy::sdk::BackendPlugin>>
///   makeMyBackend(const kproxy::sdk::Host& host, const kproxy::sdk::Options& options);
///   KPROXY_DEFINE_PLUGIN("mybackend", "1.0", "what it programs", makeMyBackend)
///
/// The SDK catches every exception at the boundary and reports it as an error. A plugin's unit
/// tests drive it through a fake host: kproxy/plugin/testing.h.
/// Everything here lives in the plugin; only C types reach the host.
///
/// Built against ABI 1.2, a plugin still runs on a 1.0/1.1 host: the SDK checks the
/// `struct_size` of everything the host hands it (refusing what is smaller than ABI 1.0 with a
/// clear error), walks endpoint arrays with the host's stride, writes an error category only
/// when the host announced it, and turns metrics into no-ops on a host without them.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <expected>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kproxy/net/ip.h"
#include "kproxy/plugin/abi.h"

namespace kproxy::sdk {

/// The address family: net/'s, whose values are the ABI's, so it crosses the ABI as is.
using Family = net::Family;
static_assert(static_cast<int>(Family::kIPv4) == KPROXY_FAMILY_IPV4 &&
              static_cast<int>(Family::kIPv6) == KPROXY_FAMILY_IPV6);
enum class Protocol : std::uint8_t {
  kTCP = KPROXY_PROTO_TCP,
  kUDP = KPROXY_PROTO_UDP,
  kSCTP = KPROXY_PROTO_SCTP
};
enum class ServiceType : std::uint8_t {
  kClusterIP = KPROXY_SVC_CLUSTER_IP,
  kNodePort = KPROXY_SVC_NODE_PORT,
  kLoadBalancer = KPROXY_SVC_LOAD_BALANCER
};

/// "ClusterIP", "NodePort", "LoadBalancer", as the API spells them.
inline const char* serviceTypeName(ServiceType t) {
  switch (t) {
    case ServiceType::kClusterIP: return "ClusterIP";
    case ServiceType::kNodePort: return "NodePort";
    case ServiceType::kLoadBalancer: return "LoadBalancer";
  }
  return "ClusterIP";
}

inline const char* protocolName(Protocol p) {
  switch (p) {
    case Protocol::kTCP: return "tcp";
    case Protocol::kUDP: return "udp";
    case Protocol::kSCTP: return "sctp";
  }
  return "tcp";
}

/// What kind of failure an error is (kproxy_error.category); the host logs it, counts it per
/// category and decides on retries with it.
enum class ErrorCategory : std::int32_t {
  kUnknown = KPROXY_ERROR_UNKNOWN,
  kKernelRefused = KPROXY_ERROR_KERNEL_REFUSED,  ///< the kernel refused the change
  kInvalidInput = KPROXY_ERROR_INVALID_INPUT,    ///< bad options or data
  kTransient = KPROXY_ERROR_TRANSIENT,           ///< busy, interrupted, out of buffers
};

struct PluginError {
  int errnum = 0;
  std::string message;
  ErrorCategory category = ErrorCategory::kUnknown;
};
template <typename T>
using Expected = std::expected<T, PluginError>;
inline std::unexpected<PluginError> fail(std::string message, int errnum = 0) {
  return std::unexpected(PluginError{errnum, std::move(message)});
}
inline std::unexpected<PluginError> fail(ErrorCategory category, std::string message,
                                         int errnum = 0) {
  return std::unexpected(PluginError{errnum, std::move(message), category});
}

/// The category of a failed kernel call by its errno: ENOBUFS, EBUSY, EINTR and EAGAIN are
/// transient (a retry may well succeed), anything else is the kernel refusing the change.
inline ErrorCategory kernelErrorCategory(int errnum) {
  switch (errnum) {
    case ENOBUFS:
    case EBUSY:
    case EINTR:
    case EAGAIN: return ErrorCategory::kTransient;
    default: return ErrorCategory::kKernelRefused;
  }
}

/// Thrown inside the plugin (and turned into an error at the boundary) when the host hands over
/// a struct too small for ABI 1.0 or an endpoint stride too small for its fields.
class AbiError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Endpoint {
  std::string ip;
  std::int32_t port = 0;
  bool isLocal = false;
  bool ready = false;
  bool serving = false;
  bool terminating = false;
  std::string nodeName;
  std::string zone;
  bool operator==(const Endpoint&) const = default;
};

struct ServicePort {
  Family family = Family::kIPv4;
  Protocol protocol = Protocol::kTCP;
  ServiceType type = ServiceType::kClusterIP;
  std::string key;  ///< "namespace/service:port"
  std::string ns;
  std::string serviceName;
  std::string portName;
  std::string clusterIP;
  std::int32_t port = 0;
  std::int32_t nodePort = 0;
  std::int32_t healthCheckNodePort = 0;
  bool sessionAffinityClientIP = false;
  std::int32_t stickyMaxAgeSeconds = 0;
  bool externalPolicyLocal = false;
  bool internalPolicyLocal = false;
  bool hasAnyEndpoints = false;
  std::vector<std::string> externalIPs;
  std::vector<std::string> loadBalancerIPs;
  std::vector<std::string> loadBalancerSourceRanges;
  std::vector<Endpoint> clusterEndpoints;
  std::vector<Endpoint> localEndpoints;
  std::vector<Endpoint> allReachableEndpoints;
  std::vector<Endpoint> allEndpoints;

  bool externallyAccessible() const {
    return nodePort != 0 || !externalIPs.empty() || !loadBalancerIPs.empty();
  }
  bool operator==(const ServicePort&) const = default;
};

/// Where NodePorts answer, as the host decided --nodeport-addresses (abi.h, ABI 1.2).
struct NodePortAddresses {
  /// false: a host older than ABI 1.2 sent no decision; decide from the node (kproxy's own
  /// backends: plan::nodePortAddressesOf).
  bool resolved = false;
  std::vector<std::string> addresses;  ///< both families; loopback ones when a CIDR holds them
  bool allLocalIPv4 = false;           ///< every local IPv4 address, also ones added later
  bool allLocalIPv6 = false;
  bool allLocal(Family family) const { return family == Family::kIPv6 ? allLocalIPv6 : allLocalIPv4; }
  bool operator==(const NodePortAddresses&) const = default;
};

struct NodeInfo {
  std::string name;
  std::string zone;
  std::vector<std::string> addresses;
  std::vector<std::string> podCIDRs;
  NodePortAddresses nodePortAddresses;
};

/// One CIDR of a ServiceCIDR object.
struct ServiceCIDR {
  std::string name;  ///< the object's name
  std::string cidr;  ///< "10.96.0.0/12", "fd00:10:96::/112"
  bool operator==(const ServiceCIDR&) const = default;
};

struct ChangedKey {
  Family family = Family::kIPv4;
  std::string key;
};

using Options = std::map<std::string, std::string, std::less<>>;

namespace detail {
// Whether a struct whose first member is `struct_size` holds all of `field` (growth rule 2).
template <typename S, typename Field>
bool covers(const S& s, Field S::*field) {
  const auto* base = reinterpret_cast<const char*>(&s);
  const auto* at = reinterpret_cast<const char*>(&(s.*field));
  return s.struct_size >= static_cast<std::size_t>(at - base) + sizeof(Field);
}
// Refuses a host struct smaller than its ABI 1.0 size instead of reading past its end.
inline void requireSize(const char* what, std::uint32_t size, std::size_t minimum) {
  if (size < minimum) {
    throw AbiError(std::string("the host passed a ") + what + " of " + std::to_string(size) +
                   " bytes; ABI 1.0 needs at least " + std::to_string(minimum));
  }
}
inline std::string str(const char* s) { return s ? std::string(s) : std::string(); }
inline std::vector<std::string> strs(const char* const* v, std::size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(str(v[i]));
  return out;
}
// Walks an endpoint array with the host's stride (growth rule 3). Every field read here is an
// ABI 1.0 field, which a stride of at least KPROXY_ENDPOINT_V1_0_SIZE covers; a field appended
// later is read only when `stride` covers it. Elements are never copied whole (the host's may
// be smaller than this header's sizeof).
inline std::vector<Endpoint> endpoints(const kproxy_endpoint* v, std::size_t n,
                                       std::size_t stride) {
  std::vector<Endpoint> out;
  out.reserve(n);
  const auto* base = reinterpret_cast<const char*>(v);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& e = *reinterpret_cast<const kproxy_endpoint*>(base + i * stride);
    out.push_back(Endpoint{str(e.ip), e.port, e.is_local != 0, e.ready != 0, e.serving != 0,
                           e.terminating != 0, str(e.node_name), str(e.zone)});
  }
  return out;
}
// The stride of `c`'s endpoint arrays: `endpoint_size` when covered and set, else ABI 1.0's.
inline std::size_t endpointStride(const kproxy_service_port& c) {
  std::size_t stride = KPROXY_ENDPOINT_V1_0_SIZE;
  if (covers(c, &kproxy_service_port::endpoint_size) && c.endpoint_size != 0) {
    stride = c.endpoint_size;
  }
  if (stride < KPROXY_ENDPOINT_V1_0_SIZE) {
    throw AbiError("the host passed endpoints of " + std::to_string(stride) +
                   " bytes; ABI 1.0 needs at least " + std::to_string(KPROXY_ENDPOINT_V1_0_SIZE));
  }
  return stride;
}
inline void copyMessage(char* dst, std::size_t cap, std::string_view msg) {
  std::size_t n = std::min(cap - 1, msg.size());
  std::memcpy(dst, msg.data(), n);
  dst[n] = '\0';
}
}  // namespace detail

/// Converts the host's service port. Throws AbiError when it is smaller than ABI 1.0's or its
/// endpoint stride is too small (the SDK's entry points turn that into an error).
inline ServicePort fromC(const kproxy_service_port& c) {
  detail::requireSize("kproxy_service_port", c.struct_size, KPROXY_SERVICE_PORT_V1_0_SIZE);
  const std::size_t stride = detail::endpointStride(c);
  ServicePort p;
  p.family = static_cast<Family>(c.family);
  p.protocol = static_cast<Protocol>(c.protocol);
  p.type = static_cast<ServiceType>(c.type);
  p.key = detail::str(c.key);
  p.ns = detail::str(c.ns);
  p.serviceName = detail::str(c.service_name);
  p.portName = detail::str(c.port_name);
  p.clusterIP = detail::str(c.cluster_ip);
  p.port = c.port;
  p.nodePort = c.node_port;
  p.healthCheckNodePort = c.health_check_node_port;
  p.sessionAffinityClientIP = c.session_affinity_client_ip != 0;
  p.stickyMaxAgeSeconds = c.sticky_max_age_seconds;
  p.externalPolicyLocal = c.external_policy_local != 0;
  p.internalPolicyLocal = c.internal_policy_local != 0;
  p.hasAnyEndpoints = c.has_any_endpoints != 0;
  p.externalIPs = detail::strs(c.external_ips, c.external_ips_count);
  p.loadBalancerIPs = detail::strs(c.load_balancer_ips, c.load_balancer_ips_count);
  p.loadBalancerSourceRanges =
      detail::strs(c.load_balancer_source_ranges, c.load_balancer_source_ranges_count);
  p.clusterEndpoints = detail::endpoints(c.cluster_endpoints, c.cluster_endpoints_count, stride);
  p.localEndpoints = detail::endpoints(c.local_endpoints, c.local_endpoints_count, stride);
  p.allReachableEndpoints =
      detail::endpoints(c.all_reachable_endpoints, c.all_reachable_endpoints_count, stride);
  p.allEndpoints = detail::endpoints(c.all_endpoints, c.all_endpoints_count, stride);
  return p;
}

/// Converts the host's node. Throws AbiError when it is smaller than ABI 1.0's.
inline NodeInfo fromC(const kproxy_node_info& c) {
  detail::requireSize("kproxy_node_info", c.struct_size, KPROXY_NODE_INFO_V1_0_SIZE);
  NodeInfo n;
  n.name = detail::str(c.name);
  n.zone = detail::str(c.zone);
  n.addresses = detail::strs(c.addresses, c.addresses_count);
  n.podCIDRs = detail::strs(c.pod_cidrs, c.pod_cidrs_count);
  if (c.struct_size >= offsetof(kproxy_node_info, nodeport_flags) + sizeof(c.nodeport_flags) &&
      (c.nodeport_flags & KPROXY_NODEPORT_RESOLVED) != 0) {
    auto& np = n.nodePortAddresses;
    np.resolved = true;
    np.addresses = detail::strs(c.nodeport_addresses, c.nodeport_addresses_count);
    np.allLocalIPv4 = (c.nodeport_flags & KPROXY_NODEPORT_ALL_LOCAL_IPV4) != 0;
    np.allLocalIPv6 = (c.nodeport_flags & KPROXY_NODEPORT_ALL_LOCAL_IPV6) != 0;
  }
  return n;
}

namespace detail {
// Calls `fn` for each service port the host visits. An exception (from the conversion or from
// `fn`) must not unwind through the host's frames: it stops the visit and is rethrown here.
template <typename Visit, typename Fn>
void visitPorts(Visit&& hostVisit, Fn& fn) {
  struct State {
    Fn* fn;
    std::exception_ptr failure;
  } state{&fn, nullptr};
  hostVisit(
      [](void* user, const kproxy_service_port* port) -> int {
        auto* st = static_cast<State*>(user);
        try {
          if (port == nullptr) throw AbiError("the host visited a NULL kproxy_service_port");
          (*st->fn)(fromC(*port));
          return 0;
        } catch (...) {
          st->failure = std::current_exception();
          return 1;
        }
      },
      &state);
  if (state.failure) std::rethrow_exception(state.failure);
}
}  // namespace detail

/// Read access to a host snapshot. Cheap to copy; valid only during the sync call. A struct
/// from the host smaller than ABI 1.0's throws AbiError (an error at the plugin boundary).
class SnapshotView {
 public:
  SnapshotView() = default;
  SnapshotView(const kproxy_host_api* host, const kproxy_snapshot* snapshot)
      : host_(host), snapshot_(snapshot) {}

  bool valid() const { return host_ != nullptr && snapshot_ != nullptr; }
  std::size_t size() const { return valid() ? host_->snapshot_size(snapshot_) : 0; }

  NodeInfo node() const {
    if (!valid()) return NodeInfo{};
    const kproxy_node_info* c = host_->snapshot_node(snapshot_);
    if (c == nullptr) return NodeInfo{};
    return fromC(*c);
  }

  /// Every CIDR of every ServiceCIDR object, both families, sorted by name then CIDR. Empty
  /// from a host older than ABI 1.2.
  std::vector<ServiceCIDR> serviceCIDRs() const {
    std::vector<ServiceCIDR> out;
    if (!valid() ||
        host_->struct_size < offsetof(kproxy_host_api, snapshot_service_cidrs) +
                                 sizeof(host_->snapshot_service_cidrs) ||
        host_->snapshot_service_cidrs == nullptr)
      return out;
    host_->snapshot_service_cidrs(
        snapshot_,
        [](void* user, const kproxy_service_cidr* c) -> int {
          if (c != nullptr && c->struct_size >= offsetof(kproxy_service_cidr, cidr) + sizeof(c->cidr))
            static_cast<std::vector<ServiceCIDR>*>(user)->push_back(
                ServiceCIDR{detail::str(c->name), detail::str(c->cidr)});
          return 0;
        },
        &out);
    return out;
  }

  /// Calls `fn(const ServicePort&)` for every service port.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    if (!valid()) return;
    detail::visitPorts(
        [this](kproxy_service_port_visitor visit, void* user) {
          host_->snapshot_foreach(snapshot_, visit, user);
        },
        fn);
  }

  /// Every service port, sorted by (family, key): a deterministic order for rendering.
  std::vector<ServicePort> all() const {
    std::vector<ServicePort> out;
    out.reserve(size());
    forEach([&](const ServicePort& p) { out.push_back(p); });
    std::sort(out.begin(), out.end(), [](const ServicePort& a, const ServicePort& b) {
      return std::pair(a.family, std::string_view(a.key)) <
             std::pair(b.family, std::string_view(b.key));
    });
    return out;
  }

  std::optional<ServicePort> find(Family family, const std::string& key) const {
    std::optional<ServicePort> out;
    if (!valid()) return out;
    auto keep = [&out](const ServicePort& p) { out = p; };
    detail::visitPorts(
        [&](kproxy_service_port_visitor visit, void* user) {
          host_->snapshot_find(snapshot_, static_cast<std::uint8_t>(family), key.c_str(), visit,
                               user);
        },
        keep);
    return out;
  }

 private:
  const kproxy_host_api* host_ = nullptr;
  const kproxy_snapshot* snapshot_ = nullptr;
};

/// A plugin metric registered with the host (Host::counter, Host::gauge). Cheap to copy. On a
/// host without plugin metrics (ABI < 1.2) it is inactive and every update does nothing.
/// Updates are thread-safe (the host serialises them).
class Metric {
 public:
  Metric() = default;
  Metric(const kproxy_host_api* api, std::uint64_t handle, std::size_t labels)
      : api_(api), handle_(handle), labels_(labels) {}
  /// Whether the host keeps this metric (false on a host without plugin metrics).
  bool active() const { return api_ != nullptr && handle_ != 0; }
  /// Counter: adds `delta` (>= 0); gauge: adds `delta`. One value per label name, in order.
  /// Returns false when the update was refused (wrong count of values, negative counter
  /// delta, set on a counter) or the metric is inactive.
  bool add(const std::vector<std::string>& labelValues, double delta) const {
    return update(false, labelValues, delta);
  }
  bool add(double delta) const { return add({}, delta); }
  /// Gauge only: sets the value.
  bool set(const std::vector<std::string>& labelValues, double value) const {
    return update(true, labelValues, value);
  }
  bool set(double value) const { return set({}, value); }
  /// Histogram only (Host::histogram, ABI 1.4): counts `value` in its bucket.
  bool observe(const std::vector<std::string>& labelValues, double value) const {
    // Only a histogram registered on a 1.4 host is active with a covered metric_observe.
    if (!active() || labelValues.size() != labels_ ||
        !detail::covers(*api_, &kproxy_host_api::metric_observe) || api_->metric_observe == nullptr)
      return false;
    return call(api_->metric_observe, labelValues, value);
  }

 private:
  bool update(bool assign, const std::vector<std::string>& labelValues, double value) const {
    // Only an active metric came from a host whose table has the functions.
    if (!active() || labelValues.size() != labels_) return false;
    return call(assign ? api_->metric_set : api_->metric_add, labelValues, value);
  }
  template <class Fn>
  bool call(Fn fn, const std::vector<std::string>& labelValues, double value) const {
    std::vector<const char*> values;
    values.reserve(labelValues.size());
    for (const auto& v : labelValues) values.push_back(v.c_str());
    return fn(api_->host_ctx, handle_, values.data(), values.size(), value) == KPROXY_OK;
  }
  const kproxy_host_api* api_ = nullptr;
  std::uint64_t handle_ = 0;
  std::size_t labels_ = 0;
};

/// The host's services: logging, what the host supports, plugin metrics.
class Host {
 public:
  explicit Host(const kproxy_host_api* api) : api_(api) {}
  /// verbosity 0..9 (shown with -v >= verbosity, or a --vmodule level for the caller's file).
  /// The caller's file and line reach the log line's header on a 1.3 host.
  void info(int verbosity, const std::string& message,
            std::source_location where = std::source_location::current()) const {
    write(verbosity, message, where);
  }
  void warning(const std::string& message,
               std::source_location where = std::source_location::current()) const {
    write(KPROXY_LOG_WARNING, message, where);
  }
  void error(const std::string& message,
             std::source_location where = std::source_location::current()) const {
    write(KPROXY_LOG_ERROR, message, where);
  }
  const kproxy_host_api* api() const { return api_; }

  /// KPROXY_HOST_* bits; 0 on a host older than ABI 1.2.
  std::uint64_t features() const {
    return api_ != nullptr && detail::covers(*api_, &kproxy_host_api::features) ? api_->features
                                                                                 : 0;
  }
  /// Whether the host reads kproxy_error.category (growth rule 4).
  bool readsErrorCategory() const { return (features() & KPROXY_HOST_ERROR_CATEGORY) != 0; }
  /// Whether the host has the plugin metric functions (ABI 1.2).
  bool hasMetrics() const {
    return api_ != nullptr && detail::covers(*api_, &kproxy_host_api::metric_set) &&
           api_->metric_register != nullptr && api_->metric_add != nullptr &&
           api_->metric_set != nullptr;
  }

  /// Registers a counter / gauge served on the host's /metrics (see kproxy_metric_spec for the
  /// name rules). A refused name is an error with the host's reason; on a host without plugin
  /// metrics the result is an inactive Metric, so a plugin needs no special case.
  Expected<Metric> counter(const std::string& name, const std::string& help,
                           const std::vector<std::string>& labelNames = {}) const {
    return registerMetric(KPROXY_METRIC_COUNTER, name, help, labelNames);
  }
  Expected<Metric> gauge(const std::string& name, const std::string& help,
                         const std::vector<std::string>& labelNames = {}) const {
    return registerMetric(KPROXY_METRIC_GAUGE, name, help, labelNames);
  }
  /// Whether the host keeps histograms (ABI 1.4: metric_observe).
  bool hasHistograms() const {
    return hasMetrics() && detail::covers(*api_, &kproxy_host_api::metric_observe) &&
           api_->metric_observe != nullptr;
  }
  /// Registers a histogram with the buckets' upper bounds (finite, ascending; +Inf implied),
  /// observed with Metric::observe. On a host without histograms (older than ABI 1.4) the
  /// result is an inactive Metric.
  Expected<Metric> histogram(const std::string& name, const std::string& help,
                             const std::vector<std::string>& labelNames,
                             const std::vector<double>& buckets) const {
    if (!hasHistograms()) return Metric{};
    return registerMetric(KPROXY_METRIC_HISTOGRAM, name, help, labelNames, buckets);
  }

 private:
  Expected<Metric> registerMetric(std::uint32_t type, const std::string& name,
                                  const std::string& help,
                                  const std::vector<std::string>& labelNames,
                                  const std::vector<double>& buckets = {}) const {
    if (!hasMetrics()) return Metric{};
    std::vector<const char*> labels;
    labels.reserve(labelNames.size());
    for (const auto& l : labelNames) labels.push_back(l.c_str());
    kproxy_metric_spec spec{};
    spec.struct_size = sizeof spec;
    spec.type = type;
    spec.name = name.c_str();
    spec.help = help.c_str();
    spec.label_names = labels.data();
    spec.label_names_count = labels.size();
    spec.buckets = buckets.data();
    spec.buckets_count = buckets.size();
    kproxy_error err{};
    std::uint64_t handle = api_->metric_register(api_->host_ctx, &spec, &err);
    if (handle == 0) {
      return fail(ErrorCategory::kInvalidInput,
                  std::string(err.message, strnlen(err.message, sizeof err.message)), err.errnum);
    }
    return Metric(api_, handle, labelNames.size());
  }

  void write(int level, const std::string& message, const std::source_location& where) const {
    if (api_ == nullptr) return;
    if (detail::covers(*api_, &kproxy_host_api::log_at) && api_->log_at != nullptr) {
      api_->log_at(api_->host_ctx, level, where.file_name(), static_cast<int>(where.line()),
                   message.c_str());
    } else if (api_->log != nullptr) {
      api_->log(api_->host_ctx, level, message.c_str());
    }
  }
  const kproxy_host_api* api_;
};

struct SyncContext {
  SnapshotView previous;  ///< invalid on the first sync
  SnapshotView next;
  std::vector<ChangedKey> changed;
  bool full = false;
};

struct SyncOutcome {
  std::uint64_t operations = 0;
  std::string summary;
};

/// The first packet of a new connection, to be explained (`kproxy explain`).
struct ExplainRequest {
  Family family = Family::kIPv4;
  Protocol protocol = Protocol::kTCP;
  std::string sourceIP;
  std::string destinationIP;
  std::uint16_t destinationPort = 0;
  bool fromNode = false;       ///< sent by the node itself (else: arriving on an interface)
  std::string inputInterface;  ///< empty when unknown or fromNode
  bool json = false;           ///< one JSON object instead of text
};

/// What a plugin implements. Calls come from one thread at a time.
class BackendPlugin {
 public:
  virtual ~BackendPlugin() = default;
  virtual Expected<SyncOutcome> sync(const SyncContext& context) = 0;
  virtual Expected<void> cleanup() = 0;
  /// Where `request`'s packet would go under what this backend programs for `snapshot`, as
  /// text or JSON (request.json). Must not touch the kernel. The default: not supported.
  virtual Expected<std::string> explain(const SnapshotView& snapshot,
                                        const ExplainRequest& request) {
    (void)snapshot;
    (void)request;
    return fail("this backend cannot explain packets");
  }
};

using Factory = Expected<std::unique_ptr<BackendPlugin>> (*)(const Host&, const Options&);

namespace detail {

struct BackendHandle {
  const kproxy_host_api* host;
  std::unique_ptr<BackendPlugin> plugin;
};

// Fills the host's error. `category` is written only when the host announced that its
// kproxy_error has the field (growth rule 4): an older host's struct ends after `message`.
inline void setError(const kproxy_host_api* host, kproxy_error* err, const PluginError& e) {
  if (err == nullptr) return;
  err->errnum = e.errnum;
  copyMessage(err->message, sizeof err->message, e.message);
  if (Host(host).readsErrorCategory()) err->category = static_cast<std::int32_t>(e.category);
}

// What an exception caught at the boundary becomes.
inline PluginError caught(const char* call, const std::exception& e) {
  if (dynamic_cast<const AbiError*>(&e) != nullptr) {
    return PluginError{0, std::string(call) + ": " + e.what(), ErrorCategory::kInvalidInput};
  }
  return PluginError{0, std::string("exception in ") + call + ": " + e.what()};
}

template <Factory F>
kproxy_backend* create(const kproxy_host_api* host, const kproxy_option* options, std::size_t n,
                       kproxy_error* err) {
  try {
    if (host == nullptr) throw AbiError("the host passed no kproxy_host_api");
    requireSize("kproxy_host_api", host->struct_size, KPROXY_HOST_API_V1_0_SIZE);
    Options opts;
    for (std::size_t i = 0; i < n; ++i) opts[str(options[i].key)] = str(options[i].value);
    auto made = F(Host(host), opts);
    if (!made) {
      setError(host, err, made.error());
      return nullptr;
    }
    auto* handle = new BackendHandle{host, std::move(*made)};
    return reinterpret_cast<kproxy_backend*>(handle);
  } catch (const AbiError& e) {
    // The table is too small to say what the host supports: write no category.
    setError(nullptr, err, caught("create", e));
  } catch (const std::exception& e) {
    setError(host, err, caught("create", e));
  } catch (...) {
    setError(host, err, PluginError{0, "unknown exception in create"});
  }
  return nullptr;
}

inline int sync(kproxy_backend* backend, const kproxy_snapshot* previous,
                const kproxy_snapshot* next, const kproxy_changed_key* changed, std::size_t n,
                std::uint32_t flags, kproxy_sync_result* result, kproxy_error* err) {
  const kproxy_host_api* host = reinterpret_cast<BackendHandle*>(backend)->host;
  try {
    auto* handle = reinterpret_cast<BackendHandle*>(backend);
    if (result != nullptr) {
      requireSize("kproxy_sync_result", result->struct_size, KPROXY_SYNC_RESULT_V1_0_SIZE);
    }
    SyncContext ctx;
    if (previous != nullptr) ctx.previous = SnapshotView(handle->host, previous);
    ctx.next = SnapshotView(handle->host, next);
    ctx.full = (flags & KPROXY_SYNC_FULL) != 0;
    ctx.changed.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      ctx.changed.push_back(ChangedKey{static_cast<Family>(changed[i].family), str(changed[i].key)});
    auto out = handle->plugin->sync(ctx);
    if (!out) {
      setError(host, err, out.error());
      return KPROXY_ERR;
    }
    if (result != nullptr) {
      result->operations = out->operations;
      copyMessage(result->summary, sizeof result->summary, out->summary);
    }
    return KPROXY_OK;
  } catch (const std::exception& e) {
    setError(host, err, caught("sync", e));
  } catch (...) {
    setError(host, err, PluginError{0, "unknown exception in sync"});
  }
  return KPROXY_ERR;
}

inline int cleanup(kproxy_backend* backend, kproxy_error* err) {
  const kproxy_host_api* host = reinterpret_cast<BackendHandle*>(backend)->host;
  try {
    auto out = reinterpret_cast<BackendHandle*>(backend)->plugin->cleanup();
    if (!out) {
      setError(host, err, out.error());
      return KPROXY_ERR;
    }
    return KPROXY_OK;
  } catch (const std::exception& e) {
    setError(host, err, caught("cleanup", e));
  } catch (...) {
    setError(host, err, PluginError{0, "unknown exception in cleanup"});
  }
  return KPROXY_ERR;
}

inline int explain(kproxy_backend* backend, const kproxy_snapshot* snapshot,
                   const kproxy_explain_request* request, kproxy_text_writer write,
                   void* writeUser, kproxy_error* err) {
  const kproxy_host_api* host = reinterpret_cast<BackendHandle*>(backend)->host;
  try {
    if (request == nullptr || write == nullptr) {
      setError(host, err, PluginError{0, "explain: no request or no writer",
                                      ErrorCategory::kInvalidInput});
      return KPROXY_ERR;
    }
    if (request->struct_size < KPROXY_EXPLAIN_REQUEST_V1_1_SIZE) {
      setError(host, err,
               PluginError{0,
                           "explain: the host passed a kproxy_explain_request of " +
                               std::to_string(request->struct_size) +
                               " bytes; ABI 1.1 needs at least " +
                               std::to_string(KPROXY_EXPLAIN_REQUEST_V1_1_SIZE),
                           ErrorCategory::kInvalidInput});
      return KPROXY_ERR;
    }
    auto* handle = reinterpret_cast<BackendHandle*>(backend);
    ExplainRequest r;
    r.family = static_cast<Family>(request->family);
    r.protocol = static_cast<Protocol>(request->protocol);
    r.sourceIP = str(request->source_ip);
    r.destinationIP = str(request->destination_ip);
    r.destinationPort = request->destination_port;
    r.fromNode = (request->flags & KPROXY_EXPLAIN_FROM_NODE) != 0;
    r.inputInterface = str(request->input_interface);
    r.json = (request->flags & KPROXY_EXPLAIN_JSON) != 0;
    auto out = handle->plugin->explain(SnapshotView(handle->host, snapshot), r);
    if (!out) {
      setError(host, err, out.error());
      return KPROXY_ERR;
    }
    write(writeUser, out->data(), out->size());
    return KPROXY_OK;
  } catch (const std::exception& e) {
    setError(host, err, caught("explain", e));
  } catch (...) {
    setError(host, err, PluginError{0, "unknown exception in explain"});
  }
  return KPROXY_ERR;
}

inline void destroy(kproxy_backend* backend) noexcept {
  delete reinterpret_cast<BackendHandle*>(backend);
}

}  // namespace detail
}  // namespace kproxy::sdk

/// Defines the exported entry point for a plugin named NAME (its --proxy-mode value).
#define KPROXY_DEFINE_PLUGIN(NAME, VERSION, DESCRIPTION, FACTORY)                       \
  extern "C" __attribute__((visibility("default"))) const kproxy_plugin_descriptor*   \
  kproxy_plugin_entry(void) {                                                          \
    static const kproxy_plugin_descriptor descriptor = {                               \
        KPROXY_PLUGIN_ABI_VERSION,                                                     \
        sizeof(kproxy_plugin_descriptor),                                              \
        NAME,                                                                          \
        VERSION,                                                                       \
        DESCRIPTION,                                                                   \
        &::kproxy::sdk::detail::create<FACTORY>,                                       \
        &::kproxy::sdk::detail::sync,                                                  \
        &::kproxy::sdk::detail::cleanup,                                               \
        &::kproxy::sdk::detail::destroy,                                               \
        {},                                                                            \
        &::kproxy::sdk::detail::explain,                                               \
        KPROXY_PLUGIN_ABI_MINOR};                                                      \
    return &descriptor;                                                                \
  }
