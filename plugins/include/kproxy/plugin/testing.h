#pragma once
/// A fake host for unit tests of a backend plugin, header-only like the SDK: no kproxy, no
/// kernel, no API server. It drives a plugin through its C descriptor exactly as kproxy does
/// (create, sync, cleanup, explain, destroy, with the ABI 1.3 host table), over snapshots built
/// from SDK value types, and keeps what the plugin logged and the metrics it registered.
///
///   #include <kproxy/plugin/testing.h>
///   namespace kt = kproxy::sdk::testing;
///   kt::FakeHost host;
///   kt::FakeSnapshot next(node, {port});
///   kt::PluginUnderTest plugin(kproxy_plugin_entry(), host, {{"node-name", "n1"}});
///   auto outcome = plugin.sync(nullptr, next, {{kproxy::sdk::Family::kIPv4, port.key}});
///
/// What it does not do: the real host's metric name rules (plugins/src/plugin_metrics.cpp)
/// are reduced to refusing an empty name and a second registration that differs; snapshots
/// are whatever the test builds, not resolved from API objects. Not thread-safe: one test
/// thread per FakeHost.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/plugin/abi.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::sdk::testing {

/// An immutable snapshot as the host hands it to a plugin: node, service ports and
/// ServiceCIDRs in their C layout. The C structs point into this object, so it can be moved
/// (the data lives behind a pointer) but not copied.
class FakeSnapshot {
 public:
  FakeSnapshot(NodeInfo node, std::vector<ServicePort> ports,
               std::vector<ServiceCIDR> serviceCIDRs = {})
      : data_(std::make_unique<Data>()) {
    data_->node = std::move(node);
    data_->ports = std::move(ports);
    data_->cidrs = std::move(serviceCIDRs);
    data_->build();
  }

  /// The opaque handle a plugin receives.
  const kproxy_snapshot* handle() const {
    return reinterpret_cast<const kproxy_snapshot*>(data_.get());
  }

 private:
  friend class FakeHost;
  struct CPort {
    kproxy_service_port port{};
    std::vector<const char*> externalIPs, loadBalancerIPs, sourceRanges;
    std::vector<kproxy_endpoint> cluster, local, reachable, all;
  };
  struct Data {
    NodeInfo node;
    std::vector<ServicePort> ports;
    std::vector<ServiceCIDR> cidrs;
    std::vector<CPort> cports;  // sized once in build(): pointers into it stay valid
    kproxy_node_info cnode{};
    std::vector<const char*> nodeAddresses, podCIDRs, nodePortAddresses;

