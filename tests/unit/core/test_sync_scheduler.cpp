#include <catch2/catch.hpp>

#include "kproxy/core/clock.h"
#include "kproxy/core/sync_scheduler.h"

using namespace kproxy::core;
using namespace std::chrono_literals;

namespace {

SyncSchedulerOptions opts(std::chrono::steady_clock::duration min, std::chrono::steady_clock::duration max,
                          int burst) {
  SyncSchedulerOptions o;
  o.minInterval = min;
  o.maxInterval = max;
  o.burst = burst;
  return o;
}

}  // namespace

TEST_CASE("nothing runs without a request before maxInterval", "[unit][scheduler]") {
  ManualClock clock;
  SyncScheduler s(opts(1s, 30s, 2), clock.now());
  CHECK_FALSE(s.takeRun(clock.now()));
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 30s);
  clock.advance(29s);
  CHECK_FALSE(s.takeRun(clock.now()));
  clock.advance(1s);
  CHECK(s.takeRun(clock.now()));  // periodic run
  s.ran(clock.now());
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 30s);
}

TEST_CASE("requests run at once up to burst, then one per minInterval", "[unit][scheduler]") {
  ManualClock clock;
  SyncScheduler s(opts(1s, 30s, 2), clock.now());
  s.request(clock.now());
  CHECK(s.nextWakeup(clock.now()) == clock.now());
  CHECK(s.takeRun(clock.now()));
  CHECK_FALSE(s.takeRun(clock.now()));  // consumed; nothing pending
  s.ran(clock.now());
  s.request(clock.now());
  CHECK(s.takeRun(clock.now()));  // second burst token
  s.ran(clock.now());

  s.request(clock.now());
  CHECK_FALSE(s.takeRun(clock.now()));  // bucket empty
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 1s);
  clock.advance(500ms);
  CHECK_FALSE(s.takeRun(clock.now()));
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 500ms);
  clock.advance(500ms);
  CHECK(s.takeRun(clock.now()));  // the pending request survived the refusal
  s.ran(clock.now());
}

TEST_CASE("the bucket refills up to burst only", "[unit][scheduler]") {
  ManualClock clock;
  SyncScheduler s(opts(1s, 1h, 2), clock.now());
  for (int i = 0; i < 2; ++i) {
    s.request(clock.now());
    REQUIRE(s.takeRun(clock.now()));
  }
  clock.advance(10s);  // would be 10 tokens without the cap
  int runs = 0;
  for (int i = 0; i < 5; ++i) {
    s.request(clock.now());
    if (s.takeRun(clock.now())) ++runs;
  }
  CHECK(runs == 2);
}

TEST_CASE("retryAfter schedules a run no later than the delay", "[unit][scheduler]") {
  ManualClock clock;
  SyncScheduler s(opts(1s, 30s, 2), clock.now());
  s.retryAfter(clock.now(), 5s);
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 5s);
  clock.advance(4s);
  CHECK_FALSE(s.takeRun(clock.now()));
  // An earlier request keeps priority over the later retry.
  s.request(clock.now());
  CHECK(s.takeRun(clock.now()));
  s.ran(clock.now());
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 30s);

  // A later retry does not postpone an earlier one.
  s.retryAfter(clock.now(), 2s);
  s.retryAfter(clock.now(), 10s);
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 2s);
  clock.advance(2s);
  CHECK(s.takeRun(clock.now()));
}

TEST_CASE("the periodic timer restarts from the last run", "[unit][scheduler]") {
  ManualClock clock;
  SyncScheduler s(opts(1s, 10s, 2), clock.now());
  clock.advance(7s);
  s.request(clock.now());
  REQUIRE(s.takeRun(clock.now()));
  clock.advance(2s);  // the sync took 2 s
  s.ran(clock.now());
  CHECK(s.nextWakeup(clock.now()) == clock.now() + 10s);
  clock.advance(9s);
  CHECK_FALSE(s.takeRun(clock.now()));
  clock.advance(1s);
  CHECK(s.takeRun(clock.now()));
}

TEST_CASE("minInterval zero means no rate limit", "[unit][scheduler]") {
  ManualClock clock;
  SyncScheduler s(opts(0s, 30s, 1), clock.now());
  for (int i = 0; i < 10; ++i) {
    s.request(clock.now());
    CHECK(s.takeRun(clock.now()));
    s.ran(clock.now());
  }
}
