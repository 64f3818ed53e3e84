#pragma once
/// NftablesBackend: the plugin's logic. Partial syncs render the changed service ports only and
/// diff them against the mirror (no kernel reads); full syncs (first, periodic, after a
/// failure) read the kproxy tables back over netlink, rebuild the mirror from what is really
/// there, render everything and diff. Each sync is one atomic batch; on failure the mirror is
/// left as it was and the next sync is full.
/// Thread-safety: one thread at a time (the plugin ABI guarantees it).

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kproxy/backends/common/reconciler.h"
#include "kproxy/nftables/differ.h"
#include "kproxy/nftables/kernel.h"
#include "kproxy/nftables/renderer.h"
#include "kproxy/plan/snapshot_source.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::nftables {

/// What a sync reads (kproxy/plan/snapshot_source.h): the host's snapshot, or a vector in tests
/// and the benchmark.
using plan::SnapshotSource;
using plan::VectorSnapshot;

struct BackendSettings {
  RenderConfig render;
  /// No conntrack cleanup; the factory then gives the backend a PrintingNftables over an empty
  /// FakeKernelNftables (kernel.h).
  bool dryRun = false;
  /// Where dry-run prints its batches (nft syntax).
  std::FILE* dryRunOutput = stdout;
  /// The first word of the sync summary and of the cleanup's log line ("ebpf-nftables" for the
  /// part ebpf mode composes, whose table is another). Static text.
  std::string_view mode = "nftables";
  /// The tables' name, for the logs (the kernel adapter is given it by the factory). Static text.
  std::string_view table = kTableName;
};

/// Element identities (set, key with identity suffix, interval end) packed in one string:
/// the ownership bookkeeping holds one per element of the table. An element takes its set's
/// index in the family's SetSpecs, a flag byte, the key's length and the key; a balancing
/// chain's whole slot layout takes nine bytes (set, flag, range, number of intervals), its
/// elements being implied by the renderer's layout (slotOffset).
class PackedElements {
 public:
  struct Ref {
    std::uint8_t set = 0;
    bool intervalEnd = false;
    std::string_view key;  ///< valid during the callback only
  };
  void add(std::uint8_t set, bool intervalEnd, std::string_view key);
  /// The 2·K elements of a K-interval layout of slot range `range` in slot map `set`.
  void addLayout(std::uint8_t set, std::uint32_t range, std::uint32_t intervals);
  /// Calls fn(const Ref&) for each element, a layout's in render order (start, end, start…).
  template <typename Fn>
  void forEach(Fn&& fn) const {
    std::string key;
    for (std::size_t i = 0; i + 3 <= bytes_.size();) {
      const auto set = static_cast<std::uint8_t>(bytes_[i]);
      const auto flags = static_cast<std::uint8_t>(bytes_[i + 1]);
      if (flags & kLayout) {
        const std::uint32_t range = u32(i + 2), k = u32(i + 6);
        for (std::uint32_t n = 0; n < k; ++n) {
          slotKey(key, range, slotOffset(n, k), false, k);
          fn(Ref{set, false, key});
          slotKey(key, range, slotOffset(n + 1, k), true, k);
          fn(Ref{set, true, key});
        }
        i += 10;
        continue;
      }
      const auto len = static_cast<std::uint8_t>(bytes_[i + 2]);
      fn(Ref{set, (flags & kEnd) != 0, std::string_view(bytes_).substr(i + 3, len)});
      i += 3 + len;
    }
  }
  void shrink() { bytes_.shrink_to_fit(); }
  std::size_t bytes() const { return bytes_.size(); }

 private:
  static constexpr std::uint8_t kEnd = 1, kLayout = 0x80;
  std::uint32_t u32(std::size_t at) const {
    std::uint32_t v = 0;
    for (std::size_t b = 0; b < 4; ++b) v = v << 8 | static_cast<std::uint8_t>(bytes_[at + b]);
    return v;
  }
  static void slotKey(std::string& out, std::uint32_t range, std::uint32_t offset, bool end, std::uint32_t k);
  std::string bytes_;
};

/// The nftables backend: its full and partial passes under the one reconcile skeleton
/// (backends/common/reconciler.h), which owns the sync around them.
class NftablesBackend final : public backends::Reconciler {
 public:
  NftablesBackend(sdk::Host host, BackendSettings settings, std::unique_ptr<KernelNftables> kernel);

  sdk::Expected<void> cleanup() override;
  /// `kproxy explain`: renders `snapshot` with this backend's settings and traces the packet
  /// (explain.h); reads neither the kernel nor the mirror.
  sdk::Expected<std::string> explain(const sdk::SnapshotView& snapshot,
                                     const sdk::ExplainRequest& request) override;

  /// The ops of the last successful (or dry-run) sync, for tests and the benchmark, when it had
  /// at most kLastOpsKept ops; empty after a bigger one (a full sync's ops would otherwise stay
  /// resident until the next sync, as much memory again as the mirror).
  const std::vector<Op>& lastOps() const { return lastOps_; }
  static constexpr std::size_t kLastOpsKept = 4096;
  const Mirror& mirror() const { return mirror_; }
  /// Wall time of the last batch in the kernel (sendmsg to the last ack), ms.
  double lastApplyMs() const { return lastApplyMs_; }

