#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "kproxy/core/nodeport_addresses.h"
#include "kproxy/core/tracker.h"

using namespace kproxy::core;

namespace {

using Strings = std::vector<std::string>;

NodePortAddresses resolved(Strings spec, Strings interfaces, NodeIPs nodeIPs = {}) {
  return decideNodePortAddresses(spec, interfaces, nodeIPs);
}

const Strings kInterfaces = {"127.0.0.1", "::1", "192.168.1.10", "192.168.2.20", "10.0.0.5",
                             "fd00:1::10", "fd00:2::20", "fe80::1"};

}  // namespace

TEST_CASE("detectNodeIPs takes InternalIP before ExternalIP, one per family", "[unit]") {
  std::vector<NodeAddress> addresses = {{"Hostname", "node-a"},
                                        {"ExternalIP", "203.0.113.7"},
                                        {"InternalIP", "192.168.1.10"},
                                        {"InternalIP", "192.168.1.11"},
                                        {"ExternalIP", "2001:db8::7"}};
  CHECK(detectNodeIPs(addresses, "0.0.0.0") == NodeIPs{"192.168.1.10", "2001:db8::7"});
  CHECK(detectNodeIPs(addresses, "") == NodeIPs{"192.168.1.10", "2001:db8::7"});
  // --bind-address replaces the node IP of its family (upstream: "overrides the primary").
  CHECK(detectNodeIPs(addresses, "192.168.9.9") == NodeIPs{"192.168.9.9", "2001:db8::7"});
  CHECK(detectNodeIPs(addresses, "fd00::9") == NodeIPs{"192.168.1.10", "fd00::9"});
  CHECK(detectNodeIPs(addresses, "::") == NodeIPs{"192.168.1.10", "2001:db8::7"});
  // An IPv6-primary node: the first InternalIP decides the primary family.
  std::vector<NodeAddress> v6first = {{"InternalIP", "fd00::10"}, {"InternalIP", "10.1.0.10"}};
  CHECK(detectNodeIPs(v6first, "") == NodeIPs{"10.1.0.10", "fd00::10"});
  CHECK(detectNodeIPs({}, "") == NodeIPs{});
}

TEST_CASE("nodePortAddresses CIDRs select interface addresses, per family", "[unit]") {
  auto r = resolved({"192.168.2.0/24"}, kInterfaces);
  CHECK(r.resolved);
  CHECK_FALSE(r.allLocalIPv4);
  // No IPv6 CIDR: IPv6 NodePorts answer on every local address (upstream adds ::/0).
  CHECK(r.allLocalIPv6);
  // ... but for the link-local one (below).
  CHECK(r.addresses == Strings{"192.168.2.20", "::1", "fd00:1::10", "fd00:2::20"});

  r = resolved({"192.168.0.0/16", "fd00:2::/64"}, kInterfaces);
  CHECK_FALSE(r.allLocalIPv4);
  CHECK_FALSE(r.allLocalIPv6);
  CHECK(r.addresses == Strings{"192.168.1.10", "192.168.2.20", "fd00:2::20"});

  // A CIDR that holds no interface address: NodePorts of that family answer nowhere.
  r = resolved({"172.16.0.0/12"}, kInterfaces);
  CHECK_FALSE(r.allLocalIPv4);
  CHECK(r.addresses == Strings{"::1", "fd00:1::10", "fd00:2::20"});
}

TEST_CASE("nodePortAddresses keeps loopback addresses a CIDR holds, for the backend to judge", "[unit]") {
  auto r = resolved({"127.0.0.0/8", "10.0.0.0/8"}, kInterfaces);
  CHECK(r.addresses == Strings{"10.0.0.5", "127.0.0.1", "::1", "fd00:1::10", "fd00:2::20"});
}

TEST_CASE("nodePortAddresses with a zero CIDR or none at all matches every local address", "[unit]") {
  for (const Strings& spec : {Strings{}, Strings{"0.0.0.0/0", "::/0"}, Strings{"0.0.0.0/0", "192.168.1.0/24"}}) {
    auto r = resolved(spec, kInterfaces);
    CHECK(r.allLocalIPv4);
    CHECK(r.allLocalIPv6);
    CHECK(r.addresses.size() == kInterfaces.size() - 1);  // all but fe80::1
  }
  auto r = resolved({"::/0", "192.168.1.0/24"}, kInterfaces);
  CHECK_FALSE(r.allLocalIPv4);
  CHECK(r.allLocalIPv6);
}

