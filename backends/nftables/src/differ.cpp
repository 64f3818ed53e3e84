#include "kproxy/nftables/differ.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

namespace kproxy::nftables {
namespace {

std::string elementId(std::string_view set, std::string_view key) {
  std::string id(set);
  id.push_back('\0');
  id.append(key);
  return id;
}

std::string verdictTarget(std::string_view verdictText) {
  for (std::string_view prefix : {"goto ", "jump "})
    if (verdictText.starts_with(prefix)) return std::string(verdictText.substr(prefix.size()));
  return {};
}

std::string valueText(const Element& e) { return e.valueText(); }

void addRef(MirrorFamily& m, const std::string& chain) {
  if (!chain.empty()) ++m.references[chain];
}
void dropRef(MirrorFamily& m, const std::string& chain) {
  if (chain.empty()) return;
  auto it = m.references.find(chain);
  if (it == m.references.end()) return;
  if (--it->second == 0) m.references.erase(it);
}

}  // namespace

std::size_t ElementTable::recordSize(std::uint32_t offset) const {
  const auto* p = reinterpret_cast<const unsigned char*>(arena_.data()) + offset;
  return 3 + p[0] + (static_cast<std::size_t>(p[1]) << 8 | p[2]);
}

ElementTable::value_type ElementTable::record(std::uint32_t offset) const {
  const auto* p = reinterpret_cast<const unsigned char*>(arena_.data()) + offset;
  const std::size_t klen = p[0];
  const std::size_t vlen = static_cast<std::size_t>(p[1]) << 8 | p[2];
  std::string_view all(arena_.data() + offset + 3, klen + vlen);
  return {all.substr(0, klen), all.substr(klen)};
}

std::size_t ElementTable::nextOccupied(std::size_t from) const {
  while (from < slots_.size() && slots_[from] < 2) ++from;
  return from;
}

std::size_t ElementTable::slotOf(std::string_view key) const {
  if (slots_.empty()) return 0;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = std::hash<std::string_view>{}(key) & mask;; i = (i + 1) & mask) {
    const std::uint32_t s = slots_[i];
    if (s == 0) return slots_.size();
    if (s >= 2 && record(s - 2).first == key) return i;
  }
}

ElementTable::const_iterator ElementTable::find(std::string_view key) const {
  return const_iterator(this, slotOf(key));
}

std::string_view ElementTable::at(std::string_view key) const {
  auto it = find(key);
  if (it == end()) throw std::out_of_range("no element with this key");
  return it->second;
}

void ElementTable::rebuild(std::size_t capacity) {
  std::string arena;
  arena.reserve(arena_.size() - garbage_);
  std::vector<std::uint32_t> slots(capacity, 0);
  const std::size_t mask = capacity - 1;
  for (std::uint32_t s : slots_) {
    if (s < 2) continue;
    const std::uint32_t from = s - 2;
    const auto offset = static_cast<std::uint32_t>(arena.size());
    arena.append(arena_, from, recordSize(from));
    std::size_t i = std::hash<std::string_view>{}(record(from).first) & mask;
    while (slots[i] != 0) i = (i + 1) & mask;
    slots[i] = offset + 2;
  }
  arena_ = std::move(arena);
  slots_ = std::move(slots);
  removed_ = 0;
  garbage_ = 0;
}

void ElementTable::set(std::string_view key, std::string_view value) {
  if (key.size() > 0xff || value.size() > 0xffff) throw std::length_error("element key or value too long");
  if (arena_.size() + 3 + key.size() + value.size() > 0xfffffff0u) throw std::length_error("element table full");
  if (garbage_ > 4096 && garbage_ * 2 > arena_.size()) rebuild(slots_.size());  // mostly dead records
  std::size_t at = slotOf(key);
  if (at < slots_.size()) {
    const std::uint32_t offset = slots_[at] - 2;
    if (record(offset).second.size() == value.size()) {  // same length: in place
      arena_.replace(offset + 3 + key.size(), value.size(), value);
      return;
    }
    garbage_ += recordSize(offset);
  } else {
    // Keep the index at most 70% full (removed slots count) and the arena mostly live.
    if ((size_ + removed_ + 1) * 10 > slots_.size() * 7) {
      std::size_t capacity = std::max<std::size_t>(16, slots_.size());
      while ((size_ + 1) * 10 > capacity * 5) capacity *= 2;
      rebuild(capacity);
    }
    const std::size_t mask = slots_.size() - 1;
    at = std::hash<std::string_view>{}(key) & mask;
    while (slots_[at] >= 2) at = (at + 1) & mask;
    if (slots_[at] == 1) --removed_;
    ++size_;
  }
  const auto offset = static_cast<std::uint32_t>(arena_.size());
  arena_.push_back(static_cast<char>(key.size()));
  arena_.push_back(static_cast<char>(value.size() >> 8));
  arena_.push_back(static_cast<char>(value.size() & 0xff));
  arena_.append(key);
  arena_.append(value);
  slots_[at] = offset + 2;
}

