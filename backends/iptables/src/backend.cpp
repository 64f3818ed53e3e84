#include "kproxy/iptables/backend.h"

#include <linux/netlink.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <list>
#include <set>
#include <span>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/conntrack_cleaner.h"
#include "kproxy/backends/common/heap.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/backends/common/sysctl.h"
#include "kproxy/iptables/explain.h"
#include "kproxy/iptables/nft_rules.h"

namespace kproxy::iptables {
namespace {

constexpr sdk::Family kFamilies[] = {sdk::Family::kIPv4, sdk::Family::kIPv6};

std::string_view familyName(sdk::Family f) { return f == sdk::Family::kIPv6 ? "ipv6" : "ipv4"; }
std::string_view toolName(sdk::Family f) { return f == sdk::Family::kIPv6 ? "ip6tables" : "iptables"; }

constexpr std::uint64_t kFnvBasis = 1469598103934665603ull;
/// FNV-1a of one more rule, ended by a newline.
std::uint64_t hashRule(std::uint64_t h, std::string_view rule) {
  for (unsigned char ch : rule) h = (h ^ ch) * 1099511628211ull;
  return (h ^ '\n') * 1099511628211ull;
}
/// FNV-1a over the rules, each ended by a newline.
std::uint64_t hashRules(const std::vector<std::string>& rules) {
  std::uint64_t h = kFnvBasis;
  for (const auto& r : rules) h = hashRule(h, r);
  return h;
}

/// What a full sync needs of the kernel's tables, read straight from iptables-save's output:
/// per table and chain, whether it is built in and a hash of its rules; the rules themselves
/// only of built-in and dispatch chains, whose rules are compared one by one. The nat table
/// of 10,000 Services is tens of MB as text and as parsed rules; this keeps a few.
struct KernelChains final : backends::IptablesSaveReader::Sink {
  struct Chain {
    bool builtin = false;
    bool keepRules = false;
    std::uint64_t hash = kFnvBasis;
    std::vector<std::string> rules;  ///< built-in and dispatch chains only
  };
  std::unordered_map<std::string, Chain> tables[3];

  const Chain* find(Table t, const std::string& name) const {
    const auto& m = tables[static_cast<std::size_t>(t)];
    auto it = m.find(name);
    return it == m.end() ? nullptr : &it->second;
  }

  void table(std::string_view name) override {
    byIndex_.clear();
    const std::optional<Table> t = tableNamed(name);
    current_ = t ? &tables[static_cast<std::size_t>(*t)] : nullptr;
    if (t) table_ = *t;
  }
  void chain(std::size_t index, backends::IptablesChain chain) override {
    if (byIndex_.size() <= index) byIndex_.resize(index + 1, nullptr);
    if (current_ == nullptr) return;
    Chain& c = (*current_)[chain.name];
    c.builtin = chain.builtin();
    c.keepRules = c.builtin || isDispatch(table_, chain.name);
    byIndex_[index] = &c;
  }
  void rule(std::size_t chainIndex, backends::IptablesRule rule) override {
    Chain* c = chainIndex < byIndex_.size() ? byIndex_[chainIndex] : nullptr;
    if (c == nullptr) return;
    c->hash = hashRule(c->hash, rule.spec);
    if (c->keepRules) c->rules.push_back(std::move(rule.spec));
  }

 private:
  static bool isDispatch(Table t, std::string_view name) {
    for (const auto& [table, chain] : dispatchChainNames())
      if (table == t && chain == name) return true;
    return false;
  }
  std::unordered_map<std::string, Chain>* current_ = nullptr;
  Table table_ = Table::kFilter;
  std::vector<Chain*> byIndex_;  ///< the current table's chains by declaration number
};

sdk::Expected<void> failed(const core::Error& e, std::string_view what) {
  const auto category = e.category == core::ErrorCategory::kKernel ? sdk::ErrorCategory::kKernelRefused
                                                                     : sdk::ErrorCategory::kUnknown;
  return sdk::fail(category, fmt::format("iptables: {}: {}", what, e.message()), e.errnum);
}

}  // namespace

/// Restore input for one family, in the order iptables-restore needs: chain declarations
/// (creating or flushing), the rules of rewritten chains, dispatch deletions and insertions,
/// jumps from built-in chains, and last the deletion of chains no longer referenced.
// How many changed objects a sync names in its summary.
constexpr std::size_t kTouchedKept = 4;

struct IptablesBackend::Edit {
  std::string declare[3], rules[3], dispatch[3], jumps[3], remove[3];
  std::size_t operations = 0;
  std::size_t rewrittenRules = 0;  ///< rules and declarations of rewritten chains
  std::vector<std::string> touched;  ///< the first objects changed, for the sync's summary
  /// With `keepNat` (a partial sync that may go over netlink): the nat chains rewritten, with
  /// their rules, and those deleted.
  bool keepNat = false;
  std::vector<std::pair<std::string, std::vector<std::string>>> natRewrites;
  std::vector<std::string> natDrops;

