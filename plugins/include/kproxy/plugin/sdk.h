#pragma once
/// Header-only C++ SDK for backend plugin authors. It turns the C ABI (kproxy/plugin/abi.h)
/// into value types and a small abstract class, and defines the exported entry point:
///
///   class MyBackend : public kproxy::sdk::BackendPlugin { ... };
///   static kproxy::sdk::Expected<std::unique_ptr<kproxy::sdk::BackendPlugin>>
///   makeMyBackend(const kproxy::sdk::Host& host, const kproxy::sdk::Options& options);
///   KPROXY_DEFINE_PLUGIN("mybackend", "1.0", "what it programs", makeMyBackend)
///
/// The SDK catches every exception at the boundary and reports it as an error.
/// Everything here lives in the plugin; only C types reach the host.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <expected>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kproxy/plugin/abi.h"

namespace kproxy::sdk {

enum class Family : std::uint8_t { kIPv4 = KPROXY_FAMILY_IPV4, kIPv6 = KPROXY_FAMILY_IPV6 };
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

inline const char* protocolName(Protocol p) {
  switch (p) {
    case Protocol::kTCP: return "tcp";
    case Protocol::kUDP: return "udp";
    case Protocol::kSCTP: return "sctp";
  }
  return "tcp";
}

struct PluginError {
  int errnum = 0;
  std::string message;
};
template <typename T>
using Expected = std::expected<T, PluginError>;
inline std::unexpected<PluginError> fail(std::string message, int errnum = 0) {
  return std::unexpected(PluginError{errnum, std::move(message)});
}

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

struct NodeInfo {
  std::string name;
  std::string zone;
  std::vector<std::string> addresses;
  std::vector<std::string> podCIDRs;
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
inline std::string str(const char* s) { return s ? std::string(s) : std::string(); }
inline std::vector<std::string> strs(const char* const* v, std::size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(str(v[i]));
  return out;
}
inline std::vector<Endpoint> endpoints(const kproxy_endpoint* v, std::size_t n) {
  std::vector<Endpoint> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(Endpoint{str(v[i].ip), v[i].port, v[i].is_local != 0, v[i].ready != 0,
                           v[i].serving != 0, v[i].terminating != 0, str(v[i].node_name),
                           str(v[i].zone)});
  }
  return out;
}
inline void copyMessage(char* dst, std::size_t cap, std::string_view msg) {
  std::size_t n = std::min(cap - 1, msg.size());
  std::memcpy(dst, msg.data(), n);
  dst[n] = '\0';
}
}  // namespace detail

inline ServicePort fromC(const kproxy_service_port& c) {
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
  p.clusterEndpoints = detail::endpoints(c.cluster_endpoints, c.cluster_endpoints_count);
  p.localEndpoints = detail::endpoints(c.local_endpoints, c.local_endpoints_count);
  p.allReachableEndpoints =
      detail::endpoints(c.all_reachable_endpoints, c.all_reachable_endpoints_count);
  p.allEndpoints = detail::endpoints(c.all_endpoints, c.all_endpoints_count);
  return p;
}

/// Read access to a host snapshot. Cheap to copy; valid only during the sync call.
class SnapshotView {
 public:
  SnapshotView() = default;
  SnapshotView(const kproxy_host_api* host, const kproxy_snapshot* snapshot)
      : host_(host), snapshot_(snapshot) {}

  bool valid() const { return host_ != nullptr && snapshot_ != nullptr; }
  std::size_t size() const { return valid() ? host_->snapshot_size(snapshot_) : 0; }

  NodeInfo node() const {
    NodeInfo n;
    if (!valid()) return n;
    const kproxy_node_info* c = host_->snapshot_node(snapshot_);
    if (c == nullptr) return n;
    n.name = detail::str(c->name);
    n.zone = detail::str(c->zone);
    n.addresses = detail::strs(c->addresses, c->addresses_count);
    n.podCIDRs = detail::strs(c->pod_cidrs, c->pod_cidrs_count);
    return n;
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
    host_->snapshot_foreach(
        snapshot_,
        [](void* user, const kproxy_service_port* port) -> int {
          (*static_cast<Fn*>(user))(fromC(*port));
          return 0;
        },
        &fn);
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
    host_->snapshot_find(
        snapshot_, static_cast<std::uint8_t>(family), key.c_str(),
        [](void* user, const kproxy_service_port* port) -> int {
          *static_cast<std::optional<ServicePort>*>(user) = fromC(*port);
          return 0;
        },
        &out);
    return out;
  }

