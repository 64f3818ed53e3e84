#include "kproxy/nftables/backend.h"
#include "kproxy/nftables/explain.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "kproxy/backends/common/heap.h"

namespace kproxy::nftables {
namespace {

constexpr net::Family kFamilies[] = {net::Family::kIPv4, net::Family::kIPv6};

using plan::HostSnapshot;

template <typename Objects>
void addDesired(DesiredFamily& d, Objects& o) {
  for (auto& c : o.chains) d.chains.push_back(&c);
  for (auto& e : o.elements) d.elements.push_back(&e);
}


bool isAffinityEntrySet(const std::string& set) {
  return set == names::kAffinityServicesMap || set == names::kAffinityNodePortsMap;
}

/// A slot-map element's key (kernel bytes and identity suffix) taken apart.
struct SlotKey {
  std::uint32_t range = 0;
  std::uint32_t offset = 0;  ///< within the range
  bool end = false;
  std::uint32_t intervals = 0;  ///< of the layout it belongs to
};
std::optional<SlotKey> slotKeyOf(std::string_view key) {
  if (key.size() != 4 + kIntervalIdentitySize) return std::nullopt;
  auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<std::uint8_t>(key[at + i]);
    return v;
  };
  const std::uint32_t slot = u32(0);
  return SlotKey{slot >> 16, slot & 0xffff, key[4] == '\x01', u32(5)};
}
/// The slot range of a slot-map element's key (nullopt for any other key).
std::optional<std::uint32_t> rangeOf(std::string_view key) {
  auto k = slotKeyOf(key);
  return k ? std::optional(k->range) : std::nullopt;
}

const Chain* chainNamed(const Fragment& f, std::string_view name) {
  for (const auto& c : f.chains)
    if (c.name == name) return &c;
  return nullptr;
}

/// The endpoints (ip . port, as the maps store them) that the fragment's chain balances over:
/// its own slot range, or that of the chain it goes to unconditionally (eTP=Cluster's
/// `goto service-…`); nullopt when there is no such chain or it does not balance.
std::optional<std::set<std::string>> chainEndpoints(const Fragment& f, std::string_view name, int depth = 0) {
  const Chain* c = chainNamed(f, name);
  if (c == nullptr || depth > 2) return std::nullopt;
  for (const auto& r : c->rules)
    for (const auto& st : r.statements) {
      if (const auto* d = std::get_if<DnatFromSlots>(&st)) {
        std::set<std::string> out;
        for (const auto& e : f.elements)
          if (!e.data.empty() && e.set.starts_with(names::kServiceEndpointsMap) &&
              rangeOf(e.key) == d->base >> 16)
            out.insert(e.data);
        return out;
      }
      const auto* v = std::get_if<Verdict>(&st);
      if (v != nullptr && v->kind == VerdictKind::kGoto && r.statements.size() == 1)
        return chainEndpoints(f, v->chain, depth + 1);
    }
  return std::nullopt;
}

}  // namespace

void PackedElements::add(std::uint8_t set, bool intervalEnd, std::string_view key) {
  if (key.size() > 255) throw std::length_error("nftables: element key longer than 255 bytes");
  bytes_.push_back(static_cast<char>(set));
  bytes_.push_back(static_cast<char>(intervalEnd ? kEnd : 0));
  bytes_.push_back(static_cast<char>(key.size()));
  bytes_.append(key);
}

void PackedElements::addLayout(std::uint8_t set, std::uint32_t range, std::uint32_t intervals) {
  bytes_.push_back(static_cast<char>(set));
  bytes_.push_back(static_cast<char>(kLayout));
  for (std::uint32_t v : {range, intervals})
    for (int shift = 24; shift >= 0; shift -= 8) bytes_.push_back(static_cast<char>((v >> shift) & 0xff));
}

void PackedElements::slotKey(std::string& out, std::uint32_t range, std::uint32_t offset, bool end,
                             std::uint32_t k) {
  KeyBuilder b;
  b.slot((range << 16) + offset);
  out = b.bytes + intervalIdentity(end, k);
}

std::string NftablesBackend::elementId(net::Family family, std::uint8_t set, std::string_view key) {
  std::string id;
  id.reserve(2 + key.size());
  id.push_back(family == net::Family::kIPv4 ? '4' : '6');
  id.push_back(static_cast<char>(set));
  id.append(key);
  return id;
}

std::uint8_t NftablesBackend::setIndex(net::Family family, std::string_view set) const {
  const auto& index = setIndex_[family == net::Family::kIPv4 ? 0 : 1];
  auto it = index.find(set);
  if (it == index.end()) throw std::logic_error("nftables: no set " + std::string(set) + " in the ruleset");
  return it->second;
}

