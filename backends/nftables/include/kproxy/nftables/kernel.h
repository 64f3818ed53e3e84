#pragma once
/// KernelNftables: the only way the nftables backend reaches the kernel. The netlink
/// implementation (libnftnl + libmnl) sits beside an in-memory fake for unit tests, and
/// --dry-run's printing decorator (kernel_printing.cpp) over that fake.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/nftables/differ.h"

namespace kproxy::nftables {

/// One atomic transaction, filled piece by piece and sent by commit(). A full sync appends its
/// ops as it produces them and drops them, so a table's worth of ops is never held at once:
/// only the encoded transaction is.
///
/// The transaction sends ops grouped by phase, in the differ's order: table, sets, chains,
/// flushes and rules; then element deletions; then element additions; then chain deletions.
/// Within a phase, ops keep their append order. So one diff's ops go as they are, and a full
/// sync appended chunk by chunk still adds every rule before any element: binding a rule to a
/// map makes the kernel walk the map's elements, which would make rules after elements
/// quadratic, and every stale interval goes before any new one.
enum class BatchPhase : std::uint8_t { kStructure, kDeleteElements, kAddElements, kDeleteChains };
inline constexpr std::size_t kBatchPhases = 4;
BatchPhase batchPhase(OpKind kind);

class KernelBatch {
 public:
  virtual ~KernelBatch() = default;
  /// Adds `ops` to the transaction (each at the end of its phase); the caller may drop them.
  virtual void append(std::span<const Op> ops) = 0;
  /// Ops appended so far.
  virtual std::size_t size() const = 0;
  /// Sends the transaction, as apply() does. A batch is committed at most once.
  virtual core::Result<void> commit() = 0;
};

class KernelNftables {
 public:
  virtual ~KernelNftables() = default;
  /// Applies `ops` as one atomic transaction. On error nothing changed, and the error's context
  /// names the refused op ("add rule ip kube-proxy X …").
  virtual core::Result<void> apply(const std::vector<Op>& ops) = 0;
  /// A transaction to fill and commit. The default keeps copies of the ops and calls apply();
  /// the netlink kernel encodes each op as it is appended.
  virtual std::unique_ptr<KernelBatch> beginBatch();
  /// Reads both kproxy tables back. `setSpecs` lists the sets whose elements to read
  /// (dynamic sets are skipped: the data path owns their elements).
  virtual core::Result<Mirror> readBack(const std::vector<SetSpec>& ip4Sets,
                                        const std::vector<SetSpec>& ip6Sets) = 0;
  /// Deletes both kproxy tables; a missing table is not an error.
  virtual core::Result<void> deleteTables() = 0;
  /// The elements of one map as (key bytes, data bytes): used for the data path's own
  /// entries (session affinity), which read-back skips. A missing map gives nothing.
  virtual core::Result<std::vector<std::pair<std::string, std::string>>> listMap(net::Family family,
                                                                                 const std::string& map) = 0;
  /// The ruleset generation (NFT_MSG_GETGEN): every transaction committed in the network
  /// namespace, by anyone, moves it on by one. nullopt when this kernel cannot tell.
  virtual core::Result<std::optional<std::uint32_t>> generation() { return std::optional<std::uint32_t>{}; }
  /// Whether a transaction committed by someone else since the last call touched the ip or
  /// ip6 table of this kernel; `until`: the generation whose transaction must have been seen
  /// (when it is known to be someone else's), else what has arrived. nullopt: cannot tell
  /// (then take it as touched). Watches from the first generation() on.
  virtual std::optional<bool> foreignTouched(std::optional<std::uint32_t> /*until*/) { return std::nullopt; }
};

/// The real kernel, over one NETLINK_NETFILTER socket (opened lazily), for the ip and ip6
/// tables named `table` (kproxy's nftables mode; the userspace proxy has a table of its own).
/// Nothing outside those tables is read or written.
std::unique_ptr<KernelNftables> makeNetlinkKernel(std::string_view table = kTableName);

/// An in-memory nftables with the kernel's refusals that matter here (missing objects, busy
/// chains), atomic batches, failure injection and a way to tamper like a foreign tool would.
class FakeKernelNftables : public KernelNftables {
 public:
  struct FakeRule {
    std::uint64_t hash = 0;  ///< 0: added by someone else
    std::vector<std::string> targets;
    std::string text;
    std::optional<std::uint32_t> slotBase{};
  };
  struct FakeChain {
    bool base = false;
    std::vector<FakeRule> rules;
  };
  struct FakeTable {
    std::map<std::string, FakeChain> chains;
    std::map<std::string, SetSpec> sets;
    std::map<std::string, std::map<std::string, std::string>> elements;  ///< set → key → valueText
  };

