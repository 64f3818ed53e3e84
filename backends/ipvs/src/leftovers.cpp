#include "kproxy/ipvs/leftovers.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/core/log.h"

namespace kproxy::ipvs {

namespace log = kproxy::log;
using backends::firstLine;
using backends::LeftoverSystem;

bool cleanUpIpvsLeftovers(LeftoverSystem& system) {
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
  auto listed = system.query({*ipvsadm, "-S", "-n"});
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
  auto cleared = system.change({*ipvsadm, "-C"}, {});
  if (!cleared || cleared->exitCode != 0) {
    log::error("ipvsadm -C failed", {{"error", cleared ? firstLine(cleared->err) : cleared.error().message()}});
    return false;
  }
  log::info(0, "removed IPVS virtual servers", {{"count", std::to_string(services)}});
  return true;
}

bool cleanUpDummyInterfaceLeftover(LeftoverSystem& system) {
  constexpr const char* kDevice = backends::kIpvsDummyInterface;
  auto ip = system.findTool("ip");
  if (!ip) {
    log::error("the ip tool (iproute2) is not installed; interface not looked for", {{"interface", kDevice}});
    return false;
  }
  auto shown = system.query({*ip, "-d", "-o", "link", "show", "dev", kDevice});
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
  auto deleted = system.change({*ip, "link", "del", "dev", kDevice}, {});
  if (!deleted || deleted->exitCode != 0) {
    log::error("deleting interface failed",
               {{"interface", kDevice}, {"error", deleted ? firstLine(deleted->err) : deleted.error().message()}});
    return false;
  }
  log::info(0, "removed interface", {{"interface", kDevice}});
  return true;
}

bool cleanUpIpsetLeftovers(LeftoverSystem& system) {
  auto ipset = system.findTool("ipset");
  if (!ipset) {
    log::info(2, "ipset tool not installed; ipset leftovers not looked for");
    return true;
  }
  auto listed = system.query({*ipset, "list", "-n"});
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
    if (!name.starts_with(backends::kKubePrefix)) continue;
    auto gone = system.change({*ipset, "destroy", name}, {});
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
    log::info(0, "removed ipsets",
              {{"count", std::to_string(destroyed.size())}, {"names", backends::joinNames(destroyed)}});
  }
  return ok;
}

}  // namespace kproxy::ipvs
