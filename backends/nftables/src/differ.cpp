#include "kproxy/nftables/differ.h"

#include <algorithm>

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

void MirrorFamily::rebuildReferences() {
  references.clear();
  for (const auto& [name, chain] : chains)
    for (const auto& t : chain.targets) ++references[t];
  for (const auto& [set, elems] : elements)
    for (const auto& [key, value] : elems)
      if (auto t = verdictTarget(value); !t.empty()) ++references[t];
}

std::string Op::toText() const {
  std::string_view fam = familyKeyword(family);
  switch (kind) {
    case OpKind::kAddTable: return fmt::format("add table {} {}", fam, kTableName);
    case OpKind::kAddSet: return "add " + set->declaration(family);
    case OpKind::kAddChain:
      if (base)
        return fmt::format("add chain {} {} {} {{ type {} hook {} priority {} ; policy accept ; }}",
                           fam, kTableName, name, base->type, base->hook, base->priority);
      return fmt::format("add chain {} {} {}", fam, kTableName, name);
    case OpKind::kFlushChain: return fmt::format("flush chain {} {} {}", fam, kTableName, name);
    case OpKind::kAddRule:
      return fmt::format("add rule {} {} {} {}", fam, kTableName, name, rule.toText(family));
    case OpKind::kDeleteElement:
      // An interval end goes with its start in nft syntax.
      if (element->intervalEnd) return fmt::format("# (end of an interval: {})", element->keyText);
      return fmt::format("delete element {} {} {} {{ {} }}", fam, kTableName, name, element->keyText);
    case OpKind::kAddElement:
      if (element->intervalEnd) return fmt::format("# (end of an interval: {})", element->keyText);
      if (!element->dataText.empty())
        return fmt::format("add element {} {} {} {{ {} : {} }}", fam, kTableName, name,
                           element->keyText, element->dataText);
      if (element->value)
        return fmt::format("add element {} {} {} {{ {} : {} }}", fam, kTableName, name,
                           element->keyText, element->value->toString());
      return fmt::format("add element {} {} {} {{ {} }}", fam, kTableName, name, element->keyText);
    case OpKind::kDeleteChain: return fmt::format("delete chain {} {} {}", fam, kTableName, name);
  }
  return {};
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
        c.rules.push_back(op.ruleHash);
        for (const auto& st : op.rule.statements)
          if (const auto* d = std::get_if<DnatFromSlots>(&st)) c.slotBase = d->base;
        for (auto& t : op.rule.targets()) {
          addRef(m, t);
          c.targets.push_back(std::move(t));
        }
        break;
      }
      case OpKind::kDeleteElement: {
        auto sit = m.elements.find(op.name);
        if (sit == m.elements.end()) break;
        auto eit = sit->second.find(op.element->key);
        if (eit == sit->second.end()) break;
        dropRef(m, verdictTarget(eit->second));
        sit->second.erase(eit);
        break;
      }
      case OpKind::kAddElement: {
        std::string value = valueText(*op.element);
        addRef(m, verdictTarget(value));
        m.elements[op.name][op.element->key] = std::move(value);
        break;
      }
      case OpKind::kDeleteChain: m.chains.erase(op.name); break;
    }
  }
}

