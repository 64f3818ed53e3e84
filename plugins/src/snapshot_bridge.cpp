#include "snapshot_bridge.h"

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "kproxy/core/log.h"
#include "kproxy/plugins/snapshot_view.h"

namespace kproxy::plugins {
namespace {

std::uint8_t protocolCode(core::Protocol p) {
  switch (p) {
    case core::Protocol::kTCP: return KPROXY_PROTO_TCP;
    case core::Protocol::kUDP: return KPROXY_PROTO_UDP;
    case core::Protocol::kSCTP: return KPROXY_PROTO_SCTP;
  }
  return KPROXY_PROTO_TCP;
}

std::uint8_t typeCode(core::ServiceType t) {
  switch (t) {
    case core::ServiceType::kNodePort: return KPROXY_SVC_NODE_PORT;
    case core::ServiceType::kLoadBalancer: return KPROXY_SVC_LOAD_BALANCER;
    default: return KPROXY_SVC_CLUSTER_IP;
  }
}

// The C view of one ServicePortState. Pointers borrow from the state, which the snapshot keeps
// alive for the duration of the visit.
class ServicePortView {
 public:
  explicit ServicePortView(const core::ServicePortState& s) {
    view_.struct_size = sizeof(kproxy_service_port);
    view_.endpoint_size = sizeof(kproxy_endpoint);
    view_.family = static_cast<std::uint8_t>(s.key.family);
    view_.protocol = protocolCode(s.protocol);
    view_.type = typeCode(s.type);
    view_.session_affinity_client_ip = s.sessionAffinityClientIP ? 1 : 0;
    view_.key = s.key.name.c_str();
    view_.ns = s.ns.c_str();
    view_.service_name = s.serviceName.c_str();
    view_.port_name = s.portName.c_str();
    view_.cluster_ip = s.clusterIP.c_str();
    view_.port = s.port;
    view_.node_port = s.nodePort;
    view_.health_check_node_port = s.healthCheckNodePort;
    view_.sticky_max_age_seconds = s.stickyMaxAgeSeconds;
    view_.external_policy_local = s.externalPolicy == core::TrafficPolicy::kLocal ? 1 : 0;
    view_.internal_policy_local = s.internalPolicy == core::TrafficPolicy::kLocal ? 1 : 0;
    view_.has_any_endpoints = s.hasAnyEndpoints ? 1 : 0;
    strings(s.externalIPs, externalIPs_, view_.external_ips, view_.external_ips_count);
    strings(s.loadBalancerVIPs, lbIPs_, view_.load_balancer_ips, view_.load_balancer_ips_count);
    strings(s.loadBalancerSourceRanges, ranges_, view_.load_balancer_source_ranges,
            view_.load_balancer_source_ranges_count);
    endpoints(s.clusterEndpoints, cluster_, view_.cluster_endpoints, view_.cluster_endpoints_count);
    endpoints(s.localEndpoints, local_, view_.local_endpoints, view_.local_endpoints_count);
    endpoints(s.allReachableEndpoints, reachable_, view_.all_reachable_endpoints,
              view_.all_reachable_endpoints_count);
    endpoints(s.allEndpoints, all_, view_.all_endpoints, view_.all_endpoints_count);
  }
  const kproxy_service_port* get() const { return &view_; }

 private:
  static void strings(const std::vector<std::string>& in, std::vector<const char*>& storage,
                      const char* const*& out, size_t& count) {
    storage.reserve(in.size());
    for (const auto& s : in) storage.push_back(s.c_str());
    out = storage.data();
    count = storage.size();
  }
  static void endpoints(const std::vector<core::Endpoint>& in, std::vector<kproxy_endpoint>& storage,
                        const kproxy_endpoint*& out, size_t& count) {
    storage.reserve(in.size());
    for (const auto& e : in) {
      storage.push_back(kproxy_endpoint{e.ip.c_str(), e.port, static_cast<uint8_t>(e.isLocal),
                                        static_cast<uint8_t>(e.ready),
                                        static_cast<uint8_t>(e.serving),
                                        static_cast<uint8_t>(e.terminating), e.nodeName.c_str(),
                                        e.zone.c_str()});
    }
    out = storage.data();
    count = storage.size();
  }

