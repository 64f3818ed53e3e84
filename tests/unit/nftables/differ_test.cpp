// NftablesDiffer: desired objects vs. a mirror → ordered ops.

#include <random>
#include <string>
#include <unordered_map>

#include <catch2/catch.hpp>

#include "kproxy/nftables/differ.h"
#include "kproxy/nftables/renderer.h"
#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::nftables;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;

namespace {

struct World {
  NftablesRenderer renderer{RenderConfig{}};
  GlobalObjects global = renderer.renderGlobal(net::Family::kIPv4, {});
  std::vector<Fragment> fragments;

  DesiredFamily desired() {
    DesiredFamily d;
    d.sets = global.sets;
    for (auto& c : global.chains) d.chains.push_back(&c);
    for (auto& e : global.elements) d.elements.push_back(&e);
    for (auto& f : fragments) {
      for (auto& c : f.chains) d.chains.push_back(&c);
      for (auto& e : f.elements) d.elements.push_back(&e);
    }
    return d;
  }
  DiffResult fullDiff(const Mirror& m) {
    StaleCandidates s;
    s.everythingNotDesired = true;
    return NftablesDiffer::diff(net::Family::kIPv4, desired(), m.ip, s, renderer.setSpecs(net::Family::kIPv4));
  }
};

std::vector<std::string> texts(const std::vector<Op>& ops) {
  std::vector<std::string> out;
  for (const auto& o : ops) out.push_back(o.toText());
  return out;
}

}  // namespace

TEST_CASE("differ: from nothing, then unchanged is zero ops", "[unit]") {
  World w;
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080)});
  w.fragments.push_back(w.renderer.renderServicePort(p));
  Mirror m;
  auto first = w.fullDiff(m);
  REQUIRE_FALSE(first.ops.empty());
  CHECK(first.ops.front().toText() == "add table ip kube-proxy");
  // Order: sets before chains before rules before elements.
  auto pos = [&](OpKind k) {
    for (std::size_t i = 0; i < first.ops.size(); ++i)
      if (first.ops[i].kind == k) return i;
    return first.ops.size();
  };
  CHECK(pos(OpKind::kAddSet) < pos(OpKind::kAddChain));
  CHECK(pos(OpKind::kAddChain) < pos(OpKind::kAddRule));
  CHECK(pos(OpKind::kAddRule) < pos(OpKind::kAddElement));
  applyToMirror(m, first.ops);
  CHECK(w.fullDiff(m).ops.empty());
}

TEST_CASE("differ: handing the rules over gives the same ops as copying them", "[unit]") {
  World w;
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080)});
  w.fragments.push_back(w.renderer.renderServicePort(p));
  Mirror m;
  auto copied = texts(w.fullDiff(m).ops);
  StaleCandidates s;
  s.everythingNotDesired = true;
  DesiredFamily d = w.desired();
  d.moveRules = true;
  auto moved = NftablesDiffer::diff(net::Family::kIPv4, d, m.ip, s, w.renderer.setSpecs(net::Family::kIPv4));
  CHECK(texts(moved.ops) == copied);
  // The rules really left the fragments.
  std::size_t left = 0;
  for (const auto& c : w.fragments[0].chains)
    for (const auto& r : c.rules) left += r.statements.size();
  CHECK(left == 0);
}

