// NftablesRenderer: the rules of each feature, as nft text.

#include <set>
#include <catch2/catch.hpp>
#include <fmt/format.h>

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

std::vector<std::string> texts(const Chain& c, net::Family fam = net::Family::kIPv4) {
  std::vector<std::string> out;
  for (const auto& r : c.rules) out.push_back(r.toText(fam));
  return out;
}

/// Elements as "set key [: value]"; interval ends as "set end KEY".
std::vector<std::string> elementTexts(const Fragment& f) {
  std::vector<std::string> out;
  for (const auto& e : f.elements) {
    if (e.intervalEnd) {
      out.push_back(e.set + " end " + e.keyText);
      continue;
    }
    std::string value = e.value ? " : " + e.value->toString() : "";
    if (!e.dataText.empty()) value = " : " + e.dataText;
    out.push_back(e.set + " " + e.keyText + value);
  }
  return out;
}

/// The DNAT rule of a balancing chain and the range base it uses.
std::uint32_t slotBaseOf(const Chain& c) {
  for (const auto& r : c.rules)
    for (const auto& st : r.statements)
      if (const auto* d = std::get_if<DnatFromSlots>(&st)) return d->base;
  FAIL("no DnatFromSlots rule in " << c.name);
  return 0;
}

RenderConfig config() {
  RenderConfig cfg;
  cfg.common.clusterCIDRs.push_back("10.0.0.0/8");
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

TEST_CASE("ClusterIP: masquerade from outside the cluster CIDR, endpoints by slot range", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "web", "172.30.0.10", 80,
                     {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080), endpoint("10.1.0.3", 8080)});
  Fragment f = r.renderServicePort(p);
  const Chain* svc = findChain(f, serviceChainName(p));
  REQUIRE(svc != nullptr);
  const std::uint32_t base = slotBaseOf(*svc);
  CHECK(base % 65536 == 0);
  const std::string map = serviceEndpointsMap(base);
  CHECK(texts(*svc) == std::vector<std::string>{
                           "ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
                           "meta l4proto tcp dnat ip to numgen random mod 65535 offset " +
                               std::to_string(base) + " map @" + map,
                       });
  // 65535 slots in three intervals of 21845, each with its end element.
  auto b = [&](std::uint32_t off) { return std::to_string(base + off); };
  CHECK(elementTexts(f) == std::vector<std::string>{
                               "hairpin-ips 10.1.0.1 . 10.1.0.1",
                               "hairpin-ips 10.1.0.2 . 10.1.0.2",
                               "hairpin-ips 10.1.0.3 . 10.1.0.3",
                               map + " " + b(0) + "-" + b(21844) + " : 10.1.0.1 . 8080",
                               map + " end " + b(21845),
                               map + " " + b(21845) + "-" + b(43689) + " : 10.1.0.2 . 8080",
                               map + " end " + b(43690),
                               map + " " + b(43690) + "-" + b(65534) + " : 10.1.0.3 . 8080",
                               map + " end " + b(65535),
                               "cluster-ips 172.30.0.10",
                               "service-ips 172.30.0.10 . tcp . 80 : goto " + serviceChainName(p),
                           });
  // No per-endpoint chains: the service chain is the only one.
  CHECK(f.chains.size() == 1);
  // The same chain keeps its range when rendered again.
  CHECK(slotBaseOf(*findChain(r.renderServicePort(p), serviceChainName(p))) == base);
}

TEST_CASE("slot ranges: lowest free range, stable per chain, reused after release and settle", "[unit]") {
  SlotRanges ranges;
  CHECK(ranges.baseOf("a") == 0u);
  CHECK(ranges.baseOf("b") == 65536u);
  CHECK(ranges.baseOf("a") == 0u);
  ranges.release("a");
  // Not in the batch that deletes a's elements: the kernel refuses a range taken over there.
  CHECK(ranges.baseOf("c") == 2u << 16);
  ranges.settle();
  CHECK(ranges.baseOf("d") == 0u);
  // Ranges read back from the kernel are kept, and skipped by new chains.
  ranges.clear();
  ranges.reserve("x", 2u << 16);
  ranges.reserve("y", 2u << 16);  // taken: ignored
  CHECK(ranges.baseOf("x") == 2u << 16);
  CHECK(ranges.baseOf("z") == 0u);
  CHECK(ranges.baseOf("w") == 1u << 16);
  CHECK(ranges.baseOf("y") == 3u << 16);
}

