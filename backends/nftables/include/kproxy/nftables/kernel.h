#pragma once
/// KernelNftables: the only way the nftables backend reaches the kernel. The netlink
/// implementation (libnftnl + libmnl) sits beside an in-memory fake for unit tests.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/nftables/differ.h"

namespace kproxy::nftables {

class KernelNftables {
 public:
  virtual ~KernelNftables() = default;
  /// Applies `ops` as one atomic transaction. On error nothing changed, and the error's context
  /// names the refused op ("add rule ip kube-proxy X …").
  virtual core::Result<void> apply(const std::vector<Op>& ops) = 0;
  /// Reads both kproxy tables back. `setSpecs` lists the sets whose elements to read
  /// (dynamic sets are skipped: the data path owns their elements).
  virtual core::Result<Mirror> readBack(const std::vector<SetSpec>& ip4Sets,
                                        const std::vector<SetSpec>& ip6Sets) = 0;
  /// Deletes both kproxy tables; a missing table is not an error.
  virtual core::Result<void> deleteTables() = 0;
  /// The elements of one map as (key bytes, data bytes): used for the data path's own
  /// entries (session affinity), which read-back skips. A missing map gives nothing.
  virtual core::Result<std::vector<std::pair<std::string, std::string>>> listMap(Family family,
                                                                                 const std::string& map) = 0;
};

/// The real kernel, over one NETLINK_NETFILTER socket (opened lazily).
std::unique_ptr<KernelNftables> makeNetlinkKernel();

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
  core::Result<std::vector<std::pair<std::string, std::string>>> listMap(Family family,
                                                                         const std::string& map) override;

  /// Makes the op at this index of the next batch fail (then clears itself).
  void failNextBatchAt(std::size_t index) { failAt_ = index; }

  std::map<Family, FakeTable> tables;
  /// Entries the data path added to dynamic maps (set → key → data), as listMap returns them.
  std::map<Family, std::map<std::string, std::map<std::string, std::string>>> dataPathEntries;
  std::size_t batches = 0;
  std::size_t readBacks = 0;
  std::size_t mapListings = 0;  ///< listMap calls
  std::size_t lastBatchSize = 0;

 private:
  std::optional<std::size_t> failAt_;
};

}  // namespace kproxy::nftables