 private:
  const kproxy_host_api* host_ = nullptr;
  const kproxy_snapshot* snapshot_ = nullptr;
};

/// The host's services, for logging.
class Host {
 public:
  explicit Host(const kproxy_host_api* api) : api_(api) {}
  /// verbosity 0..9 (shown with -v >= verbosity).
  void info(int verbosity, const std::string& message) const { write(verbosity, message); }
  void warning(const std::string& message) const { write(KPROXY_LOG_WARNING, message); }
  void error(const std::string& message) const { write(KPROXY_LOG_ERROR, message); }
  const kproxy_host_api* api() const { return api_; }

 private:
  void write(int level, const std::string& message) const {
    if (api_ != nullptr && api_->log != nullptr) api_->log(api_->host_ctx, level, message.c_str());
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

inline void setError(kproxy_error* err, const PluginError& e) {
  if (err == nullptr) return;
  err->errnum = e.errnum;
  copyMessage(err->message, sizeof err->message, e.message);
}

template <Factory F>
kproxy_backend* create(const kproxy_host_api* host, const kproxy_option* options, std::size_t n,
                       kproxy_error* err) {
  try {
    Options opts;
    for (std::size_t i = 0; i < n; ++i) opts[str(options[i].key)] = str(options[i].value);
    auto made = F(Host(host), opts);
    if (!made) {
      setError(err, made.error());
      return nullptr;
    }
    auto* handle = new BackendHandle{host, std::move(*made)};
    return reinterpret_cast<kproxy_backend*>(handle);
  } catch (const std::exception& e) {
    setError(err, PluginError{0, std::string("exception in create: ") + e.what()});
  } catch (...) {
    setError(err, PluginError{0, "unknown exception in create"});
  }
  return nullptr;
}

inline int sync(kproxy_backend* backend, const kproxy_snapshot* previous,
                const kproxy_snapshot* next, const kproxy_changed_key* changed, std::size_t n,
                std::uint32_t flags, kproxy_sync_result* result, kproxy_error* err) {
  try {
    auto* handle = reinterpret_cast<BackendHandle*>(backend);
    SyncContext ctx;
    if (previous != nullptr) ctx.previous = SnapshotView(handle->host, previous);
    ctx.next = SnapshotView(handle->host, next);
    ctx.full = (flags & KPROXY_SYNC_FULL) != 0;
    ctx.changed.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      ctx.changed.push_back(ChangedKey{static_cast<Family>(changed[i].family), str(changed[i].key)});
    auto out = handle->plugin->sync(ctx);
    if (!out) {
      setError(err, out.error());
      return KPROXY_ERR;
    }
    if (result != nullptr) {
      result->operations = out->operations;
      copyMessage(result->summary, sizeof result->summary, out->summary);
    }
    return KPROXY_OK;
  } catch (const std::exception& e) {
    setError(err, PluginError{0, std::string("exception in sync: ") + e.what()});
  } catch (...) {
    setError(err, PluginError{0, "unknown exception in sync"});
  }
  return KPROXY_ERR;
}

inline int cleanup(kproxy_backend* backend, kproxy_error* err) {
  try {
    auto out = reinterpret_cast<BackendHandle*>(backend)->plugin->cleanup();
    if (!out) {
      setError(err, out.error());
      return KPROXY_ERR;
    }
    return KPROXY_OK;
  } catch (const std::exception& e) {
    setError(err, PluginError{0, std::string("exception in cleanup: ") + e.what()});
  } catch (...) {
    setError(err, PluginError{0, "unknown exception in cleanup"});
  }
  return KPROXY_ERR;
}

inline int explain(kproxy_backend* backend, const kproxy_snapshot* snapshot,
                   const kproxy_explain_request* request, kproxy_text_writer write,
                   void* writeUser, kproxy_error* err) {
  try {
    if (request == nullptr || write == nullptr ||
        request->struct_size < sizeof(kproxy_explain_request)) {
      setError(err, PluginError{0, "explain: malformed request"});
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
      setError(err, out.error());
      return KPROXY_ERR;
    }
    write(writeUser, out->data(), out->size());
    return KPROXY_OK;
  } catch (const std::exception& e) {
    setError(err, PluginError{0, std::string("exception in explain: ") + e.what()});
  } catch (...) {
    setError(err, PluginError{0, "unknown exception in explain"});
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
        &::kproxy::sdk::detail::explain};                                              \
    return &descriptor;                                                                \
  }
