#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kproxy/core/log.h"
#include "kproxy/core/tracker.h"

namespace net = kproxy::net;

using namespace kproxy::core;

namespace {

Service service(const std::string& name, std::vector<std::string> portNames = {"http"}) {
  Service s;
  s.ns = "default";
  s.name = name;
  s.resourceVersion = "1";
  s.clusterIPs = {"10.96.0.1"};
  s.ipFamilies = {net::Family::kIPv4};
  std::int32_t port = 80;
  for (auto& p : portNames) {
    ServicePortSpec spec;
    spec.name = p;
    spec.port = port++;
    s.ports.push_back(spec);
  }
  return s;
}

EndpointSlice endpointSlice(const std::string& name, const std::string& svc,
                            std::vector<std::string> ips, std::string port = "http") {
  EndpointSlice s;
  s.ns = "default";
  s.name = name;
  s.serviceName = svc;
  s.labels[kLabelServiceName] = svc;
  s.resourceVersion = "1";
  EndpointPort p;
  p.name = std::move(port);
  p.port = 8080;
  p.protocol = Protocol::kTCP;
  s.ports = {p};
  for (auto& ip : ips) {
    SliceEndpoint e;
    e.addresses = {ip};
    e.nodeName = "node-b";
    s.endpoints.push_back(e);
  }
  return s;
}

ServicePortKey key(const std::string& name) { return {net::Family::kIPv4, name}; }

std::vector<std::string> endpointsOf(const Snapshot& snap, const std::string& name) {
  std::vector<std::string> out;
  auto st = snap.find(key(name));
  if (!st) return out;
  for (const auto& e : st->clusterEndpoints) out.push_back(e.str());
  return out;
}

TrackerConfig config() {
  TrackerConfig c;
  c.nodeName = "node-a";
  return c;
}

}  // namespace

TEST_CASE("publish builds snapshots with increasing generations", "[unit][tracker]") {
  ChangeTracker t(config());
  CHECK(t.current()->generation() == 0);
  CHECK_FALSE(t.hasPendingChanges());

  CHECK(t.upsertService(service("a")));
  CHECK(t.upsertEndpointSlice(endpointSlice("a-1", "a", {"10.0.0.1", "10.0.0.2"})));
  CHECK(t.hasPendingChanges());
  CHECK(t.pendingServiceChanges() == 1);
  CHECK(t.pendingEndpointChanges() == 1);

  auto r = t.publish();
  CHECK(r.snapshot->generation() == 1);
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/a:http")});
  CHECK(r.serviceChanges == 1);
  CHECK(r.endpointChanges == 1);
  CHECK(endpointsOf(*r.snapshot, "default/a:http") ==
        std::vector<std::string>{"10.0.0.1:8080", "10.0.0.2:8080"});
  CHECK(t.current() == r.snapshot);
  CHECK_FALSE(t.hasPendingChanges());
  CHECK(t.pendingServiceChanges() == 0);

  auto empty = t.publish();
  CHECK(empty.snapshot->generation() == 2);
  CHECK(empty.changed.empty());
}

TEST_CASE("no-op updates are dropped", "[unit][tracker]") {
  ChangeTracker t(config());
  t.upsertService(service("a"));
  t.upsertEndpointSlice(endpointSlice("a-1", "a", {"10.0.0.1"}));
  t.publish();

  Service same = service("a");
  same.resourceVersion = "2";  // only the version moved
  CHECK_FALSE(t.upsertService(same));
  EndpointSlice sameSlice = endpointSlice("a-1", "a", {"10.0.0.1"});
  sameSlice.resourceVersion = "9";
  CHECK_FALSE(t.upsertEndpointSlice(sameSlice));
  CHECK_FALSE(t.deleteService("default", "absent"));
  CHECK_FALSE(t.deleteEndpointSlice("default", "absent"));
  CHECK_FALSE(t.hasPendingChanges());
  CHECK(t.publish().changed.empty());

  // A change that resolves to the same state (here: a label) is published with no changed key.
  Service labelled = service("a");
  labelled.labels["team"] = "x";
  CHECK(t.upsertService(labelled));
  auto r = t.publish();
  CHECK(r.changed.empty());
}

