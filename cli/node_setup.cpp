#include "node_setup.h"

#include <sys/utsname.h>

#include <charconv>
#include <filesystem>
#include <cstdio>
#include <utility>

#include "kproxy/kernel/sysctl.h"
#include "kproxy/core/log.h"

namespace kproxy::cli {
namespace {

// "5.10.0-28-amd64" -> {5, 10}; {0, 0} when unreadable.
std::pair<int, int> majorMinor(std::string_view release) {
  int major = 0, minor = 0;
  const char* end = release.data() + release.size();
  auto [p, ec] = std::from_chars(release.data(), end, major);
  if (ec != std::errc{} || p == end || *p != '.') return {0, 0};
  std::from_chars(p + 1, end, minor);
  return {major, minor};
}

// Whether 127.0.0.1 lies in the IPv4 CIDR `cidr` (an IPv6 one or a keyword never holds it).
bool holdsIPv4Loopback(const std::string& cidr) {
  const auto slash = cidr.find('/');
  if (slash == std::string::npos) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  int bits = -1;
  char tail = 0;
  if (std::sscanf(cidr.c_str(), "%u.%u.%u.%u/%d%c", &a, &b, &c, &d, &bits, &tail) != 5) return false;
  if (a > 255 || b > 255 || c > 255 || d > 255 || bits < 0 || bits > 32) return false;
  const std::uint32_t address = (a << 24) | (b << 16) | (c << 8) | d;
  const std::uint32_t mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
  return (address & mask) == (0x7F000001u & mask);
}

std::string kernelRelease() {
  struct utsname u {};
  return uname(&u) == 0 ? std::string(u.release) : std::string();
}

}  // namespace

std::vector<SysctlSetting> modeSysctls(const ProxyConfig& config, std::string_view release) {
  std::vector<SysctlSetting> out;
  if (config.mode == "iptables") {
    // Upstream: localhost NodePorts only where the NodePort addresses include IPv4 loopback
    // (an empty list means every local address).
    const auto& npa = config.nodePortAddresses;
    bool loopback = npa.empty();
    for (const auto& cidr : npa) loopback = loopback || holdsIPv4Loopback(cidr);
    if (config.iptables.localhostNodePorts && loopback)
      out.push_back({"net/ipv4/conf/all/route_localnet", 1});
  } else if (config.mode == "ipvs") {
    out.push_back({"net/ipv4/vs/conntrack", 1});
    const auto version = majorMinor(release);
    if (version >= std::pair{4, 1} && version < std::pair{5, 9}) out.push_back({"net/ipv4/vs/conn_reuse_mode", 0});
    out.push_back({"net/ipv4/vs/expire_nodest_conn", 1});
    out.push_back({"net/ipv4/vs/expire_quiescent_template", 1});
    if (config.ipvs.strictARP) {
      out.push_back({"net/ipv4/conf/all/arp_ignore", 1});
      out.push_back({"net/ipv4/conf/all/arp_announce", 2});
    }
  }
  return out;
}

core::Result<void> setUpNode(const ProxyConfig& config, const SysctlRoots& roots) {
  if (auto ct = setUpConntrack(config.conntrack, roots); !ct) return ct;
  const kernel::SysctlFiles procSys(roots.procSys);
  for (const auto& setting : modeSysctls(config, kernelRelease())) {
    if (auto current = procSys.readInt(setting.path); current && *current == setting.value) {
      log::info(2, "sysctl already set", {{"entry", procSys.pathOf(setting.path).string()},
                                          {"value", std::to_string(setting.value)}});
      continue;
    }
    if (auto written = procSys.writeInt(setting.path, setting.value); !written) {
      return core::makeError(core::ErrorCategory::kIo,
                             "setting " + procSys.pathOf(setting.path).string() + " to " +
                                 std::to_string(setting.value) + ": " + written.error().message());
    }
    log::info(0, "set sysctl", {{"entry", procSys.pathOf(setting.path).string()},
                                {"value", std::to_string(setting.value)}, {"mode", config.mode}});
  }
  return {};
}

core::Result<void> applyOomScoreAdj(std::int32_t value, const std::string& file) {
  if (value < -1000 || value > 1000) {
    return core::makeError(core::ErrorCategory::kInvalidArgument,
                           "invalid oom_score_adj " + std::to_string(value) + ": must be within [-1000, 1000]");
  }
  // The kernel file, not a sysctl, but the same "write a number" contract.
  const std::filesystem::path path(file);
  const kernel::SysctlFiles dir(path.parent_path());
  if (auto written = dir.writeInt(path.filename().string(), value); !written) return std::unexpected(written.error());
  return {};
}

}  // namespace kproxy::cli
