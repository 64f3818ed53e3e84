// What the ebpf backend reports (backend.h): elements per map, writes and refusals on the
// host's metrics, the data path's elements in the full syncs' summary.
#include <fmt/format.h>

#include "kproxy/ebpf/backend.h"

namespace kproxy::ebpf {

sdk::Expected<EbpfBackend::Metrics> EbpfBackend::registerMetrics(const sdk::Host& host) {
  Metrics m;
  auto elements = host.gauge("kproxy_ebpf_map_elements",
                             "Elements of ebpf mode's maps: services and slots after the last sync, "
                             "affinity and reverse (the data path's) at the last full sync",
                             {"map"});
  if (!elements) return std::unexpected(elements.error());
  m.elements = *elements;
  auto operations = host.counter("kproxy_ebpf_map_operations_total",
                                 "Map elements written or deleted by passes the kernel accepted");
  if (!operations) return std::unexpected(operations.error());
  m.operations = *operations;
  auto failures = host.counter("kproxy_ebpf_map_operation_failures_total",
                               "Passes whose map write the kernel refused (the next sync is full)");
  if (!failures) return std::unexpected(failures.error());
  m.failures = *failures;
  // Both counters are there from the start, at 0.
  m.operations.add(0);
  m.failures.add(0);
  return m;
}

void EbpfBackend::noteWrite(std::size_t ops, bool refused) {
  if (refused)
    metrics_.failures.add(1);
  else
    metrics_.operations.add(static_cast<double>(ops));
}

backends::PassOutcome EbpfBackend::published(backends::PassOutcome out, bool full) {
  if (full) {
    // Best effort: a count that fails leaves the last one and fails no sync.
    if (auto counted = kernel_->countDataPathElements(); counted)
      dataPath_ = *counted;
    else
      host_.warning(fmt::format("ebpf: counting the data path's elements failed error=\"{}\"",
                                counted.error().message()));
    out.detail += fmt::format(" affinity={} reverse={}", dataPath_.affinity, dataPath_.reverse);
  }
  if (!metrics_.elements.active()) return out;
  std::size_t services = 0, slots = 0;
  for (const auto& [key, maps] : ports_) {
    services += maps.services.size();
    slots += maps.slots.size();
  }
  metrics_.elements.set({"services"}, static_cast<double>(services));
  metrics_.elements.set({"slots"}, static_cast<double>(slots));
  metrics_.elements.set({"affinity"}, static_cast<double>(dataPath_.affinity));
  metrics_.elements.set({"reverse"}, static_cast<double>(dataPath_.reverse));
  return out;
}

}  // namespace kproxy::ebpf