TEST_CASE("nodePortAddresses lists IPv6 link-local addresses only when a CIDR selects them", "[unit]") {
  // Every local IPv6 address: the link-local one is not listed (every backend matches it
  // without the list, or leaves it out as upstream's IPVS mode).
  auto r = resolved({}, kInterfaces);
  CHECK(r.allLocalIPv6);
  CHECK(std::find(r.addresses.begin(), r.addresses.end(), "fe80::1") == r.addresses.end());
  // A CIDR that holds it: listed, as upstream's GetNodeIPs lists it.
  r = resolved({"fe80::/10"}, kInterfaces);
  CHECK_FALSE(r.allLocalIPv6);
  // (IPv4 has no CIDR: every IPv4 address.)
  CHECK(r.addresses == Strings{"10.0.0.5", "127.0.0.1", "192.168.1.10", "192.168.2.20", "fe80::1"});
  r = resolved({"fe80::/10", "fd00:1::/64"}, {"fd00:1::10", "fe80::1", "fe80::abcd:1"});
  CHECK(r.addresses == Strings{"fd00:1::10", "fe80::1", "fe80::abcd:1"});
}

TEST_CASE("a pod's veth bringing a link-local address does not change the node", "[unit]") {
  TrackerConfig config;
  config.nodeName = "node-a";
  ChangeTracker tracker(config);
  Node node;
  node.name = "node-a";
  node.addresses = {{"InternalIP", "192.168.1.10"}};
  REQUIRE(tracker.upsertNode(node));
  REQUIRE(tracker.setInterfaceAddresses({"127.0.0.1", "192.168.1.10", "::1", "fe80::1"}));
  const NodeInfo before = tracker.publish().snapshot->node();
  CHECK(before.nodePortAddresses.addresses == Strings{"127.0.0.1", "192.168.1.10", "::1"});
  // New veths' link-local addresses come and go: nothing to sync.
  CHECK_FALSE(tracker.setInterfaceAddresses({"127.0.0.1", "192.168.1.10", "::1", "fe80::1", "fe80::42:aff:fe00:1"}));
  CHECK_FALSE(tracker.setInterfaceAddresses({"127.0.0.1", "192.168.1.10", "::1"}));
  CHECK_FALSE(tracker.hasPendingChanges());
  // A global address is a change (IPVS serves NodePorts on each).
  CHECK(tracker.setInterfaceAddresses({"127.0.0.1", "192.168.1.10", "192.168.1.11", "::1"}));
  CHECK(tracker.hasPendingChanges());
}

TEST_CASE("nodePortAddresses primary is the node IP of each family", "[unit]") {
  auto r = resolved({"primary"}, kInterfaces, NodeIPs{"192.168.1.10", "fd00:2::20"});
  CHECK_FALSE(r.allLocalIPv4);
  CHECK_FALSE(r.allLocalIPv6);
  CHECK(r.addresses == Strings{"192.168.1.10", "fd00:2::20"});

  // A node IP that no interface holds answers nowhere (upstream filters interface addresses).
  r = resolved({"primary"}, kInterfaces, NodeIPs{"192.168.7.7", "fd00:2::20"});
  CHECK(r.addresses == Strings{"fd00:2::20"});
  CHECK_FALSE(r.allLocalIPv4);

  // No node IP of a family, or a loopback one: as upstream, that family has no CIDR, so it
  // answers on every local address.
  r = resolved({"primary"}, kInterfaces, NodeIPs{"192.168.1.10", ""});
  CHECK_FALSE(r.allLocalIPv4);
  CHECK(r.allLocalIPv6);
  r = resolved({"primary"}, kInterfaces, NodeIPs{"127.0.0.1", "::1"});
  CHECK(r.allLocalIPv4);
  CHECK(r.allLocalIPv6);
}

