// explainPacket for iptables: the rules the renderer writes, traced, answered in the format
// every backend shares (plan/trace.h): which service port, each endpoint in or out with its
// reason, the verdict, the JSON form.

#include "kproxy/iptables/explain.h"
#include "kproxy/iptables/tracer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::iptables;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;

namespace {

RenderConfig config() {
  RenderConfig cfg;
  cfg.common.clusterCIDRs.push_back("10.0.0.0/8");
  return cfg;
}

sdk::NodeInfo node() {
  sdk::NodeInfo n;
  n.name = "node-a";
  n.addresses = {"192.168.1.10"};
  return n;
}

sdk::ExplainRequest request(std::string src, std::string dst, std::uint16_t port, bool json = false) {
  sdk::ExplainRequest r;
  r.sourceIP = std::move(src);
  r.destinationIP = std::move(dst);
  r.destinationPort = port;
  r.json = json;
  return r;
}

sdk::Endpoint terminating(std::string ip, int port) {
  auto e = endpoint(std::move(ip), port);
  e.ready = false;
  e.terminating = true;
  return e;
}

}  // namespace

TEST_CASE("iptables explain: ClusterIP endpoints in and out, each with its reason", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80), endpoint("10.180.0.2", 80)});
  auto notReady = endpoint("10.180.0.3", 80);
  notReady.ready = notReady.serving = false;
  auto otherZone = endpoint("10.180.0.4", 80);
  p.allEndpoints.push_back(notReady);
  p.allEndpoints.push_back(terminating("10.180.0.5", 80));
  p.allEndpoints.push_back(otherZone);
  p.allReachableEndpoints.push_back(otherZone);  // reachable, but filtered out by topology
  std::vector<sdk::ServicePort> ports{p};

  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80));
  REQUIRE(out);
  INFO(*out);
  CHECK_THAT(*out, Catch::Contains("service:   default/web:p (ClusterIP), via its cluster IP 172.30.0.41:80/tcp"));
  CHECK_THAT(*out, Catch::Contains("outcome:   DNAT to 10.180.0.1:80, 10.180.0.2:80, not masqueraded"));
  CHECK_THAT(*out, Catch::Contains("in   10.180.0.1:80            ready"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.3:80            not ready"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.5:80            terminating (ready endpoints exist)"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.4:80            not in topology hints"));
  // The trace names the rules as iptables-save prints them.
  CHECK_THAT(*out, Catch::Contains("nat KUBE-SERVICES: -d 172.30.0.41/32 -p tcp -m comment --comment "
                                   "\"default/web:p cluster IP\" -m tcp --dport 80 -j KUBE-SVC-"));
  CHECK_THAT(*out, Catch::Contains("-m statistic --mode random --probability 0.50000000000"));
  CHECK_THAT(*out, Catch::Contains("path 2 of 2"));
}

TEST_CASE("iptables explain: an off-cluster client is masqueraded", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)})};
  auto out = explainPacket(config(), ports, node(), request("203.0.113.2", "172.30.0.41", 80));
  REQUIRE(out);
  INFO(*out);
  CHECK_THAT(*out, Catch::Contains("outcome:   DNAT to 10.180.0.1:80, masqueraded"));
  CHECK_THAT(*out, Catch::Contains("MASQUERADE"));
}

TEST_CASE("iptables explain: terminating endpoints as the fallback", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80, {terminating("10.180.0.5", 80)});
  std::vector<sdk::ServicePort> ports{p};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80));
  REQUIRE(out);
  CHECK_THAT(*out, Catch::Contains("in   10.180.0.5:80            terminating (fallback)"));
}