template <typename Objects>
NftablesBackend::Owned NftablesBackend::ownedOf(net::Family family, const Objects& o) const {
  Owned out;
  for (const auto& c : o.chains) out.chains.push_back(c.name);
  // A slot map's elements are one layout per range (the renderer's), recorded as such.
  std::vector<std::uint32_t> layouts;
  for (const auto& e : o.elements) {
    const std::uint8_t set = setIndex(family, e.set);
    if (!counted(family, set)) {
      auto k = slotKeyOf(e.key);
      if (!k) throw std::logic_error("nftables: a slot map element without a slot key");
      if (std::find(layouts.begin(), layouts.end(), k->range) == layouts.end()) {
        layouts.push_back(k->range);
        out.elements.addLayout(set, k->range, k->intervals);
      }
      continue;
    }
    out.elements.add(set, e.intervalEnd, e.key);
  }
  out.elements.shrink();
  return out;
}

Element NftablesBackend::identityOf(net::Family family, const PackedElements::Ref& ref) const {
  const SetSpec& spec = renderer_.setSpecs(family)[ref.set];
  Element e{spec.name, std::string(ref.key), {}, std::nullopt};
  e.intervalEnd = ref.intervalEnd;
  e.identitySuffix = spec.interval ? kIntervalIdentitySize : 0;
  e.keyText = keyToText(spec, e.kernelKey(), family);
  return e;
}

std::uint32_t NftablesBackend::OwnerCounts::count(std::string_view id) const {
  auto it = table_.find(id);
  if (it == table_.end()) return 0;
  std::uint32_t n = 0;
  std::memcpy(&n, it->second.data(), sizeof n);
  return n;
}

void NftablesBackend::OwnerCounts::add(std::string_view id) {
  const std::uint32_t n = count(id) + 1;
  table_.set(id, std::string_view(reinterpret_cast<const char*>(&n), sizeof n));
}

void NftablesBackend::OwnerCounts::release(std::string_view id) {
  const std::uint32_t n = count(id);
  if (n <= 1) {
    table_.erase(id);
    return;
  }
  const std::uint32_t left = n - 1;
  table_.set(id, std::string_view(reinterpret_cast<const char*>(&left), sizeof left));
}

void NftablesBackend::AffinityJudge::add(const Fragment& f) {
  // An entry is valid only for the endpoints of the chains that look clients up under its pool
  // ID (the chains that balance that pool), as upstream consults only those endpoints' sets.
  for (const auto& c : f.chains)
    for (const auto& r : c.rules)
      for (const auto& st : r.statements)
        if (const auto* hit = std::get_if<DnatFromAffinity>(&st)) {
          ranges.insert(hit->id >> 16);
          auto& endpoints = valid[hit->id];
          if (auto eps = chainEndpoints(f, c.name)) endpoints.insert(eps->begin(), eps->end());
        }
}

bool NftablesBackend::affinityMayBeStale(net::Family fam, const Owned& old, const Fragment* now) const {
  std::set<std::string> oldKeys;
  old.elements.forEach([&](const PackedElements::Ref& e) {
    const std::string& set = setName(fam, e.set);
    if (isAffinityEntrySet(set)) oldKeys.insert(set + '\0' + std::string(e.key));
  });
  if (oldKeys.empty()) return false;  // no affinity before: no entries to judge
  if (now == nullptr) return true;    // the port went
  for (const auto& e : now->elements)
    if (isAffinityEntrySet(e.set)) oldKeys.erase(e.set + '\0' + e.key);
  if (!oldKeys.empty()) return true;  // an address (or NodePort) went
  // Endpoints per balancing chain, before (from the mirror) and now (from the fragment).
  const MirrorFamily& mf = mirror_.of(fam);
  // A chain that starts or stops balancing by itself moves traffic between pools (eTP
  // Cluster <-> Local): judge the entries.
  std::set<std::string> balancingBefore, balancingNow;
  for (const auto& c : old.chains)
    if (auto mc = mf.chains.find(c); mc != mf.chains.end() && mc->second.slotBase) balancingBefore.insert(c);
  for (const auto& c : now->chains)
    for (const auto& r : c.rules)
      if (std::any_of(r.statements.begin(), r.statements.end(),
                      [](const Statement& st) { return std::holds_alternative<DnatFromSlots>(st); }))
        balancingNow.insert(c.name);
  if (balancingBefore != balancingNow) return true;
  for (const auto& c : balancingBefore) {
    auto mc = mf.chains.find(c);
    std::set<std::string> was;
    old.elements.forEach([&](const PackedElements::Ref& ref) {
      const std::string& set = setName(fam, ref.set);
      if (ref.intervalEnd || !set.starts_with(names::kServiceEndpointsMap)) return;
      if (rangeOf(ref.key) != *mc->second.slotBase >> 16) return;
      auto sit = mf.elements.find(set);
      if (sit == mf.elements.end()) return;
      if (auto v = sit->second.find(std::string(ref.key)); v != sit->second.end() && v->second.starts_with("="))
        was.emplace(v->second.substr(1));
    });
    // A chain that no longer balances (or went) lost every endpoint it had.
    const auto is = chainEndpoints(*now, c);
    for (const auto& d : was)
      if (!is || !is->contains(d)) return true;
  }
  return false;
}

void NftablesBackend::AffinityJudge::mergeOlder(const AffinityJudge& older) {
  ranges.insert(older.ranges.begin(), older.ranges.end());
  for (const auto& [id, endpoints] : older.valid) valid.try_emplace(id, endpoints);
  everything = everything || older.everything;
}