TEST_CASE("differ: one endpoint removal changes map elements only, no rule or chain", "[unit]") {
  World w;
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080)});
  for (int i = 0; i < 50; ++i)
    w.fragments.push_back(w.renderer.renderServicePort(
        clusterIP("ns", "other-" + std::to_string(i), "172.30.1." + std::to_string(i), 80,
                  {endpoint("10.2.0." + std::to_string(i), 80)})));
  w.fragments.push_back(w.renderer.renderServicePort(p));
  Mirror m;
  applyToMirror(m, w.fullDiff(m).ops);

  testing::setEndpoints(p, {endpoint("10.1.0.1", 8080)});
  w.fragments.back() = w.renderer.renderServicePort(p);
  auto d = w.fullDiff(m);
  // The old layout (two intervals: two starts, two ends) goes, the new one (one interval)
  // comes, and the removed endpoint's hairpin pair goes. Nothing that makes the kernel
  // re-validate the table: no rule, no chain, no verdict.
  std::size_t deletes = 0, adds = 0;
  for (const auto& o : d.ops) {
    CHECK((o.kind == OpKind::kDeleteElement || o.kind == OpKind::kAddElement));
    if (o.kind == OpKind::kDeleteElement) ++deletes;
    if (o.kind == OpKind::kAddElement) {
      ++adds;
      CHECK_FALSE(o.element->value.has_value());
    }
  }
  CHECK(deletes == 5);
  CHECK(adds == 2);
  auto t = texts(d.ops);
  CHECK(std::find(t.begin(), t.end(), "delete element ip kube-proxy hairpin-ips { 10.1.0.2 . 10.1.0.2 }") != t.end());
  CHECK(d.pendingDelete.empty());
  applyToMirror(m, d.ops);
  CHECK(w.fullDiff(m).ops.empty());
}

TEST_CASE("differ: a removed service flushes chains and deletes elements, then chains", "[unit]") {
  World w;
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  w.fragments.push_back(w.renderer.renderServicePort(p));
  Mirror m;
  applyToMirror(m, w.fullDiff(m).ops);
  w.fragments.clear();
  auto d = w.fullDiff(m);
  auto t = texts(d.ops);
  // cluster-ips, service-ips, the hairpin pair, the interval's start and end
  CHECK(std::count_if(d.ops.begin(), d.ops.end(), [](const Op& o) { return o.kind == OpKind::kDeleteElement; }) == 5);
  CHECK(std::find(t.begin(), t.end(), "delete element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 }") != t.end());
  CHECK(std::none_of(d.ops.begin(), d.ops.end(), [](const Op& o) { return o.kind == OpKind::kDeleteChain; }));
  applyToMirror(m, d.ops);
  auto later = w.fullDiff(m);
  CHECK(later.ops.size() == 1);  // the service chain
  for (const auto& o : later.ops) CHECK(o.kind == OpKind::kDeleteChain);
}

TEST_CASE("differ: a changed element value is deleted and re-added", "[unit]") {
  World w;
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  w.fragments.push_back(w.renderer.renderServicePort(p));
  Mirror m;
  applyToMirror(m, w.fullDiff(m).ops);
  testing::setEndpoints(p, {});
  w.fragments.back() = w.renderer.renderServicePort(p);
  auto t = texts(w.fullDiff(m).ops);
  CHECK(std::find(t.begin(), t.end(),
                  "add element ip kube-proxy no-endpoint-services { 172.30.0.10 . tcp . 80 : goto reject-chain }") !=
        t.end());
  CHECK(std::find(t.begin(), t.end(), "delete element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 }") != t.end());
}