bool ElementTable::erase(std::string_view key) {
  const std::size_t at = slotOf(key);
  if (at >= slots_.size()) return false;
  garbage_ += recordSize(slots_[at] - 2);
  slots_[at] = 1;
  ++removed_;
  if (--size_ == 0) *this = ElementTable{};  // hand the memory back
  return true;
}

void MirrorFamily::rebuildReferences() {
  references.clear();
  for (const auto& [name, chain] : chains)
    for (const auto& t : chain.targets) ++references[t];
  for (const auto& [set, elems] : elements)
    for (const auto& [key, value] : elems)
      if (auto t = verdictTarget(value); !t.empty()) ++references[t];
}

std::string Op::toText(std::string_view table) const {
  std::string_view fam = familyKeyword(family);
  switch (kind) {
    case OpKind::kAddTable: return fmt::format("add table {} {}", fam, table);
    case OpKind::kAddSet: return "add " + set->declaration(family, table);
    case OpKind::kAddChain:
      if (base)
        return fmt::format("add chain {} {} {} {{ type {} hook {} priority {} ; policy accept ; }}",
                           fam, table, name, base->type, base->hook, base->priority);
      return fmt::format("add chain {} {} {}", fam, table, name);
    case OpKind::kFlushChain: return fmt::format("flush chain {} {} {}", fam, table, name);
    case OpKind::kAddRule:
      return fmt::format("add rule {} {} {} {}", fam, table, name, rule.toText(family));
    case OpKind::kDeleteElement:
      // An interval end goes with its start in nft syntax.
      if (element->intervalEnd) return fmt::format("# (end of an interval: {})", element->keyText);
      return fmt::format("delete element {} {} {} {{ {} }}", fam, table, name, element->keyText);
    case OpKind::kAddElement:
      if (element->intervalEnd) return fmt::format("# (end of an interval: {})", element->keyText);
      if (!element->dataText.empty())
        return fmt::format("add element {} {} {} {{ {} : {} }}", fam, table, name,
                           element->keyText, element->dataText);
      if (element->value)
        return fmt::format("add element {} {} {} {{ {} : {} }}", fam, table, name,
                           element->keyText, element->value->toString());
      return fmt::format("add element {} {} {} {{ {} }}", fam, table, name, element->keyText);
    case OpKind::kDeleteChain: return fmt::format("delete chain {} {} {}", fam, table, name);
  }
  return {};
}

void MirrorChain::addRule(std::uint64_t hash, const Rule& rule) {
  rules.push_back(hash);
  for (auto& t : rule.targets()) targets.push_back(std::move(t));
  for (const auto& st : rule.statements)
    if (const auto* d = std::get_if<DnatFromSlots>(&st)) slotBase = d->base;
}

void applyToMirror(Mirror& mirror, const std::vector<Op>& ops) {
  for (const auto& op : ops) {
    MirrorFamily& m = mirror.of(op.family);
    switch (op.kind) {
      case OpKind::kAddTable: m.tableExists = true; break;
      case OpKind::kAddSet: m.sets.insert(op.name); break;
      case OpKind::kAddChain: m.chains[op.name].base = op.base != nullptr; break;
      case OpKind::kFlushChain: {
        auto& c = m.chains[op.name];
        for (const auto& t : c.targets) dropRef(m, t);
        c.slotBase.reset();
        c.rules.clear();
        c.targets.clear();
        break;
      }
      case OpKind::kAddRule: {
        auto& c = m.chains[op.name];
        const std::size_t from = c.targets.size();
        c.addRule(op.ruleHash, op.rule);
        for (std::size_t i = from; i < c.targets.size(); ++i) addRef(m, c.targets[i]);
        break;
      }
      case OpKind::kDeleteElement: {
        auto sit = m.elements.find(op.name);
        if (sit == m.elements.end()) break;
        auto eit = sit->second.find(op.element->key);
        if (eit == sit->second.end()) break;
        dropRef(m, verdictTarget(eit->second));
        sit->second.erase(op.element->key);
        break;
      }
      case OpKind::kAddElement: {
        std::string value = valueText(*op.element);
        addRef(m, verdictTarget(value));
        m.elements[op.name].set(op.element->key, value);
        break;
      }
      case OpKind::kDeleteChain: m.chains.erase(op.name); break;
    }
  }
}

