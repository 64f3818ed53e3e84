#include <catch2/catch.hpp>

#include <deque>
#include <string>
#include <vector>

#include "kproxy/backends/common/reconciler.h"

using namespace kproxy;

namespace {

/// A backend whose passes do what the test queues and record what they were asked.
class ScriptedBackend final : public backends::Reconciler {
 public:
  ScriptedBackend() : Reconciler(sdk::Host(nullptr), backends::plainReconcilerOptions("scripted")) {}
  sdk::Expected<void> cleanup() override {
    requireFullSync();
    return {};
  }

  std::deque<sdk::Expected<backends::PassOutcome>> outcomes;
  bool changedOutside = false;
  std::vector<std::string> passes;  ///< "full" / "partial N" / "clean"

 protected:
  sdk::Expected<backends::PassOutcome> fullSync(const plan::SnapshotSource&) override {
    passes.push_back("full");
    return next();
  }
  sdk::Expected<backends::PassOutcome> partialSync(const plan::SnapshotSource&,
                                                   const std::vector<sdk::ChangedKey>& changed) override {
    passes.push_back("partial " + std::to_string(changed.size()));
    return next();
  }
  bool kernelChangedOutside(const std::vector<sdk::ChangedKey>&) override { return changedOutside; }
  void cleanAfterSync(const sdk::SyncContext&) override { passes.push_back("clean"); }

 private:
  sdk::Expected<backends::PassOutcome> next() {
    REQUIRE_FALSE(outcomes.empty());
    auto out = outcomes.front();
    outcomes.pop_front();
    return out;
  }
};

backends::PassOutcome ops(std::uint64_t n, std::string detail = {}) { return backends::PassOutcome{n, std::move(detail), false}; }

}  // namespace

TEST_CASE("reconciler: the first sync is full, then partial ones", "[unit]") {
  ScriptedBackend b;
  plan::VectorSnapshot snap;
  CHECK(b.needsFullSync());
  b.outcomes = {ops(10, "kernel_ms=1.0"), ops(2)};
  auto first = b.syncFrom(snap, {{net::Family::kIPv4, "a/b:c"}}, false);
  REQUIRE(first);
  CHECK(first->operations == 10);
  CHECK(first->summary.starts_with("scripted sync full=true ops=10 changed=1 ms="));
  CHECK(first->summary.ends_with(" kernel_ms=1.0"));
  auto second = b.syncFrom(snap, {{net::Family::kIPv4, "a/b:c"}}, false);
  REQUIRE(second);
  CHECK(second->summary.starts_with("scripted sync full=false ops=2 changed=1 ms="));
  CHECK(b.passes == std::vector<std::string>{"full", "partial 1"});
}

TEST_CASE("reconciler: a failed pass makes the next sync full", "[unit]") {
  ScriptedBackend b;
  plan::VectorSnapshot snap;
  b.outcomes = {ops(1), sdk::fail("the kernel refused"), ops(3), ops(0)};
  REQUIRE(b.syncFrom(snap, {}, true));
  auto failed = b.syncFrom(snap, {{net::Family::kIPv4, "k"}}, false);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().message == "the kernel refused");
  CHECK(b.needsFullSync());
  REQUIRE(b.syncFrom(snap, {{net::Family::kIPv4, "k"}}, false));
  REQUIRE(b.syncFrom(snap, {}, false));
  CHECK(b.passes == std::vector<std::string>{"full", "partial 1", "full", "partial 0"});
}

TEST_CASE("reconciler: a pass that says the kernel may differ, a change outside and cleanup make it full",
          "[unit]") {
  ScriptedBackend b;
  plan::VectorSnapshot snap;
  backends::PassOutcome doubtful = ops(1);
  doubtful.fullNext = true;
  b.outcomes = {doubtful, ops(0), ops(0), ops(0), ops(0)};
  REQUIRE(b.syncFrom(snap, {}, true));
  CHECK(b.needsFullSync());
  REQUIRE(b.syncFrom(snap, {}, false));  // full: the last pass asked for it
  b.changedOutside = true;
  REQUIRE(b.syncFrom(snap, {}, false));  // full: the kernel changed outside
  b.changedOutside = false;
  REQUIRE(b.cleanup());
  REQUIRE(b.syncFrom(snap, {}, false));  // full: after cleanup
  REQUIRE(b.syncFrom(snap, {}, false));
  CHECK(b.passes == std::vector<std::string>{"full", "full", "full", "full", "partial 0"});
}

TEST_CASE("reconciler: the backend's own cleanup follows each successful sync of the host, not a failed one",
          "[unit]") {
  ScriptedBackend b;
  b.outcomes = {ops(1), sdk::fail("the kernel refused"), ops(0)};
  REQUIRE(b.sync(sdk::SyncContext{{}, {}, {}, true}));
  REQUIRE_FALSE(b.sync(sdk::SyncContext{{}, {}, {{net::Family::kIPv4, "k"}}, false}));
  REQUIRE(b.sync(sdk::SyncContext{{}, {}, {{net::Family::kIPv4, "k"}}, false}));
  CHECK(b.passes == std::vector<std::string>{"full", "clean", "partial 1", "full", "clean"});
}