  /// Whether the edit changes nat chains only, by rewriting or deleting whole chains (no
  /// dispatch rule inserted or deleted, no jump, nothing in filter or mangle).
  bool natChainsOnly() const {
    if (!keepNat || (natRewrites.empty() && natDrops.empty())) return false;
    for (Table t : kTables) {
      const auto i = index(t);
      if (!dispatch[i].empty() || !jumps[i].empty()) return false;
      if (t != Table::kNat && (!declare[i].empty() || !remove[i].empty())) return false;
    }
    return true;
  }

  void note(Table t, std::string what) {
    if (touched.size() < kTouchedKept) touched.push_back(fmt::format("{} {}", tableName(t), what));
  }
  void rewrite(Table t, const std::string& name, const std::vector<std::string>& chainRules) {
    declare[index(t)] += fmt::format(":{} - [0:0]\n", name);
    for (const auto& r : chainRules) rules[index(t)] += fmt::format("-A {} {}\n", name, r);
    ++operations;
    rewrittenRules += chainRules.size() + 1;
    note(t, "chain " + name);
    if (keepNat && t == Table::kNat) natRewrites.emplace_back(name, chainRules);
  }
  void drop(Table t, const std::string& name) {
    declare[index(t)] += fmt::format(":{} - [0:0]\n", name);
    remove[index(t)] += fmt::format("-X {}\n", name);
    if (keepNat && t == Table::kNat) natDrops.push_back(name);
    ++operations;
    note(t, "chain " + name + " (deleted)");
  }
  /// The input; with `natOpen`, the nat block's header was written already (a streamed full
  /// sync) and its end is written whatever it holds.
  std::string text(bool natOpen = false) const {
    std::string out;
    constexpr Table kNatFirst[] = {Table::kNat, Table::kFilter, Table::kMangle};
    for (Table t : natOpen ? std::span<const Table>(kNatFirst) : std::span<const Table>(kTables)) {
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
};

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
  StreamedChains(IptablesBackend& backend, sdk::Family family, std::size_t chunkRules, bool netlink)
      : backend_(backend), family_(family), chunkRules_(chunkRules), netlinkWanted_(netlink) {}
  ~StreamedChains() {
    // Abandoned after a failure: the open restore ends without COMMIT, so the tool applies
    // nothing of it; a committed chunk still running is waited for.
    if (tool_) (void)tool_->finish();
    if (pending_) (void)pending_->finish();
  }

  /// Rewrites chain `name` with `rules`: streamed when in nat (at portDone), else added to
  /// `rest`. Over netlink, `rules` must stay valid until portDone.
  void rewrite(Table t, const std::string& name, const std::vector<std::string>& rules, Edit& rest) {
    if (t != Table::kNat) {
      rest.rewrite(t, name, rules);
      return;
    }
    ++operations;
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
  sdk::Expected<void> finish(const Edit& rest) {
    portDone();
    commitBatch();
    if (chunkRules_ != 0) commit();
    waitPending();
    if (error_) return std::unexpected(*error_);
    const bool natOpen = open_;
    buffer_ += rest.text(natOpen);
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
    if (backend_.settings_.dryRun || error_) return;
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
    if (backend_.settings_.dryRun) {
      dryRun_ += buffer_;
    } else if (tool_ && !error_) {
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
    if (backend_.settings_.dryRun) {
      close();
      return;
    }
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
    if (backend_.settings_.dryRun) {
      if (auto r = backend_.apply(family_, dryRun_); !r && !error_) error_ = r.error();
      dryRun_.clear();
      return;
    }
    if (!tool_) return;
    auto done = tool_->finish();
    tool_.reset();
    if (!done && !error_) error_ = backend_.restoreFailed(family_, done.error()).error();
  }

  IptablesBackend& backend_;
  sdk::Family family_;
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
  std::string dryRun_;
  std::optional<sdk::PluginError> error_;
};

IptablesBackend::IptablesBackend(sdk::Host host, BackendSettings settings, std::unique_ptr<KernelIptables> kernel)
    : host_(host), settings_(std::move(settings)), renderer_(settings_.render), kernel_(std::move(kernel)) {}

std::size_t IptablesBackend::mirroredChains(sdk::Family family) const {
  const auto& m = mirror_[index(family)];
  return m.chains[0].size() + m.chains[1].size() + m.chains[2].size();
}

sdk::Expected<sdk::SyncOutcome> IptablesBackend::sync(const sdk::SyncContext& context) {
  plan::HostSnapshot next(context.next);
  auto synced = syncFrom(next, context.changed, context.full);
  if (synced && !settings_.dryRun) backends::cleanStaleConntrackEntries(host_, context);
  return synced;
}

sdk::Expected<sdk::SyncOutcome> IptablesBackend::syncFrom(const plan::SnapshotSource& next,
                                                          const std::vector<sdk::ChangedKey>& changed, bool full) {
  const auto started = std::chrono::steady_clock::now();
  kernel_->takeToolTimes();  // what a failed sync's tools cost is not this sync's
  netlinkRules_ = netlinkCommits_ = 0;
  full = full || needFull_;
  // The canary: a periodic sync with nothing changed checks that the tables were not flushed
  // behind kproxy's back (upstream's iptables monitor), and resyncs in full if they were.
  if (!full && changed.empty() && !settings_.dryRun) {
    for (sdk::Family fam : kFamilies) {
      if (!familyEnabled(fam)) continue;
      auto exists = kernel_->chainExists(fam, Table::kMangle, backends::iptables_chains::kProxyCanary);
      if (!exists) {
        host_.warning(fmt::format("iptables: checking the canary chain: {}", exists.error().message()));
      } else if (!*exists) {
        host_.info(0, fmt::format("iptables: the {} mangle table lost KUBE-PROXY-CANARY (flushed?); syncing in full",
                                  toolName(fam)));
        full = true;
      }
    }
  }
  const sdk::NodeInfo node = next.node();
  renderer_.setNode(node);
  renderer_.setServiceCIDRs(next.serviceCIDRs());
  if (full) {
    // Upstream leaves per-endpoint comments out above 1,000 endpoints; decided per full sync
    // here, so that partial syncs never rewrite unrelated chains.
    std::size_t endpoints = 0;
    next.forEach([&](const sdk::ServicePort& p) { endpoints += p.allEndpoints.size(); });
    renderer_.setLargeCluster(endpoints > settings_.render.largeClusterEndpoints);
    recentLists_ = 0;
  }

  std::size_t operations = 0;
  touched_.clear();
  for (sdk::Family fam : kFamilies) {
    lastRestore_[index(fam)].clear();
    if (!familyEnabled(fam)) continue;
    std::string input;
    if (full) {
      needFull_ = true;
      // The old mirror is not read again (a failure leaves needFull_ set, and the next full
      // sync reads the kernel anew): freed first, it is never resident beside the new one
      // (about 10 MB at 10,000 Services). Its rule counts stay for the metrics until then.
      {
        MirrorFamily& old = mirror_[index(fam)];
        MirrorFamily counted;
        std::copy(std::begin(old.rules), std::end(old.rules), std::begin(counted.rules));
        old = std::move(counted);
      }
      MirrorFamily fresh;
      // A failure leaves needFull_ set, so the next sync repairs what was applied.
      if (auto r = fullSync(next, fam, fresh, input, operations); !r) return std::unexpected(r.error());
      mirror_[index(fam)] = std::move(fresh);
    } else {
      std::vector<std::string> keys;
      for (const auto& c : changed)
        if (c.family == fam) keys.push_back(c.key);
      Edit edit;
      edit.keepNat = netlinkAllowed();
      partialSync(next, fam, keys, mirror_[index(fam)], edit, operations);
      input = edit.text();
      if (auto r = applyPartial(fam, edit, input); !r) {
        needFull_ = true;  // the mirror now describes what was refused
        return std::unexpected(r.error());
      }
    }
    if (input.size() > settings_.lastRestoreKept) input.clear();
    lastRestore_[index(fam)] = std::move(input);
  }
  if (full) {
    needFull_ = false;
    warnAboutRecentLists();
    if (!settings_.dryRun) setRouteLocalnet();
    backends::releaseFreeHeap();
  }
  updateMetrics();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  sdk::SyncOutcome outcome;
  outcome.operations = operations;
  outcome.summary = fmt::format("{} sync: {} chain and rule changes in {:.1f} ms ({}", full ? "full" : "partial",
                                operations, ms, kernel_->describe());
  // Where the time went: the tools' own CPU, in user space (parsing, their cache of the table)
  // and in the kernel (for iptables-nft, applying and validating each commit).
  if (netlinkCommits_ > 0)
    outcome.summary += fmt::format("; {} rules written over netlink in {} transaction{}", netlinkRules_,
                                   netlinkCommits_, netlinkCommits_ == 1 ? "" : "s");
  if (const auto tools = kernel_->takeToolTimes(); tools.runs > 0)
    outcome.summary += fmt::format("; {} tool run{} used {:.1f} ms user and {:.1f} ms kernel CPU", tools.runs,
                                   tools.runs == 1 ? "" : "s", tools.user.count() / 1000.0,
                                   tools.system.count() / 1000.0);
  outcome.summary += ")";
  // A full sync asked to change nothing that still wrote something: the kernel differed from the
  // plan (a self-verification, or a first sync). Name the first of them.
  if (full && changed.empty() && operations > 0 && !touched_.empty())
    outcome.summary += fmt::format(" first changes: {}", fmt::join(touched_, "; "));
  return outcome;
}

sdk::Expected<void> IptablesBackend::apply(sdk::Family family, const std::string& input) {
  if (input.empty()) return {};
  if (settings_.dryRun) {
    std::fprintf(settings_.dryRunOutput, "# %s-restore --noflush\n%s", std::string(toolName(family)).c_str(),
                 input.c_str());
    std::fflush(settings_.dryRunOutput);
    return {};
  }
  auto r = kernel_->restore(family, input);
  if (!r) return restoreFailed(family, r.error());
  return {};
}

sdk::Expected<void> IptablesBackend::restoreFailed(sdk::Family family, const core::Error& e) {
  if (metrics_.restoreFailures.active()) metrics_.restoreFailures.add({std::string(familyName(family))}, 1);
  return failed(e, std::string(toolName(family)) + "-restore");
}

sdk::Expected<void> IptablesBackend::netlinkFailed(sdk::Family family, const core::Error& e) {
  if (metrics_.restoreFailures.active()) metrics_.restoreFailures.add({std::string(familyName(family))}, 1);
  // A refusal of what was encoded (an invalid or unsupported expression) would come again:
  // every later sync uses the tool. Others (a chain someone's rule still jumps to, a table
  // flushed meanwhile, no memory) are the state's, and the full sync that follows retries.
  const bool encoding = e.errnum == EINVAL || e.errnum == EOPNOTSUPP || e.errnum == EPROTONOSUPPORT ||
                        e.errnum == EAFNOSUPPORT || e.errnum == ERANGE;
  if (encoding) netlinkRefused_ = true;
  return failed(e, encoding ? "nat chains over netlink (every later sync writes them with " +
                                  std::string(toolName(family)) + "-restore)"
                            : std::string("nat chains over netlink"));
}

void IptablesBackend::partialSync(const plan::SnapshotSource& next, sdk::Family family,
                                  const std::vector<std::string>& keys, MirrorFamily& mirror, Edit& edit,
                                  std::size_t& operations) {
  // Net change of each dispatch rule's owner count.
  std::map<DispatchRule, int> delta;

  auto update = [&](const std::string& key, std::vector<ChainRules> chains, std::vector<DispatchRule> dispatch) {
    Owned& old = mirror.owned[key];
    std::set<std::pair<Table, std::string>> keep;
    for (const auto& c : chains) {
      keep.emplace(c.table, c.name);
      const std::uint64_t h = hashRules(c.rules);
      auto& states = mirror.chains[index(c.table)];
      auto [it, added] = states.try_emplace(c.name);
      if (!added && it->second.hash == h) continue;
      edit.rewrite(c.table, c.name, c.rules);
      mirror.rules[index(c.table)] += c.rules.size() - it->second.rules;
      it->second = {h, static_cast<std::uint32_t>(c.rules.size())};
    }
    for (const auto& [t, name] : old.chains)
      if (!keep.contains({t, name})) {
        edit.drop(t, name);
        auto& states = mirror.chains[index(t)];
        if (auto it = states.find(name); it != states.end()) {
          mirror.rules[index(t)] -= it->second.rules;
          states.erase(it);
        }
      }
    for (const auto& r : old.dispatch) --delta[r];
    for (const auto& r : dispatch) ++delta[r];
    Owned now;
    for (auto& c : chains) now.chains.emplace_back(c.table, std::move(c.name));
    now.dispatch = std::move(dispatch);
    if (now.chains.empty() && now.dispatch.empty() && !key.empty())
      mirror.owned.erase(key);
    else
      old = std::move(now);
  };

  for (const auto& key : keys) {
    if (key.empty()) continue;
    auto port = next.find(family, key);
    if (!port) {
      update(key, {}, {});
      continue;
    }
    Fragment f = renderer_.renderServicePort(*port);
    for (const auto& problem : f.problems) host_.warning(fmt::format("iptables: {}: {}", key, problem));
    update(key, std::move(f.chains), std::move(f.dispatch));
  }
  // The global objects follow the node and the ServiceCIDRs, which a partial sync may bring.
  GlobalObjects g = renderer_.renderGlobal(family, next.node());
  update("", std::move(g.chains), std::move(g.dispatch));

  // Dispatch rules: deletions first (they free positions), then insertions at the end of
  // their section.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [rule, d] : delta) {
      if (d == 0 || (pass == 0) != (d < 0)) continue;
      DispatchState& state = mirror.dispatch[{rule.table, rule.chain}];
      auto it = state.refs.find(rule.spec);
      if (d < 0) {
        if (it == state.refs.end()) continue;
        const int left = static_cast<int>(it->second.first) + d;
        if (left > 0) {
          it->second.first = static_cast<std::uint32_t>(left);
          continue;
        }
        edit.dispatch[index(rule.table)] += fmt::format("-D {} {}\n", rule.chain, rule.spec);
        --mirror.rules[index(rule.table)];
        --state.sizes[static_cast<std::size_t>(it->second.second)];
        state.refs.erase(it);
        ++edit.operations;
        continue;
      }
      if (it != state.refs.end()) {
        it->second.first += static_cast<std::uint32_t>(d);
        continue;
      }
      state.refs.emplace(rule.spec, std::pair{static_cast<std::uint32_t>(d), rule.section});
      ++mirror.rules[index(rule.table)];
      const auto s = static_cast<std::size_t>(rule.section);
      std::size_t position = 1, total = 0;
      for (std::size_t i = 0; i < kSections; ++i) {
        if (i <= s) position += state.sizes[i];
        total += state.sizes[i];
      }
      if (position > total)
        edit.dispatch[index(rule.table)] += fmt::format("-A {} {}\n", rule.chain, rule.spec);
      else
        edit.dispatch[index(rule.table)] += fmt::format("-I {} {} {}\n", rule.chain, position, rule.spec);
      ++state.sizes[s];
      ++edit.operations;
    }
  }
  operations += edit.operations;
}

core::Result<void> IptablesBackend::commitOverNetlink(NftRuleBatch& batch) {
  auto socket = backends::keptSocket(netlinkSocket_, NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  auto r = batch.commit(**socket);
  if (!r) netlinkSocket_.reset();  // whatever the socket holds after a failure, the next one starts clean
  return r;
}

sdk::Expected<void> IptablesBackend::applyPartial(sdk::Family family, const Edit& edit, const std::string& input) {
  if (!edit.natChainsOnly()) return apply(family, input);
  // Only whole nat chains change (an endpoint added, removed or changed): one netlink
  // transaction, without the tool's start and its fetch of the table.
  NftRuleBatch batch(family);
  std::vector<NftChainRewrite> chains;
  chains.reserve(edit.natRewrites.size());
  for (const auto& [name, rules] : edit.natRewrites) chains.push_back({name, rules});
  if (auto added = batch.add(chains); !added) {
    host_.warning(fmt::format("iptables: {}; restoring the change with {}-restore", added.error().message(),
                              toolName(family)));
    return apply(family, input);
  }
  std::vector<std::string_view> drops(edit.natDrops.begin(), edit.natDrops.end());
  batch.remove(drops);
  const std::size_t rules = batch.rules();
  if (auto r = commitOverNetlink(batch); !r) return netlinkFailed(family, r.error());
  netlinkRules_ += rules;
  ++netlinkCommits_;
  return {};
}

sdk::Expected<void> IptablesBackend::fullSync(const plan::SnapshotSource& next, sdk::Family family,
                                              MirrorFamily& out, std::string& input, std::size_t& operations) {
  // What the kernel holds (dry-run trusts an empty kernel: it reads nothing that needs
  // privileges).
  KernelChains kernel;
  if (!settings_.dryRun) {
    for (Table t : kTables) {
      backends::IptablesSaveReader reader(kernel);
      core::Result<void> read;
      auto saved = kernel_->saveTo(family, t, [&](std::string_view piece) {
        if (read) read = reader.feed(piece);
      });
      if (!saved) return failed(saved.error(), fmt::format("{}-save -t {}", toolName(family), tableName(t)));
      if (read) read = reader.finish();
      if (!read) return failed(read.error(), fmt::format("reading {}-save -t {}", toolName(family), tableName(t)));
    }
  }
  auto kernelChain = [&](Table t, const std::string& name) { return kernel.find(t, name); };

  Edit edit;
  // The owned chains' rewrites are streamed to the tool while rendering; when the kernel adapter
  // asks for inputs of a bounded size, in chunks of whole service ports, the fixed chains they
  // jump to in the first. Each chunk leaves every service either as it was or as it is wanted.
  StreamedChains stream(*this, family, settings_.dryRun ? 0 : kernel_->restoreChunkRules(),
                        netlinkAllowed());
  auto addChains = [&](const std::string& key, std::vector<ChainRules>& chains, std::vector<DispatchRule>& dispatch) {
    Owned owned;
    for (auto& c : chains) {
      const std::uint64_t h = hashRules(c.rules);
      const auto* k = kernelChain(c.table, c.name);
      if (k == nullptr || k->builtin || k->hash != h) stream.rewrite(c.table, c.name, c.rules, edit);
      out.chains[index(c.table)][c.name] = {h, static_cast<std::uint32_t>(c.rules.size())};
      out.rules[index(c.table)] += c.rules.size();
      owned.chains.emplace_back(c.table, std::move(c.name));
    }
    for (const auto& r : dispatch) {
      DispatchState& state = out.dispatch[{r.table, r.chain}];
      auto [it, inserted] = state.refs.try_emplace(r.spec, 0u, r.section);
      ++it->second.first;
      if (inserted) ++state.sizes[static_cast<std::size_t>(r.section)];
    }
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
    DispatchState& state = out.dispatch[{t, name}];
    const auto* k = kernelChain(t, name);
    bool same = k != nullptr && !k->builtin && k->rules.size() == state.refs.size();
    if (same) {
      std::size_t section = 0;
      std::set<std::string_view> seen;
      for (const auto& r : k->rules) {
        auto it = state.refs.find(r);
        if (it == state.refs.end() || !seen.insert(r).second ||
            static_cast<std::size_t>(it->second.second) < section) {
          same = false;
          break;
        }
        section = static_cast<std::size_t>(it->second.second);
      }
    }
    out.rules[index(t)] += state.refs.size();
    if (same) continue;
    std::vector<std::string> ordered[kSections];
    for (const auto& [spec, ref] : state.refs) ordered[static_cast<std::size_t>(ref.second)].push_back(spec);
    std::vector<std::string> rules;
    for (auto& section : ordered) {
      std::sort(section.begin(), section.end());
      rules.insert(rules.end(), section.begin(), section.end());
    }
    if (t == Table::kNat && stream.overNetlink())
      stream.rewrite(t, name, netlinkDispatch.emplace_back(std::move(rules)), edit);
    else
      edit.rewrite(t, name, rules);
  }
  stream.portDone();

  // Jumps from the built-in chains, each inserted first when missing (so the last of a chain's
  // jumps ends up first, as upstream's).
  for (const auto& j : g.jumps) {
    const auto* k = kernelChain(j.table, j.chain);
    const bool present = k != nullptr && std::find(k->rules.begin(), k->rules.end(), j.spec) != k->rules.end();
    if (present) continue;
    edit.jumps[index(j.table)] += fmt::format("-I {} 1 {}\n", j.chain, j.spec);
    ++edit.operations;
    edit.note(j.table, "rule -A " + j.chain + " " + j.spec);
  }

  // Chains of kproxy's that nothing wants any more (by name, so the input does not depend on
  // the order the kernel lists them in).
  for (Table t : kTables) {
    std::vector<std::string_view> stale;
    for (const auto& [name, c] : kernel.tables[index(t)])
      if (!c.builtin && isOwnedChain(t, name) && !out.chains[index(t)].contains(name) &&
          !out.dispatch.contains({t, name}))
        stale.push_back(name);
    std::sort(stale.begin(), stale.end());
    for (auto name : stale) edit.drop(t, std::string(name));
  }
  operations += edit.operations;
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

void IptablesBackend::warnAboutRecentLists() {
  if (!kernel_->replacesWholeTables() || settings_.recentListsWarning == 0 ||
      recentLists_ < settings_.recentListsWarning) {
    recentWarned_ = false;
    return;
  }
  if (recentWarned_) return;
  recentWarned_ = true;
  host_.warning(fmt::format(
      "iptables: {} session-affinity lists (-m recent) with {}: every change replaces the whole nat table, "
      "and the kernel looks each list up by a linear search when it does, so changes grow with the square "
      "of the lists (over two minutes per change at 30,000 measured); iptables-nft or --proxy-mode=nftables "
      "do not pay this per change",
      recentLists_, kernel_->describe()));
}

void IptablesBackend::setRouteLocalnet() {
  // Localhost NodePorts (IPv4) need the kernel to route packets from 127.0.0.0/8, as upstream
  // sets when --iptables-localhost-nodeports is on and NodePorts answer on loopback.
  if (!renderer_.localhostNodePorts()) return;
  backends::SysctlFiles sysctls(settings_.sysctlRoot);
  const char* name = "net/ipv4/conf/all/route_localnet";
  if (auto v = sysctls.readInt(name); v && *v == 1) return;
  if (auto w = sysctls.writeInt(name, 1); !w)
    host_.warning(fmt::format("iptables: setting {}=1 for localhost NodePorts: {}", name, w.error().message()));
  else
    host_.info(1, fmt::format("iptables: set {}=1 for localhost NodePorts", name));
}

sdk::Expected<void> IptablesBackend::cleanup() {
  needFull_ = true;
  for (auto& m : mirror_) m = MirrorFamily{};
  for (sdk::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    Edit edit;
    std::set<std::string> owned[3];
    std::vector<backends::IptablesTable> tables;
    if (!settings_.dryRun) {
      for (Table t : kTables) {
        auto text = kernel_->save(fam, t);
        if (!text) return failed(text.error(), fmt::format("{}-save -t {}", toolName(fam), tableName(t)));
        auto parsed = backends::parseIptablesSave(*text);
        if (!parsed) return failed(parsed.error(), "reading iptables-save");
        for (auto& table : parsed->tables) tables.push_back(std::move(table));
      }
    }
    for (const auto& table : tables) {
      const std::optional<Table> named = tableNamed(table.name);
      if (!named) continue;  // only filter, nat and mangle were saved
      const Table t = *named;
      for (const auto& c : table.chains)
        if (!c.builtin() && isOwnedChain(t, c.name)) owned[index(t)].insert(c.name);
      // Jumps into kproxy's chains from chains that stay (the built-in ones).
      for (const auto& c : table.chains) {
        if (owned[index(t)].contains(c.name)) continue;
        for (const auto& r : c.rules)
          if (owned[index(t)].contains(backends::ruleJumpTarget(r.spec)))
            edit.dispatch[index(t)] += fmt::format("-D {} {}\n", c.name, r.spec);
      }
      for (const auto& name : owned[index(t)]) edit.drop(t, name);
    }
    std::string input = edit.text();
    if (input.empty()) continue;
    if (auto r = apply(fam, input); !r) return r;
    host_.info(1, fmt::format("iptables cleanup: removed kproxy's chains ({})", toolName(fam)));
  }
  return {};
}

sdk::Expected<std::string> IptablesBackend::explain(const sdk::SnapshotView& snapshot,
                                                    const sdk::ExplainRequest& request) {
  const std::vector<sdk::ServicePort> ports = snapshot.all();
  const std::vector<sdk::ServiceCIDR> cidrs = snapshot.serviceCIDRs();
  return explainPacket(settings_.render, ports, snapshot.node(), request, cidrs);
}

sdk::Expected<IptablesBackend::Metrics> IptablesBackend::registerMetrics(const sdk::Host& host) {
  Metrics m;
  auto rules = host.gauge("kproxy_iptables_rules", "Rules in kproxy's iptables chains after the last sync",
                          {"family", "table"});
  if (!rules) return std::unexpected(rules.error());
  m.rules = *rules;
  auto failures = host.counter("kproxy_iptables_restore_failures_total",
                               "iptables-restore runs that the tool refused", {"family"});
  if (!failures) return std::unexpected(failures.error());
  m.restoreFailures = *failures;
  return m;
}

void IptablesBackend::updateMetrics() const {
  if (!metrics_.rules.active()) return;
  for (sdk::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    const auto& m = mirror_[index(fam)];
    for (Table t : kTables)
      metrics_.rules.set({std::string(familyName(fam)), std::string(tableName(t))},
                         static_cast<double>(m.rules[index(t)]));
  }
}

namespace {

backends::SystemProcessRunner& systemRunner() {
  static backends::SystemProcessRunner runner;
  return runner;
}

}  // namespace

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeIptablesBackend(const sdk::Host& host,
                                                                        const sdk::Options& options) {
  auto cfg = parseRenderConfig(options);
  if (!cfg) return std::unexpected(cfg.error());
  auto get = [&](std::string_view key) -> std::string {
    auto it = options.find(key);
    return it == options.end() ? std::string() : it->second;
  };
  BackendSettings settings;
  settings.dryRun = get("dry-run") == "true";
  if (auto liberal = backends::SysctlFiles().readInt("net/netfilter/nf_conntrack_tcp_be_liberal"); liberal)
    cfg->conntrackTCPLiberal = *liberal != 0;

  std::string variantOption = get("iptables-variant");
  if (variantOption.empty()) variantOption = "auto";
  if (variantOption != "auto" && variantOption != "nft" && variantOption != "legacy")
    return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                     "iptables: invalid iptables-variant \"" + variantOption + "\" (auto, nft, legacy)");
  Variant variant = Variant::kNft;
  if (variantOption == "legacy")
    variant = Variant::kLegacy;
  else if (variantOption == "auto" && !settings.dryRun)
    variant = detectVariant(systemRunner());

  std::unique_ptr<KernelIptables> kernel;
  auto tools = findVariantTools(variant);
  if (!tools) {
    if (!settings.dryRun) return sdk::fail(sdk::ErrorCategory::kInvalidInput, tools.error().message());
    kernel = std::make_unique<FakeIptables>();  // dry-run and explain never run the tools
  } else {
    settings.ipv6 = !tools->restore6.empty() && !tools->save6.empty() && backends::kernelHasIPv6();
    kernel = makeProcessKernel(std::move(*tools), systemRunner());
  }
  settings.render = std::move(*cfg);
  auto metrics = IptablesBackend::registerMetrics(host);
  if (!metrics) return std::unexpected(metrics.error());
  host.info(0, fmt::format("iptables: using {} (iptables-variant={}){}", kernel->describe(), variantOption,
                           settings.ipv6 ? "" : "; IPv6 is not programmed (no ip6tables or no IPv6 in the kernel)"));
  auto backend = std::make_unique<IptablesBackend>(host, std::move(settings), std::move(kernel));
  backend->useMetrics(std::move(*metrics));
  return backend;
}

}  // namespace kproxy::iptables
