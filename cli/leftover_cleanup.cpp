#include "leftover_cleanup.h"

#include <linux/netfilter.h>
#include <linux/netlink.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <set>

#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/backends/common/netlink_socket.h"
#include "kproxy/backends/common/nftables_table.h"
#include "kproxy/backends/common/process.h"
#include "kproxy/core/log.h"

namespace kproxy::cli {

namespace {

namespace log = kproxy::log;

// No tool this runs should take more than seconds; a hung one must not hang --cleanup or the
// start-up.
constexpr std::chrono::seconds kCommandTimeout{60};

// Upstream's fixed chains, per table: the iptables proxier's (kube-proxy, nodeports, canary,
// firewall, ...) and the IPVS proxier's (KUBE-NODE-PORT, KUBE-LOAD-BALANCER, the IPVS filters).
// Not here on purpose: KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-MARK-DROP belong to kubelet.
constexpr std::array kNatChains = {
    std::string_view{"KUBE-SERVICES"}, std::string_view{"KUBE-NODEPORTS"},
    std::string_view{"KUBE-POSTROUTING"}, std::string_view{"KUBE-MARK-MASQ"},
    std::string_view{"KUBE-PROXY-CANARY"}, std::string_view{"KUBE-NODE-PORT"},
    std::string_view{"KUBE-LOAD-BALANCER"},
};
constexpr std::array kFilterChains = {
    std::string_view{"KUBE-SERVICES"},          std::string_view{"KUBE-EXTERNAL-SERVICES"},
    std::string_view{"KUBE-FORWARD"},           std::string_view{"KUBE-NODEPORTS"},
    std::string_view{"KUBE-PROXY-FIREWALL"},    std::string_view{"KUBE-PROXY-CANARY"},
    std::string_view{"KUBE-NODE-PORT"},         std::string_view{"KUBE-SOURCE-RANGES-FIREWALL"},
    std::string_view{"KUBE-IPVS-FILTER"},       std::string_view{"KUBE-IPVS-OUT-FILTER"},
};
constexpr std::array kMangleChains = {std::string_view{"KUBE-PROXY-CANARY"}};
// Per-service chains (nat only), as upstream's isServiceChainName, plus KUBE-XLB- which
// kube-proxy before 1.24 used for Local traffic policy.
constexpr std::array kServiceChainPrefixes = {
    std::string_view{"KUBE-SVC-"}, std::string_view{"KUBE-SVL-"}, std::string_view{"KUBE-EXT-"},
    std::string_view{"KUBE-FW-"},  std::string_view{"KUBE-SEP-"}, std::string_view{"KUBE-XLB-"},
};

std::string joinNames(const std::vector<std::string>& names, std::size_t limit = 20) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) {
    if (!out.empty()) out += ",";
    out += names[i];
  }
  if (names.size() > limit) out += ",...";
  return out;
}

}  // namespace

bool isKubeProxyChain(std::string_view table, std::string_view chain) {
  auto in = [chain](const auto& list) { return std::find(list.begin(), list.end(), chain) != list.end(); };
  if (table == "nat") {
    if (in(kNatChains)) return true;
    return std::any_of(kServiceChainPrefixes.begin(), kServiceChainPrefixes.end(),
                       [chain](std::string_view prefix) { return chain.starts_with(prefix); });
  }
  if (table == "filter") return in(kFilterChains);
  if (table == "mangle") return in(kMangleChains);
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

std::optional<std::string> RealLeftoverSystem::findTool(std::string_view name) {
  return backends::findExecutable(name);
}

bool RealLeftoverSystem::pathExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

core::Result<bool> RealLeftoverSystem::deleteNftablesTable(std::string_view family, std::string_view name) {
  auto socket = backends::NetlinkSocket::open(NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  return backends::deleteNftablesTable(*socket, family == "ip6" ? NFPROTO_IPV6 : NFPROTO_IPV4, name);
}

core::Result<CommandResult> RealLeftoverSystem::run(const std::vector<std::string>& argv,
                                                    std::string_view input) {
  auto ran = backends::runProcess(argv, {.stdinData = input, .timeout = kCommandTimeout});
  if (!ran) return std::unexpected(ran.error());
  return CommandResult{ran->exitCode, std::move(ran->out), std::move(ran->err)};
}

namespace {

std::string firstLine(std::string_view text) {
  while (!text.empty() && (text.front() == '\n' || text.front() == ' ')) text.remove_prefix(1);
  return std::string(text.substr(0, text.find('\n')));
}

// One family on one iptables back end: "iptables-legacy", "ip6tables-nft", or plain "iptables".
// One save of every table (naming a table with -t would instantiate a legacy table the
// namespace does not have), then one restore per table that holds leftovers.
bool cleanUpIptables(LeftoverSystem& system, const std::string& save, const std::string& restore,
                     const std::string& label) {
  auto saved = system.run({save}, {});
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
    auto restored = system.run({restore, "--noflush"}, plan.restoreInput);
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
               {"names", joinNames(plan.deletedChains)}});
  }
  return ok;
}

