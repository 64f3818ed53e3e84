#include "metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace kproxy::cli {

// --- Histogram -------------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> upperBounds)
    : bounds(std::move(upperBounds)), counts(bounds.size(), 0) {}

void Histogram::observe(double value) {
  // Prometheus buckets are "less than or equal"; the first bound >= value takes it.
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), value);
  if (it != bounds.end()) ++counts[static_cast<std::size_t>(it - bounds.begin())];
  sum += value;
  ++count;
}

Histogram Histogram::exponential(double start, double factor, int n) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < n; ++i, v *= factor) b.push_back(v);
  return Histogram(std::move(b));
}

Histogram syncDurationHistogram() { return Histogram::exponential(0.001, 2, 15); }

Histogram networkProgrammingHistogram() {
  std::vector<double> b{0};
  for (int i = 0; i < 2; ++i) b.push_back(0.25 + 0.25 * i);  // 0.25s, 0.5s
  for (int i = 0; i < 59; ++i) b.push_back(1.0 + i);         // 1s … 59s
  for (int i = 0; i < 12; ++i) b.push_back(60.0 + 5 * i);    // 60s … 115s
  for (int i = 0; i < 7; ++i) b.push_back(120.0 + 30 * i);   // 2min … 5min
  return Histogram(std::move(b));
}

// --- process metrics -------------------------------------------------------------------------

ProcessStats readProcessStats() {
  ProcessStats s;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double pageSize = static_cast<double>(sysconf(_SC_PAGESIZE));

  if (std::ifstream stat("/proc/self/stat"); stat) {
    std::string line;
    std::getline(stat, line);
    // The command name (field 2) may hold spaces; fields after it start past the last ')'.
    const auto close = line.rfind(')');
    if (close != std::string::npos && ticks > 0) {
      std::istringstream rest(line.substr(close + 2));
      std::vector<std::string> f;
      for (std::string tok; rest >> tok;) f.push_back(tok);
      // f[0] is field 3 (state): utime=14, stime=15, starttime=22, vsize=23, rss=24.
      if (f.size() > 22) {
        s.cpuSeconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
        s.virtualBytes = std::stod(f[20]);
        s.residentBytes = std::stod(f[21]) * pageSize;
        if (std::ifstream procStat("/proc/stat"); procStat) {
          for (std::string key; procStat >> key;) {
            if (key == "btime") {
              double boot = 0;
              procStat >> boot;
              s.startTimeSeconds = boot + std::stod(f[19]) / ticks;
              break;
            }
            procStat.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
          }
        }
      }
    }
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    double n = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
    s.openFds = n - 1;  // not counting the directory handle used to count
  }
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0) s.maxFds = static_cast<double>(rl.rlim_cur);
  return s;
}

NoLocalEndpoints countNoLocalEndpoints(const core::Snapshot& snapshot) {
  NoLocalEndpoints n;
  snapshot.forEach([&n](const core::ServicePortState& sp) {
    if (!sp.localEndpoints.empty()) return true;
    if (sp.internalPolicy == core::TrafficPolicy::kLocal) ++n.internal;
    if (sp.externallyAccessible() && sp.externalPolicy == core::TrafficPolicy::kLocal) ++n.external;
    return true;
  });
  return n;
}

// --- text format -----------------------------------------------------------------------------

std::string PrometheusText::formatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

std::string PrometheusText::escapeLabel(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PrometheusText::family(const std::string& name, const std::string& help,
                            const std::string& type) {
  // HELP text escapes only backslash and newline.
  std::string escaped;
  for (char c : help) escaped += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : std::string(1, c);
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escaped, name, type);
}

void PrometheusText::sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += fmt::format("{}=\"{}\"", labels[i].first, escapeLabel(labels[i].second));
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += formatValue(value);
  out_ += '\n';
}

void PrometheusText::histogram(const std::string& name, const std::string& help,
                               const Histogram& h) {
  family(name, help, "histogram");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    sample(name + "_bucket", {{"le", formatValue(h.bounds[i])}}, static_cast<double>(cumulative));
  }
  sample(name + "_bucket", {{"le", "+Inf"}}, static_cast<double>(h.count));
  sample(name + "_sum", {}, h.sum);
  sample(name + "_count", {}, static_cast<double>(h.count));
}

// --- ProxyMetrics ----------------------------------------------------------------------------

