// The nftables plugin's factory: options to settings (the render configuration, dry-run), the
// metrics, and the kernel: netlink, or in --dry-run a printer over a table in memory. The
// plugin entry (plugin.cpp) hands it to the host.
#include "kproxy/nftables/backend.h"

namespace kproxy::nftables {

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeNftablesBackend(const sdk::Host& host,
                                                                        const sdk::Options& options) {
  auto cfg = parseRenderConfig(options);
  if (!cfg) {
    // Every refusal of parseRenderConfig is about an option's value.
    sdk::PluginError e = cfg.error();
    if (e.category == sdk::ErrorCategory::kUnknown) e.category = sdk::ErrorCategory::kInvalidInput;
    return std::unexpected(std::move(e));
  }
  BackendSettings settings;
  settings.render = std::move(*cfg);
  if (auto it = options.find("dry-run"); it != options.end()) settings.dryRun = it->second == "true";
  auto metrics = NftablesBackend::registerMetrics(host);
  if (!metrics) return std::unexpected(metrics.error());
  // --dry-run never touches the kernel: what a sync would send is printed and kept in memory,
  // over empty tables, so a later sync sees what the earlier ones would have done.
  std::unique_ptr<KernelNftables> kernel;
  if (settings.dryRun)
    kernel = std::make_unique<PrintingNftables>(std::make_unique<FakeKernelNftables>(), settings.dryRunOutput);
  else
    kernel = makeNetlinkKernel();
  auto backend = std::make_unique<NftablesBackend>(host, std::move(settings), std::move(kernel));
  backend->useMetrics(std::move(*metrics));
  return backend;
}

}  // namespace kproxy::nftables