NftablesBackend::NftablesBackend(sdk::Host host, BackendSettings settings,
                                 std::unique_ptr<KernelNftables> kernel)
    : Reconciler(host, backends::kernelReconcilerOptions(std::string(settings.mode), settings.dryRun, settings.dryRunOutput)),
      host_(host),
      settings_(std::move(settings)),
      renderer_(settings_.render),
      kernel_(std::move(kernel)) {
  for (net::Family fam : kFamilies) {
    const auto& specs = renderer_.setSpecs(fam);
    static_assert(kEndpointMapShards < 200, "set indexes are one byte");
    for (std::size_t i = 0; i < specs.size(); ++i)
      setIndex_[fam == net::Family::kIPv4 ? 0 : 1].emplace(specs[i].name, static_cast<std::uint8_t>(i));
  }
}

sdk::Expected<backends::PassOutcome> NftablesBackend::fullSync(const SnapshotSource& next) {
  return pass(next, {}, true);
}

sdk::Expected<backends::PassOutcome> NftablesBackend::partialSync(const SnapshotSource& next,
                                                                  const std::vector<sdk::ChangedKey>& changed) {
  return pass(next, changed, false);
}

bool NftablesBackend::kernelChangedOutside(const std::vector<sdk::ChangedKey>& /*changed*/) {
  checkedGeneration_ = checkGeneration(false);
  return checkedGeneration_->changedOutside;
}

/// What one sync builds for the kernel and, once the kernel has accepted it, what the
/// bookkeeping becomes. A full sync appends to `batch` as it renders; a partial sync collects
/// `ops`, which the mirror follows after the commit.
struct NftablesBackend::SyncWork {
  std::unique_ptr<KernelBatch> batch;
  std::vector<Op> ops;  ///< a partial sync's
  /// The chains flushed because no longer wanted, to delete in a later sync.
  std::map<net::Family, std::set<std::string>> pending;
  /// Which session-affinity entries this sync can judge (see removeStaleAffinity).
  std::map<net::Family, AffinityJudge> affinity;
  /// What the owner bookkeeping becomes if the kernel accepts the batch (partial syncs; a full
  /// sync rebuilds it after the batch).
  std::map<OwnerKey, std::optional<Owned>> ownedUpdates;

  /// A full sync's owner counts (family + set + key → owners), built as it renders.
  OwnerCounts fullOwners;
  /// A full sync's second pass: the ports in key order, and what it keeps of the kernel's table.
  std::map<net::Family, std::vector<std::string>> fullKeys;
  /// Per family whose table is wanted, the sets the kernel had (ours or not).
  std::map<net::Family, std::set<std::string>> fullTables;
  /// The stale chains a full sync leaves for a later sync that are base chains in the kernel.
  std::map<net::Family, std::set<std::string>> fullPendingBase;

  /// Moves `more` into the ops lastOps() reports, as long as the sync has at most kLastOpsKept.
  void keep(std::vector<Op>& more) {
    if (keptAll_ && kept_.size() + more.size() <= kLastOpsKept) {
      for (auto& o : more) kept_.push_back(std::move(o));
    } else {
      keptAll_ = false;
      kept_.clear();
    }
  }
  /// The sync's ops if it kept them all, else none.
  std::vector<Op> takeKept() { return keptAll_ ? std::move(kept_) : std::vector<Op>{}; }

 private:
  std::vector<Op> kept_;  ///< the first kLastOpsKept ops
  bool keptAll_ = true;
};

sdk::Expected<backends::PassOutcome> NftablesBackend::pass(const SnapshotSource& next,
                                                           const std::vector<sdk::ChangedKey>& changed, bool full) {
  const std::uint64_t commitsBefore = ownCommits_;
  const GenerationCheck generation = !full && checkedGeneration_ ? *checkedGeneration_ : checkGeneration(full);
  checkedGeneration_.reset();
  const sdk::NodeInfo node = next.node();
  renderer_.setNode(node);
  renderer_.setServiceCIDRs(next.serviceCIDRs());

  SyncWork work;
  if (full) {
    if (auto built = buildFullSync(next, node, work); !built) return std::unexpected(built.error());
  } else {
    buildPartialSync(next, node, changed, work);
    work.batch = kernel_->beginBatch();
    work.batch->append(work.ops);
  }
  const std::size_t count = work.batch->size();
  // Hand the chunks' freed memory back to the system before the batch is sent.
  if (full) backends::releaseFreeHeap();
  auto committed = send(*work.batch, full);
  work.batch.reset();
  if (!committed) return std::unexpected(committed.error());
  recordAcceptedSync(next, node, work, full);

  for (auto& [fam, judge] : work.affinity) removeStaleAffinity(fam, std::move(judge));
  updateMetrics(count);
  backends::PassOutcome outcome = passOutcome(full, count, changed.size());
  if (generation.before) {
    if (ownCommits_ == commitsBefore)
      // Nothing was committed (ebpf mode's part on a ClusterIP's endpoint change): the
      // generation the pass started from is the one to compare with next time, and a foreign
      // commit since then shows at the next sync's check, without a second round trip now.
      generation_ = *generation.before;
    else
      outcome.fullNext = checkGenerationAfter(*generation.before, commitsBefore);
  }
  return outcome;
}

