#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "kproxy/core/snapshot.h"

namespace net = kproxy::net;

using namespace kproxy::core;

namespace {

ServicePortKey key(const std::string& name, net::Family family = net::Family::kIPv4) {
  return ServicePortKey{family, name};
}

std::shared_ptr<const ServicePortState> state(const std::string& name, std::int32_t port = 80,
                                              net::Family family = net::Family::kIPv4) {
  auto s = std::make_shared<ServicePortState>();
  s->key = key(name, family);
  s->port = port;
  return s;
}

Snapshot build(int n) {
  Snapshot snap;
  for (int i = 0; i < n; ++i) {
    const std::string name = "ns/svc-" + std::to_string(i) + ":http";
    snap = snap.with(key(name), state(name, i));
  }
  return snap;
}

}  // namespace

TEST_CASE("empty snapshot", "[unit][snapshot]") {
  Snapshot snap;
  CHECK(snap.size() == 0);
  CHECK(snap.generation() == 0);
  CHECK(snap.find(key("a/b")) == nullptr);
  CHECK_FALSE(snap.node().known);
  int visited = 0;
  snap.forEach([&](const ServicePortState&) { return ++visited, true; });
  CHECK(visited == 0);
}

TEST_CASE("with() inserts, replaces and removes; size follows", "[unit][snapshot]") {
  Snapshot a = build(500);
  REQUIRE(a.size() == 500);
  for (int i = 0; i < 500; ++i) {
    auto found = a.find(key("ns/svc-" + std::to_string(i) + ":http"));
    REQUIRE(found != nullptr);
    CHECK(found->port == i);
  }
  // Same name, other family: a distinct key.
  CHECK(a.find(key("ns/svc-1:http", net::Family::kIPv6)) == nullptr);

  Snapshot b = a.with(key("ns/svc-7:http"), state("ns/svc-7:http", 7000));
  CHECK(b.size() == 500);
  CHECK(b.find(key("ns/svc-7:http"))->port == 7000);

  Snapshot c = b.with(key("ns/svc-7:http"), nullptr);
  CHECK(c.size() == 499);
  CHECK(c.find(key("ns/svc-7:http")) == nullptr);

  // Removing an absent key is a no-op.
  Snapshot d = c.with(key("ns/absent"), nullptr);
  CHECK(d.size() == 499);

  // Removing everything leaves an empty map.
  Snapshot e = a;
  for (int i = 0; i < 500; ++i) e = e.with(key("ns/svc-" + std::to_string(i) + ":http"), nullptr);
  CHECK(e.size() == 0);
  CHECK(e.sorted().empty());
}

TEST_CASE("persistence: older snapshots never change", "[unit][snapshot]") {
  Snapshot a = build(200);
  Snapshot b = a.with(key("ns/svc-3:http"), state("ns/svc-3:http", 3333));
  Snapshot c = b.with(key("ns/new"), state("ns/new", 1));
  Snapshot d = c.with(key("ns/svc-4:http"), nullptr);

  CHECK(a.size() == 200);
  CHECK(a.find(key("ns/svc-3:http"))->port == 3);
  CHECK(a.find(key("ns/new")) == nullptr);
  CHECK(a.find(key("ns/svc-4:http")) != nullptr);
  CHECK(b.find(key("ns/svc-3:http"))->port == 3333);
  CHECK(b.find(key("ns/new")) == nullptr);
  CHECK(c.size() == 201);
  CHECK(c.find(key("ns/svc-4:http")) != nullptr);
  CHECK(d.size() == 200);
  CHECK(d.find(key("ns/svc-4:http")) == nullptr);
}

TEST_CASE("structural sharing: untouched entries are the same objects", "[unit][snapshot]") {
  Snapshot a = build(1000);
  Snapshot b = a.with(key("ns/svc-10:http"), state("ns/svc-10:http", 1));
  int shared = 0;
  for (int i = 0; i < 1000; ++i) {
    if (b.sharesEntry(a, key("ns/svc-" + std::to_string(i) + ":http"))) ++shared;
  }
  CHECK(shared == 999);
  CHECK_FALSE(b.sharesEntry(a, key("ns/svc-10:http")));
  CHECK_FALSE(b.sharesEntry(a, key("ns/absent")));
  // Copies share everything.
  Snapshot copy = b;
  CHECK(copy.sharesEntry(b, key("ns/svc-10:http")));
}