namespace {

/// One diff of a family: the ops by kind, and what the desired objects claim, so that stale
/// candidates the sync still wants are kept.
class FamilyDiff {
 public:
  FamilyDiff(net::Family family, const MirrorFamily& mirror, const std::vector<SetSpec>& setSpecs)
      : family_(family), mirror_(mirror), setSpecs_(setSpecs) {}

  void addTableAndSets(const DesiredFamily& desired) {
    bool wantsAnything = !desired.sets.empty() || !desired.chains.empty() || !desired.elements.empty();
    if (wantsAnything && !mirror_.tableExists) tables_.push_back(op(OpKind::kAddTable, {}));
    for (const auto& s : desired.sets) {
      if (mirror_.sets.contains(s.name)) continue;
      Op o = op(OpKind::kAddSet, s.name);
      o.set = std::make_shared<const SetSpec>(s);
      sets_.push_back(std::move(o));
    }
  }

  /// A chain whose rules differ is flushed and filled again; a new one is added.
  void addChains(const DesiredFamily& desired) {
    desiredChains_.reserve(desired.chains.size());
    for (Chain* c : desired.chains) {
      desiredChains_.insert(c->name);
      std::vector<std::uint64_t> hashes;
      hashes.reserve(c->rules.size());
      for (const auto& r : c->rules) hashes.push_back(ruleHash(family_, c->name, r));
      auto it = mirror_.chains.find(c->name);
      if (it == mirror_.chains.end()) {
        Op o = op(OpKind::kAddChain, c->name);
        if (c->base) o.base = std::make_shared<const BaseHook>(*c->base);
        addChains_.push_back(std::move(o));
      } else if (it->second.rules == hashes) {
        continue;
      } else if (!it->second.rules.empty()) {
        flushes_.push_back(op(OpKind::kFlushChain, c->name));
      }
      for (std::size_t i = 0; i < c->rules.size(); ++i) {
        Op o = op(OpKind::kAddRule, c->name);
        if (desired.moveRules)
          o.rule = std::move(c->rules[i]);
        else
          o.rule = c->rules[i];
        o.ruleHash = hashes[i];
        rules_.push_back(std::move(o));
      }
    }
  }

  /// An element whose value differs is deleted and added again; a new one is added.
  void addElements(const DesiredFamily& desired) {
    desiredElements_.reserve(desired.elements.size());
    // The interval start added last, if the element before this one was one: its end goes with
    // it (see below).
    const Element* startAdded = nullptr;
    for (Element* e : desired.elements) {
      const Element* start = std::exchange(startAdded, nullptr);
      // Several owners may want one element (a hairpin pair of a pod behind two ports; an
      // address two ports share): a second add of it in one batch is refused (EEXIST).
      if (!desiredElements_.insert(elementId(e->set, e->key)).second) continue;
      std::string value = valueText(*e);
      std::optional<std::string_view> current;
      if (auto sit = mirror_.elements.find(e->set); sit != mirror_.elements.end())
        if (auto eit = sit->second.find(e->key); eit != sit->second.end()) current = eit->second;
      // An interval start is added with its end, even when the end is unchanged (an endpoint
      // replaced in place), as nft itself sends intervals: under the soak's churn the kernel
      // refused, now and then, element messages that carried a start without its end (EEXIST),
      // and accepted the same changes sent as start-end pairs. The renderer lists each start
      // just before its end.
      const bool endOfAddedStart =
          start != nullptr && e->identitySuffix != 0 && e->intervalEnd && start->set == e->set;
      if (current && *current == value && !endOfAddedStart) continue;
      if (current) {
        Op d = op(OpKind::kDeleteElement, e->set);
        d.element = std::make_shared<const Element>(e->identity());
        delElems_.push_back(std::move(d));
      }
      Op a = op(OpKind::kAddElement, e->set);
      if (desired.moveRules)
        a.element = std::make_shared<const Element>(std::move(*e));
      else
        a.element = std::make_shared<const Element>(*e);
      if (a.element->identitySuffix != 0 && !a.element->intervalEnd) startAdded = a.element.get();
      addElems_.push_back(std::move(a));
    }
  }

  void deleteStaleElements(const StaleCandidates& stale) {
    if (stale.everythingNotDesired) {
      for (const auto& [set, elems] : mirror_.elements) {
        const SetSpec* spec = specOf(set);
        if (spec != nullptr && spec->dynamic) continue;  // filled by the data path, not by us
        for (const auto& [key, value] : elems) {
          std::string text = spec != nullptr ? keyToText(*spec, key, family_) : std::string();
          deleteElement(set, std::string(key), std::move(text));
        }
      }
    } else {
      for (const auto& e : stale.elements) deleteElement(e.set, e.key, e.keyText);
    }
  }