  core::Result<void> apply(const std::vector<Op>& ops) override;
  core::Result<Mirror> readBack(const std::vector<SetSpec>& ip4Sets,
                                const std::vector<SetSpec>& ip6Sets) override;
  core::Result<void> deleteTables() override;
  core::Result<std::vector<std::pair<std::string, std::string>>> listMap(net::Family family,
                                                                         const std::string& map) override;
  /// Counts the reads (each pass makes one); the fake has no generation to tell.
  core::Result<std::optional<std::uint32_t>> generation() override {
    ++generationReads;
    return std::optional<std::uint32_t>{};
  }

  /// Makes the op at this index of the next batch fail with `errnum` (then clears itself).
  void failNextBatchAt(std::size_t index, int errnum = EINVAL) {
    failAt_ = index;
    failErrno_ = errnum;
  }

  std::map<net::Family, FakeTable> tables;
  /// Entries the data path added to dynamic maps (set → key → data), as listMap returns them.
  std::map<net::Family, std::map<std::string, std::map<std::string, std::string>>> dataPathEntries;
  std::size_t batches = 0;
  std::size_t readBacks = 0;
  std::size_t mapListings = 0;  ///< listMap calls
  std::size_t generationReads = 0;  ///< generation() calls: one per pass
  std::size_t lastBatchSize = 0;

 private:
  std::optional<std::size_t> failAt_;
  int failErrno_ = EINVAL;
};

/// --dry-run: every change in nft syntax, for table `table` (ip and ip6), in the order a kernel
/// transaction sends it (by batch phase), then handed to `inner`, which answers every read: over
/// an empty FakeKernelNftables a dry run plans as on an empty node, and its later syncs see what
/// the earlier ones would have done. `add table ip kube-proxy`, `add element ip kube-proxy
/// service-ips { … }`, `delete table ip kube-proxy`. A change the inner refuses is printed too:
/// the kernel would have been sent it.
class PrintingNftables final : public KernelNftables {
 public:
  PrintingNftables(std::unique_ptr<KernelNftables> inner, std::FILE* out, std::string table = std::string(kTableName));
  core::Result<void> apply(const std::vector<Op>& ops) override;
  /// The inner's transaction; the ops appended are printed when it is committed.
  std::unique_ptr<KernelBatch> beginBatch() override;
  core::Result<Mirror> readBack(const std::vector<SetSpec>& ip4Sets, const std::vector<SetSpec>& ip6Sets) override {
    return inner_->readBack(ip4Sets, ip6Sets);
  }
  core::Result<void> deleteTables() override;
  core::Result<std::vector<std::pair<std::string, std::string>>> listMap(net::Family family,
                                                                         const std::string& map) override {
    return inner_->listMap(family, map);
  }
  core::Result<std::optional<std::uint32_t>> generation() override { return inner_->generation(); }
  std::optional<bool> foreignTouched(std::optional<std::uint32_t> until) override {
    return inner_->foreignTouched(until);
  }

 private:
  std::unique_ptr<KernelNftables> inner_;
  std::FILE* out_;
  std::string table_;
};

}  // namespace kproxy::nftables
