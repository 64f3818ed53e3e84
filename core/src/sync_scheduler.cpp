#include "kproxy/core/sync_scheduler.h"

#include <algorithm>

namespace kproxy::core {
namespace {

using Duration = std::chrono::steady_clock::duration;

}  // namespace

// The token bucket starts full (`burst` tokens) and gains one token per minInterval, like
// upstream's flowcontrol token bucket behind BoundedFrequencyRunner. A minInterval of zero
// means no rate limit at all.
SyncScheduler::SyncScheduler(SyncSchedulerOptions options, time_point now)
    : options_(options),
      tokens_(std::max(1, options.burst)),
      lastRefill_(now),
      lastRun_(now) {
  if (options_.maxInterval < options_.minInterval) options_.maxInterval = options_.minInterval;
  if (options_.burst < 1) options_.burst = 1;
}

void SyncScheduler::refill(time_point now) {
  if (options_.minInterval <= Duration::zero()) {
    tokens_ = options_.burst;
    lastRefill_ = now;
    return;
  }
  if (now <= lastRefill_) return;
  const double gained = std::chrono::duration<double>(now - lastRefill_).count() /
                        std::chrono::duration<double>(options_.minInterval).count();
  tokens_ = std::min<double>(options_.burst, tokens_ + gained);
  lastRefill_ = now;
}

void SyncScheduler::request(time_point now) {
  if (!pendingAt_ || now < *pendingAt_) pendingAt_ = now;
}

void SyncScheduler::retryAfter(time_point now, Duration delay) {
  const time_point at = now + std::max(delay, Duration::zero());
  if (!pendingAt_ || at < *pendingAt_) pendingAt_ = at;
}

bool SyncScheduler::takeRun(time_point now) {
  const bool requested = pendingAt_ && *pendingAt_ <= now;
  const bool periodic = now >= lastRun_ + options_.maxInterval;
  if (!requested && !periodic) return false;
  refill(now);
  // Small epsilon: floating point refill must not make a token due "almost" but never.
  if (tokens_ < 1.0 - 1e-9) return false;
  tokens_ = std::max(0.0, tokens_ - 1.0);
  pendingAt_.reset();
  // Until the caller reports completion via ran(), the periodic timer counts from now.
  lastRun_ = now;
  return true;
}

SyncScheduler::time_point SyncScheduler::nextWakeup(time_point now) const {
  // When would a token be available?
  time_point tokenAt = now;
  if (options_.minInterval > Duration::zero()) {
    double tokens = tokens_;
    if (now > lastRefill_) {
      tokens += std::chrono::duration<double>(now - lastRefill_).count() /
                std::chrono::duration<double>(options_.minInterval).count();
    }
    if (tokens < 1.0 - 1e-9) {
      const auto wait = std::chrono::duration<double>(options_.minInterval) * (1.0 - tokens);
      tokenAt = now + std::chrono::ceil<Duration>(wait);
    }
  }
  time_point wake = std::max(lastRun_ + options_.maxInterval, tokenAt);
  if (pendingAt_) wake = std::min(wake, std::max(*pendingAt_, tokenAt));
  return std::max(wake, now);
}

void SyncScheduler::ran(time_point now) { lastRun_ = now; }

}  // namespace kproxy::core
