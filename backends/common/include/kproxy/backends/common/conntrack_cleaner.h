#pragma once
/// Stale conntrack cleanup after a sync, with upstream kube-proxy's rules
/// (pkg/proxy/conntrack/cleanup.go, CleanStaleEntries, the reconciling version):
///
/// - It runs when a changed service port used a cleaned protocol before or after the change
///   (upstream's ConntrackCleanupRequired), and on full syncs when any such port exists.
/// - Per family it lists the conntrack flows of each cleaned protocol and deletes:
///   (1) a flow whose original destination is a service's ClusterIP, LoadBalancer VIP or
///       external IP with the service port, and whose reply source is not a serving endpoint
///       of that service port;
///   (2) a flow whose original destination port is a service's NodePort (any address) and
///       whose reply source is not a serving endpoint of that service port.
///   A service port with no serving endpoint (scaled to zero) counts with an empty serving
///   set, so every flow to it goes: each one is DNAT'ed to a pod that is gone or no longer
///   serves, and a one-way sender (statsd, syslog) that keeps its flow alive would otherwise be
///   blackholed until the service has an endpoint again. Upstream 1.32 to 1.34.4 skipped such
///   ports; upstream fixed it as a regression (kubernetes#139629), and this follows the fix
///   (tests/kernel/conntrack_kernel_test.cpp). The ports a sync removed count the same way
///   (kubernetes#141371), unless a remaining port uses the same address or NodePort.
///   A flow that was never DNAT'ed (traffic that hit the service while it had no endpoints)
///   replies from the service address itself, so rule (1) removes it too.
/// - Traffic policies, topology and terminating state are not considered: the serving set is
///   every serving endpoint of the service port (upstream keeps UDP consistent with TCP).
/// - Never a blanket flush: only flows listed and matched are deleted, one by one.
///
/// Upstream cleans UDP only (SCTP cleanup was reverted upstream as never effective); the
/// protocols are an option so a backend can add SCTP.
/// Thread-safety: one thread at a time.

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/kernel/conntrack_table.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::backends {

struct ConntrackCleanupOptions {
  std::vector<sdk::Protocol> protocols{sdk::Protocol::kUDP};
};

/// One family's reconcile: upstream's per-family proxier observes each as one sync of its
/// conntrack reconciler.
struct FamilyReconcile {
  net::Family family = net::Family::kIPv4;
  double seconds = 0;        ///< listing, deciding and deleting
  std::size_t deleted = 0;   ///< flows the kernel really deleted
};

struct ConntrackCleanupReport {
  bool ran = false;              ///< false when no cleanup was required
  std::size_t listed = 0;        ///< flows examined
  std::vector<kernel::ConntrackFlow> stale;  ///< flows chosen for deletion
  std::size_t deleted = 0;       ///< flows the kernel really deleted (others were already gone)
  std::vector<FamilyReconcile> families;  ///< the families reconciled, in order
};

/// The families a reconcile covers.
using FamilySet = std::vector<net::Family>;
inline const FamilySet kBothFamilies{net::Family::kIPv4, net::Family::kIPv6};

class ConntrackCleaner {
 public:
  explicit ConntrackCleaner(kernel::ConntrackTable& table, ConntrackCleanupOptions options = {});

  /// The flows among `flows` (all of one family) that rules (1) and (2) above delete, given
  /// the service ports of the same family (ports of other protocols are ignored).
  std::vector<kernel::ConntrackFlow> staleFlows(std::span<const kernel::ConntrackFlow> flows,
                                        std::span<const sdk::ServicePort> ports) const;

  /// Lists, decides and deletes, family by family of `families`, for the service ports
  /// `ports` and the ports a sync removed, `deleted`. A family (and protocol) with no such port
  /// is not listed at all: no flow of it could be stale; it is still reported as reconciled
  /// (with nothing deleted).
  core::Result<ConntrackCleanupReport> reconcile(std::span<const sdk::ServicePort> ports,
                                                 const FamilySet& families = kBothFamilies,
                                                 std::span<const sdk::ServicePort> deleted = {});

  /// The whole step after a successful sync, on plain vectors (tests): `previous` and `next`
  /// hold every service port of the two snapshots.
  core::Result<ConntrackCleanupReport> afterSync(const std::vector<sdk::ServicePort>& previous,
                                                 const std::vector<sdk::ServicePort>& next,
                                                 const std::vector<sdk::ChangedKey>& changed,
                                                 bool full);
  /// The same on the host's snapshot views (backends).
  core::Result<ConntrackCleanupReport> afterSync(const sdk::SyncContext& context);

  bool cleans(sdk::Protocol protocol) const;

 private:
  kernel::ConntrackTable& table_;
  ConntrackCleanupOptions options_;
};

/// Upstream's conntrack reconciler metrics, registered by the plugin under kproxy_ names with
/// upstream's labels and buckets (the host serves them as upstream's kubeproxy_conntrack_
/// reconciler_* too, in the modes upstream registers them): per family reconciled, one
/// observation of its duration and the flows it deleted.
class ConntrackReconcilerMetrics {
 public:
  static constexpr const char* kDurationName = "kproxy_conntrack_reconciler_sync_duration_seconds";
  static constexpr const char* kDeletedName = "kproxy_conntrack_reconciler_deleted_entries_total";

  ConntrackReconcilerMetrics() = default;
  /// Registers both; a refusal is an error, and on a host without metrics (or histograms) the
  /// metric concerned is inactive.
  static sdk::Expected<ConntrackReconcilerMetrics> registerWith(const sdk::Host& host);
  void observe(const ConntrackCleanupReport& report) const;

 private:
  sdk::Metric duration_;
  sdk::Metric deleted_;
};

/// The backend hook: after a successful sync, cleans stale flows in the table `open` gives
/// (the calling thread's network namespace's, or a printer over it in a dry run), logs
/// through `host` and observes each family reconciled in `metrics`. Never fails: a cleanup
/// error is logged (and not observed) and the next required cleanup tries again.
void cleanStaleConntrackEntries(const sdk::Host& host, const sdk::SyncContext& context,
                                const std::function<std::unique_ptr<kernel::ConntrackTable>()>& open,
                                const ConntrackReconcilerMetrics& metrics = {},
                                ConntrackCleanupOptions options = {});

}  // namespace kproxy::backends
