#pragma once
/// The health decisions and response bodies of kube-proxy's health server
/// (pkg/proxy/healthcheck/proxy_health.go and service_health.go), as pure functions of their
/// inputs so they are testable with any clock.
///
/// Semantics: the proxy is healthy unless a change has been queued and not applied for
/// `healthTimeout` (upstream: 2 × syncPeriod) or longer. /livez says only that; /healthz is
/// also 503 while the Node is being deleted. When healthy, the bodies report lastUpdated as the
/// current time (upstream keeps that for compatibility with older releases).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "http_server.h"

namespace kproxy::cli {

struct HealthInput {
  double nowWall = 0;  ///< wall seconds since the epoch
  /// When the sync loop started; upstream marks the proxier updated then, so a proxy whose
  /// first sync never succeeds becomes unhealthy one timeout after its first queued change.
  double startWall = 0;
  std::optional<double> lastSuccessWall;
  std::optional<double> oldestQueuedWall;  ///< oldest change not yet applied
  std::chrono::steady_clock::duration healthTimeout = std::chrono::seconds(60);
  bool nodeDeleting = false;
  /// Whether this node's Node object has been seen. Upstream's NodeManager answers nil until
  /// then, and a node it cannot see is not eligible; only meaningful when `nodeRequired`.
  bool nodeSeen = false;
  /// The event source watches this node's Node (the API server; a manifest directory has none).
  bool nodeRequired = false;
  /// The IP families the proxier programs ("IPv4", "IPv6"), reported under "status".
  std::vector<std::string> families = {"IPv4"};
};

struct ProxyHealth {
  bool healthy = true;
  double lastUpdated = 0;  ///< wall seconds; the newest successful sync (or start)
  double currentTime = 0;
};

/// The proxier's health ignoring the Node (upstream ProxyHealthServer.Health()).
ProxyHealth evaluateProxyHealth(const HealthInput& input);

/// /healthz: 200 when healthy and the Node is eligible (seen, when the source has Nodes, and not
/// being deleted), else 503. Body:
/// {"lastUpdated":…,"currentTime":…,"nodeEligible":…,"healthy":…,"status":{"IPv4":{…}}}.
HttpResponse healthzResponse(const HealthInput& input);
/// /livez: as /healthz without the Node check and without "nodeEligible".
HttpResponse livezResponse(const HealthInput& input);

/// The answer of a service's health-check node port: 200 when the node has local ready
/// endpoints and the proxy is healthy, else 503; headers X-Content-Type-Options: nosniff and
/// X-Load-Balancing-Endpoint-Weight: <localEndpoints>.
HttpResponse serviceHealthResponse(const std::string& ns, const std::string& name,
                                   int localEndpoints, bool proxyHealthy);

/// Go's RFC 3339 form of a time as encoding/json writes it, in UTC with trailing zeros of the
/// fraction dropped: "2024-05-01T10:00:00.25Z". 0 gives Go's zero time "0001-01-01T00:00:00Z".
std::string formatRfc3339Nano(double wallSeconds);

}  // namespace kproxy::cli