NftablesBackend::GenerationCheck NftablesBackend::checkGeneration(bool full) {
  // A transaction that was not ours since our last sync (the table flushed or deleted by hand,
  // another program's rules): the mirror may no longer describe the kernel, so reconcile in
  // full. Reading the generation is one small netlink round trip.
  GenerationCheck check;
  auto g = kernel_->generation();
  if (!g || !*g) return check;
  check.before = **g;
  if (!full && generation_ && *generation_ != **g) {
    // Someone else committed since: every transaction in between is theirs, so the
    // kernel's notifications of them say whether one touched kproxy's tables.
    if (auto touched = kernel_->foreignTouched(**g); touched && !*touched) {
      host_.info(2, fmt::format("nftables: the ruleset changed outside kproxy (generation {} -> {}), not "
                                "its tables",
                                *generation_, **g));
    } else {
      host_.info(1, fmt::format("nftables: the ruleset changed outside kproxy (generation {} -> {}){}; "
                                "syncing in full",
                                *generation_, **g, touched ? ", its tables too" : ""));
      check.changedOutside = true;
    }
  } else if (full) {
    (void)kernel_->foreignTouched(std::nullopt);  // a full sync reads everything anyway
  }
  return check;
}

bool NftablesBackend::checkGenerationAfter(std::uint32_t before, std::uint64_t commitsBefore) {
  // Ours moved the generation by one per transaction; more means someone else committed
  // while this sync ran, which the next sync reconciles in full.
  auto after = kernel_->generation();
  if (!after || !*after) return false;
  generation_ = **after;
  return **after != before + static_cast<std::uint32_t>(ownCommits_ - commitsBefore);
}

sdk::Expected<void> NftablesBackend::buildFullSync(const SnapshotSource& next, const sdk::NodeInfo& node,
                                                   SyncWork& work) {
  // A full sync rebuilds the mirror and the ownership records from what it reads and renders
  // (and a failed one leaves the next sync full): the old ones go before the read-back.
  // Until this sync succeeds, nothing else may trust them.
  mirror_ = Mirror{};
  owned_.clear();
  elementOwners_ = {};
  auto read = kernel_->readBack(renderer_.setSpecs(net::Family::kIPv4), renderer_.setSpecs(net::Family::kIPv6));
  if (!read) {
    return sdk::fail(sdk::kernelErrorCategory(read.error().errnum),
                     "nftables: reading the kube-proxy tables back: " + read.error().message(),
                     read.error().errnum);
  }
  Mirror base = std::move(*read);
  // Balancing chains keep the slot ranges the kernel has for them.
  for (net::Family fam : kFamilies) {
    auto& slots = renderer_.slots(fam);
    slots.clear();
    for (const auto& [name, chain] : base.of(fam).chains)
      if (chain.slotBase) slots.reserve(name, *chain.slotBase);
  }
  // Two passes, so that the batch and the new mirror never exist at once. This one builds the
  // batch in key order (the host iterates in its own), a chunk of service ports at a time:
  // each chunk is rendered, diffed against what the kernel holds, encoded into the batch and
  // dropped. It keeps only what the stale sweep needs (owner counts, slot layouts, chains).
  // Once the kernel has accepted the batch, its table is what was rendered, and the second
  // pass renders again to build the mirror and the ownership records (rebuildAfterFullSync).
  next.forEach([&](const sdk::ServicePort& port) { work.fullKeys[port.family].push_back(port.key); });
  for (auto& [fam, k] : work.fullKeys) std::sort(k.begin(), k.end());
  work.batch = kernel_->beginBatch();
  for (net::Family fam : kFamilies) buildFullSyncFamily(fam, next, node, base, work);
  return {};
}

