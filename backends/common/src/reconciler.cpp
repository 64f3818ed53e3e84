#include "kproxy/backends/common/reconciler.h"

#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "kproxy/backends/common/conntrack_cleaner.h"
#include "kproxy/backends/common/heap.h"

namespace kproxy::backends {

ReconcilerOptions kernelReconcilerOptions(std::string mode, bool dryRun, std::FILE* dryRunOutput) {
  ReconcilerOptions options;
  options.mode = std::move(mode);
  if (dryRun) {
    options.conntrack = [dryRunOutput] {
      return std::make_unique<kernel::PrintingConntrackTable>(kernel::makeNetlinkConntrackTable(), dryRunOutput);
    };
    options.summaryNote = "dry_run=true";
  } else {
    options.conntrack = [] { return kernel::makeNetlinkConntrackTable(); };
  }
  return options;
}

ReconcilerOptions plainReconcilerOptions(std::string mode, std::string summaryNote) {
  ReconcilerOptions options;
  options.mode = std::move(mode);
  options.releaseHeapAfterFull = false;
  options.summaryNote = std::move(summaryNote);
  return options;
}

Reconciler::Reconciler(const sdk::Host& host, ReconcilerOptions options)
    : host_(host), options_(std::move(options)) {
  if (!options_.conntrack) return;
  // A refused registration costs the metrics, never the backend.
  if (auto metrics = ConntrackReconcilerMetrics::registerWith(host_))
    conntrackMetrics_ = std::move(*metrics);
  else
    host_.warning("conntrack reconciler metrics not registered: " + metrics.error().message);
}

sdk::Expected<sdk::SyncOutcome> Reconciler::sync(const sdk::SyncContext& context) {
  auto synced = syncFrom(plan::HostSnapshot(context.next), context.changed, context.full);
  // UDP flows already DNAT'ed to a removed endpoint would keep going there; best effort, it
  // logs its own failures and never fails the sync.
  if (synced && options_.conntrack) cleanStaleConntrackEntries(host_, context, options_.conntrack, conntrackMetrics_);
  if (synced) cleanAfterSync(context);
  return synced;
}

sdk::Expected<sdk::SyncOutcome> Reconciler::syncFrom(const plan::SnapshotSource& next,
                                                     const std::vector<sdk::ChangedKey>& changed, bool full) {
  const auto started = std::chrono::steady_clock::now();
  full = full || needFull_;
  if (!full && kernelChangedOutside(changed)) full = true;
  // Whatever fails below leaves the next sync full.
  needFull_ = true;
  auto pass = full ? fullSync(next) : partialSync(next, changed);
  if (!pass) return std::unexpected(pass.error());
  needFull_ = pass->fullNext;
  // A full pass frees far more than steady state needs (rendered batches, read-back mirrors).
  if (full && options_.releaseHeapAfterFull) releaseFreeHeap();

  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  sdk::SyncOutcome out;
  out.operations = pass->operations;
  out.summary = fmt::format("{} sync full={} ops={} changed={} ms={:.1f}{}{}{}{}", options_.mode, full,
                            pass->operations, changed.size(), ms, pass->detail.empty() ? "" : " ", pass->detail,
                            options_.summaryNote.empty() ? "" : " ", options_.summaryNote);
  host_.info(2, out.summary);
  return out;
}

}  // namespace kproxy::backends
