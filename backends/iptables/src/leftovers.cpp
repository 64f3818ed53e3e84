#include "kproxy/iptables/leftovers.h"

#include <algorithm>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/core/log.h"

namespace kproxy::iptables {

namespace {

namespace log = kproxy::log;
namespace chains = backends::iptables_chains;
using backends::firstLine;
using backends::LeftoverSystem;

// One family on one iptables back end: "iptables-legacy", "ip6tables-nft", or plain "iptables".
// One save of every table (naming a table with -t would instantiate a legacy table the
// namespace does not have), then one restore per table that holds leftovers.
bool cleanUpIptables(LeftoverSystem& system, const std::string& save, const std::string& restore,
                     const std::string& label) {
  auto saved = system.query({save});
  if (!saved || saved->exitCode != 0) {
    log::error("iptables-save failed",
               {{"iptables", label}, {"error", saved ? firstLine(saved->err) : saved.error().message()}});
    return false;
  }
  auto planned = planIptablesCleanup(saved->out);
  if (!planned) {
    log::error("iptables-save output not understood", {{"iptables", label}, {"error", planned.error().message()}});
    return false;
  }
  const auto& plans = *planned;
  bool ok = true;
  if (plans.empty()) log::info(2, "no iptables tables", {{"iptables", label}});
  for (const auto& plan : plans) {
    if (plan.restoreInput.empty()) {
      log::info(2, "no kube-proxy iptables leftovers", {{"iptables", label}, {"table", plan.table}});
      continue;
    }
    auto restored = system.change({restore, "--noflush"}, plan.restoreInput);
    if (!restored || restored->exitCode != 0) {
      log::error("iptables-restore failed",
                 {{"iptables", label}, {"table", plan.table},
                  {"error", restored ? firstLine(restored->err) : restored.error().message()}});
      ok = false;
      continue;
    }
    log::info(0, "removed kube-proxy iptables leftovers",
              {{"iptables", label}, {"table", plan.table},
               {"chains", std::to_string(plan.deletedChains.size())},
               {"jumpRules", std::to_string(plan.deletedRules.size())},
               {"names", backends::joinNames(plan.deletedChains)}});
  }
  return ok;
}

}  // namespace

bool isKubeProxyChain(std::string_view table, std::string_view chain) {
  auto in = [chain](const auto& list) { return std::find(list.begin(), list.end(), chain) != list.end(); };
  if (table == "nat") {
    if (in(chains::kNatLeftovers)) return true;
    return std::any_of(chains::kNatLeftoverPrefixes.begin(), chains::kNatLeftoverPrefixes.end(),
                       [chain](std::string_view prefix) { return chain.starts_with(prefix); });
  }
  if (table == "filter") return in(chains::kFilterLeftovers);
  if (table == "mangle") return in(chains::kMangleLeftovers);
  return false;
}

core::Result<std::vector<IptablesCleanupPlan>> planIptablesCleanup(std::string_view saveOutput) {
  auto save = backends::parseIptablesSave(saveOutput);
  if (!save) return std::unexpected(save.error());
  std::vector<IptablesCleanupPlan> plans;
  for (const auto& table : save->tables) {
    IptablesCleanupPlan plan;
    plan.table = table.name;
    auto removal = backends::planChainRemoval(
        table, [&](std::string_view chain) { return isKubeProxyChain(table.name, chain); });
    plan.deletedChains = std::move(removal.chains);
    plan.deletedRules = std::move(removal.rules);
    plan.restoreInput = std::move(removal.input);
    plans.push_back(std::move(plan));
  }
  return plans;
}

bool cleanUpIptablesLeftovers(LeftoverSystem& system) {
  bool ok = true;
  bool ipv6 = system.pathExists("/proc/net/if_inet6");
  for (std::string family : {"iptables", "ip6tables"}) {
    if (family == "ip6tables" && !ipv6) {
      log::info(2, "no IPv6 in this network namespace; ip6tables leftovers skipped");
      continue;
    }
    bool anyVariant = false;
    for (std::string variant : {"-legacy", "-nft"}) {
      auto save = system.findTool(family + variant + "-save");
      auto restore = system.findTool(family + variant + "-restore");
      if (!save || !restore) continue;
      anyVariant = true;
      ok = cleanUpIptables(system, *save, *restore, family + variant) && ok;
    }
    if (anyVariant) continue;
    auto save = system.findTool(family + "-save");
    auto restore = system.findTool(family + "-restore");
    if (!save || !restore) {
      log::info(2, "iptables tools not installed; leftovers not looked for", {{"iptables", family}});
      continue;
    }
    ok = cleanUpIptables(system, *save, *restore, family) && ok;
  }
  return ok;
}

}  // namespace kproxy::iptables
