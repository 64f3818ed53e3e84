#pragma once
/// The sync loop: events in, snapshots out, backend called at the pace the scheduler allows.
/// Event methods are thread-safe; run() blocks on the calling thread until stop is requested.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "kproxy/core/backend.h"
#include "kproxy/core/clock.h"
#include "kproxy/core/events.h"
#include "kproxy/core/sync_scheduler.h"
#include "kproxy/core/tracker.h"

namespace kproxy::core {

struct ProxierOptions {
  std::chrono::steady_clock::duration minSyncPeriod = std::chrono::seconds(1);
  std::chrono::steady_clock::duration syncPeriod = std::chrono::seconds(30);
  /// How often a sync is a full one (re-reads the kernel and repairs what others changed), as
  /// upstream's FullSyncPeriod. The syncPeriod tick in between is a cheap partial sync.
  std::chrono::steady_clock::duration fullSyncPeriod = std::chrono::hours(1);
  /// Delay before retrying a failed sync (always as a full sync).
  std::chrono::steady_clock::duration retryInterval = std::chrono::seconds(1);
  /// Exit run() after the first sync (used by --dry-run).
  bool oneShot = false;
  /// Self-verification: this long after the last full sync or verification (and soon after a
  /// full sync that changed the kernel), with no change pending, the applied snapshot is synced
  /// again in full: the backend reads the kernel back and diffs it against the plan, so any
  /// operation it needs is a difference someone else made, repaired at once. 0 disables it.
  std::chrono::steady_clock::duration verifyPeriod = std::chrono::minutes(5);
  /// How soon after a full sync that changed the kernel it is verified (at most verifyPeriod).
  std::chrono::steady_clock::duration verifyAfterChange = std::chrono::seconds(10);
  /// Both delays above stretch to at least this many times what a verification costs (the last
  /// one's duration; before the first, the last full sync's), so that verifications take at most
  /// 1% of the sync loop's time. A change that arrives during one waits for it, and where one
  /// takes seconds (iptables-nft at 10,000 Services; BENCHMARKS.md, "Figures behind the code")
  /// that would otherwise show in every percentile of the programming latency above the 97th.
  unsigned verifyCostFactor = 100;
};

/// Reported after every sync attempt (metrics, health, logs).
struct SyncObservation {
  SyncKind kind = SyncKind::kFull;
  bool ok = false;
  std::chrono::steady_clock::duration duration{};
  std::size_t changedServicePorts = 0;
  std::size_t serviceChanges = 0;
  std::size_t endpointChanges = 0;
  std::size_t operations = 0;
  std::string summary;
  std::optional<Error> error;
  double wallTimestamp = 0;
  /// On success: trigger times of the endpoint changes this sync programmed.
  std::vector<TriggerTime> triggerTimes;
  /// A self-verification (see ProxierOptions::verifyPeriod): a full sync of the snapshot
  /// already applied. Its `operations` are differences found in the kernel (and repaired).
  bool verification = false;
};

struct ProxierStatus {
  bool initialSyncDone = false;         ///< services and slices listed, first sync attempted
  std::optional<double> lastSuccessWall;  ///< wall seconds of the last successful sync
  /// Wall seconds of the oldest change not yet applied, including changes a sync in flight is
  /// applying (so a hung backend shows up as an old pending change).
  std::optional<double> oldestQueuedWall;
  std::optional<double> lastQueuedWall;     ///< wall seconds of the newest change event
  std::shared_ptr<const Snapshot> applied;  ///< last successfully applied snapshot
  bool nodeDeleting = false;
  /// A Node object of this node has been seen (and stays seen after it is deleted: upstream's
  /// NodeManager keeps the last one).
  bool nodeSeen = false;
  /// Service / EndpointSlice events folded into the tracker but not yet published.
  std::size_t pendingServiceChanges = 0;
  std::size_t pendingEndpointChanges = 0;
  /// Service / EndpointSlice events that changed something, since start.
  std::uint64_t serviceChangesTotal = 0;
  std::uint64_t endpointChangesTotal = 0;
};

/// One sync attempt, as /debug/services and `kproxy status` report it.
struct SyncRecord {
  std::uint64_t number = 0;  ///< 1 for the first attempt since start
  SyncKind kind = SyncKind::kFull;
  double wall = 0;  ///< when it ended (wall seconds)
  std::chrono::steady_clock::duration duration{};
  std::size_t operations = 0;           ///< kernel operations of the whole sync
  std::size_t changedServicePorts = 0;  ///< service ports it was asked to change
  std::string error;                    ///< empty when it succeeded
  bool verification = false;            ///< a self-verification (its operations: differences)
  std::string summary;                  ///< the backend's line for it
  /// In SyncLedger::failed only: when the port's change first failed, and how many attempts
  /// in a row have failed since.
  double failingSince = 0;
  std::uint32_t failedAttempts = 0;
};

/// Where the programming of each service port stands. A successful full sync reconciles every
/// port, so only the ports partial syncs touched since then are kept one by one: the ledger
/// stays small in steady state.
struct SyncLedger {
  std::optional<SyncRecord> last;             ///< the latest attempt
  std::optional<SyncRecord> lastFullSuccess;  ///< the latest successful full sync
  /// A full sync that failed after lastFullSuccess (the kernel kept the previous rules).
  std::optional<SyncRecord> lastFullFailure;
  /// Ports programmed by successful partial syncs since lastFullSuccess: their latest.
  std::map<ServicePortKey, SyncRecord> partial;
  /// Ports whose change failed to apply and has not been applied since: that attempt.
  std::map<ServicePortKey, SyncRecord> failed;
  /// The latest self-verification, and the latest one that found differences.
  std::optional<SyncRecord> lastVerification;
  std::optional<SyncRecord> lastMismatch;
  std::uint64_t verifications = 0;
  std::uint64_t mismatchedObjects = 0;  ///< over every verification since start