TEST_CASE("shared objects are kept by reference and compared by value", "[unit][tracker]") {
  ChangeTracker t(config());
  auto svc = std::make_shared<const Service>(service("a"));
  auto slice = std::make_shared<const EndpointSlice>(endpointSlice("a-1", "a", {"10.0.0.1"}));
  CHECK(t.upsertService(svc));
  CHECK(t.upsertEndpointSlice(slice));
  auto first = t.publish();
  CHECK(first.changed == std::vector<ServicePortKey>{key("default/a:http")});
  CHECK(endpointsOf(*first.snapshot, "default/a:http") ==
        std::vector<std::string>{"10.0.0.1:8080"});
  CHECK(svc->resourceVersion == "1");  // the tracker never writes to a shared object

  // A version-only update, shared or by value, is still a no-op.
  Service same = service("a");
  same.resourceVersion = "2";
  CHECK_FALSE(t.upsertService(std::make_shared<const Service>(same)));
  EndpointSlice sameSlice = endpointSlice("a-1", "a", {"10.0.0.1"});
  sameSlice.resourceVersion = "9";
  CHECK_FALSE(t.upsertEndpointSlice(std::make_shared<const EndpointSlice>(sameSlice)));
  CHECK_FALSE(t.hasPendingChanges());

  auto moved = std::make_shared<const EndpointSlice>(endpointSlice("a-1", "a", {"10.0.0.2"}));
  CHECK(t.upsertEndpointSlice(moved));
  auto second = t.publish();
  CHECK(endpointsOf(*second.snapshot, "default/a:http") ==
        std::vector<std::string>{"10.0.0.2:8080"});
}

TEST_CASE("changed keys are exactly the service ports that differ", "[unit][tracker]") {
  ChangeTracker t(config());
  for (const char* name : {"a", "b", "c"}) {
    t.upsertService(service(name, {"http", "https"}));
    t.upsertEndpointSlice(endpointSlice(std::string(name) + "-1", name, {"10.0.0.1"}));
  }
  auto first = t.publish();
  CHECK(first.changed.size() == 6);
  CHECK(first.snapshot->size() == 6);

  // An endpoint change in b's http port only.
  t.upsertEndpointSlice(endpointSlice("b-1", "b", {"10.0.0.1", "10.0.0.7"}));
  auto r = t.publish();
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/b:http")});
  CHECK(r.snapshot->sharesEntry(*first.snapshot, key("default/a:http")));
  CHECK(r.snapshot->sharesEntry(*first.snapshot, key("default/b:https")));
  CHECK_FALSE(r.snapshot->sharesEntry(*first.snapshot, key("default/b:http")));
  // The old snapshot is untouched.
  CHECK(endpointsOf(*first.snapshot, "default/b:http") == std::vector<std::string>{"10.0.0.1:8080"});

  // Renaming a port removes the old key and adds the new one.
  t.upsertService(service("c", {"http", "grpc"}));
  r = t.publish();
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/c:grpc"), key("default/c:https")});
  CHECK(r.snapshot->find(key("default/c:https")) == nullptr);
  CHECK(r.snapshot->find(key("default/c:grpc")) != nullptr);
}

TEST_CASE("deleting services and slices", "[unit][tracker]") {
  ChangeTracker t(config());
  t.upsertService(service("a", {"http", "https"}));
  t.upsertEndpointSlice(endpointSlice("a-1", "a", {"10.0.0.1"}));
  t.publish();

  CHECK(t.deleteEndpointSlice("default", "a-1"));
  auto r = t.publish();
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/a:http")});
  auto st = r.snapshot->find(key("default/a:http"));
  REQUIRE(st);
  CHECK(st->clusterEndpoints.empty());
  CHECK_FALSE(st->hasAnyEndpoints);

  CHECK(t.deleteService("default", "a"));
  r = t.publish();
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/a:http"), key("default/a:https")});
  CHECK(r.snapshot->size() == 0);

  // Slices may arrive before their service; the service picks them up.
  t.upsertEndpointSlice(endpointSlice("b-1", "b", {"10.0.0.5"}));
  r = t.publish();
  CHECK(r.changed.empty());
  t.upsertService(service("b"));
  r = t.publish();
  CHECK(endpointsOf(*r.snapshot, "default/b:http") == std::vector<std::string>{"10.0.0.5:8080"});
}

