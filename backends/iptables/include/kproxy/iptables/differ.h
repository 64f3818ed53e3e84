#pragma once
/// The iptables backend's differ: the chains and rules the renderer wants against what the kernel
/// holds, as `iptables-restore --noflush` input. A full sync reads the tables back
/// (KernelChains) and rewrites the owned chains that differ; a partial sync compares with the
/// mirror of what was applied (IptablesBackend). IPVS mode's iptables part uses the same
/// pieces for its owned chains and jumps.
///
/// Thread-safety: values; one owner each.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/core/error.h"
#include "kproxy/iptables/kernel.h"
#include "kproxy/iptables/renderer.h"

namespace kproxy::iptables {

/// How many changed objects a sync names in its summary.
inline constexpr std::size_t kTouchedKept = 4;

/// FNV-1a of a chain's rules, each ended by a newline: how chains are compared with the kernel
/// and with the mirror.
inline constexpr std::uint64_t kRulesHashBasis = 1469598103934665603ull;
/// The hash `h` of the rules so far, continued by one more rule.
std::uint64_t hashRule(std::uint64_t h, std::string_view rule);
std::uint64_t hashRules(std::span<const std::string> rules);

/// What a sync needs of the kernel's tables, read straight from iptables-save's output: per
/// table and chain, whether it is built in and a hash of its rules; the rules themselves only
/// of built-in and dispatch chains, whose rules are compared one by one. The nat table of
/// 10,000 Services is tens of MB as text and as parsed rules; this keeps a few.
class KernelChains final : public backends::IptablesSaveReader::Sink {
 public:
  struct Chain {
    bool builtin = false;
    bool keepRules = false;
    std::uint64_t hash = kRulesHashBasis;
    std::vector<std::string> rules;  ///< built-in and dispatch chains only
  };

  /// Reads table `table` of `family` with the kernel adapter's iptables-save. An error's context
  /// names the step: "iptables-save -t nat: …" when the tool failed, "reading iptables-save -t
  /// nat: …" when its output was not understood.
  core::Result<void> read(KernelIptables& kernel, net::Family family, Table table);

  const Chain* find(Table t, const std::string& name) const;
  /// The chains of table `t` read so far, by name.
  const std::unordered_map<std::string, Chain>& chains(Table t) const {
    return tables_[static_cast<std::size_t>(t)];
  }
  /// Whether `name` of `t` must be rewritten to hold rules of hash `hash`: it is missing,
  /// built in, or holds other rules.
  bool differs(Table t, const std::string& name, std::uint64_t hash) const;
  /// Whether the built-in chain of `jump` holds it.
  bool holds(const JumpRule& jump) const;

  void table(std::string_view name) override;
  void chain(std::size_t index, backends::IptablesChain chain) override;
  void rule(std::size_t chainIndex, backends::IptablesRule rule) override;

 private:
  std::unordered_map<std::string, Chain> tables_[3];
  std::unordered_map<std::string, Chain>* current_ = nullptr;
  Table table_ = Table::kFilter;
  std::vector<Chain*> byIndex_;  ///< the current table's chains by declaration number
};

/// Restore input for one family, in the order iptables-restore needs: chain declarations
/// (creating or flushing), the rules of rewritten chains, dispatch deletions and insertions,
/// jumps from built-in chains, and last the deletion of chains no longer referenced.
struct RestoreEdit {
  std::string declare[3], rules[3], dispatch[3], jumps[3], remove[3];
  std::size_t operations = 0;
  std::size_t rewrittenRules = 0;    ///< rules and declarations of rewritten chains
  /// Rules written (appended to rewritten chains, inserted), per table, however they reach
  /// the kernel (the tool, or nat chains over netlink): upstream's "rules written in the last
  /// sync".
  std::size_t written[3] = {};
  std::vector<std::string> touched;  ///< the first objects changed, for the sync's summary
  /// With `keepNat` (a partial sync that may go over netlink): the nat chains rewritten, with
  /// their rules, and those deleted.
  bool keepNat = false;
  std::vector<std::pair<std::string, std::vector<std::string>>> natRewrites;
  std::vector<std::string> natDrops;

