#pragma once
/// Removal of the nftables mode's tables (`ip kube-proxy` and `ip6 kube-proxy`, kube-proxy's and
/// kproxy's alike), as upstream's nftables.CleanupLeftovers: after the first sync in the
/// iptables-based modes, so that a node switched from nftables mode is not left with two
/// proxies' rules, and for `kproxy --cleanup`.
/// Thread-safety: as thread-safe as the LeftoverSystem.

#include <string_view>

#include "kproxy/backends/common/leftover_system.h"
#include "kproxy/nftables/ir.h"

namespace kproxy::nftables {

/// Deletes table `table` in the ip and ip6 families, each in one netlink transaction, without
/// listing the ruleset. Without nftables in the kernel there is nothing to do (logged at v=2),
/// as upstream. Returns false when a table was found and could not be deleted.
/// With another `table` (the userspace mode's `kproxy-userspace`), removes that one instead:
/// what a node switched away from the userspace mode keeps redirecting otherwise.
bool cleanUpNftablesLeftovers(backends::LeftoverSystem& system, std::string_view table = kTableName);

}  // namespace kproxy::nftables