TEST_CASE("masquerade-all marks every connection to the ClusterIP", "[unit]") {
  RenderConfig cfg;
  cfg.common.masqueradeAll = true;
  cfg.common.masqueradeBit = 5;
  NftablesRenderer r(cfg);
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  auto f = r.renderServicePort(p);
  // Matched on the ClusterIP, as upstream: the eTP=Local short-circuit into this chain keeps
  // its source (issue 10, item 6).
  CHECK(texts(*findChain(f, serviceChainName(p)))[0] == "ip daddr 172.30.0.10 jump mark-for-masquerade");
  auto g = r.renderGlobal(net::Family::kIPv4, {});
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

TEST_CASE("slot ranges exhausted: the service is rejected and the problem reported", "[unit]") {
  NftablesRenderer r(config());
  for (std::uint32_t i = 0; i < SlotRanges::kRanges; ++i)
    REQUIRE(r.slots(net::Family::kIPv4).baseOf("filler-" + std::to_string(i)).has_value());
  auto p = clusterIP("default", "late", "172.30.0.99", 80, {endpoint("10.1.0.1", 8080)});
  auto f = r.renderServicePort(p);
  CHECK(findChain(f, serviceChainName(p)) == nullptr);
  REQUIRE(f.problems.size() == 1);
  CHECK(f.problems[0].find(serviceChainName(p)) != std::string::npos);
  auto els = elementTexts(f);
  CHECK(std::find(els.begin(), els.end(), "no-endpoint-services 172.30.0.99 . tcp . 80 : drop") !=
        els.end());
}

TEST_CASE("session affinity: hit in the service chain, recorded after DNAT by its own chain", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "sticky", "172.30.0.11", 80,
                     {endpoint("10.1.0.3", 8080), endpoint("10.1.0.4", 8080)});
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 600;
  auto f = r.renderServicePort(p);
  const Chain* service = findChain(f, serviceChainName(p));
  REQUIRE(service != nullptr);
  const std::uint32_t id = affinityPoolId(slotBaseOf(*service), p, plan::Pool::kCluster);
  CHECK(id >> 16 == slotBaseOf(*service) >> 16);
  auto svc = texts(*service);
  // masquerade check, affinity hit, endpoint by slot
  REQUIRE(svc.size() == 3);
  CHECK(svc[1] == fmt::format("meta l4proto tcp dnat to ip saddr . numgen random mod 1 offset {} map @session-affinity",
                              id));
  CHECK(svc[2].starts_with("meta l4proto tcp dnat ip to numgen random mod 65535 offset "));
  const Chain* record = findChain(f, affinityChainName(p));
  REQUIRE(record != nullptr);
  CHECK(texts(*record) == std::vector<std::string>{fmt::format(
                              "meta l4proto tcp update @session-affinity {{ ip saddr . numgen random mod 1 offset {} "
                              "timeout 600s : ip daddr . th dport }}",
                              id)});
  auto els = elementTexts(f);
  CHECK(std::find(els.begin(), els.end(),
                  "affinity-services 172.30.0.11 . tcp . 80 : goto " + affinityChainName(p)) != els.end());
  // The maps are table-wide, whatever the number of services.
  auto specs = r.setSpecs(net::Family::kIPv4);
  CHECK(specs.size() == 11 + kEndpointMapShards);
  CHECK(std::count_if(specs.begin(), specs.end(), [](const SetSpec& s) { return s.dynamic; }) == 1);
  // After DNAT, the filter hooks send new DNAT'ed connections to the recording dispatch.
  auto g = r.renderGlobal(net::Family::kIPv4, {});
  int recorders = 0;
  for (const auto& c : g.chains)
    for (const auto& t : texts(c))
      if (t == "ct state new ct status dnat jump affinity-record") ++recorders;
  CHECK(recorders == 3);  // input, forward, output after nat-output
}