    static std::vector<const char*> pointers(const std::vector<std::string>& v) {
      std::vector<const char*> out;
      out.reserve(v.size());
      for (const auto& s : v) out.push_back(s.c_str());
      return out;
    }
    static std::vector<kproxy_endpoint> endpoints(const std::vector<Endpoint>& v) {
      std::vector<kproxy_endpoint> out;
      out.reserve(v.size());
      for (const auto& e : v) {
        out.push_back(kproxy_endpoint{e.ip.c_str(), e.port, e.isLocal, e.ready, e.serving,
                                      e.terminating, e.nodeName.c_str(), e.zone.c_str()});
      }
      return out;
    }
    void build() {
      nodeAddresses = pointers(node.addresses);
      podCIDRs = pointers(node.podCIDRs);
      nodePortAddresses = pointers(node.nodePortAddresses.addresses);
      cnode.struct_size = sizeof cnode;
      cnode.name = node.name.c_str();
      cnode.zone = node.zone.c_str();
      cnode.addresses = nodeAddresses.data();
      cnode.addresses_count = nodeAddresses.size();
      cnode.pod_cidrs = podCIDRs.data();
      cnode.pod_cidrs_count = podCIDRs.size();
      cnode.nodeport_addresses = nodePortAddresses.data();
      cnode.nodeport_addresses_count = nodePortAddresses.size();
      const auto& np = node.nodePortAddresses;
      cnode.nodeport_flags = (np.resolved ? KPROXY_NODEPORT_RESOLVED : 0u) |
                             (np.allLocalIPv4 ? KPROXY_NODEPORT_ALL_LOCAL_IPV4 : 0u) |
                             (np.allLocalIPv6 ? KPROXY_NODEPORT_ALL_LOCAL_IPV6 : 0u);
      cports.resize(ports.size());
      for (std::size_t i = 0; i < ports.size(); ++i) {
        const ServicePort& p = ports[i];
        CPort& c = cports[i];
        c.externalIPs = pointers(p.externalIPs);
        c.loadBalancerIPs = pointers(p.loadBalancerIPs);
        c.sourceRanges = pointers(p.loadBalancerSourceRanges);
        c.cluster = endpoints(p.clusterEndpoints);
        c.local = endpoints(p.localEndpoints);
        c.reachable = endpoints(p.allReachableEndpoints);
        c.all = endpoints(p.allEndpoints);
        kproxy_service_port& s = c.port;
        s.struct_size = sizeof s;
        s.family = static_cast<std::uint8_t>(p.family);
        s.protocol = static_cast<std::uint8_t>(p.protocol);
        s.type = static_cast<std::uint8_t>(p.type);
        s.session_affinity_client_ip = p.sessionAffinityClientIP;
        s.key = p.key.c_str();
        s.ns = p.ns.c_str();
        s.service_name = p.serviceName.c_str();
        s.port_name = p.portName.c_str();
        s.cluster_ip = p.clusterIP.c_str();
        s.port = p.port;
        s.node_port = p.nodePort;
        s.health_check_node_port = p.healthCheckNodePort;
        s.sticky_max_age_seconds = p.stickyMaxAgeSeconds;
        s.external_policy_local = p.externalPolicyLocal;
        s.internal_policy_local = p.internalPolicyLocal;
        s.has_any_endpoints = p.hasAnyEndpoints;
        s.external_ips = c.externalIPs.data();
        s.external_ips_count = c.externalIPs.size();
        s.load_balancer_ips = c.loadBalancerIPs.data();
        s.load_balancer_ips_count = c.loadBalancerIPs.size();
        s.load_balancer_source_ranges = c.sourceRanges.data();
        s.load_balancer_source_ranges_count = c.sourceRanges.size();
        s.cluster_endpoints = c.cluster.data();
        s.cluster_endpoints_count = c.cluster.size();
        s.local_endpoints = c.local.data();
        s.local_endpoints_count = c.local.size();
        s.all_reachable_endpoints = c.reachable.data();
        s.all_reachable_endpoints_count = c.reachable.size();
        s.all_endpoints = c.all.data();
        s.all_endpoints_count = c.all.size();
        s.endpoint_size = sizeof(kproxy_endpoint);
      }
    }
  };
  static const Data& of(const kproxy_snapshot* s) { return *reinterpret_cast<const Data*>(s); }
  std::unique_ptr<Data> data_;
};

/// The host side: an ABI 1.4 kproxy_host_api whose log lines and metrics a test can read.
/// Must outlive every plugin created with it.
class FakeHost {
 public:
  struct LogLine {
    int level;  ///< -v verbosity 0..9, KPROXY_LOG_WARNING or KPROXY_LOG_ERROR
    std::string message;
    std::string file;  ///< the plugin's source file (ABI 1.3's log_at; empty through log)
    int line = 0;
  };

