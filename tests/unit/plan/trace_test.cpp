// The trace result types every backend's tracer fills (plan/trace.h): the choice explorer, the
// merge of paths, the text and JSON forms.

#include "kproxy/plan/trace.h"

#include <catch2/catch.hpp>

using namespace kproxy;
using namespace kproxy::plan;

namespace {

TracePath dnatPath(std::string endpoint, bool masq = false) {
  TracePath p;
  p.outcome.verdict = TraceVerdict::kDnat;
  p.outcome.endpoints = {std::move(endpoint)};
  p.outcome.masqueraded = masq;
  return p;
}

}  // namespace

TEST_CASE("plan trace: the choice explorer visits every combination once, depth first", "[unit]") {
  ChoiceExplorer explorer;
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  do {
    const std::size_t a = explorer.choose(2);
    // The second choice exists only on the first alternative of the first.
    const std::size_t b = a == 0 ? explorer.choose(3) : 9;
    seen.emplace_back(a, b);
  } while (explorer.next());
  CHECK(seen == std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {0, 1}, {0, 2}, {1, 9}});
}

TEST_CASE("plan trace: paths merge into the endpoint set, sorted by address", "[unit]") {
  std::vector<TracePath> paths{dnatPath("10.0.1.10:80"), dnatPath("10.0.1.2:80", true), dnatPath("10.0.1.2:80")};
  TraceOutcome o = mergePaths(paths);
  CHECK(o.verdict == TraceVerdict::kDnat);
  CHECK(o.endpoints == std::vector<std::string>{"10.0.1.2:80", "10.0.1.10:80"});
  CHECK(o.masqueraded);
  CHECK_FALSE(o.mixed);
  CHECK(o.toText() == "10.0.1.2:80, 10.0.1.10:80");

  TracePath dropped;
  dropped.outcome.verdict = TraceVerdict::kDropped;
  dropped.outcome.chain = "filter KUBE-SERVICES";
  paths.push_back(dropped);
  o = mergePaths(paths);
  CHECK(o.verdict == TraceVerdict::kDnat);
  CHECK(o.mixed);
  o = mergePaths(std::vector<TracePath>{dropped});
  CHECK(o.toText() == "DROP");
  CHECK(o.chain == "filter KUBE-SERVICES");
  CHECK(o.toJson() ==
        R"({"verdict":"drop","endpoints":[],"masqueraded":false,"mixed":false,"chain":"filter KUBE-SERVICES","rule":""})");
}

TEST_CASE("plan trace: JSON strings and endpoints are written alike by every backend", "[unit]") {
  CHECK(jsonString("a\"b\\c\nd\x01") == R"("a\"b\\c\nd\u0001")");
  CHECK(endpointText("10.0.0.1", 80) == "10.0.0.1:80");
  CHECK(endpointText("fd00::1", 80) == "[fd00::1]:80");
  CHECK(verdictName(TraceVerdict::kRejected) == "reject");
}

TEST_CASE("plan trace: an unallocated ClusterIP names its ServiceCIDR", "[unit]") {
  const std::vector<sdk::ServiceCIDR> cidrs{{"kubernetes", "172.30.0.0/16"}};
  CHECK(unallocatedClusterIPReason(cidrs, net::Family::kIPv4, "172.30.0.9") ==
        "dropped: unallocated ClusterIP in ServiceCIDR kubernetes (172.30.0.0/16)");
  CHECK(unallocatedClusterIPReason(cidrs, net::Family::kIPv4, "10.0.0.1") == "dropped: unallocated ClusterIP");
}

TEST_CASE("plan trace: a packet is made from numeric addresses of one family", "[unit]") {
  auto p = Packet::make("10.0.0.2", "172.30.0.41", 80, "tcp");
  REQUIRE(p);
  CHECK(p->protocol == 6);
  CHECK_FALSE(p->fromNode);
  CHECK(p->toString() == "10.0.0.2 -> 172.30.0.41:80/tcp (arriving)");
  auto v6 = Packet::make("fd00::2", "fd00:30::41", 53, "udp", /*fromNode=*/true);
  REQUIRE(v6);
  CHECK(v6->toString() == "fd00::2 -> [fd00:30::41]:53/udp (from the node)");
  CHECK(Packet::make("10.0.0.2", "172.30.0.41", 80, "sctp")->protocol == 132);
  CHECK_FALSE(Packet::make("10.0.0.2", "fd00::1", 80, "tcp"));          // two families
  CHECK_FALSE(Packet::make("10.0.0.0/24", "172.30.0.41", 80, "tcp"));   // not a host
  CHECK_FALSE(Packet::make("node-a", "172.30.0.41", 80, "tcp"));        // not numeric
  CHECK_FALSE(Packet::make("10.0.0.2", "172.30.0.41", 80, "icmp"));     // not a service protocol
}