TEST_CASE("session affinity: every address of a service port shares its clients' endpoints", "[unit]") {
  // Upstream keeps one affinity set per endpoint, consulted whatever address the client used:
  // ClusterIP, NodePort, externalIPs and LoadBalancer IPs all record under one key and look it up.
  NftablesRenderer r(config());
  auto p = clusterIP("default", "sticky", "172.30.0.12", 80,
                     {endpoint("10.1.0.3", 8080), endpoint("10.1.0.4", 8080)});
  p.type = sdk::ServiceType::kLoadBalancer;
  p.nodePort = 30012;
  p.externalIPs = {"198.51.100.12"};
  p.loadBalancerIPs = {"203.0.113.12"};
  p.sessionAffinityClientIP = true;
  auto f = r.renderServicePort(p);
  const std::uint32_t id = affinityPoolId(slotBaseOf(*findChain(f, serviceChainName(p))), p, plan::Pool::kCluster);
  // One record chain, one key, for all four kinds of address.
  const std::string record = affinityChainName(p);
  auto els = elementTexts(f);
  for (const char* e : {"affinity-services 172.30.0.12 . tcp . 80 : goto ",
                        "affinity-services 198.51.100.12 . tcp . 80 : goto ",
                        "affinity-services 203.0.113.12 . tcp . 80 : goto ", "affinity-nodeports tcp . 30012 : goto "})
    CHECK(std::find(els.begin(), els.end(), e + record) != els.end());
  CHECK(findChain(f, externalAffinityChainName(p)) == nullptr);
  CHECK(texts(*findChain(f, record)) ==
        std::vector<std::string>{fmt::format("meta l4proto tcp update @session-affinity {{ ip saddr . numgen random "
                                             "mod 1 offset {} timeout 10800s : ip daddr . th dport }}",
                                             id)});
  // The external chain goes to the service chain, which looks the client up under that key.
  CHECK(texts(*findChain(f, externalChainName(p))).back() == "goto " + serviceChainName(p));
  // A second port of the same service has keys of its own.
  auto other = p;
  other.portName = "q";
  other.key = "default/sticky:q";
  other.port = 81;
  other.nodePort = 30013;
  auto g = r.renderServicePort(other);
  CHECK(affinityPoolId(slotBaseOf(*findChain(g, serviceChainName(other))), other, plan::Pool::kCluster) != id);
}