TEST_CASE("a slice moving to another service changes both", "[unit][tracker]") {
  ChangeTracker t(config());
  t.upsertService(service("a"));
  t.upsertService(service("b"));
  t.upsertEndpointSlice(endpointSlice("shared", "a", {"10.0.0.1"}));
  t.publish();
  CHECK(endpointsOf(*t.current(), "default/a:http").size() == 1);

  CHECK(t.upsertEndpointSlice(endpointSlice("shared", "b", {"10.0.0.1"})));
  auto r = t.publish();
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/a:http"), key("default/b:http")});
  CHECK(endpointsOf(*r.snapshot, "default/a:http").empty());
  CHECK(endpointsOf(*r.snapshot, "default/b:http") == std::vector<std::string>{"10.0.0.1:8080"});

  // Deleting by name finds it under its new owner.
  CHECK(t.deleteEndpointSlice("default", "shared"));
  r = t.publish();
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/b:http")});
}

TEST_CASE("an endpoint moving between two slices of one service", "[unit][tracker]") {
  ChangeTracker t(config());
  t.upsertService(service("a"));
  t.upsertEndpointSlice(endpointSlice("a-1", "a", {"10.0.0.1", "10.0.0.2"}));
  t.upsertEndpointSlice(endpointSlice("a-2", "a", {}));
  t.publish();
  // The new slice sees it first; the state does not change, so nothing is published.
  t.upsertEndpointSlice(endpointSlice("a-2", "a", {"10.0.0.2"}));
  CHECK(t.publish().changed.empty());
  t.upsertEndpointSlice(endpointSlice("a-1", "a", {"10.0.0.1"}));
  CHECK(t.publish().changed.empty());
  CHECK(endpointsOf(*t.current(), "default/a:http") ==
        std::vector<std::string>{"10.0.0.1:8080", "10.0.0.2:8080"});
}

TEST_CASE("slices the proxy does not use are ignored", "[unit][tracker]") {
  auto previous = kproxy::log::setSink([](kproxy::log::Severity, std::string_view) {});
  ChangeTracker t(config());
  t.upsertService(service("a"));
  t.publish();
  CHECK_FALSE(t.upsertEndpointSlice(endpointSlice("orphan", "", {"10.0.0.1"})));
  EndpointSlice headless = endpointSlice("h", "a", {"10.0.0.1"});
  headless.labels[kLabelHeadless] = "";
  CHECK_FALSE(t.upsertEndpointSlice(headless));

  // A used slice that becomes unusable is removed.
  t.upsertEndpointSlice(endpointSlice("a-1", "a", {"10.0.0.1"}));
  t.publish();
  EndpointSlice fqdn = endpointSlice("a-1", "a", {"example.com"});
  fqdn.addressType = AddressType::kFQDN;
  CHECK(t.upsertEndpointSlice(fqdn));
  CHECK(endpointsOf(*t.publish().snapshot, "default/a:http").empty());
  kproxy::log::setSink(previous);
}

TEST_CASE("node zone changes re-resolve every service; other node changes do not", "[unit][tracker]") {
  ChangeTracker t(config());
  t.upsertService(service("a"));
  EndpointSlice s = endpointSlice("a-1", "a", {"10.0.0.1", "10.0.0.2"});
  s.endpoints[0].hints = EndpointHints{{"zone-1"}, {}};
  s.endpoints[1].hints = EndpointHints{{"zone-2"}, {}};
  t.upsertEndpointSlice(s);
  t.upsertService(service("b"));
  auto first = t.publish();
  CHECK(endpointsOf(*first.snapshot, "default/a:http").size() == 2);  // no zone yet

  Node node;
  node.name = "node-a";
  node.labels[kLabelTopologyZone] = "zone-1";
  node.addresses = {{"InternalIP", "192.168.0.10"}, {"Hostname", "node-a"}};
  CHECK(t.upsertNode(node));
  CHECK(t.hasPendingChanges());
  auto r = t.publish();
  CHECK(r.snapshot->node().known);
  CHECK(r.snapshot->node().zone == "zone-1");
  CHECK(r.snapshot->node().addresses == std::vector<std::string>{"192.168.0.10"});
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/a:http")});
  CHECK(endpointsOf(*r.snapshot, "default/a:http") == std::vector<std::string>{"10.0.0.1:8080"});
  CHECK(r.snapshot->sharesEntry(*first.snapshot, key("default/b:http")));

  CHECK_FALSE(t.upsertNode(node));  // no-op
  node.resourceVersion = "7";
  CHECK_FALSE(t.upsertNode(node));
  node.podCIDRs = {"10.244.1.0/24"};
  CHECK(t.upsertNode(node));
  r = t.publish();
  CHECK(r.changed.empty());
  CHECK(r.snapshot->node().podCIDRs == std::vector<std::string>{"10.244.1.0/24"});

  Node other;
  other.name = "node-z";
  CHECK_FALSE(t.upsertNode(other));

  CHECK(t.deleteNode("node-a"));
  r = t.publish();
  CHECK_FALSE(r.snapshot->node().known);
  CHECK(r.changed == std::vector<ServicePortKey>{key("default/a:http")});  // zone gone
}