TEST_CASE("ElementTable behaves like a map of strings under random use", "[unit]") {
  // The mirror's element store packs records in an arena under an open-addressing index;
  // growth, removed slots, in-place and relocated values and compaction must all keep it a
  // plain key → value map.
  std::mt19937 rng(0x656c656d);
  ElementTable table;
  std::unordered_map<std::string, std::string> model;
  auto randomKey = [&] {
    std::string k(1 + rng() % 24, '\0');
    for (auto& c : k) c = static_cast<char>(rng() % 6);  // few distinct keys: many hits
    return k;
  };
  auto randomValue = [&] {
    std::string v(rng() % 3 == 0 ? 0 : rng() % 60, '\0');
    for (auto& c : v) c = static_cast<char>('a' + rng() % 26);
    return v;
  };
  for (int step = 0; step < 200000; ++step) {
    INFO("step " << step);
    const std::string key = randomKey();
    switch (rng() % 5) {
      case 0:
      case 1: {
        std::string value = randomValue();
        table.set(key, value);
        model[key] = value;
        break;
      }
      case 2:
        REQUIRE(table.erase(key) == (model.erase(key) == 1));
        break;
      default: {
        auto it = table.find(key);
        auto mit = model.find(key);
        REQUIRE((it == table.end()) == (mit == model.end()));
        if (mit != model.end()) REQUIRE(it->second == mit->second);
      }
    }
    REQUIRE(table.size() == model.size());
    if (step % 20000 == 0 || step == 199999) {
      std::size_t seen = 0;
      for (const auto& [k, v] : table) {
        ++seen;
        auto mit = model.find(std::string(k));
        REQUIRE(mit != model.end());
        REQUIRE(v == mit->second);
      }
      REQUIRE(seen == model.size());
    }
  }
  for (const auto& [k, v] : model) REQUIRE(table.at(k) == v);
  CHECK_THROWS_AS(table.at(std::string(30, '\x07')), std::out_of_range);
  for (const auto& [k, v] : model) REQUIRE(table.erase(k));
  CHECK(table.empty());
  CHECK(table.begin() == table.end());
}

TEST_CASE("differ: an element wanted by two service ports is added once", "[unit]") {
  // Two ports behind one pod both want its hairpin pair; a second add of one element in a batch
  // is refused by the kernel (EEXIST), which failed the whole sync.
  World w;
  auto a = clusterIP("default", "a", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  auto b = clusterIP("default", "b", "172.30.0.11", 80, {endpoint("10.1.0.1", 8080)});
  w.fragments.push_back(w.renderer.renderServicePort(a));
  w.fragments.push_back(w.renderer.renderServicePort(b));
  std::size_t wanted = 0;
  for (const auto& f : w.fragments)
    for (const auto& e : f.elements) wanted += e.set == names::kHairpinSet ? 1 : 0;
  REQUIRE(wanted == 2);
  Mirror m;
  std::unordered_map<std::string, int> added;
  for (const auto& o : w.fullDiff(m).ops)
    if (o.kind == OpKind::kAddElement) ++added[o.toText()];
  CHECK(added.size() > 0);
  for (const auto& [text, n] : added) {
    INFO(text);
    CHECK(n == 1);
  }
}

TEST_CASE("differ: an interval start whose endpoint changed is sent with its end", "[unit]") {
  // An endpoint replaced in place changes only its interval's start (the end has no data).
  // The kernel refused (EEXIST) element messages that carried such a start without its end;
  // the soak's churn hit it about once in five syncs.
  World w;
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080)});
  w.fragments.push_back(w.renderer.renderServicePort(p));
  Mirror m;
  applyToMirror(m, w.fullDiff(m).ops);
  testing::setEndpoints(p, {endpoint("10.1.0.1", 8080), endpoint("10.1.0.3", 8080)});
  w.fragments.back() = w.renderer.renderServicePort(p);
  std::vector<const Op*> added;
  auto ops = w.fullDiff(m).ops;
  for (const auto& o : ops)
    if (o.kind == OpKind::kAddElement && o.element->identitySuffix != 0) added.push_back(&o);
  std::string listing;
  for (const auto& t : texts(ops)) listing += t + "\n";
  INFO(listing);
  // The second interval: its start (new data) and, right after it, its end.
  REQUIRE(added.size() == 2);
  CHECK_FALSE(added[0]->element->intervalEnd);
  CHECK(added[0]->element->dataText == "10.1.0.3 . 8080");
  CHECK(added[1]->element->intervalEnd);
  // The kernel holds that end: it is deleted first, so the batch re-adds it.
  std::size_t deletedEnds = 0;
  for (const auto& o : ops)
    if (o.kind == OpKind::kDeleteElement && o.element->intervalEnd) ++deletedEnds;
  CHECK(deletedEnds == 1);
  applyToMirror(m, ops);
  CHECK(w.fullDiff(m).ops.empty());
}