  /// Stale chains: flush now, delete once empty and unreferenced.
  void retireStaleChains(const StaleCandidates& stale) {
    if (stale.everythingNotDesired) {
      std::vector<std::string> names;
      for (const auto& [name, chain] : mirror_.chains) names.push_back(name);
      std::sort(names.begin(), names.end());  // deterministic batches
      for (const auto& n : names) retire(n);
    } else {
      for (const auto& n : stale.chains) retire(n);
    }
  }

  /// The ops in the order a batch sends them.
  DiffResult result() && {
    // Interval elements are deleted in key order, an interval's end before the next one's start
    // at the same key: the kernel's rbtree looks a deleted element up among those the batch
    // already deactivated, and in another order it can miss one and refuse (ENOENT).
    std::stable_sort(delElems_.begin(), delElems_.end(), [](const Op& a, const Op& b) {
      if (a.name != b.name) return a.name < b.name;
      if (a.element->identitySuffix == 0 || b.element->identitySuffix == 0) return false;
      auto ka = a.element->kernelKey(), kb = b.element->kernelKey();
      if (ka != kb) return ka < kb;
      return a.element->intervalEnd && !b.element->intervalEnd;
    });
    // Additions do not depend on each other: grouped by set (each set's in render order), runs
    // of one set share a netlink message, which makes the batch smaller and spares the kernel a
    // set lookup by name per message.
    std::stable_sort(addElems_.begin(), addElems_.end(), [](const Op& a, const Op& b) { return a.name < b.name; });
    for (auto* bucket : {&tables_, &sets_, &addChains_, &flushes_, &rules_, &delElems_, &addElems_, &delChains_})
      for (auto& o : *bucket) out_.ops.push_back(std::move(o));
    return std::move(out_);
  }

 private:
  Op op(OpKind kind, std::string name) const {
    Op o;
    o.kind = kind;
    o.family = family_;
    o.name = std::move(name);
    return o;
  }

  const SetSpec* specOf(const std::string& set) const {
    for (const auto& s : setSpecs_)
      if (s.name == set) return &s;
    return nullptr;
  }

  void deleteElement(const std::string& set, const std::string& key, std::string keyText) {
    if (desiredElements_.contains(elementId(set, key))) return;
    if (!deleted_.insert(elementId(set, key)).second) return;  // listed twice: delete once
    auto sit = mirror_.elements.find(set);
    if (sit == mirror_.elements.end()) return;
    auto eit = sit->second.find(key);
    if (eit == sit->second.end()) return;
    const SetSpec* spec = specOf(set);
    const bool interval = spec != nullptr && spec->interval;
    Element gone{set, key, std::move(keyText), std::nullopt, {}, {}, eit->second == "end",
                 interval ? kIntervalIdentitySize : std::uint8_t{0}};
    Op d = op(OpKind::kDeleteElement, set);
    d.element = std::make_shared<const Element>(std::move(gone));
    delElems_.push_back(std::move(d));
  }

  void retire(const std::string& name) {
    if (desiredChains_.contains(name)) return;
    auto it = mirror_.chains.find(name);
    if (it == mirror_.chains.end()) return;
    auto refs = mirror_.references.find(name);
    bool referenced = refs != mirror_.references.end() && refs->second > 0;
    if (!it->second.rules.empty()) {
      flushes_.push_back(op(OpKind::kFlushChain, name));
      out_.pendingDelete.insert(name);
    } else if (referenced) {
      out_.pendingDelete.insert(name);
    } else {
      delChains_.push_back(op(OpKind::kDeleteChain, name));
    }
  }

  const net::Family family_;
  const MirrorFamily& mirror_;
  const std::vector<SetSpec>& setSpecs_;
  DiffResult out_;
  std::vector<Op> tables_, sets_, addChains_, flushes_, rules_, delElems_, addElems_, delChains_;
  std::unordered_set<std::string_view> desiredChains_;  ///< names owned by the desired chains
  std::unordered_set<std::string> desiredElements_;     ///< elementId of each desired element
  std::unordered_set<std::string> deleted_;             ///< elementId of each stale deletion
};

}  // namespace

DiffResult NftablesDiffer::diff(net::Family family, const DesiredFamily& desired,
                                const MirrorFamily& mirror, const StaleCandidates& stale,
                                const std::vector<SetSpec>& setSpecs) {
  FamilyDiff d(family, mirror, setSpecs);
  d.addTableAndSets(desired);
  d.addChains(desired);
  d.addElements(desired);
  d.deleteStaleElements(stale);
  d.retireStaleChains(stale);
  return std::move(d).result();
}

}  // namespace kproxy::nftables
