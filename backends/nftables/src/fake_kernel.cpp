// FakeKernelNftables: the in-memory kernel of the unit tests (kernel.h).
#include <cerrno>

#include "kproxy/nftables/kernel.h"

namespace kproxy::nftables {
namespace {

core::Result<void> refuse(const Op& op, int errnum) {
  return core::makeError(core::ErrorCategory::kKernel, "nftables: kernel refused \"" + op.toText() + "\"",
                         errnum);
}

std::string targetOf(const std::string& verdict) {
  for (std::string_view prefix : {"goto ", "jump "})
    if (verdict.starts_with(prefix)) return verdict.substr(prefix.size());
  return {};
}

bool referenced(const FakeKernelNftables::FakeTable& t, const std::string& chain) {
  for (const auto& [n, c] : t.chains)
    for (const auto& r : c.rules)
      for (const auto& target : r.targets)
        if (target == chain) return true;
  for (const auto& [s, elems] : t.elements)
    for (const auto& [k, v] : elems)
      if (targetOf(v) == chain) return true;
  return false;
}

}  // namespace

core::Result<void> FakeKernelNftables::apply(const std::vector<Op>& ops) {
  ++batches;
  lastBatchSize = ops.size();
  auto next = tables;  // atomic: work on a copy, commit at the end
  auto fail = failAt_;
  failAt_.reset();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (fail && *fail == i) return refuse(op, failErrno_);
    if (op.kind == OpKind::kAddTable) {
      next[op.family];
      continue;
    }
    auto tit = next.find(op.family);
    if (tit == next.end()) return refuse(op, ENOENT);
    FakeTable& t = tit->second;
    switch (op.kind) {
      case OpKind::kAddTable: break;
      case OpKind::kAddSet: t.sets.emplace(op.set->name, *op.set); t.elements[op.set->name]; break;
      case OpKind::kAddChain: t.chains[op.name].base = op.base != nullptr; break;
      case OpKind::kFlushChain: {
        auto it = t.chains.find(op.name);
        if (it == t.chains.end()) return refuse(op, ENOENT);
        it->second.rules.clear();
        break;
      }
      case OpKind::kAddRule: {
        auto it = t.chains.find(op.name);
        if (it == t.chains.end()) return refuse(op, ENOENT);
        auto targets = op.rule.targets();
        for (const auto& target : targets)
          if (!t.chains.contains(target)) return refuse(op, ENOENT);
        FakeRule rule{op.ruleHash, std::move(targets), op.rule.toText(op.family), std::nullopt};
        for (const auto& st : op.rule.statements)
          if (const auto* d = std::get_if<DnatFromSlots>(&st)) rule.slotBase = d->base;
        it->second.rules.push_back(std::move(rule));
        break;
      }
      case OpKind::kDeleteElement: {
        if (auto spec = t.sets.find(op.name); spec != t.sets.end() && spec->second.dynamic) {
          if (dataPathEntries[op.family][op.name].erase(op.element->key) == 0) return refuse(op, ENOENT);
          break;
        }
        auto sit = t.elements.find(op.name);
        if (sit == t.elements.end() || sit->second.erase(op.element->key) == 0) return refuse(op, ENOENT);
        break;
      }
      case OpKind::kAddElement: {
        auto sit = t.elements.find(op.name);
        if (sit == t.elements.end()) return refuse(op, ENOENT);
        std::string value = op.element->valueText();
        if (auto target = targetOf(value); !target.empty() && !t.chains.contains(target))
          return refuse(op, ENOENT);
        auto [it, inserted] = sit->second.emplace(op.element->key, value);
        if (!inserted && it->second != value) return refuse(op, EEXIST);
        break;
      }
      case OpKind::kDeleteChain: {
        auto it = t.chains.find(op.name);
        if (it == t.chains.end()) return refuse(op, ENOENT);
        if (!it->second.rules.empty() || referenced(t, op.name)) return refuse(op, EBUSY);
        t.chains.erase(it);
        break;
      }
    }
  }
  tables = std::move(next);
  return {};
}

core::Result<Mirror> FakeKernelNftables::readBack(const std::vector<SetSpec>& ip4Sets,
                                                  const std::vector<SetSpec>& ip6Sets) {
  ++readBacks;
  Mirror m;
  for (const auto& [family, t] : tables) {
    MirrorFamily& f = m.of(family);
    const auto& specs = family == net::Family::kIPv4 ? ip4Sets : ip6Sets;
    f.tableExists = true;
    for (const auto& [name, c] : t.chains) {
      MirrorChain mc;
      mc.base = c.base;
      for (const auto& r : c.rules) {
        mc.rules.push_back(r.hash);
        if (r.slotBase) mc.slotBase = r.slotBase;
        mc.targets.insert(mc.targets.end(), r.targets.begin(), r.targets.end());
      }
      f.chains.emplace(name, std::move(mc));
    }
    for (const auto& [name, spec] : t.sets) {
      f.sets.insert(name);
      bool dynamic = false;
      for (const auto& s : specs)
        if (s.name == name) dynamic = s.dynamic;
      if (dynamic) continue;
      auto& elems = f.elements[name];
      if (auto it = t.elements.find(name); it != t.elements.end())
        for (const auto& [k, v] : it->second) elems.set(k, v);
    }
    f.rebuildReferences();
  }
  return m;
}

core::Result<std::vector<std::pair<std::string, std::string>>> FakeKernelNftables::listMap(
    net::Family family, const std::string& map) {
  ++mapListings;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, data] : dataPathEntries[family][map]) out.emplace_back(key, data);
  return out;
}

core::Result<void> FakeKernelNftables::deleteTables() {
  tables.clear();
  return {};
}

}  // namespace kproxy::nftables
