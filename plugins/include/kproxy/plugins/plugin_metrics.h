#pragma once
/// Host side of plugin metrics (ABI 1.2; histograms 1.4): the counters, gauges and histograms
/// plugins register through kproxy_host_api.metric_register and update by handle. The HTTP
/// server renders collect() on /metrics.
///
/// Thread-safe: plugins update from their sync thread (or any other), the metrics server reads
/// from its own; one mutex serialises both.

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/core/histogram.h"

namespace kproxy::plugins {

enum class MetricType { kCounter, kGauge, kHistogram };

/// One metric with its current samples, for rendering.
struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<std::string> labelNames;
  /// Counters and gauges: label values (one per label name) → value, sorted by the values.
  std::map<std::vector<std::string>, double> samples;
  /// Histograms: the buckets' upper bounds, and label values → observations.
  std::vector<double> buckets;
  std::map<std::vector<std::string>, core::Histogram> histograms;
};

class PluginMetrics {
 public:
  /// Metric name prefixes the host serves itself; a plugin metric starting with one is refused.
  void reservePrefixes(std::vector<std::string> prefixes);

  /// Registers a metric and returns its handle (never 0). The same name with the same type,
  /// help, label names (and buckets) returns the same handle. Errors (kInvalidArgument,
  /// EINVAL) name the metric: a name or label name against Prometheus' rules, a reserved
  /// prefix, a name already registered differently, a duplicate label name, a histogram's
  /// bounds not finite and ascending, or a label named "le" on a histogram.
  core::Result<std::uint64_t> registerMetric(MetricType type, const std::string& name,
                                             const std::string& help,
                                             const std::vector<std::string>& labelNames,
                                             const std::vector<double>& buckets = {});
  /// Counter: adds delta >= 0; gauge: adds any delta.
  core::Result<void> add(std::uint64_t handle, std::span<const std::string> labelValues,
                         double delta);
  /// Gauge only.
  core::Result<void> set(std::uint64_t handle, std::span<const std::string> labelValues,
                         double value);
  /// Histogram only.
  core::Result<void> observe(std::uint64_t handle, std::span<const std::string> labelValues,
                             double value);

  /// Every registered metric, sorted by name.
  std::vector<MetricFamily> collect() const;

  /// Prometheus' rules: metric names [a-zA-Z_:][a-zA-Z0-9_:]*, label names
  /// [a-zA-Z_][a-zA-Z0-9_]*; neither may start with "__" (reserved for internal use).
  static bool validMetricName(std::string_view name);
  static bool validLabelName(std::string_view name);

 private:
  core::Result<MetricFamily*> family(std::uint64_t handle, std::size_t values);
  mutable std::mutex mutex_;
  std::vector<std::string> reserved_;
  std::vector<MetricFamily> families_;  ///< handle = index + 1
};

}  // namespace kproxy::plugins