TEST_CASE("local endpoints follow the configured node name", "[unit][tracker]") {
  ChangeTracker t(config());
  Service svc = service("a");
  svc.internalTrafficPolicy = TrafficPolicy::kLocal;
  t.upsertService(svc);
  EndpointSlice s = endpointSlice("a-1", "a", {"10.0.0.1", "10.0.0.2"});
  s.endpoints[0].nodeName = "node-a";
  t.upsertEndpointSlice(s);
  auto st = t.publish().snapshot->find(key("default/a:http"));
  REQUIRE(st);
  REQUIRE(st->localEndpoints.size() == 1);
  CHECK(st->localEndpoints[0].str() == "10.0.0.1:8080");
  CHECK(st->localEndpoints[0].isLocal);
}

TEST_CASE("trigger times of real endpoint changes come out with the snapshot", "[unit][tracker]") {
  TrackerConfig config;
  config.nodeName = "node-a";
  ChangeTracker tracker(config);
  tracker.upsertService(service("web"));
  auto slice = endpointSlice("web-1", "web", {"10.1.0.1"});
  slice.lastChangeTriggerTime = 1000.5;
  REQUIRE(tracker.upsertEndpointSlice(slice));
  auto first = tracker.publish();
  CHECK(first.triggerTimes == std::vector<TriggerTime>{{1000.5, net::Family::kIPv4}});
  // A no-op update carries no trigger time into the next snapshot.
  CHECK_FALSE(tracker.upsertEndpointSlice(slice));
  CHECK(tracker.publish().triggerTimes.empty());
  auto changed = endpointSlice("web-1", "web", {"10.1.0.2"});
  changed.lastChangeTriggerTime = 1002.0;
  REQUIRE(tracker.upsertEndpointSlice(changed));
  CHECK(tracker.publish().triggerTimes == std::vector<TriggerTime>{{1002.0, net::Family::kIPv4}});
  // An IPv6 slice's change is reported under IPv6 (the metric's ip_family label).
  auto v6 = endpointSlice("web-2", "web", {"fd00::1"});
  v6.addressType = AddressType::kIPv6;
  v6.lastChangeTriggerTime = 1003.0;
  REQUIRE(tracker.upsertEndpointSlice(v6));
  CHECK(tracker.publish().triggerTimes == std::vector<TriggerTime>{{1003.0, net::Family::kIPv6}});
}

TEST_CASE("ServiceCIDRs become the snapshot's cluster-wide service CIDRs", "[unit][tracker]") {
  ChangeTracker tracker(config());
  CHECK(tracker.current()->serviceCIDRs().empty());
  CHECK(tracker.upsertServiceCIDR(ServiceCIDR{"kubernetes", "1", {"10.96.0.0/12", "fd00:10:96::/112"}}));
  CHECK(tracker.hasPendingChanges());
  // Malformed CIDRs (a hand-written manifest) are left out with a log line; the rest stays.
  CHECK(tracker.upsertServiceCIDR(ServiceCIDR{"extra", "1", {"10.200.0.7/16", "bogus"}}));
  auto published = tracker.publish();
  CHECK(published.changed.empty());  // no service port changed
  CHECK(published.snapshot->serviceCIDRs() ==
        std::vector<ServiceCIDRRange>{{"extra", "10.200.0.0/16"},
                                      {"kubernetes", "10.96.0.0/12"},
                                      {"kubernetes", "fd00:10:96::/112"}});
  // Only a new resourceVersion: nothing to do.
  CHECK_FALSE(tracker.upsertServiceCIDR(ServiceCIDR{"kubernetes", "2", {"10.96.0.0/12", "fd00:10:96::/112"}}));
  CHECK_FALSE(tracker.hasPendingChanges());
  CHECK(tracker.deleteServiceCIDR("extra"));
  CHECK_FALSE(tracker.deleteServiceCIDR("extra"));
  auto after = tracker.publish();
  CHECK(after.snapshot->serviceCIDRs().size() == 2);
  CHECK(published.snapshot->serviceCIDRs().size() == 3);  // snapshots are immutable
}