DiffResult NftablesDiffer::diff(Family family, const DesiredFamily& desired,
                                const MirrorFamily& mirror, const StaleCandidates& stale,
                                const std::vector<SetSpec>& setSpecs) {
  DiffResult out;
  std::vector<Op> tables, sets, addChains, flushes, rules, delElems, addElems, delChains;
  auto op = [&](OpKind kind, std::string name) {
    Op o;
    o.kind = kind;
    o.family = family;
    o.name = std::move(name);
    return o;
  };

  bool wantsAnything = !desired.sets.empty() || !desired.chains.empty() || !desired.elements.empty();
  if (wantsAnything && !mirror.tableExists) tables.push_back(op(OpKind::kAddTable, {}));

  for (const auto& s : desired.sets) {
    if (mirror.sets.contains(s.name)) continue;
    Op o = op(OpKind::kAddSet, s.name);
    o.set = std::make_shared<const SetSpec>(s);
    sets.push_back(std::move(o));
  }

  std::unordered_set<std::string_view> desiredChains;
  desiredChains.reserve(desired.chains.size());
  for (Chain* c : desired.chains) {
    desiredChains.insert(c->name);
    std::vector<std::uint64_t> hashes;
    hashes.reserve(c->rules.size());
    for (const auto& r : c->rules) hashes.push_back(ruleHash(family, c->name, r));
    auto it = mirror.chains.find(c->name);
    if (it == mirror.chains.end()) {
      Op o = op(OpKind::kAddChain, c->name);
      if (c->base) o.base = std::make_shared<const BaseHook>(*c->base);
      addChains.push_back(std::move(o));
    } else if (it->second.rules == hashes) {
      continue;
    } else if (!it->second.rules.empty()) {
      flushes.push_back(op(OpKind::kFlushChain, c->name));
    }
    for (std::size_t i = 0; i < c->rules.size(); ++i) {
      Op o = op(OpKind::kAddRule, c->name);
      if (desired.moveRules)
        o.rule = std::move(c->rules[i]);
      else
        o.rule = c->rules[i];
      o.ruleHash = hashes[i];
      rules.push_back(std::move(o));
    }
  }

  std::unordered_set<std::string> desiredElements;
  desiredElements.reserve(desired.elements.size());
  for (Element* e : desired.elements) {
    desiredElements.insert(elementId(e->set, e->key));
    std::string value = valueText(*e);
    const std::string* current = nullptr;
    if (auto sit = mirror.elements.find(e->set); sit != mirror.elements.end())
      if (auto eit = sit->second.find(e->key); eit != sit->second.end()) current = &eit->second;
    if (current != nullptr && *current == value) continue;
    if (current != nullptr) {
      Op d = op(OpKind::kDeleteElement, e->set);
      d.element = std::make_shared<const Element>(e->identity());
      delElems.push_back(std::move(d));
    }
    Op a = op(OpKind::kAddElement, e->set);
    if (desired.moveRules)
      a.element = std::make_shared<const Element>(std::move(*e));
    else
      a.element = std::make_shared<const Element>(*e);
    addElems.push_back(std::move(a));
  }

  // Stale elements.
  auto specOf = [&](const std::string& set) -> const SetSpec* {
    for (const auto& s : setSpecs)
      if (s.name == set) return &s;
    return nullptr;
  };
  std::unordered_set<std::string> deleted;
  auto deleteElement = [&](const std::string& set, const std::string& key, std::string keyText) {
    if (desiredElements.contains(elementId(set, key))) return;
    if (!deleted.insert(elementId(set, key)).second) return;  // listed twice: delete once
    auto sit = mirror.elements.find(set);
    if (sit == mirror.elements.end()) return;
    auto eit = sit->second.find(key);
    if (eit == sit->second.end()) return;
    const SetSpec* spec = specOf(set);
    const bool interval = spec != nullptr && spec->interval;
    Element gone{set, key, std::move(keyText), std::nullopt, {}, {}, eit->second == "end",
                 interval ? kIntervalIdentitySize : std::uint8_t{0}};
    Op d = op(OpKind::kDeleteElement, set);
    d.element = std::make_shared<const Element>(std::move(gone));
    delElems.push_back(std::move(d));
  };
  if (stale.everythingNotDesired) {
    for (const auto& [set, elems] : mirror.elements) {
      const SetSpec* spec = specOf(set);
      if (spec != nullptr && spec->dynamic) continue;  // filled by the data path, not by us
      for (const auto& [key, value] : elems) {
        std::string text = spec != nullptr ? keyToText(*spec, key, family) : std::string();
        deleteElement(set, key, std::move(text));
      }
    }
  } else {
    for (const auto& e : stale.elements) deleteElement(e.set, e.key, e.keyText);
  }

  // Stale chains: flush now, delete once empty and unreferenced.
  auto retire = [&](const std::string& name) {
    if (desiredChains.contains(name)) return;
    auto it = mirror.chains.find(name);
    if (it == mirror.chains.end()) return;
    auto refs = mirror.references.find(name);
    bool referenced = refs != mirror.references.end() && refs->second > 0;
    if (!it->second.rules.empty()) {
      flushes.push_back(op(OpKind::kFlushChain, name));
      out.pendingDelete.insert(name);
    } else if (referenced) {
      out.pendingDelete.insert(name);
    } else {
      delChains.push_back(op(OpKind::kDeleteChain, name));
    }
  };
  if (stale.everythingNotDesired) {
    std::vector<std::string> names;
    for (const auto& [name, chain] : mirror.chains) names.push_back(name);
    std::sort(names.begin(), names.end());  // deterministic batches
    for (const auto& n : names) retire(n);
  } else {
    for (const auto& n : stale.chains) retire(n);
  }

  // Interval elements are deleted in key order, an interval's end before the next one's start
  // at the same key: the kernel's rbtree looks a deleted element up among those the batch
  // already deactivated, and in another order it can miss one and refuse (ENOENT).
  std::stable_sort(delElems.begin(), delElems.end(), [](const Op& a, const Op& b) {
    if (a.name != b.name) return a.name < b.name;
    if (a.element->identitySuffix == 0 || b.element->identitySuffix == 0) return false;
    auto ka = a.element->kernelKey(), kb = b.element->kernelKey();
    if (ka != kb) return ka < kb;
    return a.element->intervalEnd && !b.element->intervalEnd;
  });
  for (auto* bucket : {&tables, &sets, &addChains, &flushes, &rules, &delElems, &addElems, &delChains})
    for (auto& o : *bucket) out.ops.push_back(std::move(o));
  return out;
}

}  // namespace kproxy::nftables
