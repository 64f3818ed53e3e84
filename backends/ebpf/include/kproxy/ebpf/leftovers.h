#pragma once
/// Removal of what ebpf mode leaves on a node: its pinned links (the programs leave their
/// cgroup hooks), its pinned maps and their directory, and the nftables part's tables `ip` and
/// `ip6 kproxy-ebpf`. For the start of any other mode (after its first sync, as the other modes'
/// leftovers) and for `kproxy --cleanup`, whether or not the ebpf plugin is installed or could
/// be loaded (it needs libbpf and kernel BTF; this needs neither).
/// Thread-safety: as thread-safe as the LeftoverSystem.

#include <string>

#include "kproxy/backends/common/leftover_system.h"

namespace kproxy::ebpf {

/// The nftables part's tables (ip and ip6), apart from nftables mode's `kube-proxy`.
inline constexpr const char* kNftablesTable = "kproxy-ebpf";
/// The pin path when none is given.
inline constexpr const char* kDefaultPinPath = "/sys/fs/bpf/kproxy";

/// Detaches and removes the pins under `pinPath` (--ebpf-pin-path) and deletes the tables.
/// Logs each removal and each failure; a step that fails does not stop the other. True when
/// everything found was removed (nothing found is success).
bool cleanUpEbpfLeftovers(backends::LeftoverSystem& system, const std::string& pinPath);

}  // namespace kproxy::ebpf
