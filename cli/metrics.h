#pragma once
/// kube-proxy's Prometheus metrics (pkg/proxy/metrics/metrics.go: names with the `kubeproxy_`
/// prefix, types, help texts and histogram buckets) plus the standard process metrics, rendered
/// in the Prometheus text exposition format (version 0.0.4).
///
/// Where these differ from upstream's, by necessity: docs/upstream-differences.md, "Metrics".
///
/// kproxy additions (kproxy_ prefix; upstream has no such metrics):
///  - kproxy_sync_proxy_rules_failures_total{category}: the same failures by the category the
///    backend gave (kernel_refused, invalid_input, transient, unknown). Upstream's counter
///    above stays unlabelled, so its series does not change.
///  - the metrics backend plugins register (ABI 1.2), after the host's: renderPluginMetrics.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kproxy/core/proxier.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/plugins/plugin_metrics.h"

namespace kproxy::cli {

/// A cumulative Prometheus histogram with fixed upper bounds (+Inf is implicit).
struct Histogram {
  std::vector<double> bounds;          ///< ascending
  std::vector<std::uint64_t> counts;   ///< per bound, non-cumulative; size() == bounds.size()
  double sum = 0;
  std::uint64_t count = 0;

  explicit Histogram(std::vector<double> upperBounds);
  void observe(double value);
  /// start, start*factor, … (count bounds), like prometheus.ExponentialBuckets.
  static Histogram exponential(double start, double factor, int count);
};

/// Upstream's sync duration buckets: 1 ms doubling 15 times.
Histogram syncDurationHistogram();
/// Upstream's network programming buckets (MergeBuckets keeps a leading 0).
Histogram networkProgrammingHistogram();

/// What /proc says about this process. Fields are absent when they could not be read.
struct ProcessStats {
  std::optional<double> cpuSeconds;
  std::optional<double> residentBytes;
  std::optional<double> virtualBytes;
  std::optional<double> openFds;
  std::optional<double> maxFds;
  std::optional<double> startTimeSeconds;
};
ProcessStats readProcessStats();

/// Service ports whose Local policy has no local endpoints, as upstream counts them per sync.
struct NoLocalEndpoints {
  std::uint64_t internal = 0;  ///< internalTrafficPolicy=Local and no local endpoints
  std::uint64_t external = 0;  ///< externally reachable, eTP=Local and no local endpoints
};
NoLocalEndpoints countNoLocalEndpoints(const core::Snapshot& snapshot);

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
  void sample(const std::string& name, const Labels& labels, double value);
  void histogram(const std::string& name, const std::string& help, const Histogram& h);
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
  /// `mode` picks the backend failure counter's name; `startWall` seeds
  /// sync_proxy_rules_last_queued_timestamp_seconds (upstream sets it when the loop starts).
  ProxyMetrics(std::string mode, double startWall);

  void observeSync(const core::SyncObservation& observation);
  void countHealthz(int code);
  void countLivez(int code);

  /// The whole /metrics body. `status` supplies gauges read at scrape time (pending changes,
  /// timestamps, no-local-endpoint counts from the applied snapshot).
  std::string render(const core::ProxierStatus& status, const ProcessStats& process) const;

  /// The backend failure counter's name for `mode` (see the file comment).
  static std::string failureCounterName(const std::string& mode);

 private:
  mutable std::mutex mutex_;
  std::string mode_;
  double startWall_;
  Histogram syncAll_ = syncDurationHistogram();
  Histogram syncFull_ = syncDurationHistogram();
  Histogram syncPartial_ = syncDurationHistogram();
  Histogram networkProgramming_ = networkProgrammingHistogram();
  std::uint64_t failures_ = 0;
  std::uint64_t verifications_ = 0;
  std::uint64_t verifyMismatches_ = 0;
  std::map<std::string, std::uint64_t> failuresByCategory_;
  std::map<int, std::uint64_t> healthz_;
  std::map<int, std::uint64_t> livez_;
};

/// The metrics plugins registered (PluginMetrics::collect()), with HELP and TYPE, in the text
/// exposition format. A family without samples yet gets its HELP and TYPE only.
std::string renderPluginMetrics(const std::vector<plugins::MetricFamily>& families);

}  // namespace kproxy::cli
