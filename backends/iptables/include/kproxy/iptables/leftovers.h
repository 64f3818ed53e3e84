#pragma once
/// Removal of what upstream kube-proxy's iptables and IPVS modes leave in iptables, as its
/// iptables.CleanupLeftovers and the iptables part of ipvs.CleanupLeftovers (called from
/// platformCleanup in cmd/kube-proxy/app/server_linux.go): IPv4 and IPv6, legacy and nft back
/// ends, the fixed chains of both modes, in nat the per-service chains (KUBE-SVC-, KUBE-SVL-,
/// KUBE-EXT-, KUBE-FW-, KUBE-SEP-, and the older KUBE-XLB-), and every rule elsewhere that jumps
/// to one of them (the jumps from the built-in chains). One `iptables-restore --noflush` per
/// table and family, so each table changes atomically. Kubelet's KUBE-FIREWALL,
/// KUBE-KUBELET-CANARY and KUBE-MARK-DROP and every other program's rules are kept. The names
/// come from the catalogue (kproxy/backends/common/chain_names.h).
/// Thread-safety: pure functions, and a cleanup that is as thread-safe as its LeftoverSystem.

#include <string>
#include <string_view>
#include <vector>

#include "kproxy/backends/common/leftover_system.h"
#include "kproxy/core/error.h"

namespace kproxy::iptables {

/// What one table's cleanup does.
struct IptablesCleanupPlan {
  std::string table;                      ///< "nat", "filter", "mangle", ...
  std::vector<std::string> deletedChains;  ///< flushed and deleted, in save order
  std::vector<std::string> deletedRules;   ///< "CHAIN spec" of each rule removed from other chains
  /// Input for `iptables-restore --noflush`; empty when there is nothing to remove.
  std::string restoreInput;
};

/// Whether a chain of `table` is one kube-proxy (iptables or IPVS mode) creates and removes in
/// its own cleanup.
bool isKubeProxyChain(std::string_view table, std::string_view chain);

/// Pure text transform: `iptables-save` output (any number of tables) in, one plan per table
/// out, in the order the tables appear. Tables with nothing to remove are still listed (with an
/// empty restoreInput) so callers can log them. Output the parser refuses is an error (nothing
/// is removed from a table that was not understood).
core::Result<std::vector<IptablesCleanupPlan>> planIptablesCleanup(std::string_view saveOutput);

/// Removes kube-proxy's chains and the jumps to them from every iptables variant installed and
/// both families (IPv6 only where the namespace has it). Logs each removal (key=value) and each
/// failure as an error; one table's failure does not stop the others. Returns true when
/// everything that was found was removed (nothing found is success).
bool cleanUpIptablesLeftovers(backends::LeftoverSystem& system);

}  // namespace kproxy::iptables
