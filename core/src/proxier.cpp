#include "kproxy/core/proxier.h"

#include <algorithm>
#include <condition_variable>
#include <iterator>
#include <mutex>

#include "kproxy/core/log.h"

namespace kproxy::core {
namespace {

using Duration = std::chrono::steady_clock::duration;

std::string formatDuration(Duration d) {
  const double ms = std::chrono::duration<double, std::milli>(d).count();
  char buf[32];
  if (ms >= 1000) {
    std::snprintf(buf, sizeof buf, "%.3fs", ms / 1000);
  } else {
    std::snprintf(buf, sizeof buf, "%.3fms", ms);
  }
  return buf;
}

const char* kindName(SyncKind kind) { return kind == SyncKind::kFull ? "full" : "partial"; }

}  // namespace

struct Proxier::Impl {
  Impl(TrackerConfig trackerConfig, Backend& b, ProxierOptions o, Clock& c)
      : tracker(std::move(trackerConfig)),
        backend(b),
        options(o),
        clock(c),
        scheduler(SyncSchedulerOptions{o.minSyncPeriod, std::max(o.syncPeriod, o.minSyncPeriod), 2},
                  c.now()),
        lastFullSync(c.now()) {
    nodeName = tracker.nodeName();
  }

  // Guards everything below except the backend, which only the sync thread touches.
  mutable std::mutex mutex;
  std::condition_variable_any wake;
  bool wakeRequested = false;

  ChangeTracker tracker;
  Backend& backend;
  ProxierOptions options;
  Clock& clock;
  SyncScheduler scheduler;

  bool servicesSynced = false;
  bool slicesSynced = false;
  bool syncing = false;  // a sync is in flight (syncOnceIfDue is not re-entrant)

  std::shared_ptr<const Snapshot> applied;  // last successfully applied
  // Changed since `applied`, sorted, each once. Only syncIfDue touches it (one at a time), so
  // the backend reads it in place while the lock is released.
  std::vector<ServicePortKey> unsyncedKeys;
  std::vector<TriggerTime> unsyncedTriggerTimes;  // of endpoint changes not yet in the kernel
  bool needFull = true;
  Clock::time_point lastFullSync;

  bool initialSyncDone = false;
  std::optional<double> lastSuccessWall;
  std::optional<double> oldestQueuedWall;
  std::optional<double> inFlightQueuedWall;  // oldest change of the sync in flight
  std::optional<double> lastQueuedWall;
  std::uint64_t serviceChangesTotal = 0;
  std::uint64_t endpointChangesTotal = 0;
  bool nodeDeleting = false;
  bool nodeSeen = false;
  std::string nodeName;  // the tracker's: empty accepts any Node
  std::optional<bool> lastOk;

  std::function<void(const SyncObservation&)> observer;
  std::uint64_t syncNumber = 0;
  SyncLedger ledger;
  std::optional<Clock::time_point> nextVerify;  // set by the first successful full sync
  // What a verification costs: the last one's duration (before the first, the full sync's).
  std::chrono::steady_clock::duration verifyCost{};

  // When the next verification is due after one (or a full sync) that ended at `end`: `delay`,
  // stretched to verifyCostFactor times what a verification costs.
  Clock::time_point verifyAfter(Clock::time_point end,
                                std::chrono::steady_clock::duration delay) const {
    return end + std::max(delay, verifyCost * options.verifyCostFactor);
  }

  void record(const SyncObservation& o, const std::vector<ServicePortKey>& changedKeys);
  bool verifyDue(Clock::time_point now) const {
    return options.verifyPeriod.count() > 0 && nextVerify && now >= *nextVerify && applied && !needFull &&
           !oldestQueuedWall && unsyncedKeys.empty();
  }
  bool verify(std::unique_lock<std::mutex>& lock, Clock::time_point start);

  // Call with `mutex` held after an event changed the tracker.
  void changed() {
    const double now = clock.wallSeconds();
    if (!oldestQueuedWall) oldestQueuedWall = now;
    lastQueuedWall = now;
    scheduler.request(clock.now());
    wakeRequested = true;
    wake.notify_all();
  }