TEST_CASE("session affinity with eTP=Local: the local pool keeps keys of its own", "[unit]") {
  // The external chain balances local endpoints only: it must never find an entry that the
  // service chain recorded for a remote endpoint. The short-circuit (pods, the node) uses the
  // cluster pool, and records there; other external clients record under the local pool.
  NftablesRenderer r(config());
  auto p = clusterIP("default", "sticky", "172.30.0.13", 80,
                     {endpoint("10.1.0.3", 8080, true), endpoint("10.1.0.4", 8080)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30013;
  p.externalPolicyLocal = true;
  p.sessionAffinityClientIP = true;
  auto f = r.renderServicePort(p);
  const std::uint32_t cluster =
      affinityPoolId(slotBaseOf(*findChain(f, serviceChainName(p))), p, plan::Pool::kCluster);
  const std::uint32_t local = affinityPoolId(slotBaseOf(*findChain(f, externalChainName(p))), p, plan::Pool::kLocal);
  REQUIRE(cluster != local);
  auto ext = texts(*findChain(f, externalChainName(p)));
  CHECK(std::find(ext.begin(), ext.end(),
                  fmt::format("meta l4proto tcp dnat to ip saddr . numgen random mod 1 offset {} map @session-affinity",
                              local)) != ext.end());
  auto update = [](std::uint32_t id) {
    return fmt::format(
        "meta l4proto tcp update @session-affinity {{ ip saddr . numgen random mod 1 offset {} timeout 10800s : "
        "ip daddr . th dport }}",
        id);
  };
  CHECK(texts(*findChain(f, affinityChainName(p))) == std::vector<std::string>{update(cluster)});
  CHECK(texts(*findChain(f, externalAffinityChainName(p))) ==
        std::vector<std::string>{"ip saddr 10.0.0.0/8 " + update(cluster) + " return",
                                 "fib saddr type local " + update(cluster) + " return", update(local)});
  auto els = elementTexts(f);
  CHECK(std::find(els.begin(), els.end(),
                  "affinity-nodeports tcp . 30013 : goto " + externalAffinityChainName(p)) != els.end());

  // Both policies Local: the ClusterIP's local-… chain and the external chain balance the same
  // pool, under one key.
  auto both = p;
  both.internalPolicyLocal = true;
  auto g = r.renderServicePort(both);
  const std::uint32_t shared =
      affinityPoolId(slotBaseOf(*findChain(g, localChainName(both))), both, plan::Pool::kLocal);
  auto hit = fmt::format("meta l4proto tcp dnat to ip saddr . numgen random mod 1 offset {} map @session-affinity",
                         shared);
  for (const auto& chain : {localChainName(both), externalChainName(both)}) {
    auto t = texts(*findChain(g, chain));
    CHECK(std::find(t.begin(), t.end(), hit) != t.end());
  }
}

TEST_CASE("hairpin: masqueraded after DNAT when a packet goes back to its source", "[unit]") {
  NftablesRenderer r(config());
  auto g = r.renderGlobal(net::Family::kIPv4, {});
  const Chain* post = nullptr;
  for (const auto& c : g.chains)
    if (c.name == "nat-postrouting") post = &c;
  REQUIRE(post != nullptr);
  CHECK(texts(*post) == std::vector<std::string>{
                            "ct status dnat ip saddr . ip daddr @hairpin-ips jump mark-for-masquerade",
                            "jump masquerading"});
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
  const Chain* extChain = findChain(f, externalChainName(p));
  const std::uint32_t extBase = slotBaseOf(*extChain);
  CHECK(extBase != slotBaseOf(*findChain(f, svc)));  // its own range: the local endpoints only
  CHECK(ext == std::vector<std::string>{
                   "ip saddr 10.0.0.0/8 goto " + svc,
                   "fib saddr type local jump mark-for-masquerade",
                   "fib saddr type local goto " + svc,
                   "meta l4proto udp dnat ip to numgen random mod 65535 offset " + std::to_string(extBase) +
                       " map @" + serviceEndpointsMap(extBase),
               });
  auto els = elementTexts(f);
  CHECK(std::find(els.begin(), els.end(),
                  serviceEndpointsMap(extBase) + " " + std::to_string(extBase) + "-" +
                      std::to_string(extBase + 65534) + " : 10.1.0.4 . 53") != els.end());
  CHECK(elementTexts(f).back() == "service-nodeports udp . 30053 : goto " + externalChainName(p));

  // No local endpoint: the node and its pods still reach the cluster's endpoints through the
  // short-circuit; everything else is dropped at the end of the external chain, not by the
  // filter-stage map (which would catch the node's own connections first).
  testing::setEndpoints(p, {endpoint("10.1.0.5", 53)});
  f = r.renderServicePort(p);
  REQUIRE(findChain(f, externalChainName(p)) != nullptr);
  CHECK(texts(*findChain(f, externalChainName(p))) == std::vector<std::string>{
                                                          "ip saddr 10.0.0.0/8 goto " + svc,
                                                          "fib saddr type local jump mark-for-masquerade",
                                                          "fib saddr type local goto " + svc,
                                                          "drop",
                                                      });
  els = elementTexts(f);
  CHECK(std::find(els.begin(), els.end(), "service-nodeports udp . 30053 : goto " + externalChainName(p)) !=
        els.end());
  for (const auto& e : els) CHECK(e.find("no-endpoint") == std::string::npos);
}

TEST_CASE("iTP=Local and eTP=Local: the short-circuit uses the cluster pool", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "both", "172.30.0.16", 80,
                     {endpoint("10.1.0.7", 80, true), endpoint("10.1.0.8", 80)});
  p.type = sdk::ServiceType::kLoadBalancer;
  p.loadBalancerIPs = {"198.51.100.9"};
  p.internalPolicyLocal = true;
  p.externalPolicyLocal = true;
  auto f = r.renderServicePort(p);
  const Chain* local = findChain(f, localChainName(p));
  const Chain* cluster = findChain(f, serviceChainName(p));
  REQUIRE(local != nullptr);
  REQUIRE(cluster != nullptr);
  auto els = elementTexts(f);
  auto has = [&](const std::string& s) { return std::find(els.begin(), els.end(), s) != els.end(); };
  CHECK(has("service-ips 172.30.0.16 . tcp . 80 : goto " + localChainName(p)));
  CHECK(has("service-ips 198.51.100.9 . tcp . 80 : goto " + externalChainName(p)));
  const std::uint32_t clusterBase = slotBaseOf(*cluster);
  CHECK(has(serviceEndpointsMap(clusterBase) + " " + std::to_string(clusterBase) + "-" +
            std::to_string(clusterBase + 32766) + " : 10.1.0.7 . 80"));
  auto ext = texts(*findChain(f, externalChainName(p)));
  REQUIRE(ext.size() == 4);
  CHECK(ext[0] == "ip saddr 10.0.0.0/8 goto " + serviceChainName(p));
  CHECK(ext[2] == "fib saddr type local goto " + serviceChainName(p));
  // Both endpoints can be reached (the short-circuit), so both hairpin pairs exist.
  CHECK(has("hairpin-ips 10.1.0.8 . 10.1.0.8"));
}

TEST_CASE("source ranges admit the node's connections when a range holds a node IP", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "lb", "172.30.0.13", 80, {endpoint("10.1.0.6", 80)});
  p.type = sdk::ServiceType::kLoadBalancer;
  p.loadBalancerIPs = {"198.51.100.7"};
  p.loadBalancerSourceRanges = {"192.168.0.0/24"};
  sdk::NodeInfo node;
  node.addresses = {"192.168.0.2"};
  r.setNode(node);
  CHECK(texts(*findChain(r.renderServicePort(p), firewallChainName(p))) ==
        std::vector<std::string>{"ip saddr 192.168.0.0/24 return", "ip saddr 198.51.100.7 return", "drop"});
  node.addresses = {"192.168.7.2"};
  r.setNode(node);
  CHECK(texts(*findChain(r.renderServicePort(p), firewallChainName(p))) ==
        std::vector<std::string>{"ip saddr 192.168.0.0/24 return", "drop"});
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
  // Upstream's name for the local pool's chain; no cluster chain without external access.
  CHECK(findChain(f, serviceChainName(p)) == nullptr);
  const std::uint32_t base = slotBaseOf(*findChain(f, localChainName(p)));
  auto els = elementTexts(f);
  // One interval over the whole range: the local endpoint only.
  CHECK(std::find(els.begin(), els.end(),
                  serviceEndpointsMap(base) + " " + std::to_string(base) + "-" + std::to_string(base + 65534) +
                      " : 10.1.0.7 . 80") != els.end());
  CHECK(std::find(els.begin(), els.end(), "hairpin-ips 10.1.0.8 . 10.1.0.8") == els.end());
}