TEST_CASE("iptables explain: iTP=Local without a local endpoint drops, naming the policy", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)});
  p.internalPolicyLocal = true;
  p.localEndpoints.clear();
  std::vector<sdk::ServicePort> ports{p};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80));
  REQUIRE(out);
  INFO(*out);
  CHECK_THAT(*out, Catch::Contains("outcome:   dropped by chain filter KUBE-SERVICES: "));
  CHECK_THAT(*out, Catch::Contains("has no local endpoints"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.1:80            not local (iTP=Local)"));
}

TEST_CASE("iptables explain: JSON carries the verdict, the service and the endpoints", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {}),
                                      clusterIP("default", "api", "172.30.0.42", 80, {endpoint("10.180.0.1", 80)})};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80, true));
  REQUIRE(out);
  auto j = nlohmann::json::parse(*out);
  CHECK(j["verdict"] == "reject");
  CHECK(j["service"]["key"] == "default/web:p");
  CHECK(j["endpoints"].empty());
  CHECK(j["outcome"]["chain"] == "filter KUBE-SERVICES");
  CHECK(j["warnings"].empty());

  out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.42", 80, true));
  REQUIRE(out);
  j = nlohmann::json::parse(*out);
  CHECK(j["verdict"] == "dnat");
  CHECK(j["masqueraded"] == false);
  CHECK(j["endpoints"][0]["endpoint"] == "10.180.0.1:80");
  CHECK(j["endpoints"][0]["selected"] == true);
  CHECK(j["packet"]["port"] == 80);
  CHECK_FALSE(j["paths"].empty());
}

TEST_CASE("iptables explain: addresses that do not parse are an error", "[unit]") {
  std::vector<sdk::ServicePort> ports;
  auto out = explainPacket(config(), ports, node(), request("10.0.0.300", "172.30.0.41", 80));
  REQUIRE_FALSE(out);
  CHECK_THAT(out.error().message, Catch::Contains("10.0.0.300"));
}

TEST_CASE("iptables explain: an unallocated ClusterIP is dropped, naming its ServiceCIDR", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)})};
  const std::vector<sdk::ServiceCIDR> cidrs{{"kubernetes", "172.30.0.0/16"}, {"extra", "172.31.0.0/24"}};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.50", 80), cidrs);
  REQUIRE(out);
  INFO(*out);
  CHECK_THAT(*out, Catch::Contains("dropped by chain filter KUBE-SERVICES: -d 172.30.0.0/16"));
  CHECK_THAT(*out, Catch::Contains("reason:    dropped: unallocated ClusterIP in ServiceCIDR kubernetes (172.30.0.0/16)"));

  // A known ClusterIP's unused port is still rejected; outside every CIDR nothing happens.
  auto json = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 81, true), cidrs);
  REQUIRE(json);
  CHECK(nlohmann::json::parse(*json)["verdict"] == "reject");
  json = explainPacket(config(), ports, node(), request("10.0.0.2", "172.31.0.9", 80, true), cidrs);
  REQUIRE(json);
  auto j = nlohmann::json::parse(*json);
  CHECK(j["verdict"] == "drop");
  CHECK(j["reason"] == "dropped: unallocated ClusterIP in ServiceCIDR extra (172.31.0.0/24)");
  json = explainPacket(config(), ports, node(), request("10.0.0.2", "172.32.0.9", 80, true), cidrs);
  REQUIRE(json);
  CHECK(nlohmann::json::parse(*json)["verdict"] == "accept");
}

TEST_CASE("iptables explain: the renderer's drop and reject tags reach the trace's outcome", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)}),
                                      clusterIP("default", "empty", "172.30.0.42", 80, {})};
  IptablesRenderer renderer(config());
  renderer.setNode(node());
  renderer.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}});
  const TaggedRuleset rules = renderTaggedRuleset(renderer, net::Family::kIPv4, ports, node());
  // The tags never reach the kernel: the rules are those renderRuleset writes.
  CHECK(rules.text == renderRuleset(renderer, net::Family::kIPv4, ports, node()));
  auto tracer = IptablesTracer::fromText(rules.text, {*net::Prefix::parse("192.168.1.10")});
  REQUIRE(tracer);
  auto outcome = [&](const char* dst) {
    return tracer->trace(*plan::Packet::make("10.0.0.2", dst, 80, "tcp")).outcome;
  };
  // Untagged, a drop says only where it happened.
  CHECK(outcome("172.30.0.50").verdict == plan::TraceVerdict::kDropped);
  CHECK(outcome("172.30.0.50").reason == plan::DropReason::kNone);

  tracer->tagRules(rules.tags);
  CHECK(outcome("172.30.0.50").reason == plan::DropReason::kUnallocatedClusterIP);
  CHECK(outcome("172.30.0.42").verdict == plan::TraceVerdict::kRejected);
  CHECK(outcome("172.30.0.42").reason == plan::DropReason::kNoEndpoints);
  CHECK(outcome("172.30.0.41").reason == plan::DropReason::kNone);
}

