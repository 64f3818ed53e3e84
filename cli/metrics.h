#pragma once
/// kube-proxy's Prometheus metrics (pkg/proxy/metrics/metrics.go: names with the `kubeproxy_`
/// prefix, types, help texts with component-base's "[ALPHA] " stability prefix, labels and
/// histogram buckets), `kubernetes_build_info`, client-go's `rest_client_*` metrics of kproxy's
/// API client, and the standard process metrics, rendered in the Prometheus text exposition
/// format (version 0.0.4).
///
/// The sync metrics carry upstream's `ip_family` label ("IPv4", "IPv6"). Upstream runs one
/// proxier per family and observes each; kproxy's one sync programs every family the node
/// runs, so each sync is observed once under each of them. Network programming latency is
/// observed under the family of the EndpointSlice that carried the trigger time.
///
/// Where these differ from upstream's, by necessity: docs/upstream-differences.md, "Metrics".
///
/// kproxy additions (kproxy_ prefix; upstream has no such metrics):
///  - kproxy_sync_proxy_rules_failures_total{category}: the same failures by the category the
///    backend gave (kernel_refused, invalid_input, transient, unknown).
///  - kproxy_sync_verify_total / kproxy_sync_verify_mismatch_total{mode}: self-verification.
///  - the metrics backend plugins register (ABI 1.2; histograms 1.4), after the host's:
///    renderPluginMetrics.
///
/// Upstream families that backend plugins measure (plugins may not use upstream's names): the
/// host serves the plugin's kproxy_ series also under upstream's name, labels and help, in the
/// modes upstream registers them (renderUpstreamAliases). Upstream's nfacct counters, iptables
/// mode only, are read from the kernel at each scrape (NfacctMetrics).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kproxy/apiwatch/request_metrics.h"
#include "kproxy/core/histogram.h"
#include "kproxy/core/proxier.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/kernel/nfacct.h"
#include "kproxy/plugins/plugin_metrics.h"

namespace kproxy::cli {

using core::Histogram;

/// Upstream's sync duration buckets: 1 ms doubling 15 times.
Histogram syncDurationHistogram();
/// Upstream's network programming buckets (MergeBuckets keeps a leading 0).
Histogram networkProgrammingHistogram();
/// client-go's request and rate-limiter latency buckets (5 ms … 60 s).
Histogram restClientLatencyHistogram();

/// What /proc says about this process. Fields are absent when they could not be read.
struct ProcessStats {
  std::optional<double> cpuSeconds;
  std::optional<double> residentBytes;
  std::optional<double> virtualBytes;
  std::optional<double> openFds;
  std::optional<double> maxFds;
  std::optional<double> startTimeSeconds;
  std::optional<double> virtualMaxBytes;  ///< RLIMIT_AS; unlimited is 2^64 - 1, as client_golang's
  std::optional<double> networkReceiveBytes;   ///< IP octets in, of the process's network namespace
  std::optional<double> networkTransmitBytes;  ///< IP octets out, of its network namespace
};
ProcessStats readProcessStats();

/// The IpExt InOctets and OutOctets of a /proc/<pid>/net/netstat text: what client_golang's
/// process collector reports as the process's network bytes (the counters are its network
/// namespace's). Absent when the text has no such columns.
struct IpOctets {
  double in = 0;
  double out = 0;
};
std::optional<IpOctets> parseNetstatIpOctets(std::string_view netstat);

/// Service ports whose Local policy has no local endpoints, as upstream counts them per sync.
struct NoLocalEndpoints {
  std::uint64_t internal = 0;  ///< internalTrafficPolicy=Local and no local endpoints
  std::uint64_t external = 0;  ///< externally reachable, eTP=Local and no local endpoints
};
/// Of the service ports of `family` only (upstream's per-family proxiers count their own).
NoLocalEndpoints countNoLocalEndpoints(const core::Snapshot& snapshot, net::Family family);

/// The labels of kubernetes_build_info. Upstream's describe the Kubernetes release the binary
/// was built from; kproxy's say the release it follows (major, minor, git_version), its own
/// commit and tree state, and its compiler and platform.
struct BuildInfo {
  std::string kubernetesVersion = "v0.0.0";  ///< "v1.34.4"
  std::string commit = "unknown";            ///< kproxy's; "-dirty" suffix: a modified tree
};

/// client-go's rest_client_* metrics, fed by kproxy's API client (apiwatch::RequestMetrics)
/// and rendered on /metrics. Thread-safe.
class RestClientMetrics : public apiwatch::RequestMetrics {
 public:
  void requestDone(std::string_view method, std::string_view host, std::string_view code) override;
  void requestLatency(std::string_view verb, std::string_view host, double seconds) override;
  void rateLimiterWait(std::string_view verb, std::string_view host, double seconds) override;
  /// rest_client_requests_total, rest_client_request_duration_seconds and
  /// rest_client_rate_limiter_duration_seconds (a family without samples: HELP and TYPE only).
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, std::string, std::string>, std::uint64_t> requests_;  ///< code, method, host
  std::map<std::pair<std::string, std::string>, Histogram> latency_;      ///< verb, host
  std::map<std::pair<std::string, std::string>, Histogram> rateLimiter_;  ///< verb, host
};

/// Metric name prefixes the host serves itself (its own and the event source's families, the
/// process metrics); plugin metrics may not start with one (PluginMetrics::reservePrefixes).
std::vector<std::string> hostMetricPrefixes();

/// The failure category label of kproxy_sync_proxy_rules_failures_total for a sync error.
const char* failureCategoryLabel(core::ErrorCategory category);

/// Writes the text exposition format; families in the order they are added.
class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  void family(const std::string& name, const std::string& help, const std::string& type);
  /// An upstream family: component-base prefixes the help text with its stability level.
  void alphaFamily(const std::string& name, const std::string& help, const std::string& type) {
    family(name, "[ALPHA] " + help, type);
  }
  void sample(const std::string& name, const Labels& labels, double value);
  void histogram(const std::string& name, const std::string& help, const Histogram& h);
  /// One family's HELP and TYPE, then one labelled histogram per entry (labels before "le").
  void histograms(const std::string& name, const std::string& help,
                  const std::vector<std::pair<Labels, const Histogram*>>& series);
  const std::string& str() const { return out_; }

