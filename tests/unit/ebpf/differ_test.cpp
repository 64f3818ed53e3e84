// diffMaps: the writes between two map contents, in the phases that keep every service whole.

#include <catch2/catch.hpp>

#include <algorithm>

#include "kproxy/ebpf/differ.h"

using namespace kproxy;
using namespace kproxy::ebpf;

namespace {

ServiceKey key(const char* ip, std::uint16_t port) { return ServiceKey{*SocketAddress::of(ip, port), kProtoTCP}; }
SocketAddress at(const char* ip, std::uint16_t port) { return *SocketAddress::of(ip, port); }

std::vector<std::string> texts(const std::vector<MapOp>& ops) {
  std::vector<std::string> out;
  for (const auto& op : ops) out.push_back(op.toText());
  return out;
}

}  // namespace

TEST_CASE("equal contents need no write", "[unit][ebpf][differ]") {
  MapContents m;
  m.services[key("10.96.0.10", 80)] = ServiceValue{1, 1, 0, 0, 0};
  m.slots[SlotKey{1, 0}] = at("10.244.1.5", 8080);
  CHECK(diffMaps(m, m).empty());
}

TEST_CASE("slots are written before counts, services deleted before their slots", "[unit][ebpf][differ]") {
  MapContents current;
  current.services[key("10.96.0.10", 80)] = ServiceValue{1, 2, 0, 0, 0};
  current.slots[SlotKey{1, 0}] = at("10.244.1.5", 8080);
  current.slots[SlotKey{1, 1}] = at("10.244.1.6", 8080);
  current.services[key("10.96.0.11", 80)] = ServiceValue{2, 1, 0, 0, 0};
  current.slots[SlotKey{2, 0}] = at("10.244.9.9", 8080);

  MapContents desired;
  desired.services[key("10.96.0.10", 80)] = ServiceValue{1, 3, 0, 0, 0};  // one endpoint more
  desired.slots[SlotKey{1, 0}] = at("10.244.1.5", 8080);
  desired.slots[SlotKey{1, 1}] = at("10.244.1.7", 8080);  // changed
  desired.slots[SlotKey{1, 2}] = at("10.244.1.8", 8080);
  desired.services[key("10.96.0.12", 80)] = ServiceValue{3, 1, 0, 0, 0};  // new
  desired.slots[SlotKey{3, 0}] = at("10.244.3.1", 8080);

  CHECK(texts(diffMaps(current, desired)) == std::vector<std::string>{
                                                 "update slots 1/1 10.244.1.7:8080",
                                                 "update slots 1/2 10.244.1.8:8080",
                                                 "update slots 3/0 10.244.3.1:8080",
                                                 "update services tcp 10.96.0.10:80 id=1 count=3 local=0",
                                                 "update services tcp 10.96.0.12:80 id=3 count=1 local=0",
                                                 "delete services tcp 10.96.0.11:80",
                                                 "delete slots 2/0",
                                             });
}

TEST_CASE("a pool that shrinks lowers its count before its last slots go", "[unit][ebpf][differ]") {
  MapContents current;
  current.services[key("10.96.0.10", 80)] = ServiceValue{1, 2, 1, kFlagLocalPool, 0};
  current.slots[SlotKey{1, 0}] = at("10.244.1.5", 8080);
  current.slots[SlotKey{1, 1}] = at("10.244.1.6", 8080);
  current.slots[SlotKey{1, kLocalSlotBase}] = at("10.244.1.6", 8080);
  MapContents desired;
  desired.services[key("10.96.0.10", 80)] = ServiceValue{1, 1, 0, kFlagLocalPool, 0};
  desired.slots[SlotKey{1, 0}] = at("10.244.1.5", 8080);
  CHECK(texts(diffMaps(current, desired)) == std::vector<std::string>{
                                                 "update services tcp 10.96.0.10:80 id=1 count=1 local=0 flags=local",
                                                 "delete slots 1/1",
                                                 "delete slots 1/local+0",
                                             });
  MapContents applied = current;
  applyOps(applied, diffMaps(current, desired));
  CHECK(applied == desired);
}

TEST_CASE("empty maps are filled port by port with every slot before any count, as diffMaps would",
          "[unit][ebpf][differ]") {
  PortMaps a;
  a.services = {{key("10.96.0.10", 80), ServiceValue{1, 2, 0, 0, 0}},
                {key("203.0.113.7", 80), ServiceValue{1, 2, 0, 0, 0}}};
  a.slots = {{SlotKey{1, 0}, at("10.244.1.5", 8080)}, {SlotKey{1, 1}, at("10.244.1.6", 8080)}};
  PortMaps b;
  b.services = {{key("10.96.0.11", 53), ServiceValue{2, 1, 0, 0, 0}}};
  b.slots = {{SlotKey{2, 0}, at("10.244.2.9", 53)}};

  const auto ops = fillEmptyMaps({&a, &b});
  REQUIRE(ops.size() == 6);
  // Phase 1 then phase 2: no count before the last slot.
  for (std::size_t i = 0; i < ops.size(); ++i)
    CHECK((ops[i].kind == MapOpKind::kUpdateSlot) == (i < 3));
  MapContents filled;
  applyOps(filled, ops);
  MapContents both;
  addPortMaps(both, a);
  addPortMaps(both, b);
  CHECK(filled == both);
  // The same writes as the diff against empty maps, in another order within each phase.
  auto fromDiff = texts(diffMaps(MapContents{}, both));
  auto fromFill = texts(ops);
  std::sort(fromDiff.begin(), fromDiff.end());
  std::sort(fromFill.begin(), fromFill.end());
  CHECK(fromFill == fromDiff);
}