  kproxy_service_port view_{};
  std::vector<const char*> externalIPs_, lbIPs_, ranges_;
  std::vector<kproxy_endpoint> cluster_, local_, reachable_, all_;
};

// The node view lives as long as the snapshot's NodeInfo; it is rebuilt per call into
// thread-local storage because the ABI hands out a pointer.
struct NodeView {
  kproxy_node_info info{};
  std::vector<const char*> addresses;
  std::vector<const char*> podCIDRs;
  std::vector<const char*> nodePortAddresses;
};

void hostLogAt(void* /*ctx*/, int level, const char* file, int line, const char* message) {
  const std::string_view text = message != nullptr ? message : "";
  const std::string_view where = file != nullptr ? file : "";
  const log::Field source[] = {{"source", "plugin"}};
  if (level == KPROXY_LOG_ERROR) {
    log::writeAt(log::Severity::kError, 0, where, line, text, source);
  } else if (level == KPROXY_LOG_WARNING) {
    log::writeAt(log::Severity::kWarning, 0, where, line, text, source);
  } else {
    log::writeAt(log::Severity::kInfo, level < 0 ? 0 : level, where, line, text, source);
  }
}

// A plugin built before ABI 1.3 names no file: its lines carry no caller.
void hostLog(void* ctx, int level, const char* message) { hostLogAt(ctx, level, nullptr, 0, message); }

size_t snapshotSize(const kproxy_snapshot* snapshot) { return fromC(snapshot)->size(); }

const kproxy_node_info* snapshotNode(const kproxy_snapshot* snapshot) {
  thread_local NodeView view;
  const core::NodeInfo& node = fromC(snapshot)->node();
  view.addresses.clear();
  view.podCIDRs.clear();
  view.nodePortAddresses.clear();
  for (const auto& a : node.addresses) view.addresses.push_back(a.c_str());
  for (const auto& a : node.nodePortAddresses.addresses) view.nodePortAddresses.push_back(a.c_str());
  for (const auto& c : node.podCIDRs) view.podCIDRs.push_back(c.c_str());
  view.info.struct_size = sizeof(kproxy_node_info);
  view.info.name = node.name.c_str();
  view.info.zone = node.zone.c_str();
  view.info.addresses = view.addresses.data();
  view.info.addresses_count = view.addresses.size();
  view.info.pod_cidrs = view.podCIDRs.data();
  view.info.pod_cidrs_count = view.podCIDRs.size();
  view.info.nodeport_addresses = view.nodePortAddresses.data();
  view.info.nodeport_addresses_count = view.nodePortAddresses.size();
  const auto& np = node.nodePortAddresses;
  view.info.nodeport_flags = (np.resolved ? KPROXY_NODEPORT_RESOLVED : 0u) |
                             (np.resolved && np.allLocalIPv4 ? KPROXY_NODEPORT_ALL_LOCAL_IPV4 : 0u) |
                             (np.resolved && np.allLocalIPv6 ? KPROXY_NODEPORT_ALL_LOCAL_IPV6 : 0u);
  return &view.info;
}

void snapshotForeach(const kproxy_snapshot* snapshot, kproxy_service_port_visitor visit,
                     void* user) {
  fromC(snapshot)->forEach([&](const core::ServicePortState& state) {
    ServicePortView view(state);
    return visit(user, view.get()) == 0;
  });
}

int snapshotFind(const kproxy_snapshot* snapshot, uint8_t family, const char* key,
                 kproxy_service_port_visitor visit, void* user) {
  if (key == nullptr || (family != KPROXY_FAMILY_IPV4 && family != KPROXY_FAMILY_IPV6)) return 0;
  auto state = fromC(snapshot)->find(core::ServicePortKey{static_cast<net::Family>(family), key});
  if (!state) return 0;
  ServicePortView view(*state);
  visit(user, view.get());
  return 1;
}

// Fills a plugin's error; the plugin calling a 1.2 function has a 1.2 kproxy_error.
void metricError(kproxy_error* err, const core::Error& e) {
  if (err == nullptr) return;
  err->errnum = e.errnum;
  std::size_t n = std::min(sizeof err->message - 1, e.context.size());
  e.context.copy(err->message, n);
  err->message[n] = '\0';
  err->category = KPROXY_ERROR_INVALID_INPUT;
}

std::uint64_t metricRegister(void* ctx, const kproxy_metric_spec* spec, kproxy_error* err) {
  auto refuse = [err](std::string why) {
    metricError(err, core::Error{core::ErrorCategory::kInvalidArgument, EINVAL, std::move(why)});
    return std::uint64_t{0};
  };
  if (ctx == nullptr) return refuse("this host keeps no plugin metrics");
  if (spec == nullptr || spec->struct_size < KPROXY_METRIC_SPEC_V1_2_SIZE) {
    return refuse("plugin metric: no spec, or a spec smaller than ABI 1.2's");
  }
  if (spec->name == nullptr) return refuse("plugin metric: no name");
  std::string name(spec->name);
  MetricType type;
  if (spec->type == KPROXY_METRIC_COUNTER) {
    type = MetricType::kCounter;
  } else if (spec->type == KPROXY_METRIC_GAUGE) {
    type = MetricType::kGauge;
  } else if (spec->type == KPROXY_METRIC_HISTOGRAM) {
    type = MetricType::kHistogram;
  } else {
    return refuse("plugin metric \"" + name + "\": unknown type " + std::to_string(spec->type));
  }
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < spec->label_names_count; ++i) {
    if (spec->label_names == nullptr || spec->label_names[i] == nullptr)
      return refuse("plugin metric \"" + name + "\": a NULL label name");
    labels.emplace_back(spec->label_names[i]);
  }
  std::vector<double> buckets;
  if (type == MetricType::kHistogram) {
    // Growth rule 2: a spec that does not cover the buckets cannot describe a histogram.
    if (spec->struct_size < offsetof(kproxy_metric_spec, buckets_count) + sizeof spec->buckets_count)
      return refuse("plugin metric \"" + name + "\": a histogram's spec (ABI 1.4) has no buckets");
    if (spec->buckets_count != 0 && spec->buckets == nullptr)
      return refuse("plugin metric \"" + name + "\": NULL buckets");
    buckets.assign(spec->buckets, spec->buckets + spec->buckets_count);
  }
  auto handle = static_cast<PluginMetrics*>(ctx)->registerMetric(
      type, name, spec->help != nullptr ? spec->help : "", labels, buckets);
  if (!handle) {
    metricError(err, handle.error());
    return 0;
  }
  return *handle;
}

enum class Update { kAdd, kSet, kObserve };

template <Update kUpdate>
int metricUpdate(void* ctx, std::uint64_t handle, const char* const* values, std::size_t count,
                 double value) {
  if (ctx == nullptr || (count != 0 && values == nullptr)) return KPROXY_ERR;
  std::vector<std::string> labelValues;
  labelValues.reserve(count);
  for (std::size_t i = 0; i < count; ++i) labelValues.emplace_back(values[i] != nullptr ? values[i] : "");
  auto* metrics = static_cast<PluginMetrics*>(ctx);
  auto r = kUpdate == Update::kSet       ? metrics->set(handle, labelValues, value)
           : kUpdate == Update::kObserve ? metrics->observe(handle, labelValues, value)
                                         : metrics->add(handle, labelValues, value);
  if (!r) {
    log::info(4, "plugin metric update refused", {{"source", "plugin"}, {"error", r.error().message()}});
    return KPROXY_ERR;
  }
  return KPROXY_OK;
}

void snapshotServiceCIDRs(const kproxy_snapshot* snapshot, kproxy_service_cidr_visitor visit,
                          void* user) {
  for (const auto& range : fromC(snapshot)->serviceCIDRs()) {
    const kproxy_service_cidr c{sizeof(kproxy_service_cidr), range.name.c_str(), range.cidr.c_str()};
    if (visit(user, &c) != 0) return;
  }
}


}  // namespace

