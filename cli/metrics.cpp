#include "metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/core/log.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace kproxy::cli {

// --- histograms ------------------------------------------------------------------------------

Histogram syncDurationHistogram() { return Histogram::exponential(0.001, 2, 15); }

Histogram restClientLatencyHistogram() {
  return Histogram({0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0});
}

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
  if (rlimit rl{}; getrlimit(RLIMIT_AS, &rl) == 0) {
    s.virtualMaxBytes = static_cast<double>(rl.rlim_cur);
  }
  if (std::ifstream netstat("/proc/self/net/netstat"); netstat) {
    std::ostringstream text;
    text << netstat.rdbuf();
    if (const auto octets = parseNetstatIpOctets(text.str())) {
      s.networkReceiveBytes = octets->in;
      s.networkTransmitBytes = octets->out;
    }
  }
  return s;
}

std::optional<IpOctets> parseNetstatIpOctets(std::string_view netstat) {
  // Each group is two lines with the same "Name:" prefix: the column names, then the values.
  std::istringstream in{std::string(netstat)};
  for (std::string names, values; std::getline(in, names);) {
    if (names.rfind("IpExt:", 0) != 0) continue;
    if (!std::getline(in, values) || values.rfind("IpExt:", 0) != 0) return std::nullopt;
    std::istringstream n(names.substr(6)), v(values.substr(6));
    std::optional<double> octetsIn, octetsOut;
    for (std::string name, value; n >> name && v >> value;) {
      char* end = nullptr;
      const double number = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0') return std::nullopt;
      if (name == "InOctets") octetsIn = number;
      if (name == "OutOctets") octetsOut = number;
    }
    if (octetsIn && octetsOut) return IpOctets{*octetsIn, *octetsOut};
    return std::nullopt;
  }
  return std::nullopt;
}

NoLocalEndpoints countNoLocalEndpoints(const core::Snapshot& snapshot, net::Family family) {
  NoLocalEndpoints n;
  snapshot.forEach([&n, family](const core::ServicePortState& sp) {
    if (sp.key.family != family || !sp.localEndpoints.empty()) return true;
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
  histograms(name, help, {{Labels{}, &h}});
}

void PrometheusText::histograms(const std::string& name, const std::string& help,
                                const std::vector<std::pair<Labels, const Histogram*>>& series) {
  family(name, help, "histogram");
  for (const auto& [labels, h] : series) {
    auto with = [&labels](std::string le) {
      Labels l = labels;
      l.emplace_back("le", std::move(le));
      return l;
    };
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < h->bounds.size(); ++i) {
      cumulative += h->counts[i];
      sample(name + "_bucket", with(formatValue(h->bounds[i])), static_cast<double>(cumulative));
    }
    sample(name + "_bucket", with("+Inf"), static_cast<double>(h->count));
    sample(name + "_sum", labels, h->sum);
    sample(name + "_count", labels, static_cast<double>(h->count));
  }
}

// --- RestClientMetrics -----------------------------------------------------------------------

void RestClientMetrics::requestDone(std::string_view method, std::string_view host, std::string_view code) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(code), std::string(method), std::string(host)}];
}

void RestClientMetrics::requestLatency(std::string_view verb, std::string_view host, double seconds) {
  std::lock_guard lock(mutex_);
  latency_.try_emplace({std::string(verb), std::string(host)}, restClientLatencyHistogram())
      .first->second.observe(seconds);
}

void RestClientMetrics::rateLimiterWait(std::string_view verb, std::string_view host, double seconds) {
  std::lock_guard lock(mutex_);
  rateLimiter_.try_emplace({std::string(verb), std::string(host)}, restClientLatencyHistogram())
      .first->second.observe(seconds);
}

