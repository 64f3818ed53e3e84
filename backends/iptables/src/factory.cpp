// The plugin's factory: its options parsed into the backend's settings, the iptables variant
// chosen and its tools found (or a fake for --dry-run and explain without them).
#include <fmt/format.h>

#include "kproxy/iptables/backend.h"
#include "kproxy/kernel/nfacct.h"
#include "kproxy/kernel/sysctl.h"
#include "kproxy/plan/options.h"

namespace kproxy::iptables {
namespace {

kernel::SystemProcessRunner& systemRunner() {
  static kernel::SystemProcessRunner runner;
  return runner;
}

}  // namespace

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeIptablesBackend(const sdk::Host& host,
                                                                        const sdk::Options& options) {
  auto cfg = parseRenderConfig(options);
  if (!cfg) return std::unexpected(cfg.error());
  auto get = [&](std::string_view key) { return plan::optionValue(options, key); };
  BackendSettings settings;
  settings.dryRun = get("dry-run") == "true";
  if (auto liberal = kernel::SysctlFiles().readInt("net/netfilter/nf_conntrack_tcp_be_liberal"); liberal)
    cfg->conntrackTCPLiberal = *liberal != 0;

  std::string variantOption = get("iptables-variant");
  if (variantOption.empty()) variantOption = "auto";
  if (variantOption != "auto" && variantOption != "nft" && variantOption != "legacy")
    return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                     "iptables: invalid iptables-variant \"" + variantOption + "\" (auto, nft, legacy)");
  Variant variant = Variant::kNft;
  if (variantOption == "legacy")
    variant = Variant::kLegacy;
  else if (variantOption == "auto" && !settings.dryRun)
    variant = detectVariant(systemRunner());

  std::unique_ptr<KernelIptables> kernel;
  std::unique_ptr<kernel::Sysctls> sysctls;
  std::unique_ptr<kernel::Nfacct> nfacct;
  auto tools = findVariantTools(variant);
  if (!tools && !settings.dryRun) return sdk::fail(sdk::ErrorCategory::kInvalidInput, tools.error().message());
  if (tools) settings.ipv6 = !tools->restore6.empty() && !tools->save6.empty() && kernel::kernelHasIPv6();
  if (settings.dryRun) {
    // Dry-run and explain never run the tools nor write a sysctl: what would be restored or
    // set is printed, over an empty ruleset and a fresh kernel's sysctls in memory, which
    // learn what the dry run wrote.
    auto empty = std::make_unique<FakeIptables>();
    empty->wholeTables = variant == Variant::kLegacy;
    kernel = std::make_unique<PrintingIptables>(std::move(empty), settings.dryRunOutput,
                                                "iptables-" + std::string(variantName(variant)));
    sysctls = std::make_unique<kernel::PrintingSysctls>(std::make_unique<kernel::FakeSysctls>(freshSysctls()),
                                                        settings.dryRunOutput);
    nfacct = std::make_unique<kernel::PrintingNfacct>(std::make_unique<kernel::FakeNfacct>(), settings.dryRunOutput);
  } else {
    kernel = makeProcessKernel(std::move(*tools), systemRunner());
    sysctls = kernel::makeFileSysctls();
    // Upstream: without nfacct the rules count into nothing and its metrics are not served.
    if (auto opened = kernel::makeNetlinkNfacct())
      nfacct = std::move(*opened);
    else
      host.error("Failed to create nfacct runner, nfacct based metrics won't be available error=\"" +
                 opened.error().message() + "\"");
  }
  settings.render = std::move(*cfg);
  auto metrics = IptablesBackend::registerMetrics(host);
  if (!metrics) return std::unexpected(metrics.error());
  host.info(0, fmt::format("iptables: using {} (iptables-variant={}){}", kernel->describe(), variantOption,
                           settings.ipv6 ? "" : "; IPv6 is not programmed (no ip6tables or no IPv6 in the kernel)"));
  auto backend = std::make_unique<IptablesBackend>(host, std::move(settings), std::move(kernel), std::move(sysctls));
  backend->useMetrics(std::move(*metrics));
  backend->useNfacct(std::move(nfacct));
  return backend;
}

}  // namespace kproxy::iptables
