#pragma once
/// The conntrack sysctls kube-proxy tunes at start-up (cmd/kube-proxy/app/conntrack.go and
/// setupConntrack in server_linux.go), from KubeProxyConfiguration.conntrack:
///   nf_conntrack_max               maxPerCore × cores, not below min (maxPerCore 0: untouched)
///   nf_conntrack_tcp_timeout_established / _close_wait   when > 0, in whole seconds
///   nf_conntrack_tcp_be_liberal    1 when tcpBeLiberal
///   nf_conntrack_udp_timeout / _udp_timeout_stream       when > 0, in whole seconds
/// plus, like upstream, the module's hashsize raised to max/4 when it is lower.
/// A value already in place is not written again. A sysctl that cannot be written because it
/// is read-only (inside a network namespace nf_conntrack_max is; /sys may be mounted read-only)
/// or missing (module not loaded) is a warning, not a failure; any other write error is.
/// Callers never run this for --dry-run or --cleanup.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "proxy_config.h"

namespace kproxy::cli {

/// One sysctl to set: `path` is relative to the /proc/sys root ("net/netfilter/nf_conntrack_max").
struct SysctlSetting {
  std::string path;
  std::int64_t value = 0;
  bool operator==(const SysctlSetting&) const = default;
};

/// Upstream's getConntrackMax: maxPerCore × cores, or min when that is larger; 0 when
/// maxPerCore is 0 (leave the kernel's value).
std::int64_t conntrackMax(const ConntrackConfig& config, int cores);

/// Every /proc/sys setting the configuration asks for, in upstream's order (hashsize aside).
std::vector<SysctlSetting> conntrackSysctls(const ConntrackConfig& config, int cores);

/// Where the files live; tests point both at a temporary directory.
struct SysctlRoots {
  std::filesystem::path procSys = "/proc/sys";
  /// nf_conntrack's module parameters (hashsize).
  std::filesystem::path moduleParameters = "/sys/module/nf_conntrack/parameters";
};

enum class SysctlStatus {
  kSet,        ///< written
  kUnchanged,  ///< already had the value
  kReadOnly,   ///< could not be written (EACCES, EPERM, EROFS, EOPNOTSUPP): warned
  kMissing,    ///< does not exist (ENOENT): warned
};

struct SysctlOutcome {
  std::string file;  ///< full path
  std::int64_t value = 0;
  std::int64_t previous = -1;  ///< -1 when it could not be read
  SysctlStatus status = SysctlStatus::kSet;
  int errnum = 0;
};

/// Applies the settings (and the hashsize rule) and reports each. An error only for a write
/// the kernel refused for another reason (e.g. EINVAL: a value out of range).
core::Result<std::vector<SysctlOutcome>> applyConntrackSysctls(const ConntrackConfig& config, int cores,
                                                               const SysctlRoots& roots = {});

/// CPUs online (upstream counts the machine's CPUs, not the process's affinity).
int onlineCpus();

/// Start-up: applies with the real roots and the online CPUs, logs what was set at -v 0 and
/// every read-only or missing sysctl as a warning.
core::Result<void> setUpConntrack(const ConntrackConfig& config, const SysctlRoots& roots = {});

}  // namespace kproxy::cli
