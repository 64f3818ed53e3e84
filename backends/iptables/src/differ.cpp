// The differ: rendered chains against the kernel read back (full syncs, streamed to the tool and
// over netlink while rendered) or against the mirror (partial syncs), as restore input.
#include "kproxy/iptables/differ.h"

#include <algorithm>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <span>

#include <fmt/format.h>

#include "kproxy/iptables/backend.h"
#include "kproxy/iptables/kernel_netlink.h"
#include "tool_errors.h"

namespace kproxy::iptables {
namespace {

/// The order of a streamed full sync's input: its nat block is open first.
constexpr Table kNatFirst[] = {Table::kNat, Table::kFilter, Table::kMangle};

std::size_t index(Table t) { return static_cast<std::size_t>(t); }

bool isDispatchChain(Table t, std::string_view name) {
  for (const auto& [table, chain] : dispatchChainNames())
    if (table == t && chain == name) return true;
  return false;
}

}  // namespace

std::uint64_t hashRule(std::uint64_t h, std::string_view rule) {
  for (unsigned char ch : rule) h = (h ^ ch) * 1099511628211ull;
  return (h ^ '\n') * 1099511628211ull;
}

std::uint64_t hashRules(std::span<const std::string> rules) {
  std::uint64_t h = kRulesHashBasis;
  for (const auto& r : rules) h = hashRule(h, r);
  return h;
}

// ---- the kernel's tables ----

core::Result<void> KernelChains::read(KernelIptables& kernel, net::Family family, Table table) {
  backends::IptablesSaveReader reader(*this);
  core::Result<void> read;
  auto saved = kernel.saveTo(family, table, [&](std::string_view piece) {
    if (read) read = reader.feed(piece);
  });
  auto step = [&](const core::Error& e, std::string_view what) {
    return core::makeError(
        e.category, fmt::format("{}{}-save -t {}: {}", what, toolName(family), tableName(table), e.context),
        e.errnum);
  };
  if (!saved) return step(saved.error(), "");
  if (read) read = reader.finish();
  if (!read) return step(read.error(), "reading ");
  return {};
}

const KernelChains::Chain* KernelChains::find(Table t, const std::string& name) const {
  const auto& m = tables_[index(t)];
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

bool KernelChains::differs(Table t, const std::string& name, std::uint64_t hash) const {
  const Chain* k = find(t, name);
  return k == nullptr || k->builtin || k->hash != hash;
}

bool KernelChains::holds(const JumpRule& jump) const {
  const Chain* k = find(jump.table, jump.chain);
  return k != nullptr && std::find(k->rules.begin(), k->rules.end(), jump.spec) != k->rules.end();
}

void KernelChains::table(std::string_view name) {
  byIndex_.clear();
  const std::optional<Table> t = tableNamed(name);
  current_ = t ? &tables_[index(*t)] : nullptr;
  if (t) table_ = *t;
}

void KernelChains::chain(std::size_t index, backends::IptablesChain chain) {
  if (byIndex_.size() <= index) byIndex_.resize(index + 1, nullptr);
  if (current_ == nullptr) return;
  Chain& c = (*current_)[chain.name];
  c.builtin = chain.builtin();
  c.keepRules = c.builtin || isDispatchChain(table_, chain.name);
  byIndex_[index] = &c;
}

void KernelChains::rule(std::size_t chainIndex, backends::IptablesRule rule) {
  Chain* c = chainIndex < byIndex_.size() ? byIndex_[chainIndex] : nullptr;
  if (c == nullptr) return;
  c->hash = hashRule(c->hash, rule.spec);
  if (c->keepRules) c->rules.push_back(std::move(rule.spec));
}

// ---- restore input ----

bool RestoreEdit::natChainsOnly() const {
  if (!keepNat || (natRewrites.empty() && natDrops.empty())) return false;
  for (Table t : kTables) {
    const auto i = index(t);
    if (!dispatch[i].empty() || !jumps[i].empty()) return false;
    if (t != Table::kNat && (!declare[i].empty() || !remove[i].empty())) return false;
  }
  return true;
}

void RestoreEdit::note(Table t, std::string what) {
  if (touched.size() < kTouchedKept) touched.push_back(fmt::format("{} {}", tableName(t), what));
}

void RestoreEdit::rewrite(Table t, const std::string& name, const std::vector<std::string>& chainRules) {
  declare[index(t)] += fmt::format(":{} - [0:0]\n", name);
  for (const auto& r : chainRules) rules[index(t)] += fmt::format("-A {} {}\n", name, r);
  ++operations;
  rewrittenRules += chainRules.size() + 1;
  written[index(t)] += chainRules.size();
  note(t, "chain " + name);
  if (keepNat && t == Table::kNat) natRewrites.emplace_back(name, chainRules);
}

void RestoreEdit::drop(Table t, const std::string& name) {
  declare[index(t)] += fmt::format(":{} - [0:0]\n", name);
  remove[index(t)] += fmt::format("-X {}\n", name);
  if (keepNat && t == Table::kNat) natDrops.push_back(name);
  ++operations;
  note(t, "chain " + name + " (deleted)");
}

void RestoreEdit::deleteRule(Table t, std::string_view chain, std::string_view spec) {
  dispatch[index(t)] += fmt::format("-D {} {}\n", chain, spec);
  ++operations;
}

void RestoreEdit::insertRule(Table t, std::string_view chain, std::size_t position, std::size_t size,
                             std::string_view spec) {
  if (position > size)
    dispatch[index(t)] += fmt::format("-A {} {}\n", chain, spec);
  else
    dispatch[index(t)] += fmt::format("-I {} {} {}\n", chain, position, spec);
  ++operations;
  ++written[index(t)];
}

void RestoreEdit::insertJump(const JumpRule& jump) {
  jumps[index(jump.table)] += fmt::format("-I {} 1 {}\n", jump.chain, jump.spec);
  ++operations;
  ++written[index(jump.table)];
  note(jump.table, "rule -A " + jump.chain + " " + jump.spec);
}

std::string RestoreEdit::text(std::span<const Table> order, bool natOpen) const {
  std::string out;
  for (Table t : order) {
    const auto i = index(t);
    const bool open = natOpen && t == Table::kNat;
    if (!open && declare[i].empty() && rules[i].empty() && dispatch[i].empty() && jumps[i].empty() &&
        remove[i].empty())
      continue;
    if (!open) out += fmt::format("*{}\n", tableName(t));
    out += declare[i];
    out += rules[i];
    out += dispatch[i];
    out += jumps[i];
    out += remove[i];
    out += "COMMIT\n";
  }
  return out;
}

// ---- full syncs: streamed to the tool and over netlink ----

/// The owned nat chains of a full sync, handed to iptables-restore while the rest is still being
/// rendered, so that the tool and the renderer use both cores. Without a chunk limit
/// (iptables-legacy, which replaces the whole table on every commit), one nat block is
/// streamed into the tool as it is rendered and the rest of the full sync's input completes
/// it. With one (iptables-nft), each chunk of whole service ports is a restore of its own: the
/// tool parses and commits chunk k while chunk k+1 is rendered, and chunk k+1 starts once chunk
/// k is committed. Chains of the other tables go to the rest. In dry-run, each restore input
/// is printed instead.
///
/// With iptables-nft and `netlink` on, the service ports' chains skip the tool: the fixed
/// chains (the first "port", which also makes iptables-nft create the nat table) are restored
/// and committed first, then the service ports' chains, and after them the nat dispatch
/// chains, are encoded as the tool would encode them (NftRuleBatch) and committed in
/// transactions of whole service ports of about BackendSettings::netlinkBatchRules rules. A
/// port whose rules the encoder does not write goes to the tool, after the transactions before
/// it, and so does the rest of the sync. The rest (the filter table, the jumps from the
/// built-in chains, stale chains' deletion) is the tool's, after the last transaction.
class IptablesBackend::StreamedChains {
 public:
  /// `chunkRules`: KernelIptables::restoreChunkRules.
  StreamedChains(IptablesBackend& backend, net::Family family, std::size_t chunkRules, bool netlink)
      : backend_(backend), family_(family), chunkRules_(chunkRules), netlinkWanted_(netlink) {}
  ~StreamedChains() {
    // Abandoned after a failure: the open restore ends without COMMIT, so the tool applies
    // nothing of it; a committed chunk still running is waited for.
    if (tool_) (void)tool_->finish();
    if (pending_) (void)pending_->finish();
  }

  /// Rewrites chain `name` with `rules`: streamed when in nat (at portDone), else added to
  /// `rest`. Over netlink, `rules` must stay valid until portDone.
  void rewrite(Table t, const std::string& name, const std::vector<std::string>& rules, RestoreEdit& rest) {
    if (t != Table::kNat) {
      rest.rewrite(t, name, rules);
      return;
    }
    ++operations;
    rest.written[index(t)] += rules.size();
    if (touched.size() < kTouchedKept) touched.push_back("nat chain " + name);
    if (batch_) {
      port_.push_back(Pending{name, rules});
      return;
    }
    addText(name, rules);
  }

  /// After each service port (and the fixed chains): its chains are written, declared before
  /// their rules (the tools take `-j CHAIN` only for a chain declared above); a chunk that is
  /// full is committed.
  void portDone() {
    if (error_) {
      // The sync has failed; nothing more is written, so nothing more is held.
      port_.clear();
      declare_.clear();
      rules_.clear();
      buffer_.clear();
      chunkSize_ = 0;
      return;
    }
    if (batch_ && !port_.empty()) {
      std::vector<NftChainRewrite> chains;
      chains.reserve(port_.size());
      for (const auto& c : port_) chains.push_back({c.name, c.rules});
      // A transaction holds about netlinkBatchRules rules, or one port's if it has more (the
      // nat dispatch chains): its messages are what a full sync holds in memory.
      std::size_t incoming = 0;
      for (const auto& c : port_) incoming += c.rules.size();
      if (!batch_->empty() && batch_->rules() + incoming > backend_.settings_.netlinkBatchRules) commitBatch();
      const bool first = batch_->empty();
      auto added = batch_->add(chains);
      if (added) {
        if (keeping_) {
          if (first) keep("*nat\n");
          for (const auto& c : port_) addText(c.name, c.rules);
          keep(declare_ + rules_);
          declare_.clear();
          rules_.clear();
          chunkSize_ = 0;  // kept, not restored
        }
        port_.clear();
        return;
      }
      // The tool writes this port and everything after it, after what is in the batch.
      backend_.host_.warning(fmt::format("iptables: {}; restoring it and the rest of the sync with {}-restore",
                                         added.error().message(), toolName(family_)));
      commitBatch();
      batch_.reset();
      for (const auto& c : port_) addText(c.name, c.rules);
      port_.clear();
    }
    if (!declare_.empty()) {
      if (!error_.has_value() && !open_) open();
      buffer_ += declare_;
      buffer_ += rules_;
      declare_.clear();
      rules_.clear();
      if (chunkRules_ == 0 && buffer_.size() >= kWriteSize) send();
    }
    if (chunkRules_ != 0 && chunkSize_ >= chunkRules_) commit();
    if (netlinkWanted_) {
      // The fixed chains are committed (the nat table exists); the ports go over netlink.
      netlinkWanted_ = false;
      commit();
      waitPending();
      if (!error_) {
        batch_.emplace(family_);
        batch_->reserve(backend_.settings_.netlinkBatchRules + backend_.settings_.netlinkBatchRules / 8);
      }
    }
  }

  /// The rest of the full sync's input: appended to the open nat block (no chunk limit), or
  /// restored on its own after the last chunk.
  sdk::Expected<void> finish(const RestoreEdit& rest) {
    portDone();
    commitBatch();
    if (chunkRules_ != 0) commit();
    waitPending();
    if (error_) return std::unexpected(*error_);
    const bool natOpen = open_;
    buffer_ += rest.text(natOpen ? std::span<const Table>(kNatFirst) : std::span<const Table>(kTables), natOpen);
    if (!natOpen && buffer_.empty()) return {};
    if (!natOpen) startTool();
    open_ = false;
    close();
    if (error_) return std::unexpected(*error_);
    return {};
  }

  /// Whether nat chains go over netlink now (after the fixed chains, until a refusal).
  bool overNetlink() const { return batch_.has_value(); }

  /// What was written, when it fits BackendSettings::lastRestoreKept (else empty).
  std::string kept;
  std::size_t operations = 0;
  std::vector<std::string> touched;  ///< the first chains written
  std::size_t netlinkRules = 0, netlinkCommits = 0;

 private:
  static constexpr std::size_t kWriteSize = 256 * 1024;

  struct Pending {
    std::string name;
    std::span<const std::string> rules;
  };

  void addText(std::string_view name, std::span<const std::string> rules) {
    declare_ += fmt::format(":{} - [0:0]\n", name);
    for (const auto& r : rules) rules_ += fmt::format("-A {} {}\n", name, r);
    chunkSize_ += rules.size() + 1;
  }
  void keep(std::string_view text) {
    if (keeping_ && kept.size() + text.size() <= backend_.settings_.lastRestoreKept) {
      kept += text;
    } else if (keeping_) {
      keeping_ = false;
      std::string().swap(kept);
    }
  }
  /// Commits the netlink batch, if any, as one transaction.
  void commitBatch() {
    if (!batch_ || batch_->empty() || error_) return;
    keep("COMMIT\n");
    const std::size_t rules = batch_->rules();
    if (auto r = backend_.commitOverNetlink(*batch_); !r) {
      error_ = backend_.netlinkFailed(family_, r.error()).error();
      return;
    }
    netlinkRules += rules;
    ++netlinkCommits;
  }

  /// Starts a nat block: streamed into a tool started now, or (chunks) collected until commit.
  void open() {
    if (chunkRules_ == 0) startTool();
    open_ = true;
    buffer_ += "*nat\n";
  }
  void startTool() {
    if (error_) return;
    auto started = backend_.kernel_->startRestore(family_);
    if (!started) {
      error_ = backend_.restoreFailed(family_, started.error()).error();
      return;
    }
    tool_ = std::move(*started);
  }
  /// Waits for the chunk handed to the tool last.
  void waitPending() {
    if (!pending_) return;
    auto done = pending_->finish();
    pending_.reset();
    if (!done && !error_) error_ = backend_.restoreFailed(family_, done.error()).error();
  }
  void send() {
    if (buffer_.empty()) return;
    keep(buffer_);
    if (tool_ && !error_) {
      if (auto w = tool_->write(buffer_); !w) error_ = backend_.restoreFailed(family_, w.error()).error();
    }
    buffer_.clear();
  }
  /// Ends a chunk: once the previous one is committed, a tool gets this one and works on it
  /// while the next is rendered.
  void commit() {
    if (!open_) return;
    buffer_ += "COMMIT\n";
    open_ = false;
    chunkSize_ = 0;
    waitPending();
    startTool();
    send();
    if (tool_) {
      tool_->endInput();
      pending_ = std::move(tool_);
    }
  }
  void close() {
    send();
    if (!tool_) return;
    auto done = tool_->finish();
    tool_.reset();
    if (!done && !error_) error_ = backend_.restoreFailed(family_, done.error()).error();
  }

  IptablesBackend& backend_;
  net::Family family_;
  std::size_t chunkRules_;
  bool netlinkWanted_;  ///< netlink after the fixed chains
  std::size_t chunkSize_ = 0;
  bool open_ = false;  ///< a nat block is being written
  bool keeping_ = true;
  std::unique_ptr<RestoreStream> tool_;
  std::unique_ptr<RestoreStream> pending_;  ///< a committed chunk the tool may still be applying
  std::optional<NftRuleBatch> batch_;       ///< the service ports' chains, over netlink
  std::vector<Pending> port_;               ///< the chains of the port being rendered (netlink)
  std::string buffer_;
  std::string declare_, rules_;  ///< of the service port being rendered
  std::optional<sdk::PluginError> error_;
};

// ---- the mirror ----

void FamilyMirror::update(const std::string& key, std::vector<ChainRules> wanted,
                          std::vector<DispatchRule> wantedDispatch, DispatchDelta& delta, RestoreEdit& edit) {
  Owned& old = owned[key];
  std::set<std::pair<Table, std::string>> keep;
  for (const auto& c : wanted) {
    keep.emplace(c.table, c.name);
    const std::uint64_t h = hashRules(c.rules);
    auto& states = chains[index(c.table)];
    auto [it, added] = states.try_emplace(c.name);
    if (!added && it->second.hash == h) continue;
    edit.rewrite(c.table, c.name, c.rules);
    rules[index(c.table)] += c.rules.size() - it->second.rules;
    it->second = {h, static_cast<std::uint32_t>(c.rules.size())};
  }
  for (const auto& [t, name] : old.chains)
    if (!keep.contains({t, name})) {
      edit.drop(t, name);
      auto& states = chains[index(t)];
      if (auto it = states.find(name); it != states.end()) {
        rules[index(t)] -= it->second.rules;
        states.erase(it);
      }
    }
  for (const auto& r : old.dispatch) --delta[r];
  for (const auto& r : wantedDispatch) ++delta[r];
  Owned now;
  for (auto& c : wanted) now.chains.emplace_back(c.table, std::move(c.name));
  now.dispatch = std::move(wantedDispatch);
  if (now.chains.empty() && now.dispatch.empty() && !key.empty())
    owned.erase(key);
  else
    old = std::move(now);
}

void FamilyMirror::applyDispatch(const DispatchDelta& delta, RestoreEdit& edit) {
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [rule, d] : delta) {
      if (d == 0 || (pass == 0) != (d < 0)) continue;
      DispatchChain& state = dispatch[{rule.table, rule.chain}];
      auto it = state.refs.find(rule.spec);
      if (d < 0) {
        if (it == state.refs.end()) continue;
        const int left = static_cast<int>(it->second.first) + d;
        if (left > 0) {
          it->second.first = static_cast<std::uint32_t>(left);
          continue;
        }
        edit.deleteRule(rule.table, rule.chain, rule.spec);
        --rules[index(rule.table)];
        --state.sizes[static_cast<std::size_t>(it->second.second)];
        state.refs.erase(it);
        continue;
      }
      if (it != state.refs.end()) {
        it->second.first += static_cast<std::uint32_t>(d);
        continue;
      }
      state.refs.emplace(rule.spec, std::pair{static_cast<std::uint32_t>(d), rule.section});
      ++rules[index(rule.table)];
      const auto s = static_cast<std::size_t>(rule.section);
      std::size_t position = 1, total = 0;
      for (std::size_t i = 0; i < kSections; ++i) {
        if (i <= s) position += state.sizes[i];
        total += state.sizes[i];
      }
      edit.insertRule(rule.table, rule.chain, position, total, rule.spec);
      ++state.sizes[s];
    }
  }
}

