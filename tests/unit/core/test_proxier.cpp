#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kproxy/core/log.h"
#include "kproxy/core/proxier.h"

namespace net = kproxy::net;

using namespace kproxy::core;
using namespace std::chrono_literals;

namespace {

// An in-memory backend that records every request and can be told to fail.
class FakeBackend final : public Backend {
 public:
  struct Call {
    SyncKind kind;
    std::uint64_t previousGeneration;  // 0 when there was no previous snapshot
    std::uint64_t nextGeneration;
    std::vector<ServicePortKey> changed;
    std::size_t nextSize;
    std::size_t nextServiceCIDRs;
  };

  std::string_view name() const override { return "fake"; }

  Result<SyncResult> sync(const SyncRequest& request) override {
    std::lock_guard lock(mutex);
    calls.push_back({request.kind, request.previous ? request.previous->generation() : 0,
                     request.next->generation(),
                     std::vector<ServicePortKey>(request.changed.begin(), request.changed.end()),
                     request.next->size(), request.next->serviceCIDRs().size()});
    called.notify_all();
    if (clock) clock->advance(takes);
    if (failNext > 0) {
      --failNext;
      return makeError(failCategory, "netlink batch rejected", 22);
    }
    return SyncResult{request.changed.size(), "rules+=" + std::to_string(request.changed.size())};
  }
  Result<void> cleanup() override { return {}; }

  std::mutex mutex;
  std::condition_variable called;
  std::vector<Call> calls;
  int failNext = 0;
  ErrorCategory failCategory = ErrorCategory::kKernel;
  ManualClock* clock = nullptr;  ///< when set, each sync takes `takes` on it
  std::chrono::steady_clock::duration takes{};
};

struct QuietLog {
  QuietLog() : previous(kproxy::log::setSink([](kproxy::log::Severity, std::string_view) {})) {}
  ~QuietLog() { kproxy::log::setSink(previous); }
  kproxy::log::Sink previous;
};

Service service(const std::string& name) {
  Service s;
  s.ns = "default";
  s.name = name;
  s.clusterIPs = {"10.96.0.1"};
  ServicePortSpec p;
  p.name = "http";
  p.port = 80;
  s.ports = {p};
  return s;
}

EndpointSlice slice(const std::string& svc, std::vector<std::string> ips) {
  EndpointSlice s;
  s.ns = "default";
  s.name = svc + "-1";
  s.serviceName = svc;
  EndpointPort p;
  p.name = "http";
  p.port = 8080;
  s.ports = {p};
  for (auto& ip : ips) {
    SliceEndpoint e;
    e.addresses = {ip};
    s.endpoints.push_back(e);
  }
  return s;
}

ServicePortKey key(const std::string& svc) { return {net::Family::kIPv4, "default/" + svc + ":http"}; }

ProxierOptions options() {
  ProxierOptions o;
  o.minSyncPeriod = 1s;
  o.syncPeriod = 30s;
  o.retryInterval = 2s;
  o.verifyPeriod = 0s;  // the self-verification tests turn it on
  return o;
}

// The self-verification tests' options: verified 5 s after a full sync that changed the kernel,
// then every 60 s; no periodic partial sync in the way.
ProxierOptions verifyingOptions() {
  ProxierOptions o = options();
  o.verifyPeriod = 60s;
  o.verifyAfterChange = 5s;
  o.syncPeriod = 1h;
  return o;
}

// One Service, both informers synced: the next sync is the first, full one.
void readyWithOneService(Proxier& proxier) {
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
}

}  // namespace

TEST_CASE("no sync until services and slices are both synced; the first is full", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);

  proxier.serviceUpserted(service("a"));
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  CHECK_FALSE(proxier.syncOnceIfDue());
  proxier.servicesSynced();
  CHECK_FALSE(proxier.syncOnceIfDue());
  clock.advance(60s);  // not even the periodic sync runs
  CHECK_FALSE(proxier.syncOnceIfDue());
  CHECK_FALSE(proxier.status().initialSyncDone);

  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(backend.calls.size() == 1);
  CHECK(backend.calls[0].kind == SyncKind::kFull);
  CHECK(backend.calls[0].previousGeneration == 0);
  CHECK(backend.calls[0].nextSize == 1);
  CHECK(backend.calls[0].changed == std::vector<ServicePortKey>{key("a")});
  auto status = proxier.status();
  CHECK(status.initialSyncDone);
  CHECK(status.lastSuccessWall.has_value());
  CHECK_FALSE(status.oldestQueuedWall.has_value());
  REQUIRE(status.applied);
  CHECK(status.applied->generation() == backend.calls[0].nextGeneration);

  // Nothing changed: nothing to do.
  CHECK_FALSE(proxier.syncOnceIfDue());
}