void NftablesBackend::buildFullSyncFamily(net::Family fam, const SnapshotSource& next, const sdk::NodeInfo& node,
                                          Mirror& base, SyncWork& work) {
  auto emit = [&](DiffResult result) {
    work.batch->append(result.ops);
    work.keep(result.ops);
    work.pending[fam].merge(result.pendingDelete);
  };
  const auto& famKeys = work.fullKeys[fam];
  MirrorFamily& mf = base.of(fam);
  const auto& specs = renderer_.setSpecs(fam);
  std::unordered_set<std::string> ownedChains;
  // Slot ranges in use and their layouts' sizes: slot-map elements are not counted (each
  // range has one owner), so these tell which of them stay.
  std::unordered_map<std::uint32_t, std::uint32_t> layouts;
  // Notes what the objects own and adds them to `desired`; an element of a counted set
  // that an earlier port wanted is not added twice (the batch has it already).
  auto want = [&](DesiredFamily& desired, auto& objects) {
    for (auto& c : objects.chains) {
      ownedChains.insert(c.name);
      desired.chains.push_back(&c);
    }
    for (auto& e : objects.elements) {
      const std::uint8_t set = setIndex(fam, e.set);
      if (counted(fam, set)) {
        auto id = elementId(fam, set, e.key);
        const bool first = !work.fullOwners.contains(id);
        work.fullOwners.add(id);
        if (!first) continue;
      } else if (auto k = slotKeyOf(e.key)) {
        layouts[k->range] = k->intervals;
      }
      desired.elements.push_back(&e);
    }
  };
  if (fam == net::Family::kIPv4 || !famKeys.empty() || mf.tableExists) {
    work.fullTables[fam] = mf.sets;
    GlobalObjects global = renderer_.renderGlobal(fam, node);
    DesiredFamily desired;
    desired.sets = global.sets;
    want(desired, global);
    desired.moveRules = true;
    auto result = NftablesDiffer::diff(fam, desired, mf, {}, specs);
    applyToMirror(base, result.ops);  // the table and sets, which the chunks' diffs build on
    emit(std::move(result));
  }
  for (std::size_t from = 0; from < famKeys.size(); from += kFullSyncChunk) {
    std::vector<Fragment> frags;
    for (std::size_t i = from; i < std::min(famKeys.size(), from + kFullSyncChunk); ++i) {
      auto port = next.find(fam == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6, famKeys[i]);
      if (!port) continue;
      Fragment f = renderer_.renderServicePort(*port);
      for (const auto& problem : f.problems) host_.error("nftables: " + f.key + ": " + problem);
      work.affinity[fam].add(f);
      frags.push_back(std::move(f));
    }
    DesiredFamily desired;
    for (auto& f : frags) want(desired, f);
    desired.moveRules = true;
    emit(NftablesDiffer::diff(fam, desired, mf, {}, specs));
  }
  // What the kernel holds and no service port owns any more (the batch sends these
  // deletions before every addition: see KernelBatch).
  emit(NftablesDiffer::diff(fam, DesiredFamily{}, mf, staleAfterFullSync(fam, mf, ownedChains, layouts, work),
                            specs));
  for (const auto& name : work.pending[fam])
    if (auto c = mf.chains.find(name); c != mf.chains.end() && c->second.base) work.fullPendingBase[fam].insert(name);
  work.affinity[fam].everything = true;
}

StaleCandidates NftablesBackend::staleAfterFullSync(
    net::Family fam, const MirrorFamily& mf, const std::unordered_set<std::string>& ownedChains,
    const std::unordered_map<std::uint32_t, std::uint32_t>& layouts, const SyncWork& work) const {
  StaleCandidates stale;
  for (const auto& [name, chain] : mf.chains)
    if (!ownedChains.contains(name)) stale.chains.insert(name);
  const auto& specs = renderer_.setSpecs(fam);
  const auto& declared = setIndex_[fam == net::Family::kIPv4 ? 0 : 1];
  for (const auto& [set, elems] : mf.elements) {
    auto declaredAt = declared.find(set);
    if (declaredAt == declared.end()) {
      // A set kproxy does not declare (an older kproxy's, upstream kube-proxy's): nothing
      // in it is wanted, as for any other object of the table that is not rendered.
      for (const auto& [key, value] : elems) stale.elements.push_back(Element{set, std::string(key), {}, std::nullopt});
      continue;
    }
    const std::uint8_t index = declaredAt->second;
    const SetSpec& spec = specs[index];
    if (spec.dynamic) continue;  // filled by the data path, not by us
    for (const auto& [key, value] : elems) {
      bool owned = false;
      if (!counted(fam, index)) {
        auto k = slotKeyOf(key);
        auto layout = k ? layouts.find(k->range) : layouts.end();
        owned = layout != layouts.end() && layout->second == k->intervals &&
                inSlotLayout(k->offset, k->end, k->intervals);
      } else {
        owned = work.fullOwners.contains(elementId(fam, index, key));
      }
      if (!owned) stale.elements.push_back(Element{set, std::string(key), keyToText(spec, key, fam), std::nullopt});
    }
  }
  return stale;
}

void NftablesBackend::buildPartialSync(const SnapshotSource& next, const sdk::NodeInfo& node,
                                       const std::vector<sdk::ChangedKey>& changed, SyncWork& work) {
  std::map<net::Family, std::vector<std::string>> keysByFamily;
  for (const auto& c : changed) {
    auto& keys = keysByFamily[c.family];
    if (std::find(keys.begin(), keys.end(), c.key) == keys.end()) keys.push_back(c.key);
  }
  for (net::Family fam : kFamilies) buildPartialSyncFamily(fam, keysByFamily[fam], next, node, work);
}

