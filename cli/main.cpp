// kproxy: the program. Flags and config (kube-proxy's names), plugin loading, the event source,
// the sync loop, and signals. Everything else lives in the modules it wires together.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "config_file.h"
#include "config_watch.h"
#include "conntrack_sysctls.h"
#include "node_setup.h"
#include "explain_args.h"
#include "feature_gates.h"
#include "flags.h"
#include "kproxy/apiwatch/api_source.h"
#include "kproxy/apiwatch/event_recorder.h"
#include "kproxy/apiwatch/manifest_source.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/core/log.h"
#include "kproxy/core/proxier.h"
#include "kproxy/kernel/interface_addresses.h"
#include "kproxy/kernel/sysctl.h"
#include "kproxy/plugins/loader.h"
#include "leftover_cleanup.h"
#include "logging_setup.h"
#include "kproxy/ebpf/leftovers.h"
#include "kproxy/nftables/leftovers.h"
#include "metrics.h"
#include "ops_servers.h"
#include "proxy_config.h"
#include "service_status.h"
#include "status_command.h"
#include "version_info.h"
#include "kproxy/plan/options.h"

namespace {

using kproxy::cli::ProxyConfig;
namespace log = kproxy::log;


/// Whichever source feeds the proxier: a manifest directory or an API server.
struct EventSource {
  std::unique_ptr<kproxy::apiwatch::ManifestSource> manifests;
  std::unique_ptr<kproxy::apiwatch::ApiSource> api;
  void stop() {
    if (manifests) manifests->stop();
    if (api) api->stop();
  }
};

// The source's own counters, in Prometheus text (kproxy's names: upstream has no such metrics).
std::string sourceMetrics(const EventSource& source) {
  std::string out;
  auto counter = [&out](const char* name, const char* help, std::uint64_t value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name +
           " " + std::to_string(value) + "\n";
  };
  if (source.api) {
    const auto s = source.api->stats();
    counter("kproxy_source_decode_failures_total",
            "API objects skipped because they could not be decoded", s.decodeFailures);
    counter("kproxy_apiwatch_request_failures_total", "Failed API requests", s.requestFailures);
    counter("kproxy_apiwatch_relists_total", "LISTs after a resource's first (410 Gone, errors)",
            s.relists);
    out += "# HELP kproxy_apiwatch_connected Whether every watch is open\n"
           "# TYPE kproxy_apiwatch_connected gauge\nkproxy_apiwatch_connected " +
           std::string(s.connected ? "1" : "0") + "\n";
  } else if (source.manifests) {
    const auto s = source.manifests->stats();
    counter("kproxy_source_decode_failures_total",
            "Manifest documents skipped because they could not be decoded", s.documentFailures);
    counter("kproxy_manifest_file_read_failures_total", "Manifest files that could not be read",
            s.fileReadFailures);
  }
  return out;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "kproxy: %s\n", message.c_str());
  return 1;
}

std::string nodeName(const ProxyConfig& config) {
  if (!config.hostnameOverride.empty()) return config.hostnameOverride;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  // Kubernetes node names are lower case.
  std::string name(host);
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ",";
    out += item;
  }
  return out;
}