  /// The metrics this backend keeps on the host's /metrics (inactive ones do nothing).
  struct Metrics {
    /// Gauge kproxy_nftables_objects{family,kind}: chains, sets and set elements in
    /// kproxy's tables after the last successful sync.
    sdk::Metric objects;
    /// Counter kproxy_nftables_kernel_operations_total: objects added, changed or removed by
    /// the batches the kernel accepted.
    sdk::Metric operations;
  };
  /// Registers Metrics with the host (ABI 1.2; inactive on an older host).
  static sdk::Expected<Metrics> registerMetrics(const sdk::Host& host);
  void useMetrics(Metrics metrics) { metrics_ = std::move(metrics); }

 protected:
  sdk::Expected<backends::PassOutcome> fullSync(const SnapshotSource& next) override;
  sdk::Expected<backends::PassOutcome> partialSync(const SnapshotSource& next,
                                                   const std::vector<sdk::ChangedKey>& changed) override;
  /// Another program's transaction touched kproxy's tables since the last sync.
  bool kernelChangedOutside(const std::vector<sdk::ChangedKey>& changed) override;

 private:
  /// One pass: checks the generation, builds a full or a partial sync into a SyncWork, sends
  /// its batch and, once the kernel has accepted it, records what it holds.
  sdk::Expected<backends::PassOutcome> pass(const SnapshotSource& next, const std::vector<sdk::ChangedKey>& changed,
                                            bool full);
  /// Publishes the mirror's object counts and the sync's operations.
  void updateMetrics(std::size_t operations) const;

  struct Owned {
    std::vector<std::string> chains;
    PackedElements elements;
  };
  using OwnerKey = std::pair<net::Family, std::string>;

  /// Ports rendered, diffed and encoded together in a full sync.
  static constexpr std::size_t kFullSyncChunk = 256;
  /// A full sync's second pass, once the kernel holds what the first rendered (`keys` of each
  /// family, in `tables`: the families whose table is wanted and the sets it had): renders
  /// again to build the mirror (plus the `pending` stale chains, empty, those in `pendingBase`
  /// base chains) and the ownership records, so that they never exist beside the batch.
  void rebuildAfterFullSync(const SnapshotSource& next, const sdk::NodeInfo& node,
                            const std::map<net::Family, std::vector<std::string>>& keys,
                            const std::map<net::Family, std::set<std::string>>& tables,
                            const std::map<net::Family, std::set<std::string>>& pending,
                            const std::map<net::Family, std::set<std::string>>& pendingBase);
  /// Sends the batch; on refusal the next sync is full (and a full sync's mirror is dropped).
  sdk::Expected<void> send(KernelBatch& batch, bool full);

  struct SyncWork;
  struct GenerationCheck {
    std::optional<std::uint32_t> before;  ///< the generation before the sync, when known
    bool changedOutside = false;          ///< someone else touched kproxy's tables: sync in full
  };
  GenerationCheck checkGeneration(bool full);
  /// After a sync that started at generation `before`: true when the generation moved by more
  /// than this backend's own commits (the next sync must be full).
  bool checkGenerationAfter(std::uint32_t before, std::uint64_t commitsBefore);
  /// Reads the kernel's tables back (the mirror and the ownership records go first) and fills
  /// the batch, family by family, in chunks of kFullSyncChunk ports.
  sdk::Expected<void> buildFullSync(const SnapshotSource& next, const sdk::NodeInfo& node, SyncWork& work);
  void buildFullSyncFamily(net::Family family, const SnapshotSource& next, const sdk::NodeInfo& node, Mirror& base,
                           SyncWork& work);
  /// What the kernel holds (`mirror`) that no port of the full sync owns: chains not in
  /// `ownedChains`, slot-map elements outside `layouts` (range → intervals), elements of
  /// counted sets without owner, every element of a set kproxy does not declare.
  StaleCandidates staleAfterFullSync(net::Family family, const MirrorFamily& mirror,
                                     const std::unordered_set<std::string>& ownedChains,
                                     const std::unordered_map<std::uint32_t, std::uint32_t>& layouts,
                                     const SyncWork& work) const;
  /// Renders the changed ports only and diffs them against the mirror (no kernel reads).
  void buildPartialSync(const SnapshotSource& next, const sdk::NodeInfo& node,
                        const std::vector<sdk::ChangedKey>& changed, SyncWork& work);
  void buildPartialSyncFamily(net::Family family, const std::vector<std::string>& keys, const SnapshotSource& next,
                              const sdk::NodeInfo& node, SyncWork& work);
  /// Adds to the sync's affinity judge the changed ports (`keys`, now `fragments`) whose
  /// entries may have gone stale.
  void judgeAffinityOfChangedPorts(net::Family family, const std::vector<std::string>& keys,
                                   const std::vector<Fragment>& fragments, SyncWork& work) const;
  /// What the `touched` owners held before and none of them (`newOwned`) holds now, plus the
  /// chains left from earlier syncs.
  StaleCandidates staleAfterPartialSync(net::Family family, const std::vector<OwnerKey>& touched,
                                        const std::vector<std::pair<OwnerKey, Owned>>& newOwned);
  /// The kernel accepted the batch: the mirror, the ownership records and the slot ranges
  /// follow it.
  void recordAcceptedSync(const SnapshotSource& next, const sdk::NodeInfo& node, SyncWork& work, bool full);
  void applyOwnedUpdates(std::map<OwnerKey, std::optional<Owned>>& updates);
  /// After a full sync: the slot ranges read back for chains no port owns are free again.
  void releaseRangesOfUnownedChains();
  /// The pass's outcome: its operations and its fields of the sync summary.
  backends::PassOutcome passOutcome(bool full, std::size_t count, std::size_t changed) const;

