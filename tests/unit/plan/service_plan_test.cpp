// The service plan: upstream kube-proxy's per-service-port decisions, one case at a time.

#include <catch2/catch.hpp>

#include "kproxy/plan/service_plan.h"
#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::plan;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;

namespace {

PlanConfig clusterCIDRConfig() {
  PlanConfig cfg;
  cfg.localDetector.mode = LocalTrafficDetector::Mode::kCIDRs;
  cfg.localDetector.cidrs = {"10.0.0.0/8", "fd00:10::/64"};
  cfg.nodeIPs = {"192.168.0.2", "2001:db8::2"};
  return cfg;
}

sdk::ServicePort loadBalancer(std::vector<sdk::Endpoint> eps) {
  auto p = clusterIP("ns1", "svc1", "172.30.0.41", 80, std::move(eps));
  p.type = sdk::ServiceType::kLoadBalancer;
  p.nodePort = 3001;
  p.externalIPs = {"192.168.99.11"};
  p.loadBalancerIPs = {"1.2.3.4"};
  return p;
}

std::vector<std::string> ips(std::span<const sdk::Endpoint> eps) {
  std::vector<std::string> out;
  for (const auto& e : eps) out.push_back(e.ip);
  return out;
}

}  // namespace

TEST_CASE("plan: a ClusterIP service uses the cluster pool, masquerading off-node clients", "[unit]") {
  auto p = clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80), endpoint("10.180.2.1", 80)});
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.clusterIP == "172.30.0.41");
  CHECK(plan.usesClusterPool);
  CHECK_FALSE(plan.usesLocalPool);
  CHECK(plan.internalPool == Pool::kCluster);
  CHECK(plan.hasInternalEndpoints);
  CHECK(plan.internalNoEndpoints == NoEndpoints::kNone);
  CHECK(plan.internalMasquerade == InternalMasquerade::kNotLocal);
  CHECK(ips(plan.clusterEndpoints) == std::vector<std::string>{"10.180.0.1", "10.180.2.1"});
  CHECK_FALSE(plan.externallyAccessible);
  CHECK_FALSE(plan.capturesExternal);
  CHECK_FALSE(plan.usesFirewall);

  // Without a local-traffic detector nothing is masqueraded; with masquerade-all everything is.
  CHECK(planServicePort(p, PlanConfig{}).internalMasquerade == InternalMasquerade::kNone);
  PlanConfig all = clusterCIDRConfig();
  all.masqueradeAll = true;
  CHECK(planServicePort(p, all).internalMasquerade == InternalMasquerade::kAll);
}

TEST_CASE("plan: no endpoints anywhere rejects, internal and external", "[unit]") {
  auto plan = planServicePort(loadBalancer({}), clusterCIDRConfig());
  CHECK_FALSE(plan.hasEndpoints);
  CHECK(plan.internalNoEndpoints == NoEndpoints::kReject);
  CHECK(plan.externalNoEndpoints == NoEndpoints::kReject);
  CHECK_FALSE(plan.capturesExternal);
  CHECK_FALSE(plan.usesClusterPool);
}

TEST_CASE("plan: eTP=Cluster masquerades all external traffic into the cluster pool", "[unit]") {
  auto plan = planServicePort(loadBalancer({endpoint("10.180.0.1", 80)}), clusterCIDRConfig());
  CHECK(plan.externallyAccessible);
  CHECK(plan.capturesExternal);
  CHECK(plan.externalPool == Pool::kCluster);
  CHECK(plan.hasExternalEndpoints);
  CHECK(plan.externalMasqueradeAll);
  CHECK_FALSE(plan.shortCircuitPods);
  CHECK_FALSE(plan.shortCircuitNode);
  CHECK(plan.externalIPs == std::vector<std::string>{"192.168.99.11"});
  CHECK(plan.loadBalancerIPs == std::vector<std::string>{"1.2.3.4"});
}

TEST_CASE("plan: eTP=Local keeps the source, short-circuits pods and the node", "[unit]") {
  auto p = loadBalancer({endpoint("10.180.0.1", 80), endpoint("10.180.2.1", 80, true)});
  p.externalPolicyLocal = true;
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.externalPool == Pool::kLocal);
  CHECK(plan.hasExternalEndpoints);
  CHECK_FALSE(plan.externalMasqueradeAll);
  CHECK(plan.shortCircuitPods);
  CHECK(plan.shortCircuitNode);
  CHECK(plan.usesClusterPool);
  CHECK(plan.usesLocalPool);
  CHECK(ips(plan.localEndpoints) == std::vector<std::string>{"10.180.2.1"});

  // Without a detector the pods cannot be told apart; the node still can.
  auto noDetector = planServicePort(p, PlanConfig{});
  CHECK_FALSE(noDetector.shortCircuitPods);
  CHECK(noDetector.shortCircuitNode);
}