  /// Go's shortest round-trip formatting; "+Inf", "-Inf", "NaN".
  static std::string formatValue(double value);
  /// Escapes \, " and newline in a label value.
  static std::string escapeLabel(const std::string& value);

 private:
  std::string out_;
};

/// The metric state fed by the Proxier's observer and the health handlers. Thread-safe.
class ProxyMetrics {
 public:
  /// `mode` picks the backend failure counter's name and the mode's own families, as upstream
  /// registers them; `startWall` seeds sync_proxy_rules_last_queued_timestamp_seconds
  /// (upstream sets it when the loop starts) and is the tracker start before which trigger
  /// times are not observed; `families` are the ip_family label values ("IPv4", "IPv6").
  ProxyMetrics(std::string mode, double startWall,
               std::vector<std::string> families = {"IPv4", "IPv6"}, BuildInfo build = {});

  void observeSync(const core::SyncObservation& observation);
  void countHealthz(int code);
  void countLivez(int code);

  /// The whole /metrics body. `status` supplies gauges read at scrape time (pending changes,
  /// timestamps, no-local-endpoint counts from the applied snapshot).
  std::string render(const core::ProxierStatus& status, const ProcessStats& process) const;

  /// The backend failure counter's name for `mode` (see the file comment).
  static std::string failureCounterName(const std::string& mode);

 private:
  struct FamilyState {
    Histogram syncAll = syncDurationHistogram();
    Histogram syncFull = syncDurationHistogram();
    Histogram syncPartial = syncDurationHistogram();
    Histogram networkProgramming = networkProgrammingHistogram();
    std::uint64_t failures = 0;         ///< the mode's failure counter
    std::uint64_t partialFailures = 0;  ///< iptables mode: failed partial syncs
  };
  mutable std::mutex mutex_;
  std::string mode_;
  double startWall_;
  std::vector<std::string> families_;
  BuildInfo build_;
  std::map<std::string, FamilyState> perFamily_;
  std::uint64_t verifications_ = 0;
  std::uint64_t verifyMismatches_ = 0;
  std::map<std::string, std::uint64_t> failuresByCategory_;
  std::map<int, std::uint64_t> healthz_;
  std::map<int, std::uint64_t> livez_;
};

/// The metrics plugins registered (PluginMetrics::collect()), with HELP and TYPE, in the text
/// exposition format. A family without samples yet gets its HELP and TYPE only.
std::string renderPluginMetrics(const std::vector<plugins::MetricFamily>& families);

/// A plugin metric the host serves under upstream's name too.
struct UpstreamAlias {
  std::string_view pluginName;    ///< the plugin's kproxy_ family
  std::string_view upstreamName;  ///< pkg/proxy/metrics/metrics.go's
  std::string_view help;          ///< upstream's, without component-base's "[ALPHA] "
  std::vector<std::string_view> modes;  ///< where upstream registers it
};
/// kubeproxy_sync_proxy_rules_iptables_total / _last (from the iptables plugin's
/// kproxy_iptables_rules / _last_sync{family,table}: family "ipv4" → ip_family "IPv4", tables
/// filter and nat only, as upstream's) and kubeproxy_conntrack_reconciler_sync_duration_seconds
/// / _deleted_entries_total{ip_family} (from the reconcile skeleton's kproxy_conntrack_
/// reconciler_*).
const std::vector<UpstreamAlias>& upstreamAliases();
/// The aliased families of `families` that `mode` registers, with upstream's names, labels
/// (sorted by name) and help; a family without samples is left out, as upstream's vectors
/// before their first observation.
std::string renderUpstreamAliases(const std::string& mode, const std::vector<plugins::MetricFamily>& families);

/// Upstream's nfacct counters (iptables mode): kubeproxy_iptables_ct_state_invalid_dropped_
/// packets_total and kubeproxy_iptables_localhost_nodeports_accepted_packets_total, the packet
/// counts of the objects the iptables backend creates, read from the kernel at each scrape.
/// Thread-safe (one lock around the client).
class NfacctMetrics {
 public:
  /// `client`: nfacct in kproxy's network namespace; null when the kernel has none (then
  /// nothing is served).
  explicit NfacctMetrics(std::unique_ptr<kernel::Nfacct> client) : client_(std::move(client)) {}
  /// Opens the kernel's (makeNetlinkNfacct); when that fails, logs one line, as upstream, and
  /// serves nothing.
  static std::unique_ptr<NfacctMetrics> open();
  /// Each counter the kernel answers for; one that it does not (the object is not created
  /// yet) is logged and left out, as upstream's collector does.
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::unique_ptr<kernel::Nfacct> client_;
};

}  // namespace kproxy::cli