std::string RestClientMetrics::render() const {
  PrometheusText t;
  std::lock_guard lock(mutex_);
  auto byVerbAndHost = [](const std::map<std::pair<std::string, std::string>, Histogram>& m) {
    std::vector<std::pair<PrometheusText::Labels, const Histogram*>> series;
    for (const auto& [key, h] : m) series.push_back({{{"host", key.second}, {"verb", key.first}}, &h});
    return series;
  };
  t.histograms("rest_client_rate_limiter_duration_seconds",
               "[ALPHA] Client side rate limiter latency in seconds. Broken down by verb, and host.",
               byVerbAndHost(rateLimiter_));
  t.histograms("rest_client_request_duration_seconds",
               "[ALPHA] Request latency in seconds. Broken down by verb, and host.", byVerbAndHost(latency_));
  t.alphaFamily("rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.", "counter");
  for (const auto& [key, n] : requests_) {
    const auto& [code, method, host] = key;
    t.sample("rest_client_requests_total", {{"code", code}, {"host", host}, {"method", method}},
             static_cast<double>(n));
  }
  return t.str();
}

// --- ProxyMetrics ----------------------------------------------------------------------------

std::vector<std::string> hostMetricPrefixes() {
  return {"kubeproxy_",     "process_",         "go_",
          "kproxy_sync_",   "kproxy_source_",   "kproxy_apiwatch_",
          "kproxy_manifest_", "rest_client_",   "kubernetes_"};
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
    auto labelsOf = [&f](const std::vector<std::string>& values) {
      PrometheusText::Labels labels;
      for (std::size_t i = 0; i < f.labelNames.size() && i < values.size(); ++i)
        labels.emplace_back(f.labelNames[i], values[i]);
      return labels;
    };
    if (f.type == plugins::MetricType::kHistogram) {
      std::vector<std::pair<PrometheusText::Labels, const Histogram*>> series;
      for (const auto& [values, h] : f.histograms) series.emplace_back(labelsOf(values), &h);
      t.histograms(f.name, f.help, series);
      continue;
    }
    t.family(f.name, f.help, f.type == plugins::MetricType::kCounter ? "counter" : "gauge");
    for (const auto& [values, value] : f.samples) t.sample(f.name, labelsOf(values), value);
  }
  return t.str();
}

const std::vector<UpstreamAlias>& upstreamAliases() {
  static const std::vector<UpstreamAlias> aliases{
      {"kproxy_iptables_rules", "kubeproxy_sync_proxy_rules_iptables_total",
       "Total number of iptables rules owned by kube-proxy", {"iptables"}},
      {"kproxy_iptables_rules_last_sync", "kubeproxy_sync_proxy_rules_iptables_last",
       "Number of iptables rules written by kube-proxy in last sync", {"iptables"}},
      {"kproxy_conntrack_reconciler_sync_duration_seconds", "kubeproxy_conntrack_reconciler_sync_duration_seconds",
       "ReconcileConntrackFlowsLatency latency in seconds", {"iptables", "ipvs", "nftables"}},
      {"kproxy_conntrack_reconciler_deleted_entries_total", "kubeproxy_conntrack_reconciler_deleted_entries_total",
       "Cumulative conntrack flows deleted by conntrack reconciler", {"iptables", "ipvs", "nftables"}},
  };
  return aliases;
}

namespace {

/// A plugin series' labels as upstream's: "family" (ipv4, ipv6) becomes "ip_family" (IPv4,
/// IPv6), sorted by name as client_golang writes them. nullopt: a series upstream does not
/// have (an iptables table other than filter and nat).
std::optional<PrometheusText::Labels> upstreamLabels(const plugins::MetricFamily& f,
                                                     const std::vector<std::string>& values) {
  PrometheusText::Labels labels;
  for (std::size_t i = 0; i < f.labelNames.size() && i < values.size(); ++i) {
    const std::string& name = f.labelNames[i];
    const std::string& value = values[i];
    if (name == "family")
      labels.emplace_back("ip_family", value == "ipv6" ? "IPv6" : value == "ipv4" ? "IPv4" : value);
    else if (name == "table" && value != "filter" && value != "nat")
      return std::nullopt;
    else
      labels.emplace_back(name, value);
  }
  std::sort(labels.begin(), labels.end());
  return labels;
}

}  // namespace

