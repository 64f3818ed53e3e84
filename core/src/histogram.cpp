#include "kproxy/core/histogram.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace kproxy::core {

Histogram::Histogram(std::vector<double> upperBounds)
    : bounds(std::move(upperBounds)), counts(bounds.size(), 0) {}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), value);
  if (it != bounds.end()) ++counts[static_cast<std::size_t>(it - bounds.begin())];
  sum += value;
  ++count;
}

Histogram Histogram::exponential(double start, double factor, int n) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < n; ++i, v *= factor) b.push_back(v);
  return Histogram(std::move(b));
}

bool Histogram::validBounds(const std::vector<double>& bounds) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) return false;
    if (i > 0 && !(bounds[i - 1] < bounds[i])) return false;
  }
  return true;
}

}  // namespace kproxy::core
