#pragma once
/// Injected time, so schedulers and health logic are testable without sleeping.

#include <chrono>

namespace kproxy::core {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
  /// Wall-clock seconds since the epoch (for *_timestamp_seconds metrics).
  virtual double wallSeconds() const = 0;
};

/// The process-wide real clock.
Clock& systemClock();

/// A clock that only moves when told to. Not thread-safe.
class ManualClock final : public Clock {
 public:
  time_point now() const override { return now_; }
  double wallSeconds() const override {
    return std::chrono::duration<double>(now_.time_since_epoch()).count();
  }
  void advance(std::chrono::steady_clock::duration d) { now_ += d; }

 private:
  time_point now_{std::chrono::hours(1)};
};

}  // namespace kproxy::core
