// explainPacket: which service port, each endpoint in or out with its reason, the verdict, and
// the JSON form, on service ports built by hand (no kernel).

#include "kproxy/nftables/explain.h"
#include "kproxy/nftables/tracer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::nftables;
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

TEST_CASE("explain: ClusterIP endpoints in and out, each with its reason", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80,
                     {endpoint("10.180.0.1", 80), endpoint("10.180.0.2", 80)});
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
  CHECK_THAT(*out, Catch::Contains("service:   default/web:p (ClusterIP), via its cluster IP 172.30.0.41:80/tcp"));
  CHECK_THAT(*out, Catch::Contains("outcome:   DNAT to 10.180.0.1:80, 10.180.0.2:80, not masqueraded"));
  CHECK_THAT(*out, Catch::Contains("in   10.180.0.1:80            ready"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.3:80            not ready"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.5:80            terminating (ready endpoints exist)"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.4:80            not in topology hints"));
  CHECK_THAT(*out, Catch::Contains("@service-ips hit: 172.30.0.41 . tcp . 80"));
}

TEST_CASE("explain: terminating endpoints as the fallback", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80, {terminating("10.180.0.5", 80)});
  std::vector<sdk::ServicePort> ports{p};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80));
  REQUIRE(out);
  CHECK_THAT(*out, Catch::Contains("in   10.180.0.5:80            terminating (fallback)"));
}

TEST_CASE("explain: iTP=Local without a local endpoint drops, naming the policy", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)});
  p.internalPolicyLocal = true;
  p.localEndpoints.clear();
  std::vector<sdk::ServicePort> ports{p};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80));
  REQUIRE(out);
  CHECK_THAT(*out, Catch::Contains("outcome:   dropped by chain"));
  CHECK_THAT(*out, Catch::Contains("out  10.180.0.1:80            not local (iTP=Local)"));
}

TEST_CASE("explain: JSON carries the verdict, the service and the endpoints", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {}),
                                      clusterIP("default", "api", "172.30.0.42", 80,
                                                {endpoint("10.180.0.1", 80)})};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.41", 80, true));
  REQUIRE(out);
  auto j = nlohmann::json::parse(*out);
  CHECK(j["verdict"] == "reject");
  CHECK(j["service"]["key"] == "default/web:p");
  CHECK(j["endpoints"].empty());
  CHECK(j["outcome"]["chain"] == "reject-chain");

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

TEST_CASE("explain: addresses that do not parse are an error", "[unit]") {
  std::vector<sdk::ServicePort> ports;
  auto out = explainPacket(config(), ports, node(), request("10.0.0.300", "172.30.0.41", 80));
  REQUIRE_FALSE(out);
  CHECK_THAT(out.error().message, Catch::Contains("10.0.0.300"));
}

TEST_CASE("explain: an unallocated ClusterIP is dropped, naming its ServiceCIDR", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)})};
  const std::vector<sdk::ServiceCIDR> cidrs{{"kubernetes", "172.30.0.0/16"}, {"extra", "172.31.0.0/24"}};
  auto out = explainPacket(config(), ports, node(), request("10.0.0.2", "172.30.0.50", 80), cidrs);
  REQUIRE(out);
  CHECK_THAT(*out, Catch::Contains("dropped by chain cluster-ips-check: ip daddr 172.30.0.0/16 drop"));
  CHECK_THAT(*out, Catch::Contains("reason:    dropped: unallocated ClusterIP in ServiceCIDR kubernetes (172.30.0.0/16)"));
  CHECK_THAT(*out, Catch::Contains("unallocated ClusterIP: 172.30.0.50 is inside service CIDR 172.30.0.0/16"));

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

TEST_CASE("explain: the renderer's drop and reject tags reach the trace's outcome", "[unit]") {
  std::vector<sdk::ServicePort> ports{clusterIP("default", "web", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)}),
                                      clusterIP("default", "empty", "172.30.0.42", 80, {})};
  NftablesRenderer renderer(config());
  renderer.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}});
  const NftablesTracer tracer = NftablesTracer::fromServicePorts(renderer, net::Family::kIPv4, ports, node());
  auto outcome = [&](const char* dst, std::uint16_t port) {
    return tracer.trace(*plan::Packet::make("10.0.0.2", dst, port, "tcp")).outcome;
  };
  CHECK(outcome("172.30.0.50", 80).verdict == plan::TraceVerdict::kDropped);
  CHECK(outcome("172.30.0.50", 80).reason == plan::DropReason::kUnallocatedClusterIP);
  CHECK(outcome("172.30.0.42", 80).verdict == plan::TraceVerdict::kRejected);
  CHECK(outcome("172.30.0.42", 80).reason == plan::DropReason::kNoEndpoints);
  CHECK(outcome("172.30.0.41", 81).verdict == plan::TraceVerdict::kRejected);
  CHECK(outcome("172.30.0.41", 81).reason == plan::DropReason::kClusterIPPort);
  CHECK(outcome("172.30.0.41", 80).reason == plan::DropReason::kNone);

  // The tag is the renderer's note, no part of the rule: a rule read back without it is equal.
  Rule tagged{{Verdict{VerdictKind::kDrop, {}}}, plan::DropReason::kSourceRange};
  CHECK(tagged == Rule{{Verdict{VerdictKind::kDrop, {}}}});
  CHECK(ruleHash(net::Family::kIPv4, "c", tagged) == ruleHash(net::Family::kIPv4, "c", Rule{tagged.statements}));
}
