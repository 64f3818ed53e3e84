// The IPVS backend's factory: options → settings, and the kernel adapters (in --dry-run,
// printers over fakes: it never touches the kernel).
#include <cmath>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "kproxy/ipvs/backend.h"
#include "kproxy/net/ip.h"
#include "kproxy/plan/options.h"

namespace kproxy::ipvs {
namespace {

bool kernelHasIPv6() {
  std::ifstream disabled("/proc/sys/net/ipv6/conf/all/disable_ipv6");
  int value = 1;
  return disabled && (disabled >> value) && value == 0;
}

kernel::SystemProcessRunner& systemRunner() {
  static kernel::SystemProcessRunner runner;
  return runner;
}

/// A duration option ("30", "0.5") as whole seconds, rounded up (IPVS timeouts are seconds).
sdk::Expected<std::int32_t> secondsOption(const sdk::Options& options, std::string_view key) {
  auto it = options.find(key);
  if (it == options.end() || it->second.empty()) return 0;
  char* end = nullptr;
  const double value = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || value < 0 || value > 2147483647.0)
    return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                     fmt::format("ipvs: invalid {} \"{}\" (seconds, 0 or more)", key, it->second));
  return static_cast<std::int32_t>(std::ceil(value));
}

}  // namespace

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeIpvsBackend(const sdk::Host& host,
                                                                   const sdk::Options& options) {
  auto cfg = parseRenderConfig(options);
  if (!cfg) return std::unexpected(cfg.error());
  auto get = [&](std::string_view key) { return plan::optionValue(options, key); };
  BackendSettings settings;
  settings.render = std::move(*cfg);
  settings.dryRun = get("dry-run") == "true";
  const std::string strict = get("ipvs-strict-arp");
  if (!strict.empty() && strict != "true" && strict != "false")
    return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                     "ipvs: invalid ipvs-strict-arp \"" + strict + "\" (true, false)");
  settings.strictARP = strict == "true";
  for (auto [key, field] : {std::pair{"ipvs-tcp-timeout", &Timeouts::tcp},
                            std::pair{"ipvs-tcpfin-timeout", &Timeouts::tcpFin},
                            std::pair{"ipvs-udp-timeout", &Timeouts::udp}}) {
    auto seconds = secondsOption(options, key);
    if (!seconds) return std::unexpected(seconds.error());
    settings.timeouts.*field = *seconds;
  }
  for (const auto& c : plan::splitOptionList(get("ipvs-exclude-cidrs"))) {
    if (!net::Prefix::parse(c))
      return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                       "ipvs: invalid ipvs-exclude-cidrs entry \"" + c + "\"");
    settings.excludeCIDRs.push_back(c);
  }

  std::string variantOption = get("iptables-variant");
  if (variantOption.empty()) variantOption = "auto";
  if (variantOption != "auto" && variantOption != "nft" && variantOption != "legacy")
    return sdk::fail(
        sdk::ErrorCategory::kInvalidInput,
        "ipvs: invalid iptables-variant \"" + variantOption + "\" (auto, nft, legacy)");

  IpvsAdapters adapters;
  if (settings.dryRun) {
    // --dry-run and explain: an empty kernel in memory, behind printers that say what every
    // change would be.
    std::FILE* out = settings.dryRunOutput;
    const iptables::Variant variant =
        variantOption == "legacy" ? iptables::Variant::kLegacy : iptables::Variant::kNft;
    auto rules = std::make_unique<iptables::FakeIptables>();
    rules->wholeTables = variant == iptables::Variant::kLegacy;
    adapters.ipvs = std::make_unique<PrintingIpvs>(std::make_unique<FakeIpvs>(), out);
    adapters.link = std::make_unique<PrintingDummyLink>(std::make_unique<FakeDummyLink>(), out);
    adapters.ipsets = std::make_unique<PrintingIpsets>(std::make_unique<FakeIpsets>(), out);
    adapters.iptables = std::make_unique<iptables::PrintingIptables>(
        std::move(rules), out, "iptables-" + std::string(iptables::variantName(variant)));
    adapters.sysctls =
        std::make_unique<kernel::PrintingSysctls>(std::make_unique<kernel::FakeSysctls>(freshSysctls()), out);
  } else {
    auto ipvs = makeNetlinkIpvs();
    if (!ipvs)
      return sdk::fail(sdk::ErrorCategory::kKernelRefused, "ipvs: " + ipvs.error().message());
    auto link = makeNetlinkDummyLink();
    if (!link)
      return sdk::fail(sdk::ErrorCategory::kKernelRefused, "ipvs: " + link.error().message());
    auto ipsets = makeProcessIpsets(systemRunner());
    if (!ipsets) return sdk::fail(sdk::ErrorCategory::kInvalidInput, ipsets.error().message());
    const iptables::Variant variant = variantOption == "legacy" ? iptables::Variant::kLegacy
                                      : variantOption == "nft"
                                          ? iptables::Variant::kNft
                                          : iptables::detectVariant(systemRunner());
    auto tools = iptables::findVariantTools(variant);
    if (!tools)
      return sdk::fail(sdk::ErrorCategory::kInvalidInput, "ipvs: " + tools.error().message());
    settings.ipv6 = !tools->restore6.empty() && !tools->save6.empty() && kernelHasIPv6();
    adapters.ipvs = std::move(*ipvs);
    adapters.link = std::move(*link);
    adapters.ipsets = std::move(*ipsets);
    adapters.iptables = iptables::makeProcessKernel(std::move(*tools), systemRunner());
    adapters.sysctls = kernel::makeFileSysctls();
  }
  auto metrics = IpvsBackend::registerMetrics(host);
  if (!metrics) return std::unexpected(metrics.error());
  host.info(
      0,
      fmt::format(
          "ipvs: scheduler {}, iptables {}{}", settings.render.scheduler,
          adapters.iptables->describe(),
          settings.ipv6 ? "" : "; IPv6 is not programmed (no ip6tables or no IPv6 in the kernel)"));
  auto backend = std::make_unique<IpvsBackend>(host, std::move(settings), std::move(adapters));
  backend->useMetrics(std::move(*metrics));
  return std::unique_ptr<sdk::BackendPlugin>(std::move(backend));
}

}  // namespace kproxy::ipvs
