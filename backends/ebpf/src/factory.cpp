// The ebpf plugin's factory: options to settings, the kernel's support checked once with one
// clear error, and the kernel: libbpf, or in --dry-run a printer over maps in memory. The
// plugin entry (plugin.cpp) hands it to the host.
#include <fmt/format.h>

#include "kproxy/ebpf/backend.h"
#include "kproxy/plan/options.h"

namespace kproxy::ebpf {

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeEbpfBackend(const sdk::Host& host, const sdk::Options& options) {
  auto cfg = parseRenderConfig(options);  // its errors are invalid input, naming the option
  if (!cfg) return std::unexpected(cfg.error());
  BackendSettings settings;
  settings.render = std::move(*cfg);
  settings.dryRun = plan::optionValue(options, "dry-run") == "true";
  auto metrics = EbpfBackend::registerMetrics(host);
  if (!metrics) return std::unexpected(metrics.error());

  std::unique_ptr<KernelMaps> kernel;
  std::unique_ptr<nftables::KernelNftables> tables;
  if (settings.dryRun) {
    // --dry-run never touches the kernel: the writes are printed and kept in memory, over
    // empty maps and tables, so that a later sync sees what the earlier ones would have done.
    kernel = std::make_unique<PrintingKernelMaps>(std::make_unique<FakeKernelMaps>(), settings.dryRunOutput);
    tables = std::make_unique<nftables::PrintingNftables>(std::make_unique<nftables::FakeKernelNftables>(),
                                                          settings.dryRunOutput, kNftablesTable);
  } else {
    tables = nftables::makeNetlinkKernel(kNftablesTable);
    LibbpfSettings where;
    where.cgroupPath = plan::optionValue(options, "ebpf-cgroup-path");
    if (where.cgroupPath.empty()) where.cgroupPath = cgroupV2Root().value_or("");
    where.pinPath = plan::optionValue(options, "ebpf-pin-path");
    if (where.pinPath.empty()) where.pinPath = kDefaultPinPath;
    while (where.pinPath.size() > 1 && where.pinPath.back() == '/') where.pinPath.pop_back();
    if (auto dir = plan::optionValue(options, "ebpf-netns-dir"); !dir.empty()) where.namespaceDirs.push_back(dir);
    auto opened = openLibbpfKernel(where);
    if (!opened) return sdk::fail(sdk::ErrorCategory::kKernelRefused, opened.error().message(), opened.error().errnum);
    kernel = std::move(*opened);
    host.info(0, fmt::format("ebpf: socket load balancing for cgroup {}, maps and links pinned under {}; traffic "
                             "from other hosts through nftables tables {}; stale sockets looked for in the "
                             "namespaces of the cgroup's processes{}",
                             where.cgroupPath, where.pinPath, kNftablesTable,
                             where.namespaceDirs.empty() ? "" : " and those under " + where.namespaceDirs.front()));
  }
  auto backend = std::make_unique<EbpfBackend>(host, std::move(settings), std::move(kernel), std::move(tables));
  backend->useMetrics(std::move(*metrics));
  return std::unique_ptr<sdk::BackendPlugin>(std::move(backend));
}

}  // namespace kproxy::ebpf
