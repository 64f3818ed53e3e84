#pragma once
/// Mirror (what kproxy believes the kernel holds in its tables), Op (one kernel change) and
/// NftablesDiffer (desired objects vs. mirror → ordered ops).
///
/// Granularity: a chain whose rules differ is flushed and refilled; map/set elements are diffed
/// one by one. A chain that is no longer wanted is first flushed (and its elements removed) and
/// deleted by a later sync once nothing references it: kernels before 6.2 can refuse deleting a
/// chain whose referencing map element is deleted in the same batch.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <utility>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kproxy/nftables/ir.h"

namespace kproxy::nftables {

struct MirrorChain {
  bool base = false;
  std::vector<std::uint64_t> rules;  ///< rule hashes in order; 0 = a rule kproxy did not add
  std::vector<std::string> targets;  ///< chains the rules jump/go to (with repetition)
  std::optional<std::uint32_t> slotBase;  ///< the slot range its DnatFromSlots rule uses
  /// Records `rule` (with identity `hash`) appended to the chain.
  void addRule(std::uint64_t hash, const Rule& rule);
};

/// One set's elements as the mirror records them: key bytes → value text. Records sit in one
/// byte arena ([key length][value length][key][value]) under an open-addressing index, about
/// 30 bytes an element where a node-based map takes over 100: the elements of a big table are
/// most of what the backend keeps between syncs. Iteration order is unspecified. Views handed
/// out (find, at, iteration) stay valid until the table is next modified.
class ElementTable {
 public:
  using value_type = std::pair<std::string_view, std::string_view>;

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = ElementTable::value_type;
    using difference_type = std::ptrdiff_t;
    using pointer = const value_type*;
    using reference = const value_type&;
    const_iterator() = default;
    reference operator*() const { return current_; }
    pointer operator->() const { return &current_; }
    const_iterator& operator++() {
      slot_ = table_->nextOccupied(slot_ + 1);
      load();
      return *this;
    }
    const_iterator operator++(int) {
      auto was = *this;
      ++*this;
      return was;
    }
    bool operator==(const const_iterator& o) const { return slot_ == o.slot_; }

   private:
    friend class ElementTable;
    const_iterator(const ElementTable* table, std::size_t slot) : table_(table), slot_(slot) { load(); }
    void load() {
      if (slot_ < table_->slots_.size()) current_ = table_->record(table_->slots_[slot_] - 2);
    }
    const ElementTable* table_ = nullptr;
    std::size_t slot_ = 0;
    value_type current_;
  };

  const_iterator begin() const { return const_iterator(this, nextOccupied(0)); }
  const_iterator end() const { return const_iterator(this, slots_.size()); }
  const_iterator find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != end(); }
  /// The value of `key`; throws std::out_of_range when absent.
  std::string_view at(std::string_view key) const;
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  /// Sets the value of `key`, adding it if new.
  void set(std::string_view key, std::string_view value);
  /// Removes `key`; false when it was absent.
  bool erase(std::string_view key);
  /// Drops dead records and spare capacity (after a full sync built the table).
  void shrink() {
    if (!slots_.empty()) rebuild(slots_.size());
  }

 private:
  std::size_t slotOf(std::string_view key) const;  ///< its slot, or slots_.size()
  std::size_t nextOccupied(std::size_t from) const;
  value_type record(std::uint32_t offset) const;
  std::size_t recordSize(std::uint32_t offset) const;
  void rebuild(std::size_t capacity);  ///< re-indexes (and compacts) into `capacity` slots

  std::string arena_;
  std::vector<std::uint32_t> slots_;  ///< 0 empty, 1 removed, else record offset + 2
  std::size_t size_ = 0;
  std::size_t removed_ = 0;  ///< slots marked removed
  std::size_t garbage_ = 0;  ///< arena bytes of removed or replaced records
};