std::string renderUpstreamAliases(const std::string& mode, const std::vector<plugins::MetricFamily>& families) {
  PrometheusText t;
  for (const UpstreamAlias& alias : upstreamAliases()) {
    if (std::find(alias.modes.begin(), alias.modes.end(), mode) == alias.modes.end()) continue;
    auto f = std::find_if(families.begin(), families.end(),
                          [&](const plugins::MetricFamily& m) { return m.name == alias.pluginName; });
    if (f == families.end()) continue;
    const std::string name(alias.upstreamName);
    if (f->type == plugins::MetricType::kHistogram) {
      std::vector<std::pair<PrometheusText::Labels, const Histogram*>> series;
      for (const auto& [values, h] : f->histograms)
        if (auto labels = upstreamLabels(*f, values)) series.emplace_back(std::move(*labels), &h);
      if (!series.empty()) t.histograms(name, "[ALPHA] " + std::string(alias.help), series);
      continue;
    }
    std::vector<std::pair<PrometheusText::Labels, double>> samples;
    for (const auto& [values, value] : f->samples)
      if (auto labels = upstreamLabels(*f, values)) samples.emplace_back(std::move(*labels), value);
    if (samples.empty()) continue;
    std::sort(samples.begin(), samples.end());
    t.alphaFamily(name, std::string(alias.help), f->type == plugins::MetricType::kCounter ? "counter" : "gauge");
    for (const auto& [labels, value] : samples) t.sample(name, labels, value);
  }
  return t.str();
}

std::unique_ptr<NfacctMetrics> NfacctMetrics::open() {
  auto client = kernel::makeNetlinkNfacct();
  if (!client) {
    log::error("failed to initialize nfacct client", {{"err", client.error().message()}});
    return std::make_unique<NfacctMetrics>(nullptr);
  }
  return std::make_unique<NfacctMetrics>(std::move(*client));
}

std::string NfacctMetrics::render() const {
  struct Counter {
    const char* name;
    std::string_view object;
    const char* help;
  };
  static const Counter kCounters[] = {
      {"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", backends::kNfacctInvalidDropped,
       "packets dropped by iptables to work around conntrack problems"},
      {"kubeproxy_iptables_localhost_nodeports_accepted_packets_total", backends::kNfacctLocalhostNodePorts,
       "Number of packets accepted on nodeports of loopback interface"},
  };
  PrometheusText t;
  std::lock_guard lock(mutex_);
  if (!client_) return {};
  for (const Counter& c : kCounters) {
    auto counter = client_->get(std::string(c.object));
    if (!counter) {
      log::error("failed to collect nfacct counter",
                 {{"counter", std::string(c.object)}, {"err", counter.error().message()}});
      continue;
    }
    t.alphaFamily(c.name, c.help, "counter");
    t.sample(c.name, {}, static_cast<double>(counter->packets));
  }
  return t.str();
}

