#pragma once
/// The one reconcile skeleton every backend plugs into: the backend implements a full pass and
/// a partial pass over the plan's snapshot, nothing around them. The skeleton decides which
/// pass runs (the host asks for a full sync, the last sync failed, the last pass said the
/// kernel may differ from what the backend believes, or the backend finds so before a
/// partial pass), times it, writes the sync summary in one format for every mode, cleans
/// stale conntrack flows after a successful sync and hands freed heap back after a full one.
/// Thread-safety: as sdk::BackendPlugin, one call at a time.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/backends/common/conntrack_cleaner.h"
#include "kproxy/kernel/conntrack_table.h"
#include "kproxy/plan/snapshot_source.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::backends {

/// What one pass did.
struct PassOutcome {
  std::uint64_t operations = 0;  ///< kernel operations the pass sent (0: nothing differed)
  /// The backend's own fields for the summary ("kernel_ms=0.4 pending_delete=2"), may be empty.
  std::string detail;
  /// The pass succeeded but the kernel may now differ from what the backend believes (another
  /// program wrote while it ran): the next sync is full.
  bool fullNext = false;
};

/// Opens the conntrack table a sync's cleanup works on.
using ConntrackTableFactory = std::function<std::unique_ptr<kernel::ConntrackTable>()>;

struct ReconcilerOptions {
  std::string mode;  ///< the summary's first word: "nftables", "iptables", …
  /// Where stale UDP/SCTP flows are cleaned after each sync; none for a backend whose
  /// connections hold no conntrack NAT (userspace).
  ConntrackTableFactory conntrack;
  bool releaseHeapAfterFull = true;
  std::string summaryNote;  ///< appended to the summary, e.g. "dry_run=true"
};

/// The options of a backend that leaves conntrack alone: no cleanup, no heap release after a
/// full sync.
ReconcilerOptions plainReconcilerOptions(std::string mode, std::string summaryNote = {});

/// The options of a backend over the kernel's conntrack: the netlink table, or in a dry run a
/// printer over it that writes to `dryRunOutput` (chosen once, as the backend's other kernel
/// interfaces are).
ReconcilerOptions kernelReconcilerOptions(std::string mode, bool dryRun, std::FILE* dryRunOutput);

class Reconciler : public sdk::BackendPlugin {
 public:
  /// The sync: the pass, then the bookkeeping around it. A failed pass leaves the next sync
  /// full, so that it reads the kernel back and repairs what was applied.
  sdk::Expected<sdk::SyncOutcome> sync(const sdk::SyncContext& context) final;
  /// The same on any snapshot source (benchmarks, tests), without the conntrack cleanup, which
  /// needs the host's two snapshots. `changed` is ignored by a full pass.
  sdk::Expected<sdk::SyncOutcome> syncFrom(const plan::SnapshotSource& next,
                                           const std::vector<sdk::ChangedKey>& changed, bool full);
  /// Whether the next sync will be full (first sync, after a failure, after cleanup).
  bool needsFullSync() const { return needFull_; }

 protected:
  Reconciler(const sdk::Host& host, ReconcilerOptions options);

  /// Reads the kernel back and makes it what `next` says, repairing whatever differs.
  virtual sdk::Expected<PassOutcome> fullSync(const plan::SnapshotSource& next) = 0;
  /// Applies the service ports in `changed` (and node-wide changes) against the backend's
  /// mirror of the kernel.
  virtual sdk::Expected<PassOutcome> partialSync(const plan::SnapshotSource& next,
                                                 const std::vector<sdk::ChangedKey>& changed) = 0;
  /// Asked before a partial pass over `changed`: whether the kernel changed outside the backend
  /// since its last sync, so that only a full pass can trust it. A check that costs a tool run
  /// may be left to periodic syncs (`changed` empty). The default: no.
  virtual bool kernelChangedOutside(const std::vector<sdk::ChangedKey>& /*changed*/) { return false; }
  /// Called after each successful sync, after the conntrack cleanup, with the host's two
  /// snapshots: the backend's own cleanup of what the sync left stale (ebpf mode ends connected
  /// UDP sockets, with the conntrack cleanup's decision). It logs and counts its own failures
  /// and never fails the sync. The default: nothing.
  virtual void cleanAfterSync(const sdk::SyncContext& /*context*/) {}

  /// The next sync is full (for what the backend learns outside a pass, e.g. a cleanup).
  void requireFullSync() { needFull_ = true; }

  const sdk::Host& host() const { return host_; }

 private:
  sdk::Host host_;
  ReconcilerOptions options_;
  ConntrackReconcilerMetrics conntrackMetrics_;  ///< registered when options_.conntrack is set
  bool needFull_ = true;  ///< nothing is known of the kernel before the first full pass
};

}  // namespace kproxy::backends