TEST_CASE("IPv6 service port renders ip6 syntax", "[unit]") {
  NftablesRenderer r(config());
  auto p = clusterIP("default", "web6", "fd00:30::10", 80, {endpoint("fd00:1::1", 8080)});
  auto f = r.renderServicePort(p);
  REQUIRE(f.family == net::Family::kIPv6);
  const Chain* svc = findChain(f, serviceChainName(p));
  REQUIRE(svc != nullptr);
  const std::uint32_t base = slotBaseOf(*svc);
  CHECK(texts(*svc, net::Family::kIPv6).back() == "meta l4proto tcp dnat ip6 to numgen random mod 65535 offset " +
                                                 std::to_string(base) + " map @" + serviceEndpointsMap(base));
  auto els = elementTexts(f);
  CHECK(els[0] == "hairpin-ips fd00:1::1 . fd00:1::1");
  CHECK(els[1] == serviceEndpointsMap(base) + " " + std::to_string(base) + "-" + std::to_string(base + 65534) +
                      " : fd00:1::1 . 8080");
  CHECK(endpointChainName(p, p.clusterEndpoints[0]).find("__fd00.1..1/8080") != std::string::npos);
}

TEST_CASE("nodeport-ips: node addresses filtered by nodeport-addresses", "[unit]") {
  sdk::Options opts{{"nodeport-addresses", "192.168.0.0/16"}, {"cluster-cidr", "10.0.0.0/8"}};
  auto cfg = parseRenderConfig(opts);
  REQUIRE(cfg.has_value());
  NftablesRenderer r(*cfg);
  sdk::NodeInfo node;
  node.addresses = {"192.168.1.5", "172.16.0.5", "fd00::5"};
  auto g = r.renderGlobal(net::Family::kIPv4, node);
  REQUIRE(g.elements.size() == 1);
  CHECK(g.elements[0].keyText == "192.168.1.5");
  auto g6 = r.renderGlobal(net::Family::kIPv6, node);
  REQUIRE(g6.elements.size() == 1);  // no IPv6 CIDR given: primary IPv6 address
  CHECK(parseRenderConfig({{"masquerade-bit", "40"}}).has_value() == false);
  CHECK(parseRenderConfig({{"cluster-cidr", "nonsense"}}).has_value() == false);
  CHECK(parseRenderConfig({{"detect-local-mode", "Sometimes"}}).has_value() == false);
  CHECK(parseRenderConfig({{"detect-local-mode", "BridgeInterface"}}).has_value() == false);  // no bridge
  CHECK(parseRenderConfig({{"detect-local-mode", "InterfaceNamePrefix"}, {"pod-interface-name-prefix", "a*"}})
            .has_value() == false);
}

