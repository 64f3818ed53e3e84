// The nftables plugin's factory: options to settings (the render configuration, dry-run), the
// metrics, and the netlink kernel. The plugin entry (plugin.cpp) hands it to the host.
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
  auto backend = std::make_unique<NftablesBackend>(host, std::move(settings), makeNetlinkKernel());
  backend->useMetrics(std::move(*metrics));
  return backend;
}

}  // namespace kproxy::nftables