  /// Session-affinity entries point at an endpoint; when the endpoint leaves its service (or
  /// the service goes), upstream drops them with the endpoint's affinity set. Here the data
  /// path owns the shared `session-affinity` map, so after a sync kproxy lists it and deletes
  /// the entries whose endpoint is no longer one of their pool's. Entries are keyed by pool ID,
  /// whose high half is the slot range of a balancing chain of the pool's service port (see
  /// affinityPoolId); the judge holds the ranges whose entries it judges and, per pool ID that
  /// exists now, the endpoints that stay valid (ip . port, as the map stores them).
  struct AffinityJudge {
    std::set<std::uint32_t> ranges;
    std::unordered_map<std::uint32_t, std::set<std::string>> valid;
    bool everything = false;  ///< a full sync: entries of no known pool are stale too
    void judge(std::uint32_t range) { ranges.insert(range); }  ///< a range a changed port had
    void add(const Fragment& fragment);  ///< a service port as it is now
    void mergeOlder(const AffinityJudge& older);
  };
  void removeStaleAffinity(net::Family family, AffinityJudge judge);
  /// Whether the port's affinity entries can have gone stale between `old` and `now` (null:
  /// the port went): one of its entry addresses went, or an endpoint left one of its
  /// balancing chains. Additions never make an entry stale.
  bool affinityMayBeStale(net::Family family, const Owned& old, const Fragment* now) const;
  /// The chains and element identities a fragment (or the global objects) owns.
  template <typename Objects>
  Owned ownedOf(net::Family family, const Objects& objects) const;
  /// The index of a set in the family's SetSpecs (the renderer's sets are fixed).
  std::uint8_t setIndex(net::Family family, std::string_view set) const;
  const std::string& setName(net::Family family, std::uint8_t index) const {
    return renderer_.setSpecs(family)[index].name;
  }
  /// Whether the set's elements have owner counts. A slot map's element has exactly one owner
  /// (the chain its range belongs to), so slot maps, most of the table, are not counted.
  bool counted(net::Family family, std::uint8_t set) const { return !renderer_.setSpecs(family)[set].interval; }
  /// An owned element as an Element identity (with its key text, for printing).
  Element identityOf(net::Family family, const PackedElements::Ref& ref) const;
  /// Owner-count key of an element: family, set index and key.
  static std::string elementId(net::Family family, std::uint8_t set, std::string_view key);
  std::map<net::Family, AffinityJudge> pendingAffinity_;  ///< clean-ups that did not go through

  sdk::Host host_;
  BackendSettings settings_;
  NftablesRenderer renderer_;
  std::unique_ptr<KernelNftables> kernel_;
  Mirror mirror_;
  std::map<OwnerKey, Owned> owned_;  ///< per service port (key "" = the global objects)
  /// How many owners each element of a counted set has (elementId → count), packed as the
  /// mirror's elements are.
  class OwnerCounts {
   public:
    void add(std::string_view id);
    void release(std::string_view id);  ///< one owner less (the entry goes at zero)
    std::uint32_t count(std::string_view id) const;
    bool contains(std::string_view id) const { return table_.contains(id); }

   private:
    ElementTable table_;  ///< id → count (4 bytes)
  };
  OwnerCounts elementOwners_;
  std::unordered_map<std::string_view, std::uint8_t> setIndex_[2];
  std::map<net::Family, std::set<std::string>> pendingDelete_;
  /// The generation check kernelChangedOutside made for the partial pass that follows it.
  std::optional<GenerationCheck> checkedGeneration_;
  /// The ruleset generation after this backend's last sync, and how many transactions it has
  /// committed: a generation that moved otherwise means someone else changed nftables.
  std::optional<std::uint32_t> generation_;
  std::uint64_t ownCommits_ = 0;
  std::vector<Op> lastOps_;
  double lastApplyMs_ = 0;
  Metrics metrics_;
};

/// The factory the plugin entry uses (factory.cpp).
sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeNftablesBackend(const sdk::Host& host,
                                                                        const sdk::Options& options);

}  // namespace kproxy::nftables