std::vector<std::string> hostMetricPrefixes() {
  return {"kubeproxy_",     "process_",         "go_",
          "kproxy_sync_",   "kproxy_source_",   "kproxy_apiwatch_",
          "kproxy_manifest_"};
}

const char* failureCategoryLabel(core::ErrorCategory category) {
  switch (category) {
    case core::ErrorCategory::kKernel: return "kernel_refused";
    case core::ErrorCategory::kInvalidArgument: return "invalid_input";
    case core::ErrorCategory::kTransient: return "transient";
    default: return "unknown";
  }
}

std::string renderPluginMetrics(const std::vector<plugins::MetricFamily>& families) {
  PrometheusText t;
  for (const auto& f : families) {
    t.family(f.name, f.help, f.type == plugins::MetricType::kCounter ? "counter" : "gauge");
    for (const auto& [values, value] : f.samples) {
      PrometheusText::Labels labels;
      for (std::size_t i = 0; i < f.labelNames.size() && i < values.size(); ++i)
        labels.emplace_back(f.labelNames[i], values[i]);
      t.sample(f.name, labels, value);
    }
  }
  return t.str();
}

ProxyMetrics::ProxyMetrics(std::string mode, double startWall)
    : mode_(std::move(mode)), startWall_(startWall) {}

std::string ProxyMetrics::failureCounterName(const std::string& mode) {
  if (mode == "nftables") return "kubeproxy_sync_proxy_rules_nftables_sync_failures_total";
  if (mode == "iptables" || mode == "ipvs")
    return "kubeproxy_sync_proxy_rules_iptables_restore_failures_total";
  std::string safe;
  for (char c : mode) safe += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return "kubeproxy_sync_proxy_rules_" + safe + "_sync_failures_total";
}

void ProxyMetrics::observeSync(const core::SyncObservation& o) {
  const double seconds = std::chrono::duration<double>(o.duration).count();
  std::lock_guard lock(mutex_);
  // Upstream observes every attempt, failed ones included.
  syncAll_.observe(seconds);
  (o.kind == core::SyncKind::kFull ? syncFull_ : syncPartial_).observe(seconds);
  if (o.verification) {
    ++verifications_;
    if (o.ok) verifyMismatches_ += o.operations;
  }
  if (!o.ok) {
    ++failures_;
    ++failuresByCategory_[failureCategoryLabel(o.error ? o.error->category
                                                        : core::ErrorCategory::kInternal)];
  }
  // Network programming latency: from the change's trigger time (set by the endpoint slice
  // controller) to the end of the sync that put it in the kernel. Clock skew can make it
  // negative; upstream drops those too.
  for (double trigger : o.triggerTimes) {
    if (o.wallTimestamp >= trigger) networkProgramming_.observe(o.wallTimestamp - trigger);
  }
}

void ProxyMetrics::countHealthz(int code) {
  std::lock_guard lock(mutex_);
  ++healthz_[code];
}

void ProxyMetrics::countLivez(int code) {
  std::lock_guard lock(mutex_);
  ++livez_[code];
}

