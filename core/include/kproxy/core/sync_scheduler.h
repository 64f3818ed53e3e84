#pragma once
/// When to sync, with the semantics of kube-proxy's BoundedFrequencyRunner: a requested sync
/// runs as soon as the token bucket allows (at most `burst` runs back to back, then one per
/// `minInterval`), a sync runs at least every `maxInterval`, and a failed sync is retried
/// after `retryInterval`. Pure logic driven by the caller's clock; not thread-safe.

#include <chrono>
#include <optional>

#include "kproxy/core/clock.h"

namespace kproxy::core {

struct SyncSchedulerOptions {
  std::chrono::steady_clock::duration minInterval = std::chrono::seconds(1);
  std::chrono::steady_clock::duration maxInterval = std::chrono::seconds(30);
  int burst = 2;
};

class SyncScheduler {
 public:
  using time_point = Clock::time_point;
  SyncScheduler(SyncSchedulerOptions options, time_point now);

  /// Asks for a sync as soon as allowed.
  void request(time_point now);
  /// Asks for a sync no later than now + delay (keeps an earlier pending request).
  void retryAfter(time_point now, std::chrono::steady_clock::duration delay);
  /// True when a sync should start now; consumes a token.
  bool takeRun(time_point now);
  /// When the caller should next call takeRun (the earliest of a due request, a retry and the
  /// periodic run).
  time_point nextWakeup(time_point now) const;
  /// The periodic timer restarts from the last run.
  void ran(time_point now);

 private:
  void refill(time_point now);
  SyncSchedulerOptions options_;
  double tokens_;
  time_point lastRefill_;
  time_point lastRun_;
  std::optional<time_point> pendingAt_;
};

}  // namespace kproxy::core