  /// Whether the edit changes nat chains only, by rewriting or deleting whole chains (no
  /// dispatch rule inserted or deleted, no jump, nothing in filter or mangle).
  bool natChainsOnly() const;

  void note(Table t, std::string what);
  /// Declares (creating or flushing) chain `name` and gives it `chainRules`.
  void rewrite(Table t, const std::string& name, const std::vector<std::string>& chainRules);
  /// Flushes and deletes chain `name`.
  void drop(Table t, const std::string& name);
  /// `-D CHAIN SPEC` of a rule in a chain that stays.
  void deleteRule(Table t, std::string_view chain, std::string_view spec);
  /// `-I CHAIN POSITION SPEC` (1-based), or `-A CHAIN SPEC` when `position` is past the end.
  void insertRule(Table t, std::string_view chain, std::size_t position, std::size_t size, std::string_view spec);
  /// `-I CHAIN 1 SPEC` of a jump from a built-in chain.
  void insertJump(const JumpRule& jump);

  /// The input, tables in `order` (a table with nothing to do is left out); with `natOpen`, the
  /// nat block's header was written already (a streamed full sync) and its end is written
  /// whatever it holds.
  std::string text(std::span<const Table> order = kTables, bool natOpen = false) const;
};

/// Net change of each dispatch rule's owner count over the service ports a partial sync renders.
using DispatchDelta = std::map<DispatchRule, int>;

/// The mirror of what was applied to one family: what partial syncs diff against, never reading
/// the kernel.
struct FamilyMirror {
  /// A shared dispatch chain as applied: how many owners each rule has, its section, and how
  /// many rules each section holds (where an insert goes).
  struct DispatchChain {
    std::unordered_map<std::string, std::pair<std::uint32_t, Section>> refs;
    std::array<std::size_t, kSections> sizes{};
  };
  /// What one service port (or, under "", the global objects) owns.
  struct Owned {
    std::vector<std::pair<Table, std::string>> chains;
    std::vector<DispatchRule> dispatch;
  };
  struct ChainState {
    std::uint64_t hash = 0;  ///< of its rules
    std::uint32_t rules = 0;
  };
  /// Owned chain → its state, per table.
  std::unordered_map<std::string, ChainState> chains[3];
  std::map<std::pair<Table, std::string>, DispatchChain> dispatch;
  std::map<std::string, Owned> owned;  ///< per service port key ("" = the global objects)
  std::size_t rules[3] = {};           ///< rules in owned chains, per table (metrics)
  std::size_t written[3] = {};         ///< rules the last sync wrote, per table (metrics)

  /// What `key` owns now, as rendered: its chains whose rules changed are rewritten in `edit`,
  /// those it no longer owns dropped; its dispatch rules' owner counts change in `delta`.
  void update(const std::string& key, std::vector<ChainRules> wanted, std::vector<DispatchRule> wantedDispatch,
              DispatchDelta& delta, RestoreEdit& edit);
  /// Applies `delta` to the dispatch chains: deletions first (they free positions), then
  /// insertions at the end of their section.
  void applyDispatch(const DispatchDelta& delta, RestoreEdit& edit);
  /// Records a dispatch rule of a full sync's render.
  void addDispatch(const DispatchRule& rule);
};

/// A dispatch chain's rules as a full sync writes it: by section, sorted within each.
std::vector<std::string> dispatchChainRules(const FamilyMirror::DispatchChain& chain);
/// Whether the kernel's `chain` holds exactly the rules of `wanted`, each once, its sections in
/// order (a full sync then keeps it).
bool holdsDispatchChain(const KernelChains::Chain* chain, const FamilyMirror::DispatchChain& wanted);

}  // namespace kproxy::iptables