void FamilyMirror::addDispatch(const DispatchRule& rule) {
  DispatchChain& state = dispatch[{rule.table, rule.chain}];
  auto [it, inserted] = state.refs.try_emplace(rule.spec, 0u, rule.section);
  ++it->second.first;
  if (inserted) ++state.sizes[static_cast<std::size_t>(rule.section)];
}

std::vector<std::string> dispatchChainRules(const FamilyMirror::DispatchChain& chain) {
  std::vector<std::string> ordered[kSections];
  for (const auto& [spec, ref] : chain.refs) ordered[static_cast<std::size_t>(ref.second)].push_back(spec);
  std::vector<std::string> rules;
  for (auto& section : ordered) {
    std::sort(section.begin(), section.end());
    rules.insert(rules.end(), section.begin(), section.end());
  }
  return rules;
}

bool holdsDispatchChain(const KernelChains::Chain* chain, const FamilyMirror::DispatchChain& wanted) {
  if (chain == nullptr || chain->builtin || chain->rules.size() != wanted.refs.size()) return false;
  std::size_t section = 0;
  std::set<std::string_view> seen;
  for (const auto& r : chain->rules) {
    auto it = wanted.refs.find(r);
    if (it == wanted.refs.end() || !seen.insert(r).second || static_cast<std::size_t>(it->second.second) < section)
      return false;
    section = static_cast<std::size_t>(it->second.second);
  }
  return true;
}

