#pragma once
/// A source of Services, EndpointSlices, ServiceCIDRs and the own Node read from a Kubernetes API server with
/// list + watch, as kube-proxy's informers do.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kproxy/apiwatch/kubeconfig.h"
#include "kproxy/core/error.h"
#include "kproxy/core/events.h"

namespace kproxy::apiwatch {

/// Upstream kube-proxy's selector for Services and EndpointSlices: skip headless services and
/// services that ask for another proxy (cmd/kube-proxy/app/server.go).
inline constexpr const char* kProxyLabelSelector =
    "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";

struct ApiSourceOptions {
  /// The node whose Node object is watched (field selector metadata.name=<nodeName>). Empty:
  /// no Node watch.
  std::string nodeName;
  /// Items per LIST page (`limit`); the server returns a `continue` token for the rest.
  std::uint32_t pageSize = 500;
  /// Server-side watch timeout (`timeoutSeconds`). client-go picks 5–10 min at random; a
  /// random value in [watchTimeout, 2 × watchTimeout) is used for the same reason (spread
  /// reconnects of many nodes). Must be at least 1 s.
  std::chrono::seconds watchTimeout{300};
  /// A watch still open this long after its timeoutSeconds is considered stuck and reopened.
  /// Quiet watches are normal (no bookmarks on an idle resource); a dead peer is found sooner
  /// by TCP keepalive (about a minute).
  std::chrono::seconds watchGrace{30};
  /// Connect + TLS handshake + response headers, and the whole body of a LIST page.
  std::chrono::seconds requestTimeout{30};
  /// Exponential backoff after a failure: initial, factor 2, capped, with ±50% jitter.
  std::chrono::milliseconds initialBackoff{500};
  std::chrono::milliseconds maxBackoff{30'000};
};

/// Counters for metrics and tests. Read with stats() from any thread.
struct ApiSourceStats {
  std::uint64_t decodeFailures = 0;  ///< objects skipped because they could not be decoded
  std::uint64_t requests = 0;        ///< HTTP requests sent (LIST pages and WATCHes)
  std::uint64_t requestFailures = 0; ///< connection, TLS, HTTP status or body failures
  std::uint64_t lists = 0;           ///< complete LISTs (all pages), incl. the initial ones
  std::uint64_t relists = 0;         ///< LISTs after the first one of a resource (410, errors)
  std::uint64_t watchesOpened = 0;   ///< WATCH requests answered with 200
  std::uint64_t watchEvents = 0;     ///< ADDED/MODIFIED/DELETED events applied
  std::uint64_t bookmarks = 0;
  std::uint64_t expired = 0;         ///< 410 Gone / Expired answers, each followed by a relist
  /// Every resource has had a watch open since its last failed request (a watch the server
  /// ends on its timeout and that is resumed at once does not count as a disconnection).
  bool connected = false;
};

/// Lists and watches, on its own thread (one Asio io_context, one coroutine per resource):
///  - Services and EndpointSlices with kProxyLabelSelector; the own Node by field selector;
///    ServiceCIDRs (networking.k8s.io/v1), optionally: until they have been listed once, a
///    server without them (404) or RBAC that refuses them (401/403) is logged once as a
///    warning and treated as "no ServiceCIDRs" (asked again with the usual backoff; nothing
///    waits for them); after that a refusal is an ordinary failure that keeps what is held.
///    servicesSynced() comes after the first ServiceCIDR LIST attempt, whatever its outcome, so
///    the first sync knows them.
///  - LIST with limit/continue paging; every object is delivered as an upsert, then
///    servicesSynced() / endpointSlicesSynced() once that resource's initial LIST is complete.
///  - WATCH from the LIST's resourceVersion with allowWatchBookmarks; ADDED/MODIFIED → upsert,
///    DELETED → delete, BOOKMARK → resume point. A watch that ends (timeout, server restart,
///    network) is resumed from the last resourceVersion after a backoff.
///  - 410 Gone / "Expired" (the resume point is too old) → relist, then reconcile against what
///    is held: deletes for objects that are gone, upserts for new or changed ones, nothing for
///    unchanged ones (so a relist causes no rule churn).
///  - Failures back off exponentially with jitter (capped); a 429 or 5xx answer with
///    Retry-After (whole seconds, as client-go reads it) waits at least that long (at most
///    5 min). Requests go through a QPS/burst token bucket from the ClientConfig.
///  - An object that cannot be decoded is skipped with a warning naming it and the reason and
///    counted in decodeFailures; the stream continues. A held object whose new version is
///    undecodable keeps its last good version.
///
/// Thread-safety: start() and stop() from one thread. The sink is only called from the source's
/// thread, never concurrently. stats() from any thread.
class ApiSource {
 public:
  ApiSource(ClientConfig config, core::EventSink& sink, ApiSourceOptions options = {});
  ~ApiSource();
  ApiSource(const ApiSource&) = delete;
  ApiSource& operator=(const ApiSource&) = delete;

  /// Sets up TLS (bad CA / client certificate → kInvalidArgument) and starts the thread. The
  /// first LISTs happen in the background: the sink's *Synced() calls say when they are done.
  /// An unreachable server is not an error here; it is retried with backoff and logged.
  core::Result<void> start();

  /// Stops all requests and joins the thread; no sink call happens after it returns.
  /// Idempotent.
  void stop();

  ApiSourceStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::apiwatch