TEST_CASE("nodeport-ips: the interface addresses the host resolved", "[unit]") {
  // The option would pick the Node object's 192.168.1.5; the host's resolution wins.
  auto cfg = parseRenderConfig({{"nodeport-addresses", "192.168.0.0/16"}});
  REQUIRE(cfg.has_value());
  NftablesRenderer r(*cfg);
  sdk::NodeInfo node;
  node.addresses = {"192.168.1.5", "fd00::5"};
  node.nodePortAddresses.resolved = true;
  node.nodePortAddresses.addresses = {"127.0.0.1", "192.168.2.20", "::1", "fd00::20"};
  node.nodePortAddresses.allLocalIPv6 = true;
  auto chainTexts = [](const GlobalObjects& g, const std::string& name, net::Family fam) {
    for (const auto& c : g.chains)
      if (c.name == name) return texts(c, fam);
    return std::vector<std::string>{};
  };

  auto g = r.renderGlobal(net::Family::kIPv4, node);
  REQUIRE(g.elements.size() == 1);  // no NodePorts on loopback, as upstream's nftables mode
  CHECK(g.elements[0].keyText == "192.168.2.20");
  CHECK(chainTexts(g, "services", net::Family::kIPv4).back() == "ip daddr @nodeport-ips jump nodeports");
  CHECK(chainTexts(g, "nodeport-endpoints-check", net::Family::kIPv4).back() ==
        "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports");

  // All local (no IPv6 CIDR): any local destination but loopback, as upstream's MatchAll.
  auto g6 = r.renderGlobal(net::Family::kIPv6, node);
  REQUIRE(g6.elements.size() == 1);
  CHECK(g6.elements[0].keyText == "fd00::20");
  CHECK(chainTexts(g6, "services", net::Family::kIPv6).back() ==
        "fib daddr type local ip6 daddr != ::1 jump nodeports");
  CHECK(chainTexts(g6, "nodeport-endpoints-check", net::Family::kIPv6).back() ==
        "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports");

  node.nodePortAddresses.allLocalIPv4 = true;
  CHECK(chainTexts(r.renderGlobal(net::Family::kIPv4, node), "services", net::Family::kIPv4).back() ==
        "fib daddr type local ip daddr != 127.0.0.0/8 jump nodeports");
}

TEST_CASE("renderer: slot layouts are recognised from an element's place alone", "[unit]") {
  // The backend decides which read-back slot-map elements stay by their place in the layout
  // of their range's size, without counting them: inSlotLayout must accept exactly the starts
  // and ends that the renderer produces for K intervals.
  for (std::uint32_t k : {1u, 2u, 3u, 7u, 10u, 64u, 255u, 1000u, 4097u, 65535u}) {
    INFO("K = " << k);
    std::set<std::uint32_t> starts, ends;
    for (std::uint32_t i = 0; i < k; ++i) {
      starts.insert(slotOffset(i, k));
      ends.insert(i + 1 == k ? kSlotsPerRange : slotOffset(i + 1, k));
    }
    REQUIRE(starts.size() == k);
    for (std::uint32_t o = 0; o <= kSlotsPerRange; ++o) {
      if (inSlotLayout(o, false, k) != starts.contains(o)) FAIL("start at " << o);
      if (inSlotLayout(o, true, k) != ends.contains(o)) FAIL("end at " << o);
    }
  }
  CHECK_FALSE(inSlotLayout(0, false, 0));
  CHECK_FALSE(inSlotLayout(kSlotsPerRange + 1, true, 3));
}