TEST_CASE("later changes sync partially with exactly the changed keys", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  std::vector<SyncObservation> observed;
  proxier.setObserver([&](const SyncObservation& o) { observed.push_back(o); });
  proxier.serviceUpserted(service("a"));
  proxier.serviceUpserted(service("b"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());

  proxier.endpointSliceUpserted(slice("b", {"10.0.0.2"}));
  CHECK(proxier.status().oldestQueuedWall.has_value());
  // A no-op event does not ask for a sync.
  proxier.serviceUpserted(service("a"));
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(backend.calls.size() == 2);
  CHECK(backend.calls[1].kind == SyncKind::kPartial);
  CHECK(backend.calls[1].previousGeneration == backend.calls[0].nextGeneration);
  CHECK(backend.calls[1].changed == std::vector<ServicePortKey>{key("b")});

  REQUIRE(observed.size() == 2);
  CHECK(observed[1].ok);
  CHECK(observed[1].kind == SyncKind::kPartial);
  CHECK(observed[1].changedServicePorts == 1);
  CHECK(observed[1].endpointChanges == 1);
  CHECK(observed[1].serviceChanges == 0);
  CHECK(observed[1].operations == 1);
  CHECK(observed[1].summary == "rules+=1");

  // Burst used up: the next change waits for minSyncPeriod.
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.3"}));
  CHECK_FALSE(proxier.syncOnceIfDue());
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().changed == std::vector<ServicePortKey>{key("a")});
}

TEST_CASE("a failed sync is retried as a full sync from the last applied snapshot", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  std::vector<SyncObservation> observed;
  proxier.setObserver([&](const SyncObservation& o) { observed.push_back(o); });
  proxier.serviceUpserted(service("a"));
  proxier.serviceUpserted(service("b"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  const auto appliedGeneration = backend.calls[0].nextGeneration;

  backend.failNext = 1;
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(observed.size() == 2);
  CHECK_FALSE(observed[1].ok);
  REQUIRE(observed[1].error.has_value());
  CHECK(observed[1].error->category == ErrorCategory::kKernel);
  CHECK(proxier.status().applied->generation() == appliedGeneration);
  CHECK(proxier.status().oldestQueuedWall.has_value());

  // Another change arrives before the retry; the retry carries both.
  proxier.endpointSliceUpserted(slice("b", {"10.0.0.2"}));
  CHECK_FALSE(proxier.syncOnceIfDue());  // retry not due yet, tokens spent
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());
  const auto& retry = backend.calls.back();
  CHECK(retry.kind == SyncKind::kFull);
  CHECK(retry.previousGeneration == appliedGeneration);
  CHECK(retry.changed == std::vector<ServicePortKey>{key("a"), key("b")});
  CHECK(observed.back().ok);
  CHECK_FALSE(proxier.status().oldestQueuedWall.has_value());

  // And back to partial afterwards.
  clock.advance(1s);
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.9"}));
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kPartial);
}

TEST_CASE("a failed sync of any category is logged with it and retried as a full sync",
          "[unit][proxier]") {
  const ErrorCategory category =
      GENERATE(ErrorCategory::kTransient, ErrorCategory::kInvalidArgument, ErrorCategory::kPlugin);
  std::vector<std::string> lines;
  auto previous = kproxy::log::setSink(
      [&lines](kproxy::log::Severity, std::string_view line) { lines.emplace_back(line); });
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  backend.failNext = 1;
  backend.failCategory = category;
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  REQUIRE(proxier.syncOnceIfDue());
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());
  kproxy::log::setSink(previous);
  CHECK(backend.calls.back().kind == SyncKind::kFull);
  CHECK(proxier.status().lastSuccessWall.has_value());
  const std::string expected = std::string("category=\"") + toString(category) + "\"";
  CHECK(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find("Sync failed") != std::string::npos && l.find(expected) != std::string::npos;
  }));
}

TEST_CASE("a failure with no change pending is still retried", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  backend.failNext = 1;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  CHECK_FALSE(proxier.status().applied);
  CHECK(proxier.status().initialSyncDone);
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kFull);
  CHECK(backend.calls.back().previousGeneration == 0);
  CHECK(proxier.status().applied);
}