kproxy_host_api makeHostApi(PluginMetrics* metrics) {
  kproxy_host_api api{};
  api.struct_size = sizeof api;
  api.abi_version = KPROXY_PLUGIN_ABI_VERSION;
  api.host_ctx = metrics;
  api.log = &hostLog;
  api.snapshot_size = &snapshotSize;
  api.snapshot_node = &snapshotNode;
  api.snapshot_foreach = &snapshotForeach;
  api.snapshot_find = &snapshotFind;
  api.features = KPROXY_HOST_ERROR_CATEGORY;
  api.snapshot_service_cidrs = &snapshotServiceCIDRs;
  api.log_at = &hostLogAt;
  // Without a registry the functions stay NULL: plugins then treat metrics as absent (rule 5)
  // instead of failing to register.
  if (metrics != nullptr) {
    api.metric_register = &metricRegister;
    api.metric_add = &metricUpdate<Update::kAdd>;
    api.metric_set = &metricUpdate<Update::kSet>;
    api.metric_observe = &metricUpdate<Update::kObserve>;
  }
  return api;
}

const kproxy_host_api* hostApi() {
  static const kproxy_host_api api = makeHostApi(nullptr);
  return &api;
}

sdk::SnapshotView sdkView(const core::Snapshot& snapshot) { return sdk::SnapshotView(hostApi(), toC(&snapshot)); }

}  // namespace kproxy::plugins
