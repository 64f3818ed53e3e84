#pragma once
/// IptablesBackend: --proxy-mode=iptables. Renders upstream kube-proxy's chains through the
/// shared service plan and changes the kernel with `iptables-restore --noflush`, one input per
/// family (each table commits on its own).
///
/// Partial syncs never read the kernel: a mirror of what was applied (a hash of each owned
/// chain's rules, the reference counts of the dispatch rules, and what each service port owns)
/// tells which of the changed service ports' chains differ. Only those chains are rewritten;
/// a dispatch chain (KUBE-SERVICES, KUBE-NODEPORTS, ...) is never rewritten by a partial sync,
/// its rules are inserted (`-I CHAIN N`, at the end of their section) and deleted (`-D`) one
/// by one, so an endpoint change touches the service's KUBE-SVC / KUBE-SEP chains only and a
/// new service adds a handful of lines. Full syncs (first, hourly, after a failure, when the
/// canary chain has gone) read the tables back with iptables-save and repair what differs;
/// over an unchanged kernel they write nothing. A refused restore leaves the mirror as it was
/// and makes the next sync full.
///
/// Thread-safety: one thread at a time (the plugin ABI guarantees it).

#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kproxy/backends/common/reconciler.h"
#include "kproxy/iptables/differ.h"
#include "kproxy/iptables/kernel.h"
#include "kproxy/iptables/kernel_netlink.h"
#include "kproxy/iptables/renderer.h"
#include "kproxy/kernel/nfacct.h"
#include "kproxy/kernel/sysctl.h"
#include "kproxy/plan/snapshot_source.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::iptables {

struct BackendSettings {
  RenderConfig render;
  /// No conntrack cleanup; the factory then gives the backend printers over fakes
  /// (PrintingIptables, kernel::PrintingSysctls).
  bool dryRun = false;
  std::FILE* dryRunOutput = stdout;
  /// Program IPv6 (ip6tables) too; off when the kernel has no IPv6 or no ip6tables exists.
  bool ipv6 = true;
  /// lastRestore() keeps inputs up to this size (bytes); a bigger full sync's would otherwise
  /// stay resident until the next sync, as much memory again as the text the tool read.
  std::size_t lastRestoreKept = 4u << 20;
  /// iptables-nft: a full sync writes the service ports' nat chains over netlink (NftRuleBatch)
  /// rather than through iptables-nft-restore, in transactions of whole service ports of about
  /// this many rules: the tool's parse of the text and its commit per chunk are what a full
  /// sync through it costs. Why this size: BENCHMARKS.md, "Figures behind the code".
  bool netlinkRules = true;
  std::size_t netlinkBatchRules = 10000;
  /// With a variant whose commits replace whole tables (iptables-legacy), a full sync that
  /// leaves at least this many xt_recent lists (session-affinity endpoints) warns once: the
  /// kernel looks each `-m recent` rule's list up by a linear search on every replace, so every
  /// change costs about the square of the lists. Measured: BENCHMARKS.md, "Figures behind the
  /// code".
  std::size_t recentListsWarning = 5000;
};

/// The iptables backend: its full and partial passes under the one reconcile skeleton
/// (backends/common/reconciler.h), which owns the sync around them.
class IptablesBackend final : public backends::Reconciler {
 public:
  /// `sysctls`: where route_localnet is set (kernel::makeFileSysctls() on a node).
  IptablesBackend(sdk::Host host, BackendSettings settings, std::unique_ptr<KernelIptables> kernel,
                  std::unique_ptr<kernel::Sysctls> sysctls);

  sdk::Expected<void> cleanup() override;
  /// `kproxy explain`: renders `snapshot` with this backend's settings and traces the packet
  /// (explain.h); reads neither the kernel nor the mirror.
  sdk::Expected<std::string> explain(const sdk::SnapshotView& snapshot, const sdk::ExplainRequest& request) override;

  /// The restore input of the last sync per family (empty when it wrote nothing, or when it
  /// was bigger than BackendSettings::lastRestoreKept).
  const std::string& lastRestore(net::Family family) const { return lastRestore_[index(family)]; }
  /// Owned chains in the mirror, per family.
  std::size_t mirroredChains(net::Family family) const;
  /// Rules in kproxy's chains of `table` as the mirror counts them (kproxy_iptables_rules).
  std::size_t mirroredRules(net::Family family, Table table) const {
    return mirror_[index(family)].rules[index(table)];
  }
  /// Rules the last sync wrote to `table` (kproxy_iptables_rules_last_sync).
  std::size_t writtenRules(net::Family family, Table table) const {
    return mirror_[index(family)].written[index(table)];
  }