// A duration as a decimal number of seconds ("30", "0.5", "0"), the options' format.
std::string seconds(kproxy::cli::Duration d) {
  const auto ns = d.count();
  std::string out = std::to_string(ns / 1'000'000'000);
  if (auto frac = ns % 1'000'000'000; frac != 0) {
    std::string digits = std::to_string(frac < 0 ? -frac : frac);
    digits.insert(0, 9 - digits.size(), '0');
    while (digits.back() == '0') digits.pop_back();
    if (ns < 0 && ns > -1'000'000'000) out = "-0";
    out += "." + digits;
  }
  return out;
}

// What every backend is told, as strings (plugins/README.md lists the keys).
kproxy::plugins::BackendOptions backendOptions(const ProxyConfig& config) {
  kproxy::plugins::BackendOptions options;
  options["node-name"] = nodeName(config);
  options["cluster-cidr"] = config.clusterCIDR;
  options["detect-local-mode"] = config.detectLocalMode;
  options["pod-bridge-interface"] = config.detectLocal.bridgeInterface;
  options["pod-interface-name-prefix"] = config.detectLocal.interfaceNamePrefix;
  options["masquerade-all"] = config.masqueradeAll ? "true" : "false";
  options["nodeport-addresses"] = joined(config.nodePortAddresses);
  // IPVS mode's iptables rules use the iptables section's bit, as upstream's.
  options["masquerade-bit"] =
      std::to_string(config.mode == "iptables" || config.mode == "ipvs" ? config.iptables.masqueradeBit
                                                                        : config.nftables.masqueradeBit);
  options["dry-run"] = config.dryRun ? "true" : "false";
  options["ipvs-scheduler"] = config.ipvs.scheduler;
  options["ipvs-strict-arp"] = config.ipvs.strictARP ? "true" : "false";
  options["ipvs-exclude-cidrs"] = joined(config.ipvs.excludeCIDRs);
  options["ipvs-tcp-timeout"] = seconds(config.ipvs.tcpTimeout);
  options["ipvs-tcpfin-timeout"] = seconds(config.ipvs.tcpFinTimeout);
  options["ipvs-udp-timeout"] = seconds(config.ipvs.udpTimeout);
  options["conntrack-udp-timeout"] = seconds(config.conntrack.udpTimeout);
  options["sync-period"] = seconds(config.effectiveSyncPeriod());
  options["min-sync-period"] = seconds(config.effectiveMinSyncPeriod());
  options["localhost-nodeports"] = config.iptables.localhostNodePorts ? "true" : "false";
  options["iptables-variant"] = config.iptablesVariant;
  options["udp-timeout"] = seconds(config.userspace.udpIdleTimeout);
  options["userspace-connect-timeout"] = seconds(config.userspace.connectTimeout);
  options["userspace-connect-attempts"] = std::to_string(config.userspace.connectAttempts);
  options["userspace-max-connections"] = std::to_string(config.userspace.maxConnections);
  options["userspace-idle-timeout"] = seconds(config.userspace.idleTimeout);
  options["userspace-endpoint-grace"] = seconds(config.userspace.endpointGrace);
  options["ebpf-cgroup-path"] = config.ebpf.cgroupPath;
  options["ebpf-pin-path"] = config.ebpf.pinPath;
  options["ebpf-netns-dir"] = config.ebpf.netnsDir;
  if (config.bindAddress != "0.0.0.0" && config.bindAddress != "::" && !config.bindAddress.empty())
    options["node-ips"] = config.bindAddress;
  return options;
}

// What the tracker is told: the same for the daemon and for `kproxy explain`, so that explain
// decides node semantics (where NodePorts answer) as the running daemon would.
kproxy::core::TrackerConfig trackerConfigOf(const ProxyConfig& config) {
  kproxy::core::TrackerConfig tracker;
  tracker.nodeName = nodeName(config);
  tracker.nodePortAddresses = config.nodePortAddresses;
  tracker.bindAddress = config.bindAddress;
  tracker.preferSameTrafficDistribution =
      kproxy::cli::featureEnabled(config.featureGates, "PreferSameTrafficDistribution");
  return tracker;
}

// Loads the built-in plugins (no flag needed) and every --plugin-dir. A directory that cannot
// be read or a plugin that is refused is logged; only a missing selected mode is fatal.
void loadPlugins(kproxy::plugins::PluginRegistry& registry, const ProxyConfig& config) {
  // Plugins register their metrics when a backend is created: keep the host's names theirs.
  registry.metrics().reservePrefixes(kproxy::cli::hostMetricPrefixes());
  std::vector<std::filesystem::path> loaded;
  auto loadOnce = [&](const std::filesystem::path& dir) {
    std::error_code ec;
    auto canonical = std::filesystem::weakly_canonical(dir, ec);
    if (ec) canonical = dir;
    // The same directory named twice (a --plugin-dir equal to a default one) loads once.
    if (std::find(loaded.begin(), loaded.end(), canonical) != loaded.end()) return;
    loaded.push_back(canonical);
    for (const auto& err : registry.loadDirectory(dir)) log::warning(err.message());
  };
  for (const auto& dir : kproxy::plugins::defaultPluginDirs()) loadOnce(dir);
  for (const auto& dir : config.pluginDirs) loadOnce(dir);
}

// --cleanup: every loaded backend removes what it creates; safe to run twice.
int cleanupAll(const kproxy::plugins::PluginRegistry& registry, const ProxyConfig& config) {
  int rc = 0;
  auto options = backendOptions(config);
  for (const auto& plugin : registry.plugins()) {
    auto backend = registry.createBackend(plugin.name, options);
    if (!backend) {
      log::warning("cleanup skipped", {{"mode", plugin.name}, {"reason", backend.error().message()}});
      continue;
    }
    if (auto r = (*backend)->cleanup(); !r) {
      log::error("cleanup failed", {{"mode", plugin.name}, {"error", r.error().message()}});
      rc = 1;
    } else {
      log::info(0, "cleaned up", {{"mode", plugin.name}});
    }
  }
  // What kube-proxy's iptables, IPVS and nftables modes leave, whether or not such a plugin is
  // loaded (upstream's platformCleanup with cleanupAndExit cleans every mode). A dry run reads
  // the system and prints what it would change.
  kproxy::backends::RealLeftoverSystem real;
  kproxy::backends::PrintingLeftoverSystem printing(real, stdout);
  kproxy::backends::LeftoverSystem& system = config.dryRun ? static_cast<kproxy::backends::LeftoverSystem&>(printing) : real;
  if (!kproxy::cli::cleanUpKubeProxyLeftovers(system)) rc = 1;
  if (!kproxy::nftables::cleanUpNftablesLeftovers(system)) rc = 1;
  // ebpf mode's pins and tables, also where its plugin cannot be loaded (no libbpf, no BTF).
  if (!kproxy::ebpf::cleanUpEbpfLeftovers(system, config.ebpf.pinPath)) rc = 1;
  return rc;
}

// The source of Services: a manifest directory, else an API server (--kubeconfig, with
// --master overriding its server; --master alone; or the in-cluster service account). The
// client configuration is resolved first (nullopt for a manifest directory) so that a bad one
// fails before anything starts.
kproxy::core::Result<std::optional<kproxy::apiwatch::ClientConfig>> apiClientConfig(
    const ProxyConfig& config) {
  if (!config.manifestsDir.empty()) return std::optional<kproxy::apiwatch::ClientConfig>();
  auto resolved = kproxy::apiwatch::resolveClientConfig(config.clientConnection.kubeconfig, config.master);
  if (!resolved) return std::unexpected(resolved.error());
  resolved->qps = config.clientConnection.qps;
  resolved->burst = config.clientConnection.burst;
  resolved->allowHttpCredentials = config.allowHttpCredentials;
  if (auto transport = kproxy::apiwatch::checkCredentialTransport(*resolved); !transport)
    return std::unexpected(transport.error());
  return std::optional<kproxy::apiwatch::ClientConfig>(std::move(*resolved));
}

// Starts the source that feeds `sink`: the manifest directory or the API server.
kproxy::core::Result<void> startSource(EventSource& source, const ProxyConfig& config,
                                       std::optional<kproxy::apiwatch::ClientConfig> apiConfig,
                                       kproxy::core::EventSink& sink, const std::string& node) {
  if (apiConfig) {
    kproxy::apiwatch::ApiSourceOptions apiOptions;
    apiOptions.nodeName = node;
    source.api = std::make_unique<kproxy::apiwatch::ApiSource>(std::move(*apiConfig), sink, apiOptions);
    return source.api->start();
  }
  source.manifests = std::make_unique<kproxy::apiwatch::ManifestSource>(config.manifestsDir, sink);
  return source.manifests->start();
}

// Posts a Warning Event on a Service whose change has kept failing: at least kAttempts
// attempts in a row over at least kPersist; then at most once per kRepeat while it goes on.
struct FailureEvents {
  static constexpr std::uint32_t kAttempts = 3;
  static constexpr double kPersist = 5;
  static constexpr double kRepeat = 600;
  std::string node;
  std::map<std::string, double> lastPosted;  // "namespace/name" -> wall seconds

  void report(const kproxy::core::SyncLedger& ledger, kproxy::apiwatch::EventRecorder& recorder) {
    std::map<std::string, const kproxy::core::SyncRecord*> failing;  // one event per Service
    for (const auto& [key, r] : ledger.failed) {
      if (r.failedAttempts < kAttempts || r.wall - r.failingSince < kPersist) continue;
      const std::string service = key.name.substr(0, key.name.rfind(':'));
      failing.try_emplace(service, &r);
    }
    for (const auto& [service, r] : failing) {
      auto it = lastPosted.find(service);
      if (it != lastPosted.end() && r->wall - it->second < kRepeat) continue;
      lastPosted[service] = r->wall;
      const auto slash = service.find('/');
      kproxy::apiwatch::ServiceEvent e;
      e.ns = service.substr(0, slash);
      e.service = service.substr(slash + 1);
      e.reason = "FailedToSyncProxyRules";
      e.count = static_cast<std::int32_t>(r->failedAttempts);
      e.firstSeenWall = r->failingSince;
      e.message = fmt::format("kproxy on node {} could not program this Service: {} attempts failed over {:.0f}s; "
                              "last error: {}",
                              node, r->failedAttempts, r->wall - r->failingSince, r->error);
      recorder.post(std::move(e));
    }
  }
};

// Keeps the snapshot of the first sync instead of programming anything (kproxy explain).
class SnapshotCapture final : public kproxy::core::Backend {
 public:
  std::string_view name() const override { return "explain"; }
  kproxy::core::Result<kproxy::core::SyncResult> sync(const kproxy::core::SyncRequest& request) override {
    snapshot = *request.next;
    synced = true;
    return kproxy::core::SyncResult{};
  }
  kproxy::core::Result<void> cleanup() override { return {}; }
  kproxy::core::Snapshot snapshot;
  bool synced = false;
};

// kproxy explain: one snapshot from the source's initial list, then the backend's answer.
int explain(std::span<const char* const> args) {
  auto command = kproxy::cli::parseExplainCommand(args);
  if (!command) return fail(command.error().message());
  if (command->showHelp) {
    std::fputs(kproxy::cli::explainUsage().c_str(), stdout);
    return 0;
  }
  auto parsed = kproxy::cli::parseFlags(command->flags);
  if (!parsed) return fail(parsed.error().message());
  for (const auto& warning : parsed->warnings) std::fprintf(stderr, "%s\n", warning.c_str());
  auto effective = kproxy::cli::effectiveConfig(*parsed);
  if (!effective) return fail(effective.error().message());
  ProxyConfig config = std::move(*effective);
  if (auto applied = kproxy::cli::applyLogging(config.logging); !applied) return fail(applied.error());
  // The backend is asked what it WOULD program: never the kernel.
  config.dryRun = true;

  kproxy::plugins::PluginRegistry registry;
  loadPlugins(registry, config);
  std::vector<std::string> modes;
  for (const auto& p : registry.plugins()) modes.push_back(p.name);
  if (auto valid = kproxy::cli::validate(config, modes); !valid) return fail(valid.error().message());
  auto backend = registry.createPluginBackend(config.mode, backendOptions(config));
  if (!backend) return fail(backend.error().message());
  if (!(*backend)->canExplain()) {
    return fail("backend " + config.mode + " cannot explain: its plugin has no explain entry point");
  }

  auto apiConfig = apiClientConfig(config);
  if (!apiConfig) return fail(apiConfig.error().message());
  kproxy::core::TrackerConfig tracker = trackerConfigOf(config);
  tracker.ipv6 = true;  // nothing is programmed, so the node's kernel does not matter
  kproxy::core::ProxierOptions options;
  options.minSyncPeriod = std::chrono::milliseconds(0);
  options.oneShot = true;
  SnapshotCapture capture;
  kproxy::core::Proxier proxier(tracker, capture, options);
  FailureEvents failureEvents{tracker.nodeName, {}};  // the sync thread's only

  EventSource source;
  if (auto started = startSource(source, config, std::move(*apiConfig), proxier, tracker.nodeName);
      !started)
    return fail(started.error().message());
  // An API server that never answers must not leave explain hanging.
  constexpr auto kInitialListTimeout = std::chrono::seconds(60);
  std::stop_source stop;
  std::jthread watchdog([&stop, kInitialListTimeout](std::stop_token token) {
    std::mutex mutex;
    std::condition_variable_any never;
    std::unique_lock lock(mutex);
    never.wait_for(lock, token, kInitialListTimeout, [] { return false; });
    if (!token.stop_requested()) stop.request_stop();
  });
  bool ok = proxier.run(stop.get_token());
  watchdog.request_stop();
  watchdog.join();
  source.stop();
  if (!capture.synced) {
    return fail("explain: no initial list of Services and EndpointSlices from the source within " +
                std::to_string(kInitialListTimeout.count()) + " s");
  }
  if (!ok) return fail("explain: no snapshot from the source");

  auto text = (*backend)->explain(capture.snapshot, command->request);
  if (!text) return fail(text.error().message());
  std::fputs(text->c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::span<const char* const> args(const_cast<const char* const*>(argv) + 1,
                                    static_cast<std::size_t>(argc - 1));
  if (!args.empty() && std::string_view(args[0]) == "explain") return explain(args.subspan(1));
  if (!args.empty() && std::string_view(args[0]) == "status") return kproxy::cli::statusCommand(args.subspan(1));
  auto parsed = kproxy::cli::parseFlags(args);
  if (!parsed) return fail(parsed.error().message());
  for (const auto& warning : parsed->warnings) std::fprintf(stderr, "%s\n", warning.c_str());
  if (parsed->config.showHelp) {
    std::fputs(kproxy::cli::usage().c_str(), stdout);
    return 0;
  }
  if (parsed->config.showVersion) {
    std::printf("%s\n", kproxy::cli::versionLine().c_str());
    return 0;
  }
  auto effective = kproxy::cli::effectiveConfig(*parsed);
  if (!effective) return fail(effective.error().message());
  ProxyConfig config = std::move(*effective);
  if (auto applied = kproxy::cli::applyLogging(config.logging); !applied) return fail(applied.error());
  for (const auto& flag : kproxy::cli::ignoredFlags(*parsed)) {
    log::warning("flag ignored because --config is given", {{"flag", flag}});
  }
  if (!config.cleanup)
    for (const auto& warning : kproxy::cli::nodePortAddressWarnings(config)) log::warning(warning);

  // Block the stop signals before any thread starts so that only the waiter below sees them.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);

  kproxy::plugins::PluginRegistry registry;
  loadPlugins(registry, config);
  std::vector<std::string> modes;
  for (const auto& p : registry.plugins()) modes.push_back(p.name);
  if (auto valid = kproxy::cli::validate(config, modes); !valid) return fail(valid.error().message());
  for (const auto& warning : kproxy::cli::featureGateWarnings(config.featureGates)) log::warning(warning);

  if (!parsed->writeConfigTo.empty()) {
    if (auto w = kproxy::cli::writeConfigFile(config, parsed->writeConfigTo); !w)
      return fail(w.error().message());
    return 0;
  }
  if (config.cleanup) return cleanupAll(registry, config);
  // --init-only: the privileged node set-up, then exit (upstream's InitAndExit), so that the
  // long-running kproxy can run with CAP_NET_ADMIN only. Nothing is programmed, no server
  // started, no API server asked.
  if (config.initOnly) {
    if (config.dryRun) {
      for (const auto& s : kproxy::cli::conntrackSysctls(config.conntrack, kproxy::cli::onlineCpus()))
        std::printf("sysctl %s=%lld\n", s.path.c_str(), static_cast<long long>(s.value));
      for (const auto& s : kproxy::cli::modeSysctls(config, ""))
        std::printf("sysctl %s=%lld\n", s.path.c_str(), static_cast<long long>(s.value));
      return 0;
    }
    if (auto done = kproxy::cli::setUpNode(config); !done) return fail("--init-only: " + done.error().message());
    log::info(0, "System initialized and --init-only specified", {{"mode", config.mode}});
    return 0;
  }

  // Only the selected mode's plugin runs from here on.
  registry.unloadAllBut(config.mode);
  auto backend = registry.createBackend(config.mode, backendOptions(config));
  if (!backend) return fail(backend.error().message());

  // As upstream's platformCleanup: a mode that is not iptables-based removes iptables and IPVS
  // leftovers (a node migrating from kube-proxy's iptables or IPVS mode), and an iptables-based
  // one removes nftables mode's tables. Failures are logged and not fatal, as upstream.
  //
  // Unlike upstream, all of it happens only once this mode's first sync has put its own rules in
  // (make before break; called from the sync observer below). Removed at start, the old rules
  // would leave every service address without any rule until that sync (start-up, the initial
  // list and the sync itself): a connection opened in the gap gets a conntrack entry without
  // NAT, its SYNs go out by the default route, and every SYN that reuses its 4-tuple matches
  // that entry again (and keeps it alive) for 120 s after the last. Until then the old mode's
  // rules, hooked first, still serve the services' traffic; the first NAT rule that matches a
  // connection decides it, so the two never both apply. (Only the observer of a run that is not
  // a dry run calls it; dry_run_changes_nothing checks.)
  const bool iptablesBased = config.mode == "iptables" || config.mode == "ipvs";
  auto removeOtherModesLeftovers = [&config, iptablesBased] {
    kproxy::backends::RealLeftoverSystem system;
    if (!iptablesBased && !kproxy::cli::cleanUpKubeProxyLeftovers(system))
      log::warning("some iptables or IPVS leftovers could not be removed; continuing");
    // The userspace mode redirects in a table of its own: nftables mode's DNAT would win. ebpf
    // mode's nftables part has one too, and both would DNAT traffic from other hosts.
    if ((iptablesBased || config.mode == "userspace" || config.mode == "ebpf") &&
        !kproxy::nftables::cleanUpNftablesLeftovers(system))
      log::warning("some nftables leftovers could not be removed; continuing");
    // The userspace mode's redirects, left by a node switched from it, would catch the
    // services' traffic before this mode's rules do.
    if (config.mode != "userspace" && !kproxy::nftables::cleanUpNftablesLeftovers(system, "kproxy-userspace"))
      log::warning("the userspace mode's nftables table could not be removed; continuing");
    // ebpf mode's programs steer every local connect of their cgroup before any rule of this
    // mode sees a packet: detached once this mode's rules are in.
    if (config.mode != "ebpf" && !kproxy::ebpf::cleanUpEbpfLeftovers(system, config.ebpf.pinPath))
      log::warning("some ebpf leftovers could not be removed; continuing");
  };

  // Conntrack sysctls, as upstream's setupConntrack (not for --dry-run, which changes nothing;
  // --cleanup returned above). Read-only or missing ones are warnings.
  if (!config.dryRun) {
    if (auto ct = kproxy::cli::setUpConntrack(config.conntrack); !ct)
      return fail("setting conntrack sysctls: " + ct.error().message());
  }

  auto apiConfig = apiClientConfig(config);
  if (!apiConfig) return fail(apiConfig.error().message());
  // client-go's rest_client_* metrics of the API source's and the Event recorder's requests.
  auto restClientMetrics = std::make_shared<kproxy::cli::RestClientMetrics>();
  if (*apiConfig) (*apiConfig)->requestMetrics = restClientMetrics;

  // upstream's ProxyServer.Run: the OOM score first (not for a dry run, which changes nothing);
  // a failure is logged and not fatal.
  if (!config.dryRun) {
    if (auto oom = kproxy::cli::applyOomScoreAdj(config.oomScoreAdj); !oom)
      log::info(2, "Failed to apply OOMScore", {{"err", oom.error().message()}});
    else
      log::info(2, "applied oom_score_adj", {{"value", std::to_string(config.oomScoreAdj)}});
  }

  kproxy::core::TrackerConfig tracker = trackerConfigOf(config);
  tracker.ipv6 = kproxy::kernel::kernelHasIPv6();
  if (!tracker.ipv6) log::info(0, "IPv6 is not available in this network namespace; IPv6 service ports are skipped");
  kproxy::core::ProxierOptions options;
  options.syncPeriod = config.effectiveSyncPeriod();
  options.minSyncPeriod = config.effectiveMinSyncPeriod();
  options.oneShot = config.dryRun;
  options.verifyPeriod = config.dryRun ? kproxy::cli::Duration::zero() : config.verifyPeriod;
  kproxy::core::Proxier proxier(tracker, **backend, options);

  // --nodeport-addresses selects the node's interface addresses: read them now (before the
  // first sync) and follow them. Without them the backend decides from the Node object.
  auto addressWatcher = kproxy::kernel::InterfaceAddressWatcher::start(
      kproxy::backends::kIpvsDummyInterface,
      [&proxier](std::vector<std::string> addresses) {
        proxier.interfaceAddressesChanged(std::move(addresses));
      });
  if (!addressWatcher) {
    log::error("interface addresses cannot be read; NodePorts follow the Node object's addresses",
               {{"error", addressWatcher.error().message()}});
  }

  if (config.mode == "iptables") {
    // Upstream's default mode, and so kproxy's; the figure is BENCHMARKS.md's (10,000 Services
    // × 2 endpoints, "one endpoint changed", both modes of kproxy on the same machine).
    log::info(0,
              "running in iptables mode, upstream kube-proxy's default; nftables mode applied one "
              "endpoint change in 9.1 ms against iptables mode's 193 ms at 10,000 Services "
              "(BENCHMARKS.md): consider --proxy-mode=nftables (mode: nftables in the config file)");
  }
  log::info(0, "starting", {{"version", kproxy::cli::kKproxyVersion}, {"commit", kproxy::cli::kKproxyCommit},
                            {"kubernetes", kproxy::cli::kKubernetesVersion}, {"mode", config.mode},
                            {"node", tracker.nodeName}, {"manifests", config.manifestsDir},
                            {"dryRun", config.dryRun ? "true" : "false"}});

  // Events on Services whose changes keep failing to apply (API server mode; not --dry-run).
  std::unique_ptr<kproxy::apiwatch::EventRecorder> recorder;
  if (*apiConfig && !config.dryRun) {
    auto created = kproxy::apiwatch::EventRecorder::create(**apiConfig, tracker.nodeName);
    if (created) {
      recorder = std::move(*created);
    } else {
      log::warning("Events cannot be posted", {{"error", created.error().message()}});
    }
  }

  FailureEvents failureEvents{tracker.nodeName, {}};  // the sync thread's only
  bool otherModesRemoved = false;                     // the sync thread's only

  EventSource source;
  if (auto started = startSource(source, config, std::move(*apiConfig), proxier, tracker.nodeName);
      !started)
    return fail(started.error().message());

  std::stop_source stop;
  std::jthread signalWaiter([&stop, stopSignals](std::stop_token token) {
    timespec tick{0, 200'000'000};
    while (!token.stop_requested()) {
      int sig = sigtimedwait(&stopSignals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        log::info(0, "stopping; kernel rules stay in place", {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
        stop.request_stop();
        return;
      }
    }
  });

  // Metrics, health and health-check node port servers (not for a dry run: it changes nothing
  // and exits after one sync).
  std::unique_ptr<kproxy::cli::OpsServers> ops;
  std::atomic<bool> fatal = false;
  if (!config.dryRun) {
    kproxy::cli::OpsOptions opsOptions;
    opsOptions.mode = config.mode;
    opsOptions.metricsBindAddress = config.metricsBindAddress;
    opsOptions.healthzBindAddress = config.healthzBindAddress;
    opsOptions.bindAddressHardFail = config.bindAddressHardFail;
    opsOptions.healthTimeout = 2 * config.effectiveSyncPeriod();
    opsOptions.configzJson = kproxy::cli::toConfigzJson(config);
    // Upstream's --profiling installs Go's /debug/pprof and /debug/flags/v. A C++ program has no
    // Go profiles to serve (profile kproxy with perf); the run-time verbosity it can serve.
    if (config.enableProfiling) {
      opsOptions.setVerbosity = [](const std::string& body) { return kproxy::cli::setVerbosityFromText(body); };
      log::warning("Profiling: /debug/pprof is not served (kproxy is not a Go program: profile it with perf "
                   "record -g -p PID); PUT /debug/flags/v changes the log verbosity",
                   {{"address", config.metricsBindAddress}});
    }
    // The families this node runs (upstream runs a proxier for each): the ip_family labels.
    opsOptions.nodeRequired = source.api != nullptr && !tracker.nodeName.empty();
    opsOptions.families = tracker.ipv6 ? std::vector<std::string>{"IPv4", "IPv6"} : std::vector<std::string>{"IPv4"};
    opsOptions.build = kproxy::cli::BuildInfo{kproxy::cli::kKubernetesVersion, kproxy::cli::kKproxyCommit};
    // iptables mode: upstream's nfacct counters, read from this network namespace's objects
    // (opened here, on the main thread, in the namespace the backend programs).
    std::shared_ptr<const kproxy::cli::NfacctMetrics> nfacct;
    if (config.mode == "iptables") nfacct = kproxy::cli::NfacctMetrics::open();
    opsOptions.extraMetrics = [&source, &registry, restClientMetrics, nfacct, mode = config.mode] {
      const auto plugins = registry.metrics().collect();
      return restClientMetrics->render() + sourceMetrics(source) +
             kproxy::cli::renderUpstreamAliases(mode, plugins) + (nfacct ? nfacct->render() : std::string()) +
             kproxy::cli::renderPluginMetrics(plugins);
    };
    // /debug/services: the shared plan's view of every service port (the same in every mode)
    // and the sync ledger. The node-wide plan settings are the options every backend gets.
    {
      const kproxy::plugins::BackendOptions given = backendOptions(config);
      auto commonOptions = kproxy::plan::parseCommonOptions(kproxy::sdk::Options(given.begin(), given.end()), "kproxy");
      if (!commonOptions) return fail(commonOptions.error().message);
      opsOptions.debugServices = [&proxier, common = std::move(*commonOptions),
                                  mode = config.mode](const std::string& service) {
        kproxy::cli::ServiceStatusInput in;
        in.mode = mode;
        in.snapshot = proxier.status().applied;
        in.ledger = proxier.syncLedger();
        in.common = common;
        in.nowWall = kproxy::core::systemClock().wallSeconds();
        in.service = service;
        return kproxy::cli::servicesStatus(in).dump();
      };
    }
    ops = std::make_unique<kproxy::cli::OpsServers>(std::move(opsOptions), proxier);
    // The proxier calls a copy of the observer: state lives outside it.
    proxier.setObserver([&ops, &proxier, &recorder, &failureEvents, &removeOtherModesLeftovers,
                         &otherModesRemoved](const kproxy::core::SyncObservation& o) {
      if (o.ok && !otherModesRemoved) {
        otherModesRemoved = true;
        removeOtherModesLeftovers();
      }
      ops->observe(o);
      if (!o.ok && recorder) failureEvents.report(proxier.syncLedger(), *recorder);
      // A full sync (the first above all, right after the initial list) frees far more than
      // steady state needs: decoded documents, rendered batches. malloc keeps freed pages
      // mapped unless asked, so the process would stay at its peak size.
      if (o.ok && o.kind == kproxy::core::SyncKind::kFull) malloc_trim(0);
    });
    ops->start([&stop, &fatal](const std::string& reason) {
      log::error("stopping", {{"reason", reason}});
      fatal = true;
      stop.request_stop();
    });
  }

  // upstream's runLoop: a changed --config file ends the process with an error, for the
  // DaemonSet or unit to restart it with the new file (not for a dry run, which ends anyway).
  std::unique_ptr<kproxy::cli::ConfigFileWatcher> configWatcher;
  if (!parsed->configFile.empty() && !config.dryRun) {
    auto watching = kproxy::cli::ConfigFileWatcher::start(parsed->configFile, [&stop, &fatal](const std::string& why) {
      log::error("Error running ProxyServer", {{"err", why}});
      fatal = true;
      stop.request_stop();
    });
    if (!watching) return fail(watching.error().message());
    configWatcher = std::move(*watching);
  }

  bool ok = proxier.run(stop.get_token());
  configWatcher.reset();
  if (addressWatcher) addressWatcher->reset();  // its callback uses the proxier
  proxier.setObserver(nullptr);
  if (ops) ops->stop();
  source.stop();
  signalWaiter.request_stop();
  return ok && !fatal ? 0 : 1;
}