TEST_CASE("forEach is stable and complete; sorted() orders by key", "[unit][snapshot]") {
  Snapshot a = build(300).with(key("ns/svc-1:http", net::Family::kIPv6),
                               state("ns/svc-1:http", 1, net::Family::kIPv6));
  std::vector<ServicePortKey> first, second;
  a.forEach([&](const ServicePortState& s) { return first.push_back(s.key), true; });
  Snapshot copy = a;
  copy.forEach([&](const ServicePortState& s) { return second.push_back(s.key), true; });
  CHECK(first == second);
  CHECK(first.size() == 301);
  CHECK(std::set<ServicePortKey>(first.begin(), first.end()).size() == 301);

  int visited = 0;
  a.forEach([&](const ServicePortState&) { return ++visited < 5; });
  CHECK(visited == 5);

  auto sorted = a.sorted();
  REQUIRE(sorted.size() == 301);
  for (std::size_t i = 1; i < sorted.size(); ++i) CHECK(sorted[i - 1]->key < sorted[i]->key);
}

TEST_CASE("withNode and withGeneration leave entries shared", "[unit][snapshot]") {
  Snapshot a = build(10);
  NodeInfo node;
  node.name = "n1";
  node.zone = "z1";
  node.known = true;
  Snapshot b = a.withNode(node).withGeneration(7);
  CHECK(b.generation() == 7);
  CHECK(b.node().zone == "z1");
  CHECK(a.generation() == 0);
  CHECK_FALSE(a.node().known);
  CHECK(b.sharesEntry(a, key("ns/svc-3:http")));
}

TEST_CASE("ServicePortKeyHash is consistent with equality", "[unit][snapshot]") {
  ServicePortKeyHash h;
  CHECK(h(key("a/b:c")) == h(key("a/b:c")));
  CHECK(h(key("a/b:c")) != h(key("a/b:c", net::Family::kIPv6)));
}

TEST_CASE("Endpoint::str brackets IPv6", "[unit][snapshot]") {
  Endpoint v4;
  v4.ip = "10.0.0.1";
  v4.port = 8080;
  Endpoint v6;
  v6.ip = "fd00::1";
  v6.port = 443;
  CHECK(v4.str() == "10.0.0.1:8080");
  CHECK(v6.str() == "[fd00::1]:443");
}

TEST_CASE("EndpointList reads like a vector and never changes under a copy", "[unit][snapshot]") {
  Endpoint a;
  a.ip = "10.0.0.1";
  a.port = 80;
  Endpoint b = a;
  b.ip = "10.0.0.2";

  EndpointList empty;
  CHECK(empty.empty());
  CHECK(empty.size() == 0);
  CHECK(empty.begin() == empty.end());
  CHECK(empty == std::vector<Endpoint>{});

  EndpointList list = std::vector<Endpoint>{a, b};
  REQUIRE(list.size() == 2);
  CHECK(list[0] == a);
  CHECK(list.back() == b);
  const std::vector<Endpoint>& asVector = list;
  CHECK(asVector == std::vector<Endpoint>{a, b});

  EndpointList copy = list;
  CHECK(copy.sharesStorage(list));
  copy.push_back(a);
  CHECK_FALSE(copy.sharesStorage(list));
  CHECK(list.size() == 2);
  CHECK(copy.size() == 3);
  EndpointList cleared = list;
  cleared.clear();
  CHECK(cleared.empty());
  CHECK(list.size() == 2);

  // Equality is by content, whatever the storage.
  CHECK(list == EndpointList{a, b});
  CHECK_FALSE(list == EndpointList{b, a});
  CHECK_FALSE(list == empty);
}

TEST_CASE("ServicePortState policy helpers", "[unit][snapshot]") {
  ServicePortState s;
  CHECK_FALSE(s.externallyAccessible());
  CHECK(s.usesClusterEndpoints());
  CHECK_FALSE(s.usesLocalEndpoints());

  s.internalPolicy = TrafficPolicy::kLocal;
  CHECK_FALSE(s.usesClusterEndpoints());
  CHECK(s.usesLocalEndpoints());

  s.nodePort = 30080;  // external access needs Cluster endpoints for short-circuiting
  CHECK(s.externallyAccessible());
  CHECK(s.usesClusterEndpoints());

  ServicePortState e;
  e.externalIPs = {"1.2.3.4"};
  e.externalPolicy = TrafficPolicy::kLocal;
  CHECK(e.externallyAccessible());
  CHECK(e.usesClusterEndpoints());
  CHECK(e.usesLocalEndpoints());

  ServicePortState lb;
  lb.loadBalancerVIPs = {"5.6.7.8"};
  CHECK(lb.externallyAccessible());
}