// ---- the backend's syncs ----

void IptablesBackend::partialSyncFamily(const plan::SnapshotSource& next, net::Family family,
                                        const std::vector<std::string>& keys, FamilyMirror& mirror,
                                        RestoreEdit& edit, std::size_t& operations) {
  DispatchDelta delta;
  for (const auto& key : keys) {
    if (key.empty()) continue;
    auto port = next.find(family, key);
    if (!port) {
      mirror.update(key, {}, {}, delta, edit);
      continue;
    }
    Fragment f = renderer_.renderServicePort(*port);
    for (const auto& problem : f.problems) host_.warning(fmt::format("iptables: {}: {}", key, problem));
    mirror.update(key, std::move(f.chains), std::move(f.dispatch), delta, edit);
  }
  // The global objects follow the node and the ServiceCIDRs, which a partial sync may bring.
  GlobalObjects g = renderer_.renderGlobal(family, next.node());
  mirror.update("", std::move(g.chains), std::move(g.dispatch), delta, edit);
  mirror.applyDispatch(delta, edit);
  operations += edit.operations;
}

sdk::Expected<void> IptablesBackend::fullSyncFamily(const plan::SnapshotSource& next, net::Family family,
                                                    FamilyMirror& out, std::string& input,
                                                    std::size_t& operations) {
  // What the kernel holds (in --dry-run, what PrintingIptables' ruleset in memory holds).
  KernelChains kernel;
  for (Table t : kTables)
    if (auto read = kernel.read(*kernel_, family, t); !read) return failed(read.error());

  RestoreEdit edit;
  // The owned chains' rewrites are streamed to the tool while rendering; when the kernel adapter
  // asks for inputs of a bounded size, in chunks of whole service ports, the fixed chains they
  // jump to in the first. Each chunk leaves every service either as it was or as it is wanted.
  StreamedChains stream(*this, family, kernel_->restoreChunkRules(), netlinkAllowed());
  auto addChains = [&](const std::string& key, std::vector<ChainRules>& chains, std::vector<DispatchRule>& dispatch) {
    FamilyMirror::Owned owned;
    for (auto& c : chains) {
      const std::uint64_t h = hashRules(c.rules);
      if (kernel.differs(c.table, c.name, h)) stream.rewrite(c.table, c.name, c.rules, edit);
      out.chains[index(c.table)][c.name] = {h, static_cast<std::uint32_t>(c.rules.size())};
      out.rules[index(c.table)] += c.rules.size();
      owned.chains.emplace_back(c.table, std::move(c.name));
    }
    for (const auto& r : dispatch) out.addDispatch(r);
    owned.dispatch = std::move(dispatch);
    out.owned.emplace(key, std::move(owned));
  };

  GlobalObjects g = renderer_.renderGlobal(family, next.node());
  auto globalChains = g.chains;
  auto globalDispatch = g.dispatch;
  addChains("", globalChains, globalDispatch);
  stream.portDone();
  next.forEach([&](const sdk::ServicePort& p) {
    if (p.family != family) return;
    Fragment f = renderer_.renderServicePort(p);
    for (const auto& problem : f.problems) host_.warning(fmt::format("iptables: {}: {}", p.key, problem));
    recentLists_ += f.recentLists;
    addChains(p.key, f.chains, f.dispatch);
    stream.portDone();
  });

  // The dispatch chains: kept when they hold exactly the wanted rules in section order,
  // rewritten otherwise. Over netlink, the nat ones go in the last transaction, together (the
  // chains are created before any rule, and KUBE-SERVICES jumps to KUBE-NODEPORTS); 10,000
  // Services make 10,000 rules of KUBE-SERVICES the tool would parse. The filter ones stay with
  // the tool.
  std::list<std::vector<std::string>> netlinkDispatch;  // alive until the stream's portDone
  for (const auto& [t, name] : g.dispatchChains) {
    const FamilyMirror::DispatchChain& state = out.dispatch[{t, name}];
    out.rules[index(t)] += state.refs.size();
    if (holdsDispatchChain(kernel.find(t, name), state)) continue;
    std::vector<std::string> rules = dispatchChainRules(state);
    if (t == Table::kNat && stream.overNetlink())
      stream.rewrite(t, name, netlinkDispatch.emplace_back(std::move(rules)), edit);
    else
      edit.rewrite(t, name, rules);
  }
  stream.portDone();

  // Jumps from the built-in chains, each inserted first when missing (so the last of a chain's
  // jumps ends up first, as upstream's).
  for (const auto& j : g.jumps)
    if (!kernel.holds(j)) edit.insertJump(j);

  // Chains of kproxy's that nothing wants any more (by name, so the input does not depend on
  // the order the kernel lists them in).
  for (Table t : kTables) {
    std::vector<std::string_view> stale;
    for (const auto& [name, c] : kernel.chains(t))
      if (!c.builtin && isOwnedChain(t, name) && !out.chains[index(t)].contains(name) &&
          !out.dispatch.contains({t, name}))
        stale.push_back(name);
    std::sort(stale.begin(), stale.end());
    for (auto name : stale) edit.drop(t, std::string(name));
  }
  operations += edit.operations;
  std::copy(std::begin(edit.written), std::end(edit.written), std::begin(out.written));
  auto finished = stream.finish(edit);
  operations += stream.operations;
  netlinkRules_ += stream.netlinkRules;
  netlinkCommits_ += stream.netlinkCommits;
  for (auto* list : {&stream.touched, &edit.touched})
    for (auto& t : *list)
      if (touched_.size() < kTouchedKept) touched_.push_back(std::move(t));
  input = std::move(stream.kept);
  return finished;
}

}  // namespace kproxy::iptables