TEST_CASE("the syncPeriod tick is partial; a full sync comes every fullSyncPeriod", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  ProxierOptions o = options();
  o.fullSyncPeriod = 90s;
  Proxier proxier(TrackerConfig{}, backend, o, clock);
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kFull);
  clock.advance(29s);
  CHECK_FALSE(proxier.syncOnceIfDue());
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kPartial);
  CHECK(backend.calls.back().changed.empty());
  clock.advance(30s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kPartial);
  clock.advance(30s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kFull);
  CHECK(backend.calls.size() == 4);
}

TEST_CASE("a node change forces a full sync", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  TrackerConfig config;
  config.nodeName = "node-a";
  Proxier proxier(config, backend, options(), clock);
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  Node node;
  node.name = "node-a";
  node.addresses = {{"InternalIP", "192.168.1.5"}};
  node.deleting = true;
  proxier.nodeUpserted(node);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kFull);
  CHECK(proxier.status().nodeDeleting);
}

TEST_CASE("the cluster autoscaler's taint reports the node as being deleted", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  TrackerConfig config;
  config.nodeName = "node-a";
  Proxier proxier(config, backend, options(), clock);
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  Node node;
  node.name = "node-a";
  node.taints = {{"node.kubernetes.io/unschedulable", "", "NoSchedule"}};
  Node other = node;
  other.name = "node-b";
  proxier.nodeUpserted(other);
  CHECK_FALSE(proxier.status().nodeSeen);  // another node's object
  proxier.nodeUpserted(node);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK_FALSE(proxier.status().nodeDeleting);  // cordoned is not being deleted
  CHECK(proxier.status().nodeSeen);
  node.taints.push_back({std::string(kTaintToBeDeletedByClusterAutoscaler), "1718000000", "NoSchedule"});
  proxier.nodeUpserted(node);
  CHECK(proxier.status().nodeDeleting);  // known at once, before the sync
  clock.advance(std::chrono::seconds(2));
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(proxier.status().nodeDeleting);
  node.taints.pop_back();  // the autoscaler changed its mind
  proxier.nodeUpserted(node);
  clock.advance(std::chrono::seconds(2));
  REQUIRE(proxier.syncOnceIfDue());
  CHECK_FALSE(proxier.status().nodeDeleting);
}

TEST_CASE("oneShot: run() returns after the first sync with its outcome", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  auto opts = options();
  opts.oneShot = true;
  SECTION("success") {
    FakeBackend backend;
    Proxier proxier(TrackerConfig{}, backend, opts, clock);
    proxier.serviceUpserted(service("a"));
    proxier.servicesSynced();
    proxier.endpointSlicesSynced();
    std::stop_source stop;
    CHECK(proxier.run(stop.get_token()));
    CHECK(backend.calls.size() == 1);
  }
  SECTION("failure") {
    FakeBackend backend;
    backend.failNext = 1;
    Proxier proxier(TrackerConfig{}, backend, opts, clock);
    proxier.servicesSynced();
    proxier.endpointSlicesSynced();
    std::stop_source stop;
    CHECK_FALSE(proxier.run(stop.get_token()));
  }
}

TEST_CASE("run() on its own thread syncs on events and stops on request", "[unit][proxier]") {
  QuietLog quiet;
  FakeBackend backend;
  auto opts = options();
  opts.minSyncPeriod = 0s;
  Proxier proxier(TrackerConfig{}, backend, opts);  // real clock
  std::jthread loop([&](std::stop_token stop) { proxier.run(stop); });

  auto waitCalls = [&](std::size_t n) {
    std::unique_lock lock(backend.mutex);
    return backend.called.wait_for(lock, 60s, [&] { return backend.calls.size() >= n; });
  };
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(waitCalls(1));
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  REQUIRE(waitCalls(2));
  {
    std::lock_guard lock(backend.mutex);
    CHECK(backend.calls[1].changed == std::vector<ServicePortKey>{key("a")});
  }
  loop.request_stop();
  loop.join();
}

TEST_CASE("trigger times are reported once, by the sync that programmed them", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  std::vector<SyncObservation> observed;
  proxier.setObserver([&](const SyncObservation& o) { observed.push_back(o); });
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());

  backend.failNext = 1;
  auto s = slice("a", {"10.0.0.1"});
  s.lastChangeTriggerTime = 500.0;
  proxier.endpointSliceUpserted(s);
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(observed.size() == 2);
  CHECK_FALSE(observed[1].ok);
  CHECK(observed[1].triggerTimes.empty());  // not in the kernel yet
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(observed.size() == 3);
  CHECK(observed[2].ok);
  CHECK(observed[2].triggerTimes == std::vector<TriggerTime>{{500.0, net::Family::kIPv4}});
  clock.advance(31s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(observed.back().triggerTimes.empty());
}

