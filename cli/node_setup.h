#pragma once
/// The privileged node set-up of `--init-only`, as upstream's: the conntrack sysctls
/// (setupConntrack, conntrack_sysctls.h) and the sysctls the mode's proxier sets before it would
/// program anything (pkg/proxy/<mode>/proxier.go, NewProxier with initOnly):
///   iptables   net/ipv4/conf/all/route_localnet = 1, when localhost NodePorts are on and the
///              NodePort addresses include IPv4 loopback (--iptables-localhost-nodeports)
///   ipvs       net/ipv4/vs/conntrack = 1, expire_nodest_conn = 1, expire_quiescent_template = 1,
///              conn_reuse_mode = 0 on kernels 4.1 to 5.8, and with --ipvs-strict-arp
///              net/ipv4/conf/all/arp_ignore = 1, arp_announce = 2
///   nftables, userspace and other plugins: none.
/// kproxy leaves net/ipv4/ip_forward to the node in every mode (docs/upstream-differences.md).
/// After it, a kproxy with CAP_NET_ADMIN only (and a read-only /proc/sys) finds the values in
/// place: the backends write a sysctl only when it differs.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "conntrack_sysctls.h"
#include "kproxy/core/error.h"
#include "proxy_config.h"

namespace kproxy::cli {

/// The mode's sysctls for `config`, in upstream's order; `kernelRelease` as uname -r prints it
/// (IPVS's conn_reuse_mode depends on it).
std::vector<SysctlSetting> modeSysctls(const ProxyConfig& config, std::string_view kernelRelease);

/// --init-only: the conntrack sysctls (read-only or missing ones are warnings, as at every
/// start-up), then the mode's, each written only when it differs; a mode sysctl that cannot be
/// written is an error naming it, as upstream's EnsureSysctl. Logs what it set.
core::Result<void> setUpNode(const ProxyConfig& config, const SysctlRoots& roots = {});

/// --oom-score-adj / oomScoreAdj: writes `value` to `file` (this process's oom_score_adj), as
/// upstream's ProxyServer.Run does at start-up (not for --init-only or --cleanup). An error when
/// it cannot be written (lowering it needs CAP_SYS_RESOURCE); upstream logs that at -v 2 and
/// runs on.
core::Result<void> applyOomScoreAdj(std::int32_t value, const std::string& file = "/proc/self/oom_score_adj");

}  // namespace kproxy::cli
