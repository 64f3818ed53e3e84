#pragma once
/// A cumulative Prometheus histogram with fixed upper bounds, shared by the host's own metrics
/// (cli/metrics.h) and the histograms backend plugins register (plugins/plugin_metrics.h).
/// Thread-safety: a value; its owner serialises access.

#include <cstdint>
#include <vector>

namespace kproxy::core {

struct Histogram {
  std::vector<double> bounds;         ///< ascending; +Inf is implicit
  std::vector<std::uint64_t> counts;  ///< per bound, non-cumulative; size() == bounds.size()
  double sum = 0;
  std::uint64_t count = 0;

  explicit Histogram(std::vector<double> upperBounds);
  /// Counts `value` in the first bucket whose bound is >= value (Prometheus' "le").
  void observe(double value);
  /// start, start*factor, … (count bounds), like prometheus.ExponentialBuckets.
  static Histogram exponential(double start, double factor, int count);
  /// Whether `bounds` are usable as upper bounds: finite and strictly ascending.
  static bool validBounds(const std::vector<double>& bounds);
};

}  // namespace kproxy::core