  bool ready() const { return servicesSynced && slicesSynced; }

  // Adds a publish's changed keys (sorted) to unsyncedKeys. The common case, nothing left
  // from a failed sync, takes them over without a copy.
  void addUnsynced(std::vector<ServicePortKey> changed) {
    if (unsyncedKeys.empty()) {
      unsyncedKeys = std::move(changed);
      unsyncedKeys.erase(std::unique(unsyncedKeys.begin(), unsyncedKeys.end()), unsyncedKeys.end());
      return;
    }
    std::vector<ServicePortKey> merged;
    merged.reserve(unsyncedKeys.size() + changed.size());
    std::set_union(std::make_move_iterator(unsyncedKeys.begin()), std::make_move_iterator(unsyncedKeys.end()),
                   std::make_move_iterator(changed.begin()), std::make_move_iterator(changed.end()),
                   std::back_inserter(merged));
    unsyncedKeys = std::move(merged);
  }

  bool syncIfDue(std::unique_lock<std::mutex>& lock);
};

bool Proxier::Impl::syncIfDue(std::unique_lock<std::mutex>& lock) {
  if (!ready() || syncing) return false;
  const auto start = clock.now();
  if (verifyDue(start)) return verify(lock, start);
  if (!scheduler.takeRun(start)) return false;
  syncing = true;

  // Publishing happens under the lock but outside the backend call, so events keep flowing
  // while the kernel is programmed.
  PublishResult published = tracker.publish();
  addUnsynced(std::move(published.changed));
  unsyncedTriggerTimes.insert(unsyncedTriggerTimes.end(), published.triggerTimes.begin(),
                              published.triggerTimes.end());
  const std::optional<double> queuedAt = std::exchange(oldestQueuedWall, std::nullopt);
  inFlightQueuedWall = queuedAt;

  SyncKind kind = SyncKind::kPartial;
  if (needFull || !applied || start - lastFullSync >= options.fullSyncPeriod ||
      applied->node() != published.snapshot->node()) {
    kind = SyncKind::kFull;
  }
  std::shared_ptr<const Snapshot> previous = applied;
  std::shared_ptr<const Snapshot> next = published.snapshot;
  const std::vector<ServicePortKey>& changedKeys = unsyncedKeys;
  lock.unlock();

  SyncRequest request;
  request.previous = previous.get();
  request.next = next.get();
  request.changed = changedKeys;
  request.kind = kind;
  Result<SyncResult> result = backend.sync(request);

  const auto end = clock.now();
  SyncObservation observation;
  observation.kind = kind;
  observation.ok = result.has_value();
  observation.duration = end - start;
  observation.changedServicePorts = changedKeys.size();
  observation.serviceChanges = published.serviceChanges;
  observation.endpointChanges = published.endpointChanges;
  observation.wallTimestamp = clock.wallSeconds();
  if (result) {
    observation.operations = result->operations;
    observation.summary = result->summary;
  } else {
    observation.error = result.error();
  }

  if (result) {
    log::info(2, "Synced rules",
              {{"backend", std::string(backend.name())}, {"kind", kindName(kind)},
               {"generation", std::to_string(next->generation())},
               {"changed", std::to_string(changedKeys.size())},
               {"operations", std::to_string(result->operations)},
               {"duration", formatDuration(observation.duration)}, {"summary", result->summary}});
    if (observation.duration > std::chrono::seconds(1)) {
      log::info(0, "Slow sync", {{"backend", std::string(backend.name())}, {"kind", kindName(kind)},
                                 {"changed", std::to_string(changedKeys.size())},
                                 {"operations", std::to_string(result->operations)},
                                 {"duration", formatDuration(observation.duration)}});
    }
  } else {
    log::error("Sync failed; retrying with a full sync",
               {{"backend", std::string(backend.name())}, {"kind", kindName(kind)},
                {"changed", std::to_string(changedKeys.size())},
                {"duration", formatDuration(observation.duration)},
                {"error", result.error().message()},
                {"category", toString(result.error().category)},
                {"retryIn", formatDuration(options.retryInterval)}});
  }

  lock.lock();
  record(observation, changedKeys);
  syncing = false;
  inFlightQueuedWall.reset();
  initialSyncDone = true;
  lastOk = observation.ok;
  if (result) {
    applied = next;
    unsyncedKeys = {};  // a first sync's keys are every service port's: not kept as capacity
    observation.triggerTimes = std::exchange(unsyncedTriggerTimes, {});
    needFull = false;
    if (kind == SyncKind::kFull) {
      lastFullSync = start;
      // The cost of a verification until one has run: a full sync also reads the kernel back.
      if (ledger.verifications == 0) verifyCost = end - start;
      // A full sync that changed the kernel is checked soon: did the kernel keep it?
      nextVerify = verifyAfter(end, observation.operations > 0
                                        ? std::min(options.verifyAfterChange, options.verifyPeriod)
                                        : options.verifyPeriod);
    }
    lastSuccessWall = observation.wallTimestamp;
  } else {
    // The kernel still holds `applied`; the retry reconciles everything from there.
    needFull = true;
    scheduler.retryAfter(end, options.retryInterval);
    if (queuedAt && (!oldestQueuedWall || *queuedAt < *oldestQueuedWall)) oldestQueuedWall = queuedAt;
  }
  nodeDeleting = next->node().deleting;
  scheduler.ran(end);
  auto observe = observer;
  wakeRequested = true;  // let a run() loop waiting behind a concurrent syncOnceIfDue re-check
  wake.notify_all();
  lock.unlock();
  if (observe) observe(observation);
  lock.lock();
  return true;
}

// A full sync of the snapshot already applied: nothing changed since, so every operation the
// backend needs after reading the kernel back is a difference someone else made. The sync
// repairs them at once; they are logged, counted and kept in the ledger.
bool Proxier::Impl::verify(std::unique_lock<std::mutex>& lock, Clock::time_point start) {
  syncing = true;
  std::shared_ptr<const Snapshot> snapshot = applied;
  lock.unlock();

  SyncRequest request;
  request.previous = snapshot.get();
  request.next = snapshot.get();
  request.kind = SyncKind::kFull;
  Result<SyncResult> result = backend.sync(request);

  const auto end = clock.now();
  SyncObservation observation;
  observation.kind = SyncKind::kFull;
  observation.verification = true;
  observation.ok = result.has_value();
  observation.duration = end - start;
  observation.wallTimestamp = clock.wallSeconds();
  const std::string backendName(backend.name());
  if (result) {
    observation.operations = result->operations;
    observation.summary = result->summary;
    if (result->operations == 0) {
      log::info(2, "Verified the kernel against the plan",
                {{"backend", backendName}, {"generation", std::to_string(snapshot->generation())},
                 {"duration", formatDuration(observation.duration)}});
    } else {
      log::warning("The kernel differed from the plan; repaired",
                   {{"backend", backendName}, {"differences", std::to_string(result->operations)},
                    {"duration", formatDuration(observation.duration)}, {"summary", result->summary}});
    }
  } else {
    observation.error = result.error();
    log::error("Verification failed; retrying with a full sync",
               {{"backend", backendName}, {"error", result.error().message()},
                {"category", toString(result.error().category)},
                {"retryIn", formatDuration(options.retryInterval)}});
  }

  lock.lock();
  record(observation, {});
  syncing = false;
  lastOk = observation.ok;
  if (result) {
    lastFullSync = start;
    lastSuccessWall = observation.wallTimestamp;
    verifyCost = end - start;
    nextVerify = verifyAfter(end, options.verifyPeriod);
    if (*nextVerify - end > options.verifyPeriod) {
      log::info(1, "Verifications take long; the next waits longer than the verify period",
                {{"backend", backendName}, {"duration", formatDuration(observation.duration)},
                 {"next", formatDuration(*nextVerify - end)}});
    }
  } else {
    needFull = true;
    scheduler.retryAfter(end, options.retryInterval);
  }
  scheduler.ran(end);
  auto observe = observer;
  wakeRequested = true;
  wake.notify_all();
  lock.unlock();
  if (observe) observe(observation);
  lock.lock();
  return true;
}

void Proxier::Impl::record(const SyncObservation& o, const std::vector<ServicePortKey>& changedKeys) {
  SyncRecord r;
  r.number = ++syncNumber;
  r.kind = o.kind;
  r.wall = o.wallTimestamp;
  r.duration = o.duration;
  r.operations = o.operations;
  r.changedServicePorts = changedKeys.size();
  if (o.error) r.error = o.error->message();
  r.verification = o.verification;
  r.summary = o.summary;
  ledger.last = r;
  if (o.verification) {
    ++ledger.verifications;
    ledger.lastVerification = r;
    if (o.ok && o.operations > 0) {
      ledger.lastMismatch = r;
      ledger.mismatchedObjects += o.operations;
    }
  }
  if (o.ok && o.kind == SyncKind::kFull) {
    ledger.lastFullSuccess = r;
    ledger.lastFullFailure.reset();
    ledger.partial.clear();
    ledger.failed.clear();
  } else if (o.ok) {
    for (const auto& key : changedKeys) {
      ledger.partial[key] = r;
      ledger.failed.erase(key);
    }
  } else {
    if (o.kind == SyncKind::kFull) ledger.lastFullFailure = r;
    for (const auto& key : changedKeys) {
      auto it = ledger.failed.find(key);
      const double since = it != ledger.failed.end() ? it->second.failingSince : r.wall;
      const std::uint32_t attempts = it != ledger.failed.end() ? it->second.failedAttempts + 1 : 1;
      SyncRecord& f = ledger.failed[key];
      f = r;
      f.failingSince = since;
      f.failedAttempts = attempts;
    }
  }
}

const SyncRecord* SyncLedger::programmed(const ServicePortKey& key) const {
  if (auto it = partial.find(key); it != partial.end()) return &it->second;
  return lastFullSuccess ? &*lastFullSuccess : nullptr;
}

const SyncRecord* SyncLedger::failure(const ServicePortKey& key) const {
  auto it = failed.find(key);
  return it != failed.end() ? &it->second : nullptr;
}

Proxier::Proxier(TrackerConfig tracker, Backend& backend, ProxierOptions options, Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(tracker), backend, options, clock)) {}