bool cleanUpAllIptables(LeftoverSystem& system) {
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

bool cleanUpIpvs(LeftoverSystem& system) {
  if (!system.pathExists("/proc/net/ip_vs")) {
    log::info(2, "no IPVS in this kernel; no IPVS leftovers");
    return true;
  }
  auto ipvsadm = system.findTool("ipvsadm");
  if (!ipvsadm) {
    log::error("IPVS is loaded but ipvsadm is not installed; IPVS virtual servers not removed",
               {{"fix", "install ipvsadm or run ipvsadm -C"}});
    return false;
  }
  // Like upstream's Flush: every virtual server, as only kube-proxy is expected to create them.
  auto listed = system.run({*ipvsadm, "-S", "-n"}, {});
  std::size_t services = 0;
  if (listed && listed->exitCode == 0) {
    for (std::string_view rest = listed->out; !rest.empty();) {
      auto end = rest.find('\n');
      if (rest.starts_with("-A ")) ++services;
      rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    }
    if (services == 0) {
      log::info(2, "no IPVS virtual servers");
      return true;
    }
  }
  auto cleared = system.run({*ipvsadm, "-C"}, {});
  if (!cleared || cleared->exitCode != 0) {
    log::error("ipvsadm -C failed", {{"error", cleared ? firstLine(cleared->err) : cleared.error().message()}});
    return false;
  }
  log::info(0, "removed IPVS virtual servers", {{"count", std::to_string(services)}});
  return true;
}

// As upstream's DeleteDummyDevice: absent is fine; a kube-ipvs0 that is not a dummy device is
// not ours to delete and is reported.
bool cleanUpDummyDevice(LeftoverSystem& system) {
  constexpr const char* kDevice = "kube-ipvs0";
  auto ip = system.findTool("ip");
  if (!ip) {
    log::error("the ip tool (iproute2) is not installed; interface not looked for", {{"interface", kDevice}});
    return false;
  }
  auto shown = system.run({*ip, "-d", "-o", "link", "show", "dev", kDevice}, {});
  if (!shown) {
    log::error("ip link show failed", {{"interface", kDevice}, {"error", shown.error().message()}});
    return false;
  }
  if (shown->exitCode != 0) {
    if (shown->err.find("does not exist") != std::string::npos) {
      log::info(2, "no IPVS dummy interface", {{"interface", kDevice}});
      return true;
    }
    log::error("ip link show failed", {{"interface", kDevice}, {"error", firstLine(shown->err)}});
    return false;
  }
  // `ip -d -o` prints the link kind as a word of the detail part ("... \    dummy addrgenmode ...").
  auto detail = backends::splitIptablesWords(shown->out);
  if (std::find(detail.begin(), detail.end(), "dummy") == detail.end()) {
    log::error("interface is not a dummy device; not deleted", {{"interface", kDevice}});
    return false;
  }
  auto deleted = system.run({*ip, "link", "del", "dev", kDevice}, {});
  if (!deleted || deleted->exitCode != 0) {
    log::error("deleting interface failed",
               {{"interface", kDevice}, {"error", deleted ? firstLine(deleted->err) : deleted.error().message()}});
    return false;
  }
  log::info(0, "removed interface", {{"interface", kDevice}});
  return true;
}

bool cleanUpIpsets(LeftoverSystem& system) {
  auto ipset = system.findTool("ipset");
  if (!ipset) {
    log::info(2, "ipset tool not installed; ipset leftovers not looked for");
    return true;
  }
  auto listed = system.run({*ipset, "list", "-n"}, {});
  if (!listed || listed->exitCode != 0) {
    log::error("ipset list failed", {{"error", listed ? firstLine(listed->err) : listed.error().message()}});
    return false;
  }
  bool ok = true;
  std::vector<std::string> destroyed;
  for (std::string_view rest = listed->out; !rest.empty();) {
    auto end = rest.find('\n');
    std::string name(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    if (!name.starts_with("KUBE-")) continue;
    auto gone = system.run({*ipset, "destroy", name}, {});
    if (!gone || gone->exitCode != 0) {
      log::error("ipset destroy failed",
                 {{"ipset", name}, {"error", gone ? firstLine(gone->err) : gone.error().message()}});
      ok = false;
      continue;
    }
    destroyed.push_back(name);
  }
  if (destroyed.empty()) {
    log::info(2, "no kube-proxy ipsets");
  } else {
    log::info(0, "removed ipsets", {{"count", std::to_string(destroyed.size())}, {"names", joinNames(destroyed)}});
  }
  return ok;
}

}  // namespace

bool cleanUpNftablesLeftovers(LeftoverSystem& system, std::string_view tableName) {
  bool ok = true;
  for (std::string_view family : {"ip", "ip6"}) {
    const std::string table = std::string(family) + " " + std::string(tableName);
    auto deleted = system.deleteNftablesTable(family, tableName);
    if (!deleted) {
      const int e = deleted.error().errnum;
      if (e == EPROTONOSUPPORT || e == EAFNOSUPPORT || e == EOPNOTSUPP) {
        // As upstream, where knftables cannot be set up: no nftables here, so nothing to remove.
        log::info(2, "nftables not available; nftables leftovers not looked for",
                  {{"error", deleted.error().message()}});
        return true;
      }
      log::error("deleting nftables table failed", {{"table", table}, {"error", deleted.error().message()}});
      ok = false;
      continue;
    }
    if (*deleted) log::info(0, "removed nftables leftovers", {{"table", table}});
  }
  return ok;
}

bool cleanUpKubeProxyLeftovers(LeftoverSystem& system) {
  bool ok = cleanUpIpvs(system);
  ok = cleanUpDummyDevice(system) && ok;
  ok = cleanUpAllIptables(system) && ok;
  // After iptables: a set that a rule still refers to cannot be destroyed.
  ok = cleanUpIpsets(system) && ok;
  return ok;
}

}  // namespace kproxy::cli