void NftablesBackend::buildPartialSyncFamily(net::Family fam, const std::vector<std::string>& keys,
                                             const SnapshotSource& next, const sdk::NodeInfo& node,
                                             SyncWork& work) {
  const MirrorFamily& mf = mirror_.of(fam);
  std::vector<Fragment> frags;
  for (const auto& key : keys) {
    auto port = next.find(fam == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6, key);
    if (port) frags.push_back(renderer_.renderServicePort(*port));
  }
  judgeAffinityOfChangedPorts(fam, keys, frags, work);
  for (const auto& f : frags)
    for (const auto& problem : f.problems) host_.error("nftables: " + f.key + ": " + problem);
  bool needed = fam == net::Family::kIPv4 || !frags.empty() || mf.tableExists;
  if (!needed && keys.empty()) return;
  DesiredFamily desired;
  std::optional<GlobalObjects> global;
  std::vector<std::pair<OwnerKey, Owned>> newOwned;
  if (needed) {
    global = renderer_.renderGlobal(fam, node);
    desired.sets = global->sets;
    addDesired(desired, *global);
    newOwned.emplace_back(OwnerKey{fam, ""}, ownedOf(fam, *global));
  }
  for (auto& f : frags) {
    addDesired(desired, f);
    newOwned.emplace_back(OwnerKey{fam, f.key}, ownedOf(fam, f));
  }
  desired.moveRules = true;

  std::vector<OwnerKey> touched;
  if (needed) touched.emplace_back(fam, "");
  for (const auto& k : keys) touched.emplace_back(fam, k);
  auto result =
      NftablesDiffer::diff(fam, desired, mf, staleAfterPartialSync(fam, touched, newOwned), renderer_.setSpecs(fam));
  for (auto& op : result.ops) work.ops.push_back(std::move(op));
  work.pending[fam] = std::move(result.pendingDelete);
  for (const auto& ok : touched) work.ownedUpdates[ok] = std::nullopt;
  for (auto& [ok, o] : newOwned) work.ownedUpdates[ok] = std::move(o);
}

void NftablesBackend::judgeAffinityOfChangedPorts(net::Family fam, const std::vector<std::string>& keys,
                                                  const std::vector<Fragment>& frags, SyncWork& work) const {
  // Only ports whose entries may have gone stale are judged (judging lists the whole
  // affinity map): an endpoint left a chain, or an entry address went.
  const MirrorFamily& mf = mirror_.of(fam);
  for (const auto& key : keys) {
    auto it = owned_.find({fam, key});
    if (it == owned_.end()) continue;
    const Fragment* now = nullptr;
    for (const auto& f : frags)
      if (f.key == key) now = &f;
    if (!affinityMayBeStale(fam, it->second, now)) continue;
    // The pool IDs the port had: their ranges are those of its balancing chains.
    for (const auto& c : it->second.chains)
      if (auto mc = mf.chains.find(c); mc != mf.chains.end() && mc->second.slotBase)
        work.affinity[fam].judge(*mc->second.slotBase >> 16);
    if (now != nullptr) work.affinity[fam].add(*now);
  }
}

StaleCandidates NftablesBackend::staleAfterPartialSync(net::Family fam, const std::vector<OwnerKey>& touched,
                                                       const std::vector<std::pair<OwnerKey, Owned>>& newOwned) {
  // Stale candidates: what the re-rendered owners held before and no longer hold.
  StaleCandidates stale;
  stale.chains = pendingDelete_[fam];
  std::unordered_map<std::string, int> delta;
  for (const auto& ok : touched) {
    auto it = owned_.find(ok);
    if (it == owned_.end()) continue;
    for (const auto& c : it->second.chains) stale.chains.insert(c);
    it->second.elements.forEach([&](const PackedElements::Ref& e) { --delta[elementId(fam, e.set, e.key)]; });
  }
  for (const auto& [ok, o] : newOwned)
    o.elements.forEach([&](const PackedElements::Ref& e) { ++delta[elementId(fam, e.set, e.key)]; });
  // An element shared by several touched owners (a hairpin pair of a pod behind two
  // ports) can be listed once per owner; the differ deletes it once.
  for (const auto& ok : touched) {
    auto it = owned_.find(ok);
    if (it == owned_.end()) continue;
    it->second.elements.forEach([&](const PackedElements::Ref& e) {
      auto id = elementId(fam, e.set, e.key);
      int owners = 1;  // a slot-map element's one owner is its range's chain
      if (counted(fam, e.set)) {
        owners = static_cast<int>(elementOwners_.count(id));
      }
      int now = owners + delta[id];
      if (now <= 0) stale.elements.push_back(identityOf(fam, e));
    });
  }
  return stale;
}

void NftablesBackend::recordAcceptedSync(const SnapshotSource& next, const sdk::NodeInfo& node, SyncWork& work,
                                         bool full) {
  if (!full) {
    applyToMirror(mirror_, work.ops);  // a full sync's base followed its ops already
    work.keep(work.ops);
  }
  lastOps_ = work.takeKept();
  if (full) {
    work.fullOwners = {};
    rebuildAfterFullSync(next, node, work.fullKeys, work.fullTables, work.pending, work.fullPendingBase);
    pendingDelete_.clear();
  }
  applyOwnedUpdates(work.ownedUpdates);
  if (full) releaseRangesOfUnownedChains();
  for (net::Family fam : kFamilies) renderer_.slots(fam).settle();
  for (auto& [fam, names] : work.pending) pendingDelete_[fam] = std::move(names);
}