Proxier::~Proxier() = default;

void Proxier::serviceUpserted(Service service) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.upsertService(std::move(service))) {
    ++impl_->serviceChangesTotal;
    impl_->changed();
  }
}

void Proxier::sharedServiceUpserted(std::shared_ptr<const Service> service) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.upsertService(std::move(service))) {
    ++impl_->serviceChangesTotal;
    impl_->changed();
  }
}

void Proxier::serviceDeleted(const std::string& ns, const std::string& name) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.deleteService(ns, name)) {
    ++impl_->serviceChangesTotal;
    impl_->changed();
  }
}

void Proxier::endpointSliceUpserted(EndpointSlice slice) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.upsertEndpointSlice(std::move(slice))) {
    ++impl_->endpointChangesTotal;
    impl_->changed();
  }
}

void Proxier::sharedEndpointSliceUpserted(std::shared_ptr<const EndpointSlice> slice) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.upsertEndpointSlice(std::move(slice))) {
    ++impl_->endpointChangesTotal;
    impl_->changed();
  }
}

void Proxier::endpointSliceDeleted(const std::string& ns, const std::string& name) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.deleteEndpointSlice(ns, name)) {
    ++impl_->endpointChangesTotal;
    impl_->changed();
  }
}

void Proxier::nodeUpserted(Node node) {
  std::lock_guard lock(impl_->mutex);
  const bool deleting = node.beingDeleted();
  if (impl_->nodeName.empty() || node.name == impl_->nodeName) impl_->nodeSeen = true;
  if (deleting && !impl_->nodeDeleting) {
    log::info(0, "Node is being deleted",
              {{"node", node.name}, {"reason", node.deleting ? "deletionTimestamp"
                                                              : kTaintToBeDeletedByClusterAutoscaler}});
  }
  if (impl_->tracker.upsertNode(std::move(node))) {
    impl_->nodeDeleting = deleting;
    impl_->changed();
  }
}

