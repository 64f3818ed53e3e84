#pragma once
/// Removal of what kube-proxy's iptables and IPVS modes leave on a node, as upstream's
/// iptables.CleanupLeftovers and ipvs.CleanupLeftovers (called from platformCleanup in
/// cmd/kube-proxy/app/server_linux.go): for `kproxy --cleanup`, and after the first sync in
/// nftables mode, so that operators migrating from kube-proxy's iptables or IPVS mode are not
/// left with two proxies' rules. The other way round, nftables::cleanUpNftablesLeftovers
/// (kproxy/nftables/leftovers.h) removes nftables mode's tables.
///
/// cli/ keeps no kernel code: each step is its backend's (kproxy/iptables/leftovers.h,
/// kproxy/ipvs/leftovers.h), on a backends::LeftoverSystem. They are plain functions of the
/// backends' libraries rather than the plugin ABI's cleanup(): that one removes what a kproxy
/// backend of the running mode owns, while these remove what upstream's modes leave whether or
/// not such a plugin is installed or still loaded (only the selected mode's stays loaded), which
/// the ABI 1.x cannot ask for without a new entry point.

#include "kproxy/backends/common/leftover_system.h"

namespace kproxy::cli {

/// Removes kube-proxy's leftovers: IPVS virtual servers, kube-ipvs0, iptables, then the ipsets
/// (a set that a rule still refers to cannot be destroyed). Logs each
/// removal (key=value) and each failure as an error; a step that fails does not stop the
/// others. Returns true when everything that was found was removed (nothing found is success),
/// so a second run succeeds and removes nothing.
bool cleanUpKubeProxyLeftovers(backends::LeftoverSystem& system);

}  // namespace kproxy::cli