void NftablesBackend::applyOwnedUpdates(std::map<OwnerKey, std::optional<Owned>>& updates) {
  for (auto& [ok, o] : updates) {
    auto it = owned_.find(ok);
    if (it != owned_.end()) {
      // A balancing chain that went away frees its slot range (its elements went with it).
      for (const auto& c : it->second.chains)
        if (!o || std::find(o->chains.begin(), o->chains.end(), c) == o->chains.end())
          renderer_.slots(ok.first).release(c);
      it->second.elements.forEach([&](const PackedElements::Ref& e) {
        if (!counted(ok.first, e.set)) return;
        auto id = elementId(ok.first, e.set, e.key);
        elementOwners_.release(id);
      });
      owned_.erase(it);
    }
    if (!o) continue;
    o->elements.forEach([&](const PackedElements::Ref& e) {
        if (counted(ok.first, e.set)) elementOwners_.add(elementId(ok.first, e.set, e.key));
      });
    owned_[ok] = std::move(*o);
  }
}

void NftablesBackend::releaseRangesOfUnownedChains() {
  // Ranges read back for chains no longer wanted are free again.
  for (net::Family fam : kFamilies) {
    std::unordered_set<std::string> live;
    for (const auto& [ok, o] : owned_)
      if (ok.first == fam) live.insert(o.chains.begin(), o.chains.end());
    std::vector<std::string> gone;
    renderer_.slots(fam).forEach([&](const std::string& c) {
      if (!live.contains(c)) gone.push_back(c);
    });
    for (const auto& c : gone) renderer_.slots(fam).release(c);
  }
}

backends::PassOutcome NftablesBackend::passOutcome(bool full, std::size_t count, std::size_t changed) const {
  backends::PassOutcome out;
  out.operations = count;
  std::size_t pending = 0;
  for (const auto& [fam, names] : pendingDelete_) pending += names.size();
  out.detail = fmt::format("pending_delete={} kernel_ms={:.1f}", pending, count == 0 ? 0.0 : lastApplyMs_);
  // A full sync asked to change nothing that still needed operations: the kernel differed from
  // the plan (a self-verification, or a first sync). Name the first of them.
  if (full && changed == 0 && count > 0 && !lastOps_.empty()) {
    out.detail += " first ops:";
    for (std::size_t i = 0; i < std::min<std::size_t>(lastOps_.size(), 3); ++i) {
      out.detail += i ? "; " : " ";
      out.detail += lastOps_[i].toText(settings_.table);
    }
  }
  return out;
}

void NftablesBackend::removeStaleAffinity(net::Family fam, AffinityJudge judge) {
  if (auto pending = pendingAffinity_.find(fam); pending != pendingAffinity_.end()) {
    judge.mergeOlder(pending->second);  // what an earlier sync could not finish
    pendingAffinity_.erase(pending);
  }
  if (!judge.everything && judge.ranges.empty()) return;
  // Nothing to judge in a table without the map (a family without services).
  if (!mirror_.of(fam).sets.contains(names::kAffinityMap)) return;
  const std::size_t addr = fam == net::Family::kIPv4 ? 4 : 16;
  const SetSpec* spec = nullptr;
  for (const auto& sp : renderer_.setSpecs(fam))
    if (sp.name == names::kAffinityMap) spec = &sp;
  // An entry that expires between the listing and the deletion makes the kernel refuse the
  // batch: list again and retry; after that, the next sync tries again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto entries = kernel_->listMap(fam, names::kAffinityMap);
    if (!entries) {
      host_.error(fmt::format("nftables: reading the affinity map: {}", entries.error().message()));
      break;
    }
    std::vector<Op> ops;
    for (const auto& [key, data] : *entries) {
      if (key.size() != addr + 4) continue;
      // key: client . pool ID (host byte order, as numgen leaves it)
      std::uint32_t id = 0;
      std::memcpy(&id, key.data() + addr, sizeof id);
      // An entry this sync cannot judge stays, unless the sync saw every service.
      if (!judge.everything && !judge.ranges.contains(id >> 16)) continue;
      if (auto v = judge.valid.find(id); v != judge.valid.end() && v->second.contains(data)) continue;
      Op op;
      op.kind = OpKind::kDeleteElement;
      op.family = fam;
      op.name = names::kAffinityMap;
      op.element = std::make_shared<const Element>(
          Element{names::kAffinityMap, key, spec ? keyToText(*spec, key, fam) : std::string(), std::nullopt});
      ops.push_back(std::move(op));
    }
    if (ops.empty()) return;
    // Its own batch: a refusal here must not undo the sync.
    auto applied = kernel_->apply(ops);
    if (applied) {
      ++ownCommits_;
      host_.info(2, fmt::format("nftables removed stale affinity entries count={}", ops.size()));
      return;
    }
    host_.info(2, fmt::format("nftables removing {} stale affinity entries: {} (attempt {})", ops.size(),
                              applied.error().message(), attempt + 1));
  }
  host_.error("nftables: stale affinity entries not removed; the next sync tries again");
  pendingAffinity_[fam] = std::move(judge);
}

