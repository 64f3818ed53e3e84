// NftablesRenderer: the rules of each feature, as nft text.

#include <catch2/catch.hpp>

#include "kproxy/nftables/renderer.h"
#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::nftables;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;

namespace {

const Chain* findChain(const Fragment& f, const std::string& name) {
  for (const auto& c : f.chains)
    if (c.name == name) return &c;
  return nullptr;
}

std::vector<std::string> texts(const Chain& c, Family fam = Family::kIPv4) {
  std::vector<std::string> out;
  for (const auto& r : c.rules) out.push_back(r.toText(fam));
  return out;
}

std::vector<std::string> elementTexts(const Fragment& f) {
  std::vector<std::string> out;
  for (const auto& e : f.elements)
    out.push_back(e.set + " " + e.keyText + (e.value ? " : " + e.value->toString() : ""));
  return out;
}

RenderConfig config() {
  RenderConfig cfg;
  cfg.clusterCIDRs.push_back(*Address::parse("10.0.0.0/8"));
  return cfg;
}

}  // namespace

TEST_CASE("chain names follow upstream's hash scheme", "[unit]") {
  auto p = clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)}, sdk::Protocol::kTCP,
                     "p80");
  // Values from upstream kube-proxy's nftables proxier tests.
  CHECK(serviceChainName(p) == "service-ULMVA6XW-ns1/svc1/tcp/p80");
  CHECK(externalChainName(p) == "external-ULMVA6XW-ns1/svc1/tcp/p80");
  CHECK(endpointChainName(p, p.clusterEndpoints[0]) == "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80");
}

TEST_CASE("ClusterIP: masquerade from outside the cluster CIDR and a numgen cascade", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "web", "172.30.0.10", 80,
                     {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080), endpoint("10.1.0.3", 8080)});
  Fragment f = r.renderServicePort(p);
  const Chain* svc = findChain(f, serviceChainName(p));
  REQUIRE(svc != nullptr);
  auto e = [&](int i) { return endpointChainName(p, p.clusterEndpoints[static_cast<std::size_t>(i)]); };
  CHECK(texts(*svc) == std::vector<std::string>{
                           "ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
                           "numgen random mod 3 == 0 goto " + e(0),
                           "numgen random mod 2 == 0 goto " + e(1),
                           "goto " + e(2),
                       });
  const Chain* ep = findChain(f, e(1));
  REQUIRE(ep != nullptr);
  CHECK(texts(*ep) == std::vector<std::string>{"ip saddr 10.1.0.2 jump mark-for-masquerade",
                                               "meta l4proto tcp dnat to 10.1.0.2:8080"});
  CHECK(elementTexts(f) == std::vector<std::string>{
                               "cluster-ips 172.30.0.10",
                               "service-ips 172.30.0.10 . tcp . 80 : goto " + serviceChainName(p),
                           });
  CHECK(f.chains.size() == 4);
}

TEST_CASE("masquerade-all marks every service packet", "[unit]") {
  RenderConfig cfg;
  cfg.masqueradeAll = true;
  cfg.masqueradeBit = 5;
  NftablesRenderer r(cfg);
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  auto f = r.renderServicePort(p);
  CHECK(texts(*findChain(f, serviceChainName(p)))[0] == "jump mark-for-masquerade");
  auto g = r.renderGlobal(Family::kIPv4, {});
  for (const auto& c : g.chains)
    if (c.name == "mark-for-masquerade") CHECK(texts(c)[0] == "meta mark set meta mark | 0x00000020");
}

TEST_CASE("no endpoints: reject through no-endpoint-services, no chains", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "empty", "172.30.0.14", 80, {});
  auto f = r.renderServicePort(p);
  CHECK(f.chains.empty());
  CHECK(elementTexts(f) == std::vector<std::string>{
                               "cluster-ips 172.30.0.14",
                               "no-endpoint-services 172.30.0.14 . tcp . 80 : goto reject-chain"});
}

TEST_CASE("session affinity: one shared map, update in endpoint chains", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "sticky", "172.30.0.11", 80,
                     {endpoint("10.1.0.3", 8080), endpoint("10.1.0.4", 8080)});
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 600;
  auto f = r.renderServicePort(p);
  auto svc = texts(*findChain(f, serviceChainName(p)));
  // masquerade check, hairpin marks for the affinity path, affinity hit, 2-endpoint cascade
  REQUIRE(svc.size() == 6);
  CHECK(svc[1] == "ip saddr 10.1.0.3 jump mark-for-masquerade");
  CHECK(svc[2] == "ip saddr 10.1.0.4 jump mark-for-masquerade");
  CHECK(svc[3] == "meta l4proto tcp dnat to ip saddr . ip daddr . meta l4proto . th dport map @affinity");
  auto ep = texts(*findChain(f, endpointChainName(p, p.clusterEndpoints[0])));
  CHECK(ep[1] ==
        "update @affinity { ip saddr . ip daddr . meta l4proto . th dport timeout 600s : 10.1.0.3 . 8080 }");
  // The map is table-wide, whatever the number of services.
  auto specs = r.setSpecs(Family::kIPv4);
  CHECK(specs.size() == 8);
}