  /// The latest successful sync that programmed `key` (null before the first success).
  const SyncRecord* programmed(const ServicePortKey& key) const;
  /// The failed attempt to apply a change of `key`, when it is still not applied.
  const SyncRecord* failure(const ServicePortKey& key) const;
};

class Proxier final : public EventSink {
 public:
  Proxier(TrackerConfig tracker, Backend& backend, ProxierOptions options,
          Clock& clock = systemClock());
  ~Proxier() override;

  void serviceUpserted(Service service) override;
  void serviceDeleted(const std::string& ns, const std::string& name) override;
  void endpointSliceUpserted(EndpointSlice slice) override;
  void endpointSliceDeleted(const std::string& ns, const std::string& name) override;
  void nodeUpserted(Node node) override;
  void nodeDeleted(const std::string& name) override;
  void serviceCIDRUpserted(ServiceCIDR cidr) override;
  void serviceCIDRDeleted(const std::string& name) override;
  void sharedServiceUpserted(std::shared_ptr<const Service> service) override;
  void sharedEndpointSliceUpserted(std::shared_ptr<const EndpointSlice> slice) override;
  void servicesSynced() override;
  void endpointSlicesSynced() override;
  /// The node's interface addresses changed (the host reads them; see
  /// ChangeTracker::setInterfaceAddresses). Thread-safe.
  void interfaceAddressesChanged(std::vector<std::string> addresses);

  /// Called (on the sync thread) after each sync attempt.
  void setObserver(std::function<void(const SyncObservation&)> observer);
  ProxierStatus status() const;
  /// A copy of the sync ledger (small: see SyncLedger).
  SyncLedger syncLedger() const;

  /// Runs syncs until `stop` is requested (or after one sync with oneShot). Returns false when
  /// oneShot was set and that sync failed.
  bool run(std::stop_token stop);

  /// Runs at most one sync now if one is due (for tests with a ManualClock). Returns whether a
  /// sync ran.
  bool syncOnceIfDue();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::core