TEST_CASE("a ServiceCIDR change syncs partially with no changed keys", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());

  proxier.serviceCIDRUpserted(ServiceCIDR{"kubernetes", "1", {"10.96.0.0/12"}});
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(backend.calls.size() == 2);
  CHECK(backend.calls[1].kind == SyncKind::kPartial);
  CHECK(backend.calls[1].changed.empty());
  CHECK(backend.calls[1].nextServiceCIDRs == 1);
  CHECK(proxier.status().applied->serviceCIDRs() ==
        std::vector<ServiceCIDRRange>{{"kubernetes", "10.96.0.0/12"}});

  // The same object again (a resync): nothing to do. Deleted: another sync.
  proxier.serviceCIDRUpserted(ServiceCIDR{"kubernetes", "2", {"10.96.0.0/12"}});
  clock.advance(1s);
  CHECK_FALSE(proxier.syncOnceIfDue());
  proxier.serviceCIDRDeleted("kubernetes");
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().nextServiceCIDRs == 0);
}

TEST_CASE("the sync ledger names the sync that last programmed each port, and failed changes",
          "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  CHECK_FALSE(proxier.syncLedger().last.has_value());
  CHECK(proxier.syncLedger().programmed(key("a")) == nullptr);

  proxier.serviceUpserted(service("a"));
  proxier.serviceUpserted(service("b"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  SyncLedger l = proxier.syncLedger();
  REQUIRE(l.lastFullSuccess.has_value());
  CHECK(l.lastFullSuccess->number == 1);
  CHECK(l.lastFullSuccess->operations == 2);  // the fake counts one per changed port
  CHECK(l.lastFullSuccess->changedServicePorts == 2);
  CHECK(l.lastFullSuccess->error.empty());
  REQUIRE(l.programmed(key("a")) != nullptr);
  CHECK(l.programmed(key("a"))->number == 1);
  CHECK(l.partial.empty());

  // A partial sync programs b only.
  clock.advance(1s);
  proxier.endpointSliceUpserted(slice("b", {"10.0.0.2"}));
  REQUIRE(proxier.syncOnceIfDue());
  l = proxier.syncLedger();
  CHECK(l.last->number == 2);
  CHECK(l.last->kind == SyncKind::kPartial);
  CHECK(l.programmed(key("b"))->number == 2);
  CHECK(l.programmed(key("a"))->number == 1);

  // A failed change of a: recorded against a, with the error; b keeps its programming.
  clock.advance(1s);
  backend.failNext = 1;
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  REQUIRE(proxier.syncOnceIfDue());
  l = proxier.syncLedger();
  REQUIRE(l.failure(key("a")) != nullptr);
  CHECK(l.failure(key("a"))->number == 3);
  CHECK(l.failure(key("a"))->error.find("netlink batch rejected") != std::string::npos);
  CHECK(l.failure(key("b")) == nullptr);
  CHECK(l.programmed(key("a"))->number == 1);
  CHECK(l.last->number == 3);
  CHECK_FALSE(l.lastFullFailure.has_value());  // a partial one failed

  // The retry is a full sync and fails too: recorded as a failed full sync.
  clock.advance(2s);
  backend.failNext = 1;
  REQUIRE(proxier.syncOnceIfDue());
  l = proxier.syncLedger();
  REQUIRE(l.lastFullFailure.has_value());
  CHECK(l.lastFullFailure->number == 4);
  CHECK(l.failure(key("a"))->number == 4);

  // The next retry succeeds: every port is programmed by it, nothing is failed any more.
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());
  l = proxier.syncLedger();
  CHECK(l.lastFullSuccess->number == 5);
  CHECK_FALSE(l.lastFullFailure.has_value());
  CHECK(l.failed.empty());
  CHECK(l.partial.empty());
  CHECK(l.programmed(key("a"))->number == 5);
  CHECK(l.programmed(key("b"))->number == 5);
}

TEST_CASE("self-verification: a full sync of the applied snapshot when nothing is pending", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, verifyingOptions(), clock);
  std::vector<SyncObservation> observed;
  proxier.setObserver([&](const SyncObservation& ob) { observed.push_back(ob); });
  readyWithOneService(proxier);
  REQUIRE(proxier.syncOnceIfDue());  // the first full sync changed the kernel (1 op)
  const auto applied = proxier.status().applied->generation();

  clock.advance(4s);
  CHECK_FALSE(proxier.syncOnceIfDue());  // not yet
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());  // verifyAfterChange after a full sync that changed things
  REQUIRE(backend.calls.size() == 2);
  CHECK(backend.calls[1].kind == SyncKind::kFull);
  CHECK(backend.calls[1].changed.empty());
  CHECK(backend.calls[1].previousGeneration == applied);
  CHECK(backend.calls[1].nextGeneration == applied);  // the same snapshot, not a new one
  REQUIRE(observed.size() == 2);
  CHECK(observed[1].verification);
  CHECK(observed[1].operations == 0);  // the fake counts changed ports: a clean kernel
  SyncLedger l = proxier.syncLedger();
  CHECK(l.verifications == 1);
  CHECK(l.mismatchedObjects == 0);
  CHECK_FALSE(l.lastMismatch.has_value());

  // Then every verifyPeriod; a pending change comes first and postpones it.
  clock.advance(59s);
  CHECK_FALSE(proxier.syncOnceIfDue());
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kPartial);
  CHECK_FALSE(observed.back().verification);
  REQUIRE(proxier.syncOnceIfDue());  // now the verification, the change being applied
  CHECK(observed.back().verification);

  // A failed verification is retried as a full sync.
  clock.advance(60s);
  backend.failNext = 1;
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(observed.back().verification);
  CHECK_FALSE(observed.back().ok);
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(backend.calls.back().kind == SyncKind::kFull);
  CHECK_FALSE(observed.back().verification);
  CHECK(observed.back().ok);
}