  FakeHost() {
    api_.struct_size = sizeof api_;
    api_.abi_version = KPROXY_PLUGIN_ABI_VERSION;
    api_.host_ctx = this;
    api_.log = [](void* ctx, int level, const char* message) {
      self(ctx).logs_.push_back(LogLine{level, message != nullptr ? message : "", {}, 0});
    };
    api_.log_at = [](void* ctx, int level, const char* file, int line, const char* message) {
      self(ctx).logs_.push_back(
          LogLine{level, message != nullptr ? message : "", file != nullptr ? file : "", line});
    };
    api_.snapshot_size = [](const kproxy_snapshot* s) { return FakeSnapshot::of(s).ports.size(); };
    api_.snapshot_node = [](const kproxy_snapshot* s) { return &FakeSnapshot::of(s).cnode; };
    api_.snapshot_foreach = [](const kproxy_snapshot* s, kproxy_service_port_visitor visit,
                               void* user) {
      for (const auto& c : FakeSnapshot::of(s).cports) {
        if (visit(user, &c.port) != 0) return;
      }
    };
    api_.snapshot_find = [](const kproxy_snapshot* s, std::uint8_t family, const char* key,
                            kproxy_service_port_visitor visit, void* user) -> int {
      for (const auto& c : FakeSnapshot::of(s).cports) {
        if (c.port.family == family && std::strcmp(c.port.key, key) == 0) {
          visit(user, &c.port);
          return 1;
        }
      }
      return 0;
    };
    api_.features = KPROXY_HOST_ERROR_CATEGORY;
    api_.metric_register = [](void* ctx, const kproxy_metric_spec* spec,
                              kproxy_error* err) -> std::uint64_t {
      return self(ctx).registerMetric(*spec, err);
    };
    api_.metric_add = [](void* ctx, std::uint64_t h, const char* const* values, std::size_t n,
                         double delta) { return self(ctx).update(h, values, n, delta, false); };
    api_.metric_set = [](void* ctx, std::uint64_t h, const char* const* values, std::size_t n,
                         double value) { return self(ctx).update(h, values, n, value, true); };
    api_.metric_observe = [](void* ctx, std::uint64_t h, const char* const* values, std::size_t n,
                             double value) { return self(ctx).observe(h, values, n, value); };
    api_.snapshot_service_cidrs = [](const kproxy_snapshot* s, kproxy_service_cidr_visitor visit,
                                     void* user) {
      for (const auto& c : FakeSnapshot::of(s).cidrs) {
        kproxy_service_cidr cidr{sizeof(kproxy_service_cidr), c.name.c_str(), c.cidr.c_str()};
        if (visit(user, &cidr) != 0) return;
      }
    };
  }
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  const kproxy_host_api* api() const { return &api_; }
  /// Every line the plugin logged, in order.
  const std::vector<LogLine>& logs() const { return logs_; }
  /// The value of a registered metric with these label values; nullopt when never set.
  std::optional<double> metric(const std::string& name,
                               const std::vector<std::string>& labelValues = {}) const {
    return valueOf(name, labelValues, &Registered::values);
  }
  /// A histogram's observations with these label values (ABI 1.4).
  struct Observations {
    std::uint64_t count = 0;
    double sum = 0;
  };
  /// nullopt when never observed.
  std::optional<Observations> observed(const std::string& name,
                                       const std::vector<std::string>& labelValues = {}) const {
    return valueOf(name, labelValues, &Registered::observations);
  }

 private:
  struct Registered {
    std::string name, help;
    std::uint32_t type;
    std::vector<std::string> labels;
    std::map<std::vector<std::string>, double> values;
    std::map<std::vector<std::string>, Observations> observations;
  };
  static FakeHost& self(void* ctx) { return *static_cast<FakeHost*>(ctx); }
  /// The entry for `labelValues` in `member` of the metric named `name`.
  template <class Value>
  std::optional<Value> valueOf(const std::string& name, const std::vector<std::string>& labelValues,
                               std::map<std::vector<std::string>, Value> Registered::*member) const {
    for (const auto& m : metrics_) {
      if (m.name != name) continue;
      auto it = (m.*member).find(labelValues);
      if (it != (m.*member).end()) return it->second;
    }
    return std::nullopt;
  }

  std::uint64_t registerMetric(const kproxy_metric_spec& spec, kproxy_error* err) {
    std::string name = spec.name != nullptr ? spec.name : "";
    std::vector<std::string> labels = detail::strs(spec.label_names, spec.label_names_count);
    for (std::size_t i = 0; i < metrics_.size(); ++i) {
      const auto& m = metrics_[i];
      if (m.name != name) continue;
      if (m.type == spec.type && m.help == detail::str(spec.help) && m.labels == labels)
        return i + 1;
      return refuse(err,
                    "metric " + name + " is already registered with another type, help or labels");
    }
    if (name.empty()) return refuse(err, "a metric needs a name");
    metrics_.push_back(Registered{name, detail::str(spec.help), spec.type, std::move(labels), {}, {}});
    return metrics_.size();
  }
  static std::uint64_t refuse(kproxy_error* err, const std::string& why) {
    if (err != nullptr) {
      err->errnum = EINVAL;
      detail::copyMessage(err->message, sizeof err->message, why);
    }
    return 0;
  }
  int update(std::uint64_t handle, const char* const* values, std::size_t n, double v, bool set) {
    if (handle == 0 || handle > metrics_.size()) return KPROXY_ERR;
    Registered& m = metrics_[handle - 1];
    if (n != m.labels.size()) return KPROXY_ERR;
    if (m.type == KPROXY_METRIC_HISTOGRAM) return KPROXY_ERR;
    if (m.type == KPROXY_METRIC_COUNTER && (set || v < 0)) return KPROXY_ERR;
    double& value = m.values[detail::strs(values, n)];
    value = set ? v : value + v;
    return KPROXY_OK;
  }