ProxyMetrics::ProxyMetrics(std::string mode, double startWall, std::vector<std::string> families,
                           BuildInfo build)
    : mode_(std::move(mode)), startWall_(startWall), families_(std::move(families)), build_(std::move(build)) {
  for (const auto& f : families_) perFamily_[f];
}

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
  // One sync programs every family: each family's series sees it, as each of upstream's
  // per-family proxiers would see its own. Upstream observes every attempt, failed ones too.
  for (auto& [family, f] : perFamily_) {
    f.syncAll.observe(seconds);
    (o.kind == core::SyncKind::kFull ? f.syncFull : f.syncPartial).observe(seconds);
    if (!o.ok) {
      ++f.failures;
      // Upstream's iptables proxier counts a failed partial restore (it falls back to a full one).
      if (o.kind == core::SyncKind::kPartial) ++f.partialFailures;
    }
  }
  if (o.verification) {
    ++verifications_;
    if (o.ok) verifyMismatches_ += o.operations;
  }
  if (!o.ok) {
    ++failuresByCategory_[failureCategoryLabel(o.error ? o.error->category
                                                        : core::ErrorCategory::kInternal)];
  }
  // Network programming latency: from the change's trigger time (set by the endpoint slice
  // controller) to the end of the sync that put it in the kernel, under the slice's family.
  // Changes triggered before kproxy started are not observed (upstream's tracker start time),
  // nor those clock skew puts in the future.
  for (const core::TriggerTime& trigger : o.triggerTimes) {
    if (trigger.wall < startWall_ || trigger.wall > o.wallTimestamp) continue;
    auto it = perFamily_.find(std::string(net::toString(trigger.family)));
    if (it != perFamily_.end()) it->second.networkProgramming.observe(o.wallTimestamp - trigger.wall);
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
  PrometheusText t;
  std::lock_guard lock(mutex_);
  using Labels = PrometheusText::Labels;
  auto eachFamily = [this](auto member) {
    std::vector<std::pair<Labels, const Histogram*>> series;
    for (const auto& [family, f] : perFamily_) series.push_back({{{"ip_family", family}}, &(f.*member)});
    return series;
  };
  auto familyCounter = [&](const std::string& name, const std::string& help, auto member) {
    t.alphaFamily(name, help, "counter");
    for (const auto& [family, f] : perFamily_)
      t.sample(name, {{"ip_family", family}}, static_cast<double>(f.*member));
  };
  auto familyGauge = [&](const std::string& name, const std::string& help, double value) {
    t.alphaFamily(name, help, "gauge");
    for (const auto& family : families_) t.sample(name, {{"ip_family", family}}, value);
  };
  const bool iptablesMode = mode_ == "iptables";
  const bool nftablesMode = mode_ == "nftables";
  const bool upstreamMode = iptablesMode || nftablesMode || mode_ == "ipvs";

  // kubernetes_build_info: one constant series (component-base registers it in every binary).
  {
    const std::string& v = build_.kubernetesVersion;
    std::string major, minor;
    if (auto dot = v.find('.'); dot != std::string::npos) {
      major = v.substr(v.front() == 'v' ? 1 : 0, dot - (v.front() == 'v' ? 1 : 0));
      const auto next = v.find('.', dot + 1);
      minor = v.substr(dot + 1, next == std::string::npos ? std::string::npos : next - dot - 1);
    }
    const bool dirty = build_.commit.ends_with("-dirty");
    const std::string commit = dirty ? build_.commit.substr(0, build_.commit.size() - 6) : build_.commit;
    t.alphaFamily("kubernetes_build_info",
                  "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree "
                  "state, build date, Go version, and compiler from which Kubernetes was built, and platform on "
                  "which it is running.",
                  "gauge");
#if defined(__x86_64__)
    const char* arch = "amd64";
#elif defined(__aarch64__)
    const char* arch = "arm64";
#else
    const char* arch = "unknown";
#endif
    t.sample("kubernetes_build_info",
             {{"build_date", "1970-01-01T00:00:00Z"},
              {"compiler", "gcc"},
              {"git_commit", commit},
              {"git_tree_state", dirty ? "dirty" : "clean"},
              {"git_version", v},
              {"go_version", ""},
              {"major", major},
              {"minor", minor},
              {"platform", std::string("linux/") + arch}},
             1);
  }

  t.histograms("kubeproxy_network_programming_duration_seconds",
               "[ALPHA] In Cluster Network Programming Latency in seconds",
               eachFamily(&FamilyState::networkProgramming));
  t.alphaFamily("kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status", "counter");
  for (const auto& [code, n] : healthz_)
    t.sample("kubeproxy_proxy_healthz_total", {{"code", std::to_string(code)}}, static_cast<double>(n));
  t.alphaFamily("kubeproxy_proxy_livez_total", "Cumulative proxy livez HTTP status", "counter");
  for (const auto& [code, n] : livez_)
    t.sample("kubeproxy_proxy_livez_total", {{"code", std::to_string(code)}}, static_cast<double>(n));
  // Upstream registers the full and partial histograms in iptables and nftables mode; kproxy
  // serves them in every mode (each of its backends has both passes).
  t.histograms("kubeproxy_sync_full_proxy_rules_duration_seconds",
               "[ALPHA] SyncProxyRules latency in seconds for full resyncs", eachFamily(&FamilyState::syncFull));
  t.histograms("kubeproxy_sync_partial_proxy_rules_duration_seconds",
               "[ALPHA] SyncProxyRules latency in seconds for partial resyncs",
               eachFamily(&FamilyState::syncPartial));
  t.histograms("kubeproxy_sync_proxy_rules_duration_seconds", "[ALPHA] SyncProxyRules latency in seconds",
               eachFamily(&FamilyState::syncAll));

  t.alphaFamily("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes",
                "gauge");
  t.sample("kubeproxy_sync_proxy_rules_endpoint_changes_pending", {},
           static_cast<double>(status.pendingEndpointChanges));
  t.alphaFamily("kubeproxy_sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes",
                "counter");
  t.sample("kubeproxy_sync_proxy_rules_endpoint_changes_total", {},
           static_cast<double>(status.endpointChangesTotal));

  const std::string failures = failureCounterName(mode_);
  familyCounter(failures,
                nftablesMode   ? "Cumulative proxy nftables sync failures"
                : upstreamMode ? "Cumulative proxy iptables restore failures"
                               : "Cumulative proxy " + mode_ + " sync failures",
                &FamilyState::failures);
  if (iptablesMode) {
    familyCounter("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                  "Cumulative proxy iptables partial restore failures", &FamilyState::partialFailures);
  }
  if (nftablesMode) {
    // Upstream deletes stale chains in a separate transaction after the sync; kproxy's nftables
    // backend removes what it no longer needs in the sync's own transaction, so this stays 0
    // and a failure is a sync failure above.
    t.alphaFamily("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
                  "Cumulative proxy nftables cleanup failures", "counter");
    for (const auto& family : families_)
      t.sample("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", {{"ip_family", family}}, 0);
  }
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

  familyGauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
              "The last time a sync of proxy rules was queued",
              std::max(startWall_, status.lastQueuedWall.value_or(0)));
  familyGauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
              "The last time proxy rules were successfully synced", status.lastSuccessWall.value_or(0));

  t.alphaFamily("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "Number of services with a Local traffic policy and no endpoints", "gauge");
  if (status.applied) {
    for (const auto& family : families_) {
      const auto fam = family == "IPv6" ? net::Family::kIPv6 : net::Family::kIPv4;
      const NoLocalEndpoints noLocal = countNoLocalEndpoints(*status.applied, fam);
      t.sample("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
               {{"ip_family", family}, {"traffic_policy", "external"}}, static_cast<double>(noLocal.external));
      t.sample("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
               {{"ip_family", family}, {"traffic_policy", "internal"}}, static_cast<double>(noLocal.internal));
    }
  }

  t.alphaFamily("kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes",
                "gauge");
  t.sample("kubeproxy_sync_proxy_rules_service_changes_pending", {},
           static_cast<double>(status.pendingServiceChanges));
  t.alphaFamily("kubeproxy_sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes",
                "counter");
  t.sample("kubeproxy_sync_proxy_rules_service_changes_total", {},
           static_cast<double>(status.serviceChangesTotal));

  // Process metrics: client_golang's process collector's families on Linux, with its names,
  // types and help texts, in the order its registry sorts them.
  auto processFamily = [&t](const char* name, const char* help, const char* type,
                           const std::optional<double>& value) {
    if (!value) return;
    t.family(name, help, type);
    t.sample(name, {}, *value);
  };
  processFamily("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
               "counter", process.cpuSeconds);
  processFamily("process_max_fds", "Maximum number of open file descriptors.", "gauge",
               process.maxFds);
  processFamily("process_network_receive_bytes_total",
               "Number of bytes received by the process over the network.", "counter",
               process.networkReceiveBytes);
  processFamily("process_network_transmit_bytes_total",
               "Number of bytes sent by the process over the network.", "counter",
               process.networkTransmitBytes);
  processFamily("process_open_fds", "Number of open file descriptors.", "gauge", process.openFds);
  processFamily("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
               process.residentBytes);
  processFamily("process_start_time_seconds",
               "Start time of the process since unix epoch in seconds.", "gauge",
               process.startTimeSeconds);
  processFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
               process.virtualBytes);
  processFamily("process_virtual_memory_max_bytes",
               "Maximum amount of virtual memory available in bytes.", "gauge",
               process.virtualMaxBytes);
  return t.str();
}

}  // namespace kproxy::cli