TEST_CASE("self-verification: at most 1% of the time when verifications take long", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  backend.clock = &clock;
  backend.takes = 2s;  // every sync, full or not
  Proxier proxier(TrackerConfig{}, backend, verifyingOptions(), clock);
  std::vector<SyncObservation> observed;
  proxier.setObserver([&](const SyncObservation& ob) { observed.push_back(ob); });
  readyWithOneService(proxier);
  REQUIRE(proxier.syncOnceIfDue());  // the first full sync: 2 s, changed the kernel

  // Not 5 s after it but 100 x 2 s: until a verification has run, a full sync is its cost.
  clock.advance(199s);
  CHECK_FALSE(proxier.syncOnceIfDue());
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(observed.size() == 2);
  CHECK(observed[1].verification);

  // The next one 100 x its 2 s later, not after verifyPeriod (60 s).
  clock.advance(199s);
  CHECK_FALSE(proxier.syncOnceIfDue());
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(observed.back().verification);
  CHECK(observed.size() == 3);

  // Cheap ones go back to the period.
  backend.takes = 100ms;
  clock.advance(200s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(observed.size() == 4);
  clock.advance(59s);
  CHECK_FALSE(proxier.syncOnceIfDue());
  clock.advance(1s);
  REQUIRE(proxier.syncOnceIfDue());
  CHECK(observed.size() == 5);
  CHECK(observed.back().verification);
}

TEST_CASE("self-verification is off with verifyPeriod 0", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  ProxierOptions o = options();
  o.verifyPeriod = 0s;
  Proxier proxier(TrackerConfig{}, backend, o, clock);
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  clock.advance(10min);
  proxier.syncOnceIfDue();  // the periodic partial sync, if any
  for (const auto& c : backend.calls) CHECK((c.kind == SyncKind::kPartial || c.changed.size() == 1));
  CHECK(proxier.syncLedger().verifications == 0);
}

TEST_CASE("the ledger counts a port's failed attempts in a row and when they started", "[unit][proxier]") {
  QuietLog quiet;
  ManualClock clock;
  FakeBackend backend;
  Proxier proxier(TrackerConfig{}, backend, options(), clock);
  proxier.serviceUpserted(service("a"));
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  clock.advance(1s);
  backend.failNext = 3;
  proxier.endpointSliceUpserted(slice("a", {"10.0.0.1"}));
  REQUIRE(proxier.syncOnceIfDue());
  const double first = proxier.syncLedger().failure(key("a"))->failingSince;
  for (int i = 0; i < 2; ++i) {
    clock.advance(2s);
    REQUIRE(proxier.syncOnceIfDue());
  }
  SyncLedger l = proxier.syncLedger();
  REQUIRE(l.failure(key("a")) != nullptr);
  CHECK(l.failure(key("a"))->failedAttempts == 3);
  CHECK(l.failure(key("a"))->failingSince == first);
  CHECK(l.failure(key("a"))->wall > first);
  clock.advance(2s);
  REQUIRE(proxier.syncOnceIfDue());  // the fourth attempt succeeds
  CHECK(proxier.syncLedger().failure(key("a")) == nullptr);
}