TEST_CASE("the tracker decides nodePortAddresses against interface addresses once known", "[unit]") {
  TrackerConfig config;
  config.nodeName = "node-a";
  config.nodePortAddresses = {"primary"};
  ChangeTracker tracker(config);
  // "primary" before the Node object: decided, nowhere (not "every local address" meanwhile).
  CHECK_FALSE(tracker.setInterfaceAddresses({"192.168.1.10"}));
  CHECK(tracker.current()->node().nodePortAddresses == nodePortAddressesBeforeNode({}));
  CHECK(tracker.current()->node().nodePortAddresses.resolved);
  CHECK_FALSE(tracker.current()->node().nodePortAddresses.allLocalIPv4);

  Node node;
  node.name = "node-a";
  node.addresses = {{"InternalIP", "192.168.1.10"}};
  REQUIRE(tracker.upsertNode(node));
  CHECK(tracker.publish().snapshot->node().nodePortAddresses.addresses == Strings{"192.168.1.10"});

  // Another address that "primary" does not select changes nothing.
  CHECK_FALSE(tracker.setInterfaceAddresses({"192.168.1.10", "192.168.2.20"}));
  CHECK_FALSE(tracker.hasPendingChanges());

  // The Node's InternalIP moves to another interface address: followed.
  node.addresses = {{"InternalIP", "192.168.2.20"}};
  node.addresses = std::vector<NodeAddress>{NodeAddress{"InternalIP", "192.168.2.20"}};
  REQUIRE(tracker.upsertNode(node));
  CHECK(tracker.publish().snapshot->node().nodePortAddresses.addresses == Strings{"192.168.2.20"});

  // An address change that does not change the outcome publishes nothing new for the node.
  tracker.setInterfaceAddresses({"192.168.1.10", "192.168.2.20", "10.9.9.9"});
  CHECK_FALSE(tracker.hasPendingChanges());
}

TEST_CASE("without interface addresses the tracker decides against the Node object's", "[unit]") {
  TrackerConfig config;
  config.nodeName = "node-a";
  config.nodePortAddresses = {"192.168.0.0/16"};
  ChangeTracker tracker(config);
  // No Node object and no interface addresses yet: CIDRs select nothing, and the family
  // without a CIDR answers on every local address, as it will later.
  CHECK(tracker.current()->node().nodePortAddresses.resolved);
  CHECK(tracker.current()->node().nodePortAddresses.addresses.empty());
  CHECK(tracker.current()->node().nodePortAddresses.allLocalIPv6);
  Node node;
  node.name = "node-a";
  node.addresses = {{"InternalIP", "192.168.1.10"}, {"ExternalIP", "203.0.113.7"}};
  REQUIRE(tracker.upsertNode(node));
  // As in `kproxy explain`: the Node object's addresses stand for the interfaces'.
  NodePortAddresses np = tracker.publish().snapshot->node().nodePortAddresses;
  CHECK(np.resolved);
  CHECK(np.addresses == Strings{"192.168.1.10"});
  REQUIRE(tracker.setInterfaceAddresses({"192.168.1.10", "192.168.2.20", "10.0.0.1"}));
  np = tracker.publish().snapshot->node().nodePortAddresses;
  CHECK(np.resolved);
  CHECK(np.addresses == Strings{"192.168.1.10", "192.168.2.20"});
  CHECK(np.allLocalIPv6);
  // The Node object goes: CIDRs do not need it.
  REQUIRE(tracker.deleteNode("node-a"));
  CHECK(tracker.publish().snapshot->node().nodePortAddresses.addresses == Strings{"192.168.1.10", "192.168.2.20"});
}

TEST_CASE("\"primary\" with a --bind-address takes it as the node IP of its family", "[unit]") {
  TrackerConfig config;
  config.nodeName = "node-a";
  config.nodePortAddresses = {"primary"};
  config.bindAddress = "192.168.2.20";
  ChangeTracker tracker(config);
  // Before the Node object: the bind address alone, not every local address of either family.
  CHECK(tracker.current()->node().nodePortAddresses.addresses == Strings{"192.168.2.20"});
  CHECK_FALSE(tracker.current()->node().nodePortAddresses.allLocalIPv4);
  CHECK_FALSE(tracker.current()->node().nodePortAddresses.allLocalIPv6);
  Node node;
  node.name = "node-a";
  node.addresses = {{"InternalIP", "192.168.1.10"}, {"InternalIP", "fd00:1::10"}};
  REQUIRE(tracker.upsertNode(node));
  // Without interface addresses (explain), and with them (the daemon): the same answer.
  CHECK(tracker.publish().snapshot->node().nodePortAddresses.addresses == Strings{"192.168.2.20", "fd00:1::10"});
  tracker.setInterfaceAddresses({"192.168.1.10", "192.168.2.20", "fd00:1::10", "fd00:2::20"});
  CHECK(tracker.current()->node().nodePortAddresses.addresses == Strings{"192.168.2.20", "fd00:1::10"});
}

TEST_CASE("a mode without --nodeport-addresses gets upstream's default for it", "[unit]") {
  CHECK(defaultNodePortAddresses("nftables") == Strings{"primary"});
  for (const char* mode : {"iptables", "ipvs", "userspace"}) {
    INFO(mode);
    CHECK(defaultNodePortAddresses(mode).empty());
  }
}