  struct Metrics {
    sdk::Metric rules;            ///< gauge kproxy_iptables_rules{family,table}
    sdk::Metric lastSync;         ///< gauge kproxy_iptables_rules_last_sync{family,table}
    sdk::Metric restoreFailures;  ///< counter kproxy_iptables_restore_failures_total{family}
  };
  static sdk::Expected<Metrics> registerMetrics(const sdk::Host& host);
  void useMetrics(Metrics metrics) { metrics_ = std::move(metrics); }
  /// Where upstream's nfacct objects are made (none: the kernel has no nfacct, and the rules
  /// count into none). Each full sync ensures both, and the rules count into those that exist.
  void useNfacct(std::unique_ptr<kernel::Nfacct> nfacct) { nfacct_ = std::move(nfacct); }
  /// The nfacct objects the rules count into (after a full sync).
  const NfacctObjects& nfacctObjects() const { return renderer_.nfacct(); }

 protected:
  sdk::Expected<backends::PassOutcome> fullSync(const plan::SnapshotSource& next) override;
  sdk::Expected<backends::PassOutcome> partialSync(const plan::SnapshotSource& next,
                                                   const std::vector<sdk::ChangedKey>& changed) override;
  /// The canary: on a periodic sync (nothing changed), whether a table lost KUBE-PROXY-CANARY,
  /// i.e. was flushed behind kproxy's back (upstream's iptables monitor).
  bool kernelChangedOutside(const std::vector<sdk::ChangedKey>& changed) override;

 private:
  static std::size_t index(net::Family f) { return f == net::Family::kIPv6 ? 1 : 0; }
  static std::size_t index(Table t) { return static_cast<std::size_t>(t); }

  // The differ (differ.cpp).
  /// A full sync's owned chains, written to the tool while rendered.
  class StreamedChains;

  /// What every pass does first: the renderer learns the node (and, in a full pass, whether
  /// the cluster is large), the pass's counters start at zero.
  void beginPass(const plan::SnapshotSource& next, bool full);
  /// Renders and applies a full sync of `family`: the mirror it leaves in `out`, what it wrote
  /// in `input` (when it fits settings_.lastRestoreKept).
  sdk::Expected<void> fullSyncFamily(const plan::SnapshotSource& next, net::Family family, FamilyMirror& out,
                                     std::string& input, std::size_t& operations);
  void partialSyncFamily(const plan::SnapshotSource& next, net::Family family,
                         const std::vector<std::string>& keys, FamilyMirror& mirror, RestoreEdit& edit,
                         std::size_t& operations);
  /// The pass's outcome: its operations and its fields of the sync summary (the variant, what
  /// went over netlink, the tools' CPU, and after a full pass the first changes).
  backends::PassOutcome passOutcome(bool full, std::size_t operations);

  sdk::Expected<void> apply(net::Family family, const std::string& input);
  /// Applies a partial sync's edit (`input`, its text): over netlink when it only rewrites or
  /// deletes nat chains and the kernel adapter allows it, else through the tool.
  sdk::Expected<void> applyPartial(net::Family family, const RestoreEdit& edit, const std::string& input);
  /// Counts a refused restore and names the tool in its error.
  sdk::Expected<void> restoreFailed(net::Family family, const core::Error& e);
  /// Counts a refused netlink transaction; when the kernel refused the encoding itself, later
  /// syncs use the tool only.
  sdk::Expected<void> netlinkFailed(net::Family family, const core::Error& e);
  /// Commits `batch` on the backend's netfilter socket, opened on first use and kept: closing
  /// one after a commit waits for the kernel to release what the commit replaced.
  core::Result<void> commitOverNetlink(NftRuleBatch& batch);
  /// After a full sync: warns once when settings_.recentListsWarning applies (and again after
  /// the count has fallen below it and risen back).
  void warnAboutRecentLists();
  /// Whether this sync may write nat chains over netlink (NftRuleBatch).
  bool netlinkAllowed() { return settings_.netlinkRules && !netlinkRefused_ && kernel_->netlinkRules(); }
  bool familyEnabled(net::Family family) const { return family == net::Family::kIPv4 || settings_.ipv6; }
  void setRouteLocalnet();
  /// Upstream's full sync step: creates the nfacct objects that do not exist yet, and has the
  /// renderer count into those that do.
  void ensureNfacct();
  void updateMetrics() const;

  sdk::Host host_;
  BackendSettings settings_;
  IptablesRenderer renderer_;
  std::unique_ptr<KernelIptables> kernel_;
  std::unique_ptr<kernel::Sysctls> sysctls_;
  std::unique_ptr<kernel::Nfacct> nfacct_;
  FamilyMirror mirror_[2];
  std::string lastRestore_[2];
  std::vector<std::string> touched_;  ///< the first objects the current sync changed
  bool netlinkRefused_ = false;       ///< the kernel refused NftRuleBatch's encoding once
  std::optional<kernel::NetlinkSocket> netlinkSocket_;  ///< for NftRuleBatch's transactions
  std::size_t netlinkRules_ = 0, netlinkCommits_ = 0;  ///< of the current sync
  std::size_t recentLists_ = 0;  ///< xt_recent lists the current full sync rendered
  bool recentWarned_ = false;    ///< warnAboutRecentLists() has warned for the current count
  Metrics metrics_;
};

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeIptablesBackend(const sdk::Host& host,
                                                                        const sdk::Options& options);

}  // namespace kproxy::iptables