  int observe(std::uint64_t handle, const char* const* values, std::size_t n, double v) {
    if (handle == 0 || handle > metrics_.size()) return KPROXY_ERR;
    Registered& m = metrics_[handle - 1];
    if (m.type != KPROXY_METRIC_HISTOGRAM || n != m.labels.size()) return KPROXY_ERR;
    Observations& o = m.observations[detail::strs(values, n)];
    ++o.count;
    o.sum += v;
    return KPROXY_OK;
  }

  kproxy_host_api api_{};
  std::vector<LogLine> logs_;
  std::vector<Registered> metrics_;
};

/// One backend of a plugin, created and driven through its descriptor as kproxy drives it.
/// A failed create is kept in createError(); the other calls then fail with it.
class PluginUnderTest {
 public:
  PluginUnderTest(const kproxy_plugin_descriptor* descriptor, const FakeHost& host,
                  const Options& options = {})
      : descriptor_(descriptor) {
    std::vector<kproxy_option> opts;
    for (const auto& [k, v] : options) opts.push_back({k.c_str(), v.c_str()});
    kproxy_error err{};
    backend_ = descriptor_->create(host.api(), opts.data(), opts.size(), &err);
    if (backend_ == nullptr) createError_ = toError(err);
  }
  ~PluginUnderTest() {
    if (backend_ != nullptr) descriptor_->destroy(backend_);
  }
  PluginUnderTest(const PluginUnderTest&) = delete;
  PluginUnderTest& operator=(const PluginUnderTest&) = delete;

  const std::optional<PluginError>& createError() const { return createError_; }

  /// A sync from `previous` (nullptr: the first one) to `next`. `full` sets KPROXY_SYNC_FULL.
  Expected<SyncOutcome> sync(const FakeSnapshot* previous, const FakeSnapshot& next,
                             const std::vector<ChangedKey>& changed, bool full = false) {
    if (createError_) return std::unexpected(*createError_);
    std::vector<kproxy_changed_key> keys;
    for (const auto& k : changed)
      keys.push_back({static_cast<std::uint8_t>(k.family), k.key.c_str()});
    kproxy_sync_result result{};
    result.struct_size = sizeof result;
    kproxy_error err{};
    if (descriptor_->sync(backend_, previous != nullptr ? previous->handle() : nullptr,
                          next.handle(), keys.data(), keys.size(), full ? KPROXY_SYNC_FULL : 0u,
                          &result, &err) != KPROXY_OK) {
      return std::unexpected(toError(err));
    }
    return SyncOutcome{result.operations,
                       std::string(result.summary, strnlen(result.summary, sizeof result.summary))};
  }

  Expected<void> cleanup() {
    if (createError_) return std::unexpected(*createError_);
    kproxy_error err{};
    if (descriptor_->cleanup(backend_, &err) != KPROXY_OK) return std::unexpected(toError(err));
    return {};
  }

  /// The plugin's answer to `kproxy explain` for `request` under `snapshot`.
  Expected<std::string> explain(const FakeSnapshot& snapshot, const ExplainRequest& request) {
    if (createError_) return std::unexpected(*createError_);
    if (descriptor_->struct_size < offsetof(kproxy_plugin_descriptor, explain) + sizeof(void*) ||
        descriptor_->explain == nullptr) {
      return fail("the plugin has no explain entry point");
    }
    kproxy_explain_request r{};
    r.struct_size = sizeof r;
    r.family = static_cast<std::uint8_t>(request.family);
    r.protocol = static_cast<std::uint8_t>(request.protocol);
    r.destination_port = request.destinationPort;
    r.flags = (request.fromNode ? KPROXY_EXPLAIN_FROM_NODE : 0u) |
              (request.json ? KPROXY_EXPLAIN_JSON : 0u);
    r.source_ip = request.sourceIP.c_str();
    r.destination_ip = request.destinationIP.c_str();
    r.input_interface = request.inputInterface.c_str();
    std::string text;
    kproxy_error err{};
    auto append = [](void* user, const char* t, std::size_t n) {
      static_cast<std::string*>(user)->append(t, n);
    };
    if (descriptor_->explain(backend_, snapshot.handle(), &r, append, &text, &err) != KPROXY_OK) {
      return std::unexpected(toError(err));
    }
    return text;
  }

 private:
  static PluginError toError(const kproxy_error& err) {
    return PluginError{err.errnum,
                       std::string(err.message, strnlen(err.message, sizeof err.message)),
                       static_cast<ErrorCategory>(err.category)};
  }
  const kproxy_plugin_descriptor* descriptor_;
  kproxy_backend* backend_ = nullptr;
  std::optional<PluginError> createError_;
};

}  // namespace kproxy::sdk::testing