TEST_CASE("plan: eTP=Local without a local endpoint still captures, then drops (issue 10, item 1)", "[unit]") {
  auto p = loadBalancer({endpoint("10.180.0.1", 80)});
  p.externalPolicyLocal = true;
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.capturesExternal);
  CHECK_FALSE(plan.hasExternalEndpoints);
  CHECK(plan.externalNoEndpoints == NoEndpoints::kDrop);
  CHECK(plan.shortCircuitPods);
  CHECK(plan.shortCircuitNode);
  CHECK(ips(plan.clusterEndpoints) == std::vector<std::string>{"10.180.0.1"});
  // The ClusterIP is unaffected.
  CHECK(plan.hasInternalEndpoints);
}

TEST_CASE("plan: both policies Local short-circuit to the cluster pool", "[unit]") {
  auto p = loadBalancer({endpoint("10.180.0.1", 80), endpoint("10.180.2.1", 80, true)});
  p.externalPolicyLocal = true;
  p.internalPolicyLocal = true;
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.internalPool == Pool::kLocal);
  CHECK(plan.usesClusterPool);  // for the short-circuit
  CHECK(ips(plan.clusterEndpoints) == std::vector<std::string>{"10.180.0.1", "10.180.2.1"});
  CHECK(plan.shortCircuitPods);
  CHECK_FALSE(plan.poolsEqual());
}

TEST_CASE("plan: iTP=Local without external access never uses the cluster pool", "[unit]") {
  auto p = clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)});
  p.internalPolicyLocal = true;
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK_FALSE(plan.usesClusterPool);
  CHECK(plan.clusterEndpoints.empty());
  CHECK(plan.internalPool == Pool::kLocal);
  CHECK_FALSE(plan.hasInternalEndpoints);
  CHECK(plan.internalNoEndpoints == NoEndpoints::kDrop);  // endpoints exist, none here
}

TEST_CASE("plan: source ranges filter LoadBalancer IPs and admit the node when a range holds it", "[unit]") {
  auto p = loadBalancer({endpoint("10.180.0.1", 80)});
  p.loadBalancerSourceRanges = {"203.0.113.0/25", "fd00::/8"};
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.usesFirewall);
  CHECK(plan.firewallAllowedSources == std::vector<std::string>{"203.0.113.0/25"});

  p.loadBalancerSourceRanges = {"203.0.113.0/25", "192.168.0.0/24"};
  plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.firewallAllowedSources == std::vector<std::string>{"203.0.113.0/25", "192.168.0.0/24", "1.2.3.4"});

  p.loadBalancerIPs.clear();  // no LoadBalancer IP: nothing to filter (NodePorts never are)
  CHECK_FALSE(planServicePort(p, clusterCIDRConfig()).usesFirewall);
}

TEST_CASE("plan: addresses of the other family are left out", "[unit]") {
  auto p = loadBalancer({endpoint("10.180.0.1", 80)});
  p.externalIPs = {"192.168.99.11", "fd00::11", "not-an-ip"};
  auto plan = planServicePort(p, clusterCIDRConfig());
  CHECK(plan.externalIPs == std::vector<std::string>{"192.168.99.11"});
}

TEST_CASE("plan: session affinity with upstream's default timeout", "[unit]") {
  auto p = clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)});
  CHECK_FALSE(planServicePort(p, PlanConfig{}).affinity);
  p.sessionAffinityClientIP = true;
  CHECK(planServicePort(p, PlanConfig{}).affinityTimeoutSeconds == kDefaultAffinityTimeoutSeconds);
  p.stickyMaxAgeSeconds = 60;
  CHECK(planServicePort(p, PlanConfig{}).affinityTimeoutSeconds == 60);
}

TEST_CASE("plan: service CIDR ranges per family, sorted, nested ones folded", "[unit]") {
  const std::vector<sdk::ServiceCIDR> cidrs{{"b", "10.96.0.0/12"},     {"a", "10.100.0.0/16"},
                                            {"c", "10.0.0.0/24"},      {"b", "fd00:10:96::/112"},
                                            {"d", "10.96.0.0/12"},     {"e", "nonsense"},
                                            {"f", "10.96.0.1/12"}};  // host bits: the same range
  auto v4 = serviceCIDRRanges(cidrs, net::Family::kIPv4);
  CHECK(v4 == std::vector<ServiceCIDRRange>{{"10.0.0.0/24", {"c"}}, {"10.96.0.0/12", {"b", "d", "f", "a"}}});
  auto v6 = serviceCIDRRanges(cidrs, net::Family::kIPv6);
  CHECK(v6 == std::vector<ServiceCIDRRange>{{"fd00:10:96::/112", {"b"}}});
  CHECK(serviceCIDRRanges({}, net::Family::kIPv4).empty());
}
