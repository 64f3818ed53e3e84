// The status fields the metrics and health servers read from the Proxier.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <mutex>

#include "kproxy/core/proxier.h"
#include "ops_fixtures.h"

using namespace kproxy::core;
using namespace std::chrono_literals;

namespace {

class RecordingBackend final : public Backend {
 public:
  std::string_view name() const override { return "recording"; }
  Result<SyncResult> sync(const SyncRequest&) override {
    if (during) during();
    return SyncResult{1, "ok"};
  }
  Result<void> cleanup() override { return {}; }
  std::function<void()> during;
};

ProxierOptions options() {
  ProxierOptions o;
  o.minSyncPeriod = 1s;
  o.syncPeriod = 30s;
  return o;
}

}  // namespace

TEST_CASE("status counts changes, pending changes and the queue times", "[unit][proxier-status]") {
  ops_test::QuietLog quiet;
  ManualClock clock;
  RecordingBackend backend;
  TrackerConfig tracker;
  tracker.nodeName = "node-a";
  Proxier proxier(tracker, backend, options(), clock);

  const double t0 = clock.wallSeconds();
  proxier.serviceUpserted(ops_test::localLoadBalancer("web", 32000, "10.96.0.10"));
  clock.advance(2s);
  proxier.endpointSliceUpserted(ops_test::sliceFor("web", {{"10.244.1.1"}}));
  proxier.serviceUpserted(ops_test::localLoadBalancer("web", 32000, "10.96.0.10"));  // no-op

  auto s = proxier.status();
  CHECK(s.serviceChangesTotal == 1);
  CHECK(s.endpointChangesTotal == 1);
  CHECK(s.pendingServiceChanges == 1);
  CHECK(s.pendingEndpointChanges == 1);
  REQUIRE(s.oldestQueuedWall);
  CHECK(*s.oldestQueuedWall == t0);
  REQUIRE(s.lastQueuedWall);
  CHECK(*s.lastQueuedWall == t0 + 2);

  // While the backend works, the changes it applies still count as pending for health.
  std::optional<double> oldestDuringSync;
  backend.during = [&] { oldestDuringSync = proxier.status().oldestQueuedWall; };
  proxier.servicesSynced();
  proxier.endpointSlicesSynced();
  REQUIRE(proxier.syncOnceIfDue());
  REQUIRE(oldestDuringSync);
  CHECK(*oldestDuringSync == t0);

  s = proxier.status();
  CHECK_FALSE(s.oldestQueuedWall);
  CHECK(s.pendingServiceChanges == 0);
  CHECK(s.pendingEndpointChanges == 0);
  CHECK(s.serviceChangesTotal == 1);
  CHECK(s.lastQueuedWall);

  proxier.serviceDeleted("default", "web");
  proxier.endpointSliceDeleted("default", "web-1");
  s = proxier.status();
  CHECK(s.serviceChangesTotal == 2);
  CHECK(s.endpointChangesTotal == 2);
}