TEST_CASE("iptables explain: the INVALID drop in KUBE-FORWARD and the localnet drop are tagged", "[unit]") {
  sdk::NodeInfo n = node();
  n.nodePortAddresses.resolved = true;
  n.nodePortAddresses.addresses = {"192.168.1.10", "127.0.0.1"};  // NodePorts on localhost too
  IptablesRenderer renderer(config());
  renderer.setNode(n);
  const TaggedRuleset rules = renderTaggedRuleset(renderer, net::Family::kIPv4, {}, n);
  auto taggedAs = [&](plan::DropReason reason) {
    std::vector<std::string> out;
    for (const auto& tag : rules.tags)
      if (tag.reason == reason) out.push_back(tag.chain + " " + tag.spec);
    return out;
  };
  CHECK(taggedAs(plan::DropReason::kInvalidConnection) ==
        std::vector<std::string>{"KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"});
  const auto localnet = taggedAs(plan::DropReason::kLocalnet);
  REQUIRE(localnet.size() == 1);
  CHECK(localnet[0].starts_with("KUBE-PROXY-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 "));
  CHECK(localnet[0].ends_with("-j DROP"));
  // Each names a rule of the ruleset the kernel is given, and a trace that ends there says why.
  CHECK(rules.text.find("-A " + taggedAs(plan::DropReason::kInvalidConnection)[0]) != std::string::npos);
  CHECK(rules.text.find("-A " + localnet[0]) != std::string::npos);
  auto tracer = IptablesTracer::fromText(rules.text, {*net::Prefix::parse("192.168.1.10")});
  REQUIRE(tracer);
  tracer->tagRules(rules.tags);
  const Trace t = tracer->trace(*plan::Packet::make("10.0.0.2", "127.0.0.1", 9999, "tcp"));
  INFO(t.toText());
  CHECK(t.outcome.verdict == plan::TraceVerdict::kDropped);
  CHECK(t.outcome.chain == "filter KUBE-PROXY-FIREWALL");
  CHECK(t.outcome.reason == plan::DropReason::kLocalnet);

  // With liberal TCP conntrack there is no INVALID drop, and no tag.
  RenderConfig liberal = config();
  liberal.conntrackTCPLiberal = true;
  IptablesRenderer liberalRenderer(liberal);
  liberalRenderer.setNode(n);
  for (const auto& tag : renderTaggedRuleset(liberalRenderer, net::Family::kIPv4, {}, n).tags)
    CHECK(tag.reason != plan::DropReason::kInvalidConnection);
}

TEST_CASE("iptables explain: a localhost NodePort goes through the rule that counts it into nfacct", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30111;
  std::vector<sdk::ServicePort> ports{p};
  auto counted = explainPacket(config(), ports, node(), request("127.0.0.1", "127.0.0.1", 30111), {}, {true, true});
  REQUIRE(counted);
  INFO(*counted);
  CHECK_THAT(*counted, Catch::Contains("outcome:   DNAT to 10.180.0.1:80, masqueraded"));
  CHECK_THAT(*counted, Catch::Contains("nat KUBE-NODEPORTS: -d 127.0.0.0/8 -p tcp -m comment --comment \"default/web:p\" "
                                       "-m tcp --dport 30111 -m nfacct --nfacct-name  localhost_nps_accepted_pkts"));
  // Without the object, the same answer through upstream's other rule.
  auto plain = explainPacket(config(), ports, node(), request("127.0.0.1", "127.0.0.1", 30111));
  REQUIRE(plain);
  CHECK_THAT(*plain, Catch::Contains("outcome:   DNAT to 10.180.0.1:80, masqueraded"));
  CHECK_THAT(*plain, !Catch::Contains("nfacct"));
}
