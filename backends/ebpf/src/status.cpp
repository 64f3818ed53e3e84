// What the ebpf backend reports (backend.h): elements per map, writes and refusals on the
// host's metrics, the data path's elements in the full syncs' summary; and the stale-socket
// cleanup after a sync, with its log lines and counters.
#include <cerrno>
#include <chrono>
#include <exception>
#include <optional>

#include <fmt/format.h>

#include "kproxy/ebpf/backend.h"
#include "kproxy/ebpf/stale_sockets.h"

namespace kproxy::ebpf {

sdk::Expected<EbpfBackend::Metrics> EbpfBackend::registerMetrics(const sdk::Host& host) {
  Metrics m;
  // Each registered into its field; the first refusal is the answer.
  std::optional<sdk::PluginError> refused;
  auto take = [&refused](sdk::Metric& into, sdk::Expected<sdk::Metric> registered) {
    if (refused) return;
    if (registered)
      into = *registered;
    else
      refused = registered.error();
  };
  take(m.elements, host.gauge("kproxy_ebpf_map_elements",
                              "Elements of ebpf mode's maps: services and slots after the last sync, "
                              "affinity and reverse (the data path's) at the last full sync",
                              {"map"}));
  take(m.operations, host.counter("kproxy_ebpf_map_operations_total",
                                  "Map elements written or deleted by passes the kernel accepted"));
  take(m.failures, host.counter("kproxy_ebpf_map_operation_failures_total",
                                "Passes whose map write the kernel refused (the next sync is full)"));
  take(m.socketOperations, host.counter("kproxy_ebpf_socket_operations_total",
                                        "Connected UDP sockets steered to an endpoint: listed by the stale-socket "
                                        "cleanups, and ended as stale",
                                        {"operation"}));
  take(m.socketFailures, host.counter("kproxy_ebpf_socket_operation_failures_total",
                                      "Stale-socket cleanups that did not complete: the kernel refused a pass, or "
                                      "cannot end sockets (bpf_sock_destroy, Linux 6.5+); and network namespaces a "
                                      "cleanup could not walk (the others were cleaned)",
                                      {"reason"}));
  if (refused) return std::unexpected(*refused);
  // The counters are there from the start, at 0.
  m.operations.add(0);
  m.failures.add(0);
  for (const char* operation : {"listed", "ended"}) m.socketOperations.add({operation}, 0);
  for (const char* reason : {"kernel", "unsupported", "namespace"}) m.socketFailures.add({reason}, 0);
  return m;
}

core::Result<backends::ConntrackCleanupReport> EbpfBackend::endStaleSockets(
    const std::function<core::Result<backends::ConntrackCleanupReport>(backends::ConntrackCleaner&)>& decide) {
  const auto started = std::chrono::steady_clock::now();
  SteeredSocketTable table(*kernel_);
  backends::ConntrackCleaner cleaner(table);
  auto report = decide(cleaner);
  // A namespace that could not be walked costs its own sockets only: named, counted, and
  // walked again by the next cleanup.
  for (const auto& skipped : table.skippedNamespaces()) {
    metrics_.socketFailures.add({"namespace"}, 1);
    host_.warning(fmt::format("ebpf: stale sockets in a network namespace were not looked at: {}", skipped));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (!report) {
    if (report.error().errnum == EOPNOTSUPP) {
      metrics_.socketFailures.add({"unsupported"}, 1);
      if (!warnedCannotEndSockets_)
        host_.warning(fmt::format("ebpf: connected UDP sockets steered to an endpoint that is removed are not ended "
                                  "(they keep sending to it): {}",
                                  report.error().message()));
      warnedCannotEndSockets_ = true;
    } else {
      // The sync stands; the next cleanup lists again.
      metrics_.socketFailures.add({"kernel"}, 1);
      host_.error(fmt::format("ebpf: ending stale sockets failed error=\"{}\" ms={:.1f}", report.error().message(), ms));
    }
    return report;
  }
  if (!report->ran) return report;
  metrics_.socketOperations.add({"listed"}, static_cast<double>(report->listed));
  metrics_.socketOperations.add({"ended"}, static_cast<double>(report->deleted));
  for (const auto& flow : report->stale) host_.info(4, fmt::format("ebpf: ending stale socket flow=\"{}\"", flow.str()));
  host_.info(report->stale.empty() ? 4 : 2, fmt::format("ebpf: stale sockets listed={} stale={} ended={} ms={:.1f}",
                                                        report->listed, report->stale.size(), report->deleted, ms));
  return report;
}

core::Result<backends::ConntrackCleanupReport> EbpfBackend::endStaleSockets(
    const std::vector<sdk::ServicePort>& previous, const std::vector<sdk::ServicePort>& next,
    const std::vector<sdk::ChangedKey>& changed, bool full) {
  return endStaleSockets([&](backends::ConntrackCleaner& c) { return c.afterSync(previous, next, changed, full); });
}

void EbpfBackend::cleanAfterSync(const sdk::SyncContext& context) {
  try {
    (void)endStaleSockets([&](backends::ConntrackCleaner& c) { return c.afterSync(context); });
  } catch (const std::exception& e) {
    // The maps are already written; a failed cleanup must not turn into a failed sync.
    metrics_.socketFailures.add({"kernel"}, 1);
    host_.error(fmt::format("ebpf: ending stale sockets failed error=\"{}\"", e.what()));
  }
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