void Proxier::nodeDeleted(const std::string& name) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.deleteNode(name)) impl_->changed();
}

void Proxier::interfaceAddressesChanged(std::vector<std::string> addresses) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.setInterfaceAddresses(std::move(addresses))) impl_->changed();
}

// The CIDRs are table-wide objects of a backend: a partial sync whose snapshots differ in them
// re-renders them (no service port changes).
void Proxier::serviceCIDRUpserted(ServiceCIDR cidr) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.upsertServiceCIDR(std::move(cidr))) impl_->changed();
}

void Proxier::serviceCIDRDeleted(const std::string& name) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->tracker.deleteServiceCIDR(name)) impl_->changed();
}

void Proxier::servicesSynced() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->servicesSynced) return;
  impl_->servicesSynced = true;
  impl_->changed();
}

void Proxier::endpointSlicesSynced() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->slicesSynced) return;
  impl_->slicesSynced = true;
  impl_->changed();
}

void Proxier::setObserver(std::function<void(const SyncObservation&)> observer) {
  std::lock_guard lock(impl_->mutex);
  impl_->observer = std::move(observer);
}

ProxierStatus Proxier::status() const {
  std::lock_guard lock(impl_->mutex);
  ProxierStatus s;
  s.initialSyncDone = impl_->initialSyncDone;
  s.lastSuccessWall = impl_->lastSuccessWall;
  s.oldestQueuedWall = impl_->oldestQueuedWall;
  if (impl_->inFlightQueuedWall &&
      (!s.oldestQueuedWall || *impl_->inFlightQueuedWall < *s.oldestQueuedWall)) {
    s.oldestQueuedWall = impl_->inFlightQueuedWall;
  }
  s.lastQueuedWall = impl_->lastQueuedWall;
  s.applied = impl_->applied;
  s.nodeDeleting = impl_->nodeDeleting;
  s.nodeSeen = impl_->nodeSeen;
  s.pendingServiceChanges = impl_->tracker.pendingServiceChanges();
  s.pendingEndpointChanges = impl_->tracker.pendingEndpointChanges();
  s.serviceChangesTotal = impl_->serviceChangesTotal;
  s.endpointChangesTotal = impl_->endpointChangesTotal;
  return s;
}

SyncLedger Proxier::syncLedger() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->ledger;
}

bool Proxier::syncOnceIfDue() {
  std::unique_lock lock(impl_->mutex);
  return impl_->syncIfDue(lock);
}

bool Proxier::run(std::stop_token stop) {
  std::unique_lock lock(impl_->mutex);
  while (!stop.stop_requested()) {
    if (impl_->syncIfDue(lock)) {
      if (impl_->options.oneShot) return impl_->lastOk.value_or(false);
      continue;
    }
    impl_->wakeRequested = false;
    auto pred = [this] { return impl_->wakeRequested; };
    if (!impl_->ready() || impl_->syncing) {
      impl_->wake.wait(lock, stop, pred);
      continue;
    }
    // The scheduler speaks the injected clock's time; convert to a real deadline.
    const auto now = impl_->clock.now();
    auto delay = impl_->scheduler.nextWakeup(now) - now;
    if (impl_->options.verifyPeriod.count() > 0 && impl_->nextVerify) delay = std::min(delay, *impl_->nextVerify - now);
    impl_->wake.wait_until(lock, stop, std::chrono::steady_clock::now() + delay, pred);
  }
  return true;
}

}  // namespace kproxy::core
