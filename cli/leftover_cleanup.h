#pragma once
/// Removal of what kube-proxy's iptables and IPVS modes leave on a node, as upstream's
/// iptables.CleanupLeftovers and ipvs.CleanupLeftovers (called from platformCleanup in
/// cmd/kube-proxy/app/server_linux.go): for `kproxy --cleanup`, and at start-up in nftables
/// mode, so that operators migrating from kube-proxy's iptables or IPVS mode are not left with
/// two proxies' rules. The other way round, cleanUpNftablesLeftovers removes nftables mode's
/// tables.
///
/// What is removed (everything else, including kubelet's KUBE-FIREWALL, KUBE-KUBELET-CANARY and
/// KUBE-MARK-DROP chains and every other program's rules, is kept):
///   - iptables, IPv4 and IPv6, legacy and nft back ends: kube-proxy's fixed chains
///     (iptables and IPVS modes), in nat its per-service chains (KUBE-SVC-, KUBE-SVL-, KUBE-EXT-,
///     KUBE-FW-, KUBE-SEP-, and the older KUBE-XLB-), and every rule elsewhere that jumps to one
///     of them (the jumps from the built-in chains). One `iptables-restore --noflush` per table
///     and family, so each table changes atomically.
///   - IPVS (only where the kernel has it): every virtual server, as upstream's Flush.
///   - the `kube-ipvs0` dummy interface.
///   - ipsets named KUBE-* (when the ipset tool is installed), after iptables no longer refers
///     to them.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::cli {

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

/// Output of a finished command.
struct CommandResult {
  int exitCode = 0;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// The system the cleanup works on: tools, files and processes. The real one runs programs;
/// tests use a fake. Not thread-safe.
class LeftoverSystem {
 public:
  virtual ~LeftoverSystem() = default;
  /// Full path of an executable found in PATH or the sbin directories, if any.
  virtual std::optional<std::string> findTool(std::string_view name) = 0;
  virtual bool pathExists(const std::string& path) = 0;
  /// Runs argv (argv[0] a full path) with `input` on stdin. An error only when it could not run.
  virtual core::Result<CommandResult> run(const std::vector<std::string>& argv, std::string_view input) = 0;
  /// Deletes the nftables table `name` of `family` ("ip" or "ip6") in one netlink transaction;
  /// whether it existed. Never lists the ruleset: `nft list tables` (nft 1.0.6) reads every
  /// rule, which costs seconds of CPU on a node holding iptables-nft's rules (BENCHMARKS.md,
  /// "Figures behind the code"). An error of errno EPROTONOSUPPORT / EAFNOSUPPORT when the
  /// kernel has no nftables.
  virtual core::Result<bool> deleteNftablesTable(std::string_view family, std::string_view name) = 0;
};

/// The real system: backends' process runner (a minute's timeout per command), /proc and /sys.
class RealLeftoverSystem : public LeftoverSystem {
 public:
  std::optional<std::string> findTool(std::string_view name) override;
  bool pathExists(const std::string& path) override;
  core::Result<CommandResult> run(const std::vector<std::string>& argv, std::string_view input) override;
  core::Result<bool> deleteNftablesTable(std::string_view family, std::string_view name) override;
};

/// Removes kube-proxy's iptables, IPVS, kube-ipvs0 and ipset leftovers. Logs each removal
/// (key=value) and each failure as an error; a step that fails does not stop the others.
/// Returns true when everything that was found was removed (nothing found is success), so a
/// second run succeeds and removes nothing.
bool cleanUpKubeProxyLeftovers(LeftoverSystem& system);

/// Removes the nftables mode's tables (`ip kube-proxy` and `ip6 kube-proxy`, kube-proxy's and
/// kproxy's alike), as upstream's nftables.CleanupLeftovers: after the first sync in the
/// iptables-based modes, so that a node switched from nftables mode is not left with two
/// proxies' rules, and for `kproxy --cleanup`. Without nftables in the kernel there is nothing to
/// do (logged at v=2), as upstream. Returns false when a table was found and could not be
/// deleted.
/// With another `table` (the userspace mode's `kproxy-userspace`), removes that one instead:
/// what a node switched away from the userspace mode keeps redirecting otherwise.
bool cleanUpNftablesLeftovers(LeftoverSystem& system, std::string_view table = "kube-proxy");

}  // namespace kproxy::cli