TEST_CASE("plan trace: an explain request becomes a packet or the one error", "[unit]") {
  sdk::ExplainRequest request;
  request.sourceIP = "10.0.0.2";
  request.destinationIP = "172.30.0.41";
  request.destinationPort = 80;
  request.protocol = sdk::Protocol::kUDP;
  request.inputInterface = "eth1";
  auto arriving = packetOf(request);
  REQUIRE(arriving);
  CHECK(arriving->protocol == 17);
  CHECK(arriving->inputInterface == "eth1");
  CHECK(arriving->toString() == "10.0.0.2 -> 172.30.0.41:80/udp (arriving)");

  // A packet the node sends arrives on no interface, whatever the request says.
  request.fromNode = true;
  auto sent = packetOf(request);
  REQUIRE(sent);
  CHECK(sent->fromNode);
  CHECK(sent->inputInterface.empty());

  request.destinationIP = "fd00::1";
  auto bad = packetOf(request);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message ==
        "explain: cannot make a packet from 10.0.0.2 to fd00::1 (addresses must be numeric and of one family)");
}

TEST_CASE("plan trace: a trace prints its packet, its paths and its outcome", "[unit]") {
  Trace trace;
  trace.packet = *Packet::make("10.0.0.2", "172.30.0.41", 80, "tcp");
  trace.paths = {dnatPath("10.180.0.1:80")};
  trace.outcome = mergePaths(trace.paths);
  CHECK(trace.toText() == traceText(trace.packet.toString(), trace.paths, trace.warnings, trace.outcome));
  CHECK(trace.toText().starts_with("packet 10.0.0.2 -> 172.30.0.41:80/tcp (arriving)\n"));
}

TEST_CASE("plan trace: the node's local addresses", "[unit]") {
  auto text = [](const std::vector<net::Prefix>& v) {
    std::vector<std::string> out;
    for (const auto& a : v) out.push_back(a.toString());
    return out;
  };
  sdk::NodeInfo node;
  node.addresses = {"192.168.0.10", "fd00::10", "not-an-address"};
  const std::vector<std::string> nodeIPs{"192.168.9.9"};
  const std::vector<std::string> nodePorts{"10.1.0.5", "10.2.0.0/16"};
  // The Node's host addresses, then those NodePorts answer on; the node IPs only stand in.
  CHECK(text(nodeLocalAddresses(node, nodeIPs, nodePorts)) ==
        std::vector<std::string>{"192.168.0.10", "fd00::10", "10.1.0.5"});
  node.addresses = {"not-an-address"};
  CHECK(text(nodeLocalAddresses(node, nodeIPs, {})) == std::vector<std::string>{"192.168.9.9"});
  node.addresses.clear();
  CHECK(text(nodeLocalAddresses(node, nodeIPs, nodePorts)) == std::vector<std::string>{"192.168.9.9", "10.1.0.5"});
  CHECK(nodeLocalAddresses(node, {}, {}).empty());
}

TEST_CASE("plan trace: the merged outcome keeps the deciding rule's reason", "[unit]") {
  TracePath dropped;
  dropped.outcome.verdict = TraceVerdict::kDropped;
  dropped.outcome.reason = DropReason::kUnallocatedClusterIP;
  CHECK(mergePaths(std::vector<TracePath>{dropped}).reason == DropReason::kUnallocatedClusterIP);
  CHECK(dropReasonName(DropReason::kUnallocatedClusterIP) == "unallocated-cluster-ip");
  CHECK(dropReasonName(DropReason::kNone).empty());
  // Not part of the JSON every backend prints.
  CHECK(mergePaths(std::vector<TracePath>{dropped}).toJson().find("reason") == std::string::npos);
}