void NftablesBackend::rebuildAfterFullSync(const SnapshotSource& next, const sdk::NodeInfo& node,
                                           const std::map<net::Family, std::vector<std::string>>& keys,
                                           const std::map<net::Family, std::set<std::string>>& tables,
                                           const std::map<net::Family, std::set<std::string>>& pending,
                                           const std::map<net::Family, std::set<std::string>>& pendingBase) {
  mirror_ = Mirror{};
  owned_.clear();
  elementOwners_ = {};
  for (const auto& [fam, sets] : tables) {
    MirrorFamily& mf = mirror_.of(fam);
    const auto& specs = renderer_.setSpecs(fam);
    mf.tableExists = true;
    mf.sets = sets;
    for (const auto& spec : specs) mf.sets.insert(spec.name);
    // Stale chains the batch flushed (or found referenced) stay, empty, until a later sync.
    if (auto p = pending.find(fam); p != pending.end()) {
      auto b = pendingBase.find(fam);
      for (const auto& name : p->second) mf.chains[name].base = b != pendingBase.end() && b->second.contains(name);
    }
    auto record = [&](const OwnerKey& ok, const auto& objects) {
      for (const auto& c : objects.chains) {
        MirrorChain& mc = mf.chains[c.name];
        mc.base = c.base.has_value();
        for (const auto& r : c.rules) mc.addRule(ruleHash(fam, c.name, r), r);
      }
      for (const auto& e : objects.elements) {
        // As the first pass, the first port to want an element sets it.
        auto& table = mf.elements[e.set];
        if (!table.contains(e.key)) table.set(e.key, e.valueText());
      }
      Owned o = ownedOf(fam, objects);
      o.elements.forEach([&](const PackedElements::Ref& e) {
        if (counted(fam, e.set)) elementOwners_.add(elementId(fam, e.set, e.key));
      });
      owned_[ok] = std::move(o);
    };
    record({fam, ""}, renderer_.renderGlobal(fam, node));
    if (auto k = keys.find(fam); k != keys.end())
      for (const auto& key : k->second) {
        auto port = next.find(fam == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6, key);
        if (port) record({fam, key}, renderer_.renderServicePort(*port));
      }
    for (const auto& spec : specs)
      if (auto it = mf.elements.find(spec.name); it != mf.elements.end()) it->second.shrink();
    mf.rebuildReferences();
  }
}

sdk::Expected<void> NftablesBackend::send(KernelBatch& batch, bool full) {
  if (batch.size() == 0) return {};
  auto started = std::chrono::steady_clock::now();
  auto applied = batch.commit();
  if (applied) ++ownCommits_;
  lastApplyMs_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (!applied) {
    // The mirror still describes the kernel, but the next sync (full: the skeleton's rule
    // after a failure) reads it anyway.
    if (full) mirror_ = Mirror{};
    host_.error(fmt::format("nftables sync failed ops={} error=\"{}\"", batch.size(), applied.error().message()));
    return sdk::fail(sdk::kernelErrorCategory(applied.error().errnum), applied.error().message(),
                     applied.error().errnum);
  }
  return {};
}

sdk::Expected<void> NftablesBackend::cleanup() {
  requireFullSync();
  mirror_ = Mirror{};
  owned_.clear();
  elementOwners_ = {};
  pendingDelete_.clear();
  auto deleted = kernel_->deleteTables();
  if (!deleted) {
    return sdk::fail(sdk::kernelErrorCategory(deleted.error().errnum), deleted.error().message(),
                     deleted.error().errnum);
  }
  host_.info(1, fmt::format("{} cleanup deleted_tables=\"ip {}, ip6 {}\"", settings_.mode, settings_.table, settings_.table));
  return {};
}

sdk::Expected<std::string> NftablesBackend::explain(const sdk::SnapshotView& snapshot,
                                                    const sdk::ExplainRequest& request) {
  const std::vector<sdk::ServicePort> ports = snapshot.all();
  const std::vector<sdk::ServiceCIDR> cidrs = snapshot.serviceCIDRs();
  return explainPacket(settings_.render, ports, snapshot.node(), request, cidrs);
}

sdk::Expected<NftablesBackend::Metrics> NftablesBackend::registerMetrics(const sdk::Host& host) {
  Metrics m;
  auto objects = host.gauge("kproxy_nftables_objects",
                            "Chains, sets and set elements in kproxy's nftables tables",
                            {"family", "kind"});
  if (!objects) return std::unexpected(objects.error());
  m.objects = *objects;
  auto operations = host.counter("kproxy_nftables_kernel_operations_total",
                                 "nftables objects added, changed or removed by accepted batches");
  if (!operations) return std::unexpected(operations.error());
  m.operations = *operations;
  return m;
}

void NftablesBackend::updateMetrics(std::size_t operations) const {
  if (!metrics_.objects.active() && !metrics_.operations.active()) return;
  metrics_.operations.add(static_cast<double>(operations));
  for (net::Family fam : kFamilies) {
    const MirrorFamily& m = mirror_.of(fam);
    std::size_t elements = 0;
    for (const auto& [set, table] : m.elements) elements += table.size();  // a fixed few sets
    const std::string family = fam == net::Family::kIPv4 ? "ipv4" : "ipv6";
    metrics_.objects.set({family, "chain"}, static_cast<double>(m.chains.size()));
    metrics_.objects.set({family, "set"}, static_cast<double>(m.sets.size()));
    metrics_.objects.set({family, "element"}, static_cast<double>(elements));
  }
}

}  // namespace kproxy::nftables
