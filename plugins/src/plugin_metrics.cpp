#include "kproxy/plugins/plugin_metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>

namespace kproxy::plugins {
namespace {

using core::ErrorCategory;
using core::makeError;

bool nameChars(std::string_view name, bool colon) {
  if (name.empty() || name.starts_with("__")) return false;
  auto first = [colon](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
  };
  if (!first(name[0])) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return first(c) || (c >= '0' && c <= '9'); });
}

const char* typeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "counter";
}

}  // namespace

bool PluginMetrics::validMetricName(std::string_view name) { return nameChars(name, true); }
bool PluginMetrics::validLabelName(std::string_view name) { return nameChars(name, false); }

void PluginMetrics::reservePrefixes(std::vector<std::string> prefixes) {
  std::lock_guard lock(mutex_);
  reserved_ = std::move(prefixes);
}

core::Result<std::uint64_t> PluginMetrics::registerMetric(MetricType type, const std::string& name,
                                                          const std::string& help,
                                                          const std::vector<std::string>& labelNames,
                                                          const std::vector<double>& buckets) {
  const std::string what = "plugin metric \"" + name + "\"";
  if (!validMetricName(name)) {
    return makeError(ErrorCategory::kInvalidArgument,
                     what + ": not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, not \"__*\")",
                     EINVAL);
  }
  if (help.find('\n') != std::string::npos) {
    return makeError(ErrorCategory::kInvalidArgument, what + ": help must be one line", EINVAL);
  }
  std::set<std::string_view> seen;
  for (const auto& label : labelNames) {
    if (!validLabelName(label)) {
      return makeError(ErrorCategory::kInvalidArgument,
                       what + ": label \"" + label +
                           "\" is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not \"__*\")",
                       EINVAL);
    }
    if (!seen.insert(label).second) {
      return makeError(ErrorCategory::kInvalidArgument, what + ": label \"" + label + "\" twice",
                       EINVAL);
    }
  }
  if (type == MetricType::kHistogram) {
    if (!core::Histogram::validBounds(buckets)) {
      return makeError(ErrorCategory::kInvalidArgument,
                       what + ": bucket bounds must be finite and strictly ascending", EINVAL);
    }
    if (seen.contains("le")) {
      return makeError(ErrorCategory::kInvalidArgument,
                       what + ": a histogram's label \"le\" is the bucket's", EINVAL);
    }
  }
  const std::vector<double> bounds = type == MetricType::kHistogram ? buckets : std::vector<double>{};
  std::lock_guard lock(mutex_);
  for (const auto& prefix : reserved_) {
    if (name.starts_with(prefix)) {
      return makeError(ErrorCategory::kInvalidArgument,
                       what + ": names starting with \"" + prefix + "\" are kproxy's own", EINVAL);
    }
  }
  for (std::size_t i = 0; i < families_.size(); ++i) {
    const auto& f = families_[i];
    if (f.name != name) continue;
    if (f.type == type && f.help == help && f.labelNames == labelNames && f.buckets == bounds) return i + 1;
    return makeError(ErrorCategory::kInvalidArgument,
                     what + ": already registered as a " + typeName(f.type) +
                         " with other help, labels or buckets",
                     EINVAL);
  }
  families_.push_back(MetricFamily{name, help, type, labelNames, {}, bounds, {}});
  return families_.size();
}

core::Result<MetricFamily*> PluginMetrics::family(std::uint64_t handle, std::size_t values) {
  if (handle == 0 || handle > families_.size()) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "plugin metric handle " + std::to_string(handle) + " is unknown", EINVAL);
  }
  MetricFamily& f = families_[handle - 1];
  if (values != f.labelNames.size()) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "plugin metric \"" + f.name + "\": " + std::to_string(values) +
                         " label values for " + std::to_string(f.labelNames.size()) + " labels",
                     EINVAL);
  }
  return &f;
}

core::Result<void> PluginMetrics::add(std::uint64_t handle, std::span<const std::string> labelValues,
                                      double delta) {
  std::lock_guard lock(mutex_);
  auto f = family(handle, labelValues.size());
  if (!f) return std::unexpected(f.error());
  if ((*f)->type == MetricType::kHistogram) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "plugin metric \"" + (*f)->name + "\": a histogram is observed, not added to", EINVAL);
  }
  if ((*f)->type == MetricType::kCounter && !(delta >= 0)) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "plugin metric \"" + (*f)->name + "\": a counter cannot go down", EINVAL);
  }
  (*f)->samples[std::vector<std::string>(labelValues.begin(), labelValues.end())] += delta;
  return {};
}

core::Result<void> PluginMetrics::set(std::uint64_t handle, std::span<const std::string> labelValues,
                                      double value) {
  std::lock_guard lock(mutex_);
  auto f = family(handle, labelValues.size());
  if (!f) return std::unexpected(f.error());
  if ((*f)->type != MetricType::kGauge) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "plugin metric \"" + (*f)->name + "\": only a gauge can be set", EINVAL);
  }
  (*f)->samples[std::vector<std::string>(labelValues.begin(), labelValues.end())] = value;
  return {};
}

core::Result<void> PluginMetrics::observe(std::uint64_t handle, std::span<const std::string> labelValues,
                                          double value) {
  std::lock_guard lock(mutex_);
  auto f = family(handle, labelValues.size());
  if (!f) return std::unexpected(f.error());
  if ((*f)->type != MetricType::kHistogram) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "plugin metric \"" + (*f)->name + "\": only a histogram is observed", EINVAL);
  }
  (*f)->histograms
      .try_emplace(std::vector<std::string>(labelValues.begin(), labelValues.end()), (*f)->buckets)
      .first->second.observe(value);
  return {};
}

std::vector<MetricFamily> PluginMetrics::collect() const {
  std::lock_guard lock(mutex_);
  std::vector<MetricFamily> out = families_;
  std::sort(out.begin(), out.end(),
            [](const MetricFamily& a, const MetricFamily& b) { return a.name < b.name; });
  return out;
}

}  // namespace kproxy::plugins