std::string ProxyMetrics::render(const core::ProxierStatus& status,
                                 const ProcessStats& process) const {
  const NoLocalEndpoints noLocal =
      status.applied ? countNoLocalEndpoints(*status.applied) : NoLocalEndpoints{};
  PrometheusText t;
  std::lock_guard lock(mutex_);

  t.histogram("kubeproxy_network_programming_duration_seconds",
              "In Cluster Network Programming Latency in seconds", networkProgramming_);
  t.family("kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status", "counter");
  for (const auto& [code, n] : healthz_)
    t.sample("kubeproxy_proxy_healthz_total", {{"code", std::to_string(code)}}, static_cast<double>(n));
  t.family("kubeproxy_proxy_livez_total", "Cumulative proxy livez HTTP status", "counter");
  for (const auto& [code, n] : livez_)
    t.sample("kubeproxy_proxy_livez_total", {{"code", std::to_string(code)}}, static_cast<double>(n));
  t.histogram("kubeproxy_sync_full_proxy_rules_duration_seconds",
              "SyncProxyRules latency in seconds for full resyncs", syncFull_);
  t.histogram("kubeproxy_sync_partial_proxy_rules_duration_seconds",
              "SyncProxyRules latency in seconds for partial resyncs", syncPartial_);
  t.histogram("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds",
              syncAll_);

  t.family("kubeproxy_sync_proxy_rules_endpoint_changes_pending",
           "Pending proxy rules Endpoint changes", "gauge");
  t.sample("kubeproxy_sync_proxy_rules_endpoint_changes_pending", {},
           static_cast<double>(status.pendingEndpointChanges));
  t.family("kubeproxy_sync_proxy_rules_endpoint_changes_total",
           "Cumulative proxy rules Endpoint changes", "counter");
  t.sample("kubeproxy_sync_proxy_rules_endpoint_changes_total", {},
           static_cast<double>(status.endpointChangesTotal));

  const std::string failures = failureCounterName(mode_);
  const bool upstreamName = mode_ == "nftables" || mode_ == "iptables" || mode_ == "ipvs";
  t.family(failures,
           mode_ == "nftables"  ? "Cumulative proxy nftables sync failures"
           : upstreamName       ? "Cumulative proxy iptables restore failures"
                                : "Cumulative proxy " + mode_ + " sync failures",
           "counter");
  t.sample(failures, {}, static_cast<double>(failures_));
  t.family("kproxy_sync_proxy_rules_failures_total",
           "Cumulative failed syncs by the category the backend gave", "counter");
  for (const char* category : {"invalid_input", "kernel_refused", "transient", "unknown"}) {
    auto it = failuresByCategory_.find(category);
    t.sample("kproxy_sync_proxy_rules_failures_total", {{"category", category}},
             it == failuresByCategory_.end() ? 0.0 : static_cast<double>(it->second));
  }

  // Self-verification (ProxierOptions::verifyPeriod): full syncs of the applied snapshot, and
  // the kernel objects they found different from the plan (and repaired).
  t.family("kproxy_sync_verify_total", "Self-verifications of the kernel against the plan", "counter");
  t.sample("kproxy_sync_verify_total", {{"mode", mode_}}, static_cast<double>(verifications_));
  t.family("kproxy_sync_verify_mismatch_total",
           "Kernel objects a self-verification found different from the plan (and repaired)", "counter");
  t.sample("kproxy_sync_verify_mismatch_total", {{"mode", mode_}}, static_cast<double>(verifyMismatches_));

  t.family("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
           "The last time a sync of proxy rules was queued", "gauge");
  t.sample("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", {},
           std::max(startWall_, status.lastQueuedWall.value_or(0)));
  t.family("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
           "The last time proxy rules were successfully synced", "gauge");
  t.sample("kubeproxy_sync_proxy_rules_last_timestamp_seconds", {},
           status.lastSuccessWall.value_or(0));

  t.family("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
           "Number of services with a Local traffic policy and no endpoints", "gauge");
  if (status.applied) {
    t.sample("kubeproxy_sync_proxy_rules_no_local_endpoints_total", {{"traffic_policy", "external"}},
             static_cast<double>(noLocal.external));
    t.sample("kubeproxy_sync_proxy_rules_no_local_endpoints_total", {{"traffic_policy", "internal"}},
             static_cast<double>(noLocal.internal));
  }

  t.family("kubeproxy_sync_proxy_rules_service_changes_pending",
           "Pending proxy rules Service changes", "gauge");
  t.sample("kubeproxy_sync_proxy_rules_service_changes_pending", {},
           static_cast<double>(status.pendingServiceChanges));
  t.family("kubeproxy_sync_proxy_rules_service_changes_total",
           "Cumulative proxy rules Service changes", "counter");
  t.sample("kubeproxy_sync_proxy_rules_service_changes_total", {},
           static_cast<double>(status.serviceChangesTotal));

  // Process metrics, with the Prometheus client's names and help texts.
  auto processGauge = [&t](const char* name, const char* help, const char* type,
                           const std::optional<double>& value) {
    if (!value) return;
    t.family(name, help, type);
    t.sample(name, {}, *value);
  };
  processGauge("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
               "counter", process.cpuSeconds);
  processGauge("process_max_fds", "Maximum number of open file descriptors.", "gauge",
               process.maxFds);
  processGauge("process_open_fds", "Number of open file descriptors.", "gauge", process.openFds);
  processGauge("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
               process.residentBytes);
  processGauge("process_start_time_seconds",
               "Start time of the process since unix epoch in seconds.", "gauge",
               process.startTimeSeconds);
  processGauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
               process.virtualBytes);
  return t.str();
}

}  // namespace kproxy::cli
