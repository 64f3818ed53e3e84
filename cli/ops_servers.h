#pragma once
/// kproxy's operator-facing HTTP side, as kube-proxy serves it: the metrics server
/// (/metrics, /proxyMode, /healthz, /configz, /debug/flags/v, and kproxy's /debug/services), the health server (/healthz, /livez) and the
/// per-service health-check node ports, all on one EventLoop thread, fed by the Proxier's
/// observer and status().

#include <chrono>
#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/core/clock.h"
#include "kproxy/core/proxier.h"
#include "metrics.h"

namespace kproxy::cli {

struct OpsOptions {
  std::string mode;                 ///< served by /proxyMode, names the failure counter
  std::string metricsBindAddress;   ///< "host:port"; empty disables the metrics server
  std::string healthzBindAddress;   ///< "host:port"; empty disables the health server
  /// Exit (via onFatal) instead of retrying when a server cannot bind (upstream
  /// bindAddressHardFail); otherwise binding is retried every 5 s, as upstream does.
  bool bindAddressHardFail = false;
  /// Upstream: 2 × syncPeriod.
  std::chrono::steady_clock::duration healthTimeout = std::chrono::seconds(60);
  std::string configzJson;          ///< the /configz body
  /// IPs the health-check node ports listen on; empty: every address.
  std::vector<std::string> healthCheckAddresses;
  std::vector<std::string> families = {"IPv4", "IPv6"};
  /// /healthz: the event source watches this node's Node, and a node not seen yet is not
  /// eligible (upstream); false for a manifest directory, which has no Node to wait for.
  bool nodeRequired = false;
  BuildInfo build;  ///< kubernetes_build_info
  /// More Prometheus text appended to /metrics (the event source's counters). Called on the
  /// server's thread; must be thread-safe.
  std::function<std::string()> extraMetrics;
  /// The /debug/services body for the given service ("namespace/name"; empty: every service).
  /// Called on the server's thread; must be thread-safe. Unset: the path is not served.
  std::function<std::string(const std::string& service)> debugServices;
  /// PUT /debug/flags/v: sets the log verbosity from the body and returns the answer, or the
  /// error for a 400 (upstream's StringFlagPutHandler over GlogSetter). Called on the server's
  /// thread. Unset: /debug/flags is not served (upstream serves it with enableProfiling).
  std::function<std::expected<std::string, std::string>(const std::string& body)> setVerbosity;
};

class OpsServers {
 public:
  /// `proxier` must outlive this object.
  OpsServers(OpsOptions options, const core::Proxier& proxier,
             core::Clock& clock = core::systemClock());
  ~OpsServers();  ///< stops
  OpsServers(const OpsServers&) = delete;
  OpsServers& operator=(const OpsServers&) = delete;

  /// Starts the loop thread and the servers. `onFatal` is called (from the loop thread) when
  /// bindAddressHardFail is set and a server cannot bind.
  void start(std::function<void(const std::string&)> onFatal);
  /// Stops every server and the loop thread. Idempotent.
  void stop();
  /// Feed from Proxier::setObserver (any thread): metrics, then a health-check port reconcile.
  void observe(const core::SyncObservation& observation);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::cli