TEST_CASE("NodePort with eTP=Local: local endpoints only, source kept, drop when none", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "np", "172.30.0.12", 53,
                     {endpoint("10.1.0.4", 53, true), endpoint("10.1.0.5", 53)}, sdk::Protocol::kUDP);
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30053;
  p.externalPolicyLocal = true;
  auto f = r.renderServicePort(p);
  auto ext = texts(*findChain(f, externalChainName(p)));
  std::string svc = serviceChainName(p);
  CHECK(ext == std::vector<std::string>{
                   "ip saddr 10.0.0.0/8 goto " + svc,
                   "fib saddr type local jump mark-for-masquerade",
                   "fib saddr type local goto " + svc,
                   "goto " + endpointChainName(p, p.localEndpoints[0]),
               });
  CHECK(elementTexts(f).back() == "service-nodeports udp . 30053 : goto " + externalChainName(p));

  // No local endpoint: external traffic is dropped, internal still served.
  testing::setEndpoints(p, {endpoint("10.1.0.5", 53)});
  f = r.renderServicePort(p);
  CHECK(findChain(f, externalChainName(p)) == nullptr);
  CHECK(elementTexts(f).back() == "no-endpoint-nodeports udp . 30053 : drop");
}

TEST_CASE("NodePort with eTP=Cluster is masqueraded", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "np", "172.30.0.12", 80, {endpoint("10.1.0.4", 80)});
  p.nodePort = 30080;
  auto f = r.renderServicePort(p);
  CHECK(texts(*findChain(f, externalChainName(p))) ==
        std::vector<std::string>{"jump mark-for-masquerade", "goto " + serviceChainName(p)});
}

TEST_CASE("LoadBalancer source ranges are rules in a firewall chain; externalIPs", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "lb", "172.30.0.13", 443, {endpoint("10.1.0.6", 8443)}, sdk::Protocol::kSCTP);
  p.type = sdk::ServiceType::kLoadBalancer;
  p.loadBalancerIPs = {"198.51.100.7"};
  p.loadBalancerSourceRanges = {"203.0.113.0/24", "192.0.2.0/25"};
  p.externalIPs = {"198.51.100.8"};
  auto f = r.renderServicePort(p);
  CHECK(texts(*findChain(f, firewallChainName(p))) ==
        std::vector<std::string>{"ip saddr 203.0.113.0/24 return", "ip saddr 192.0.2.0/25 return", "drop"});
  auto els = elementTexts(f);
  auto has = [&](const std::string& s) { return std::find(els.begin(), els.end(), s) != els.end(); };
  CHECK(has("service-ips 198.51.100.8 . sctp . 443 : goto " + externalChainName(p)));
  CHECK(has("service-ips 198.51.100.7 . sctp . 443 : goto " + externalChainName(p)));
  CHECK(has("firewall-ips 198.51.100.7 . sctp . 443 : goto " + firewallChainName(p)));
}

TEST_CASE("iTP=Local uses local endpoints for the ClusterIP", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "itp", "172.30.0.15", 80,
                     {endpoint("10.1.0.7", 80, true), endpoint("10.1.0.8", 80)});
  p.internalPolicyLocal = true;
  auto f = r.renderServicePort(p);
  auto svc = texts(*findChain(f, serviceChainName(p)));
  CHECK(svc.back() == "goto " + endpointChainName(p, p.localEndpoints[0]));
  CHECK(findChain(f, endpointChainName(p, p.clusterEndpoints[1])) == nullptr);
}

TEST_CASE("IPv6 service port renders ip6 syntax", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "web6", "fd00:30::10", 80, {endpoint("fd00:1::1", 8080)});
  auto f = r.renderServicePort(p);
  REQUIRE(f.family == Family::kIPv6);
  auto ep = texts(*findChain(f, endpointChainName(p, p.clusterEndpoints[0])), Family::kIPv6);
  CHECK(ep == std::vector<std::string>{"ip6 saddr fd00:1::1 jump mark-for-masquerade",
                                       "meta l4proto tcp dnat to [fd00:1::1]:8080"});
  CHECK(endpointChainName(p, p.clusterEndpoints[0]).find("__fd00.1..1/8080") != std::string::npos);
}

TEST_CASE("nodeport-ips: node addresses filtered by nodeport-addresses", "[unit]") {
  sdk::Options opts{{"nodeport-addresses", "192.168.0.0/16"}, {"cluster-cidr", "10.0.0.0/8"}};
  auto cfg = parseRenderConfig(opts);
  REQUIRE(cfg.has_value());
  NftablesRenderer r(*cfg);
  sdk::NodeInfo node;
  node.addresses = {"192.168.1.5", "172.16.0.5", "fd00::5"};
  auto g = r.renderGlobal(Family::kIPv4, node);
  REQUIRE(g.elements.size() == 1);
  CHECK(g.elements[0].keyText == "192.168.1.5");
  auto g6 = r.renderGlobal(Family::kIPv6, node);
  REQUIRE(g6.elements.size() == 1);  // no IPv6 CIDR given: primary IPv6 address
  CHECK(parseRenderConfig({{"masquerade-bit", "40"}}).has_value() == false);
  CHECK(parseRenderConfig({{"cluster-cidr", "nonsense"}}).has_value() == false);
}