TEST_CASE("detect-local modes: how pods are told apart in the rules", "[unit]") {
  auto p = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30080;
  p.externalPolicyLocal = true;
  auto rulesFor = [&](const sdk::Options& opts, const sdk::NodeInfo& node) {
    auto cfg = parseRenderConfig(opts);
    REQUIRE(cfg.has_value());
    NftablesRenderer r(*cfg);
    r.setNode(node);
    auto f = r.renderServicePort(p);
    std::vector<std::string> out = texts(*findChain(f, serviceChainName(p)));
    for (const auto& t : texts(*findChain(f, externalChainName(p)))) out.push_back(t);
    return out;
  };
  const std::string svc = serviceChainName(p);
  sdk::NodeInfo node;
  node.podCIDRs = {"10.1.0.0/24", "fd00:1::/64"};

  // NodeCIDR: the Node's podCIDRs, with no --cluster-cidr at all.
  auto rules = rulesFor({{"detect-local-mode", "NodeCIDR"}}, node);
  CHECK(rules[0] == "ip saddr != 10.1.0.0/24 jump mark-for-masquerade");
  CHECK(std::find(rules.begin(), rules.end(), "ip saddr 10.1.0.0/24 goto " + svc) != rules.end());

  rules = rulesFor({{"detect-local-mode", "BridgeInterface"}, {"pod-bridge-interface", "cbr0"}}, node);
  CHECK(rules[0] == "iifname != \"cbr0\" jump mark-for-masquerade");
  CHECK(std::find(rules.begin(), rules.end(), "iifname \"cbr0\" goto " + svc) != rules.end());

  rules = rulesFor({{"detect-local-mode", "InterfaceNamePrefix"}, {"pod-interface-name-prefix", "veth"}}, node);
  CHECK(rules[0] == "iifname != \"veth*\" jump mark-for-masquerade");
  CHECK(std::find(rules.begin(), rules.end(), "iifname \"veth*\" goto " + svc) != rules.end());

  // ClusterCIDR without a CIDR: no detector, so no masquerade rule and no pod short-circuit
  // (the node's own short-circuit stays).
  rules = rulesFor({{"detect-local-mode", "ClusterCIDR"}}, node);
  for (const auto& r : rules) CHECK(r.find("ip saddr") == std::string::npos);
  CHECK(std::find(rules.begin(), rules.end(), "fib saddr type local goto " + svc) != rules.end());
}

TEST_CASE("cluster-ips-check drops unallocated ClusterIPs of the family's service CIDRs", "[unit]") {
  NftablesRenderer r(config());
  auto check = [&](net::Family fam) {
    auto g = r.renderGlobal(fam, {});
    for (const auto& c : g.chains)
      if (c.name == names::kClusterIPsCheckChain) return texts(c, fam);
    return std::vector<std::string>{"(no chain)"};
  };
  // Without ServiceCIDRs only the reject of known ClusterIPs' unused ports.
  CHECK(check(net::Family::kIPv4) == std::vector<std::string>{"ip daddr @cluster-ips reject"});
  r.setServiceCIDRs({{"kubernetes", "10.96.0.0/12"},
                     {"kubernetes", "fd00:10:96::/112"},
                     {"extra", "10.100.0.0/16"},  // inside the first: folded into it
                     {"more", "192.168.200.0/24"},
                     {"broken", "not-a-cidr"}});
  CHECK(check(net::Family::kIPv4) == std::vector<std::string>{"ip daddr @cluster-ips reject",
                                                         "ip daddr 10.96.0.0/12 drop",
                                                         "ip daddr 192.168.200.0/24 drop"});
  CHECK(check(net::Family::kIPv6) == std::vector<std::string>{"ip6 daddr @cluster-ips reject",
                                                         "ip6 daddr fd00:10:96::/112 drop"});
}