/// What one family's kproxy table holds. Elements are keyed by their kernel bytes; the value is
/// the verdict text ("goto service-…", "drop"), empty for plain sets.
struct MirrorFamily {
  bool tableExists = false;
  std::unordered_map<std::string, MirrorChain> chains;
  std::set<std::string> sets;
  std::unordered_map<std::string, ElementTable> elements;
  /// How many rules and elements reference each chain.
  std::unordered_map<std::string, std::uint32_t> references;

  bool empty() const { return !tableExists && chains.empty() && sets.empty(); }
  /// Recomputes `references` from chains and elements (after read-back).
  void rebuildReferences();
};

struct Mirror {
  MirrorFamily ip;
  MirrorFamily ip6;
  MirrorFamily& of(net::Family f) { return f == net::Family::kIPv4 ? ip : ip6; }
  const MirrorFamily& of(net::Family f) const { return f == net::Family::kIPv4 ? ip : ip6; }
};

enum class OpKind : std::uint8_t {
  kAddTable,
  kAddSet,
  kAddChain,
  kFlushChain,
  kAddRule,
  kDeleteElement,
  kAddElement,
  kDeleteChain,
};

/// One kernel change. Owns what it needs to be encoded and printed.
///
/// A full sync holds one Op per rule of the table (hundreds of thousands at scale), so the rare
/// payloads (set declarations, base hooks, elements) sit behind pointers: an Op is ~100 bytes
/// plus its rule, not the ~440 bytes it would be with every payload inline.
struct Op {
  OpKind kind = OpKind::kAddTable;
  net::Family family = net::Family::kIPv4;
  std::uint64_t ruleHash = 0;                ///< kAddRule
  std::string name;                          ///< chain or set
  Rule rule;                                 ///< kAddRule
  std::shared_ptr<const BaseHook> base;      ///< kAddChain of a base chain
  std::shared_ptr<const SetSpec> set;        ///< kAddSet
  std::shared_ptr<const Element> element;    ///< kAddElement / kDeleteElement

  /// One line of nft syntax that `nft -f` accepts, e.g. "add rule ip kube-proxy services …",
  /// for the ops of `table` (another backend's own table, e.g. the userspace proxy's).
  std::string toText(std::string_view table = kTableName) const;
};

/// Applies successful ops to a mirror (after the kernel accepted the batch).
void applyToMirror(Mirror& mirror, const std::vector<Op>& ops);

/// The desired objects of one family for the scope of this sync.
struct DesiredFamily {
  std::span<const SetSpec> sets;  ///< the renderer's (they outlive the diff)
  std::vector<Chain*> chains;
  std::vector<Element*> elements;
  /// The caller hands the rules of `chains` and the elements over: ops take them by move
  /// instead of by copy (a full sync would otherwise hold everything twice). The chains' rule
  /// lists and the added elements are left moved-from; only chain names and hooks stay
  /// meaningful.
  bool moveRules = false;
};

/// Objects outside `desired` that this sync must consider removing.
struct StaleCandidates {
  /// Full sync: every mirror object not desired (chains, elements of non-dynamic sets).
  bool everythingNotDesired = false;
  /// Partial sync: chains and elements that changed service ports owned before.
  std::set<std::string> chains;
  std::vector<Element> elements;  ///< set + key (+ keyText for printing); may repeat
};

struct DiffResult {
  std::vector<Op> ops;
  /// Chains flushed because no longer wanted: delete them in a later sync.
  std::set<std::string> pendingDelete;
};

class NftablesDiffer {
 public:
  /// Ops turning `mirror` (one family) into `desired` within the scope. `setSpecs` decodes
  /// read-back keys for printing. Ops come in kernel-safe order: table, sets, chains, flushes,
  /// rules, element deletions, element additions, chain deletions.
  static DiffResult diff(net::Family family, const DesiredFamily& desired, const MirrorFamily& mirror,
                         const StaleCandidates& stale, const std::vector<SetSpec>& setSpecs);
};

}  // namespace kproxy::nftables
