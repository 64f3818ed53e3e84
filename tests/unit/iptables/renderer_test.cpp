// IptablesRenderer: upstream's chain names, probabilities and rule layout, each rule in the
// form iptables-save prints (the kernel tests check those forms against both variants).

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "iptables_fixtures.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/iptables/renderer.h"

using namespace kproxy;
using namespace kproxy::iptables;
using kproxy::iptables::testing::allFeatureServices;
using kproxy::iptables::testing::chainsOf;
using kproxy::iptables::testing::clusterIP;
using kproxy::iptables::testing::endpoint;

namespace {

IptablesRenderer makeRenderer(RenderConfig cfg = kproxy::iptables::testing::featureConfig(),
                              sdk::NodeInfo node = kproxy::iptables::testing::featureNode()) {
  IptablesRenderer r(std::move(cfg));
  r.setNode(node);
  return r;
}

const ChainRules* chainOf(const Fragment& f, std::string_view name) {
  for (const auto& c : f.chains)
    if (c.name == name) return &c;
  return nullptr;
}

/// The rules `f` wants in dispatch chain `chain` of `table`.
std::vector<std::string> dispatchOf(const Fragment& f, Table table, std::string_view chain) {
  std::vector<std::string> out;
  for (const auto& r : f.dispatch)
    if (r.table == table && r.chain == chain) out.push_back(r.spec);
  return out;
}

std::vector<std::string> chainNames(const Fragment& f) {
  std::vector<std::string> out;
  for (const auto& c : f.chains) out.push_back(c.name);
  std::sort(out.begin(), out.end());
  return out;
}

using Rules = std::vector<std::string>;

}  // namespace

TEST_CASE("renderer: chain names are upstream's hashes", "[unit]") {
  const auto r = makeRenderer();
  // Names from upstream's proxier_test.go for the same service port names and endpoints.
  auto f = r.renderServicePort(clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)},
                                         sdk::Protocol::kTCP, "p80"));
  CHECK(chainNames(f) == Rules{"KUBE-SEP-SXIVWICOYRO3J4NJ", "KUBE-SVC-XPGD46QRK7WJZT7O"});

  auto lb = clusterIP("ns5", "svc5", "172.30.0.45", 80, {endpoint("10.180.0.3", 80)}, sdk::Protocol::kTCP, "p80");
  lb.type = sdk::ServiceType::kLoadBalancer;
  lb.nodePort = 3002;
  lb.loadBalancerIPs = {"5.6.7.8"};
  lb.loadBalancerSourceRanges = {"203.0.113.0/25"};
  CHECK(chainNames(r.renderServicePort(lb)) ==
        Rules{"KUBE-EXT-NUKIZ6OKUXPJNT4C", "KUBE-FW-NUKIZ6OKUXPJNT4C", "KUBE-SEP-I77PXRDZVX7PMWMN",
              "KUBE-SVC-NUKIZ6OKUXPJNT4C"});

  auto local = clusterIP("ns2", "svc2", "172.30.0.42", 80, {endpoint("10.180.0.2", 80, true)}, sdk::Protocol::kTCP,
                         "p80");
  local.type = sdk::ServiceType::kNodePort;
  local.nodePort = 3001;
  local.externalPolicyLocal = true;
  CHECK(chainNames(r.renderServicePort(local)) == Rules{"KUBE-EXT-GNZBNJ2PO5MGZ6GT", "KUBE-SEP-RS4RBKLTHTF2IUXJ",
                                                        "KUBE-SVC-GNZBNJ2PO5MGZ6GT", "KUBE-SVL-GNZBNJ2PO5MGZ6GT"});
}

TEST_CASE("renderer: probabilities are 1/n as iptables-save prints them", "[unit]") {
  CHECK(probabilityText(2) == "0.50000000000");
  CHECK(probabilityText(3) == "0.33333333349");
  CHECK(probabilityText(4) == "0.25000000000");
  CHECK(probabilityText(7) == "0.14285714272");
  CHECK(probabilityText(10) == "0.10000000009");

  const auto r = makeRenderer();
  auto f = r.renderServicePort(clusterIP("ns", "three", "172.30.0.1", 80,
                                         {endpoint("10.1.0.1", 80), endpoint("10.1.0.2", 80), endpoint("10.1.0.3", 80)}));
  const auto* svc = chainOf(f, "KUBE-SVC-" + backends::portProtoHash("ns/three:p", "tcp"));
  REQUIRE(svc != nullptr);
  REQUIRE(svc->rules.size() == 4);  // masquerade, then one per endpoint
  CHECK(svc->rules[1].find("-m statistic --mode random --probability 0.33333333349 ") != std::string::npos);
  CHECK(svc->rules[2].find("-m statistic --mode random --probability 0.50000000000 ") != std::string::npos);
  CHECK(svc->rules[3].find("statistic") == std::string::npos);
  CHECK(f.endpointChains == 3);
}

TEST_CASE("renderer: a ClusterIP service port, rule by rule", "[unit]") {
  const auto r = makeRenderer();
  auto f = r.renderServicePort(clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)},
                                         sdk::Protocol::kTCP, "p80"));
  CHECK(f.problems.empty());
  CHECK(dispatchOf(f, Table::kNat, "KUBE-SERVICES") ==
        Rules{"-d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp --dport 80 -j "
              "KUBE-SVC-XPGD46QRK7WJZT7O"});
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-SERVICES") ==
        Rules{"-d 172.30.0.41/32 -m comment --comment \"ClusterIP without a service on this port\" -j REJECT "
              "--reject-with icmp-port-unreachable"});
  for (const auto& d : f.dispatch)
    CHECK(d.section == (d.table == Table::kFilter ? Section::kClusterIP : Section::kServicePort));
  CHECK(dispatchOf(f, Table::kNat, "KUBE-NODEPORTS").empty());
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-EXTERNAL-SERVICES").empty());

  const auto* svc = chainOf(f, "KUBE-SVC-XPGD46QRK7WJZT7O");
  REQUIRE(svc != nullptr);
  CHECK(svc->table == Table::kNat);
  CHECK(svc->rules ==
        Rules{"! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp "
              "--dport 80 -j KUBE-MARK-MASQ",
              "-m comment --comment \"ns1/svc1:p80 -> 10.180.0.1:80\" -j KUBE-SEP-SXIVWICOYRO3J4NJ"});
  const auto* sep = chainOf(f, "KUBE-SEP-SXIVWICOYRO3J4NJ");
  REQUIRE(sep != nullptr);
  CHECK(sep->rules == Rules{"-s 10.180.0.1/32 -m comment --comment \"ns1/svc1:p80\" -j KUBE-MARK-MASQ",
                            "-p tcp -m comment --comment \"ns1/svc1:p80\" -m tcp -j DNAT --to-destination "
                            "10.180.0.1:80"});
}

TEST_CASE("renderer: NodePort, LoadBalancer with source ranges, external IPs", "[unit]") {
  const auto r = makeRenderer();
  auto lb = clusterIP("ns5", "svc5", "172.30.0.45", 80, {endpoint("10.180.0.3", 80)}, sdk::Protocol::kTCP, "p80");
  lb.type = sdk::ServiceType::kLoadBalancer;
  lb.nodePort = 3002;
  lb.loadBalancerIPs = {"5.6.7.8"};
  lb.loadBalancerSourceRanges = {"203.0.113.0/25"};
  lb.externalIPs = {"192.168.99.22"};
  auto f = r.renderServicePort(lb);
  const std::string ext = "KUBE-EXT-NUKIZ6OKUXPJNT4C", fw = "KUBE-FW-NUKIZ6OKUXPJNT4C",
                    svc = "KUBE-SVC-NUKIZ6OKUXPJNT4C";

  CHECK(dispatchOf(f, Table::kNat, "KUBE-SERVICES") ==
        Rules{"-d 172.30.0.45/32 -p tcp -m comment --comment \"ns5/svc5:p80 cluster IP\" -m tcp --dport 80 -j " + svc,
              "-d 192.168.99.22/32 -p tcp -m comment --comment \"ns5/svc5:p80 external IP\" -m tcp --dport 80 -j " +
                  ext,
              "-d 5.6.7.8/32 -p tcp -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -m tcp --dport 80 -j " +
                  fw});
  CHECK(dispatchOf(f, Table::kNat, "KUBE-NODEPORTS") ==
        Rules{"-p tcp -m comment --comment \"ns5/svc5:p80\" -m tcp --dport 3002 -j " + ext});
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-PROXY-FIREWALL") ==
        Rules{"-d 5.6.7.8/32 -p tcp -m comment --comment \"ns5/svc5:p80 traffic not accepted by " + fw +
              "\" -m tcp --dport 80 -j DROP"});
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-EXTERNAL-SERVICES").empty());  // it has endpoints

  const auto* extChain = chainOf(f, ext);
  REQUIRE(extChain != nullptr);
  CHECK(extChain->rules ==
        Rules{"-m comment --comment \"masquerade traffic for ns5/svc5:p80 external destinations\" -j KUBE-MARK-MASQ",
              "-j " + svc});
  const auto* fwChain = chainOf(f, fw);
  REQUIRE(fwChain != nullptr);
  CHECK(fwChain->rules ==
        Rules{"-s 203.0.113.0/25 -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -j " + ext,
              "-m comment --comment \"other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL\""});

  SECTION("a source range holding a node IP admits the load balancer IP itself") {
    lb.loadBalancerSourceRanges.push_back("192.168.50.0/24");
    auto g = r.renderServicePort(lb);
    const auto* c = chainOf(g, fw);
    REQUIRE(c != nullptr);
    CHECK(std::count(c->rules.begin(), c->rules.end(),
                     "-s 5.6.7.8/32 -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -j " + ext) == 1);
    CHECK(c->rules.size() == 4);
  }
}

TEST_CASE("renderer: externalTrafficPolicy=Local", "[unit]") {
  const auto r = makeRenderer();
  auto p = clusterIP("ns2", "svc2", "172.30.0.42", 80, {endpoint("10.180.0.2", 80, true), endpoint("10.180.0.9", 80)},
                     sdk::Protocol::kTCP, "p80");
  p.type = sdk::ServiceType::kLoadBalancer;
  p.nodePort = 3001;
  p.externalPolicyLocal = true;
  p.healthCheckNodePort = 30000;
  p.loadBalancerIPs = {"1.2.3.4"};
  const std::string hash = "GNZBNJ2PO5MGZ6GT";

  SECTION("with a local endpoint: the short-circuit, then the local pool") {
    auto f = r.renderServicePort(p);
    const auto* ext = chainOf(f, "KUBE-EXT-" + hash);
    REQUIRE(ext != nullptr);
    CHECK(ext->rules ==
          Rules{"-s 10.0.0.0/8 -m comment --comment \"pod traffic for ns2/svc2:p80 external destinations\" -j "
                "KUBE-SVC-" + hash,
                "-m comment --comment \"masquerade LOCAL traffic for ns2/svc2:p80 external destinations\" -m addrtype "
                "--src-type LOCAL -j KUBE-MARK-MASQ",
                "-m comment --comment \"route LOCAL traffic for ns2/svc2:p80 external destinations\" -m addrtype "
                "--src-type LOCAL -j KUBE-SVC-" + hash,
                "-j KUBE-SVL-" + hash});
    const auto* svl = chainOf(f, "KUBE-SVL-" + hash);
    REQUIRE(svl != nullptr);
    CHECK(svl->rules == Rules{"-m comment --comment \"ns2/svc2:p80 -> 10.180.0.2:80\" -j KUBE-SEP-RS4RBKLTHTF2IUXJ"});
    CHECK(dispatchOf(f, Table::kFilter, "KUBE-NODEPORTS") ==
          Rules{"-p tcp -m comment --comment \"ns2/svc2:p80 health check node port\" -m tcp --dport 30000 -j ACCEPT"});
    CHECK(dispatchOf(f, Table::kFilter, "KUBE-EXTERNAL-SERVICES").empty());
  }
  SECTION("without one: external traffic is dropped, the short-circuit still serves pods and the node") {
    p.localEndpoints.clear();
    for (auto& e : p.allEndpoints) e.isLocal = false;
    p.clusterEndpoints = p.allReachableEndpoints = p.allEndpoints;
    auto f = r.renderServicePort(p);
    CHECK(chainOf(f, "KUBE-SVL-" + hash) == nullptr);
    const auto* ext = chainOf(f, "KUBE-EXT-" + hash);
    REQUIRE(ext != nullptr);
    CHECK(ext->rules.size() == 3);  // no jump to an empty local pool
    CHECK(dispatchOf(f, Table::kFilter, "KUBE-EXTERNAL-SERVICES") ==
          Rules{"-d 1.2.3.4/32 -p tcp -m comment --comment \"ns2/svc2:p80 has no local endpoints\" -m tcp --dport 80 "
                "-j DROP",
                "-p tcp -m comment --comment \"ns2/svc2:p80 has no local endpoints\" -m addrtype --dst-type LOCAL -m "
                "tcp --dport 3001 -j DROP"});
  }
}

TEST_CASE("renderer: internalTrafficPolicy=Local", "[unit]") {
  const auto r = makeRenderer();
  auto p = clusterIP("ns", "itp", "172.30.0.7", 80, {endpoint("10.1.0.1", 80, true), endpoint("10.1.0.2", 80)});
  p.internalPolicyLocal = true;
  const std::string hash = backends::portProtoHash("ns/itp:p", "tcp");
  auto f = r.renderServicePort(p);
  CHECK(dispatchOf(f, Table::kNat, "KUBE-SERVICES") ==
        Rules{"-d 172.30.0.7/32 -p tcp -m comment --comment \"ns/itp:p cluster IP\" -m tcp --dport 80 -j KUBE-SVL-" +
              hash});
  CHECK(chainOf(f, "KUBE-SVC-" + hash) == nullptr);
  const auto* svl = chainOf(f, "KUBE-SVL-" + hash);
  REQUIRE(svl != nullptr);
  REQUIRE(svl->rules.size() == 2);
  CHECK(svl->rules[0].starts_with("! -s 10.0.0.0/8 -d 172.30.0.7/32 -p tcp "));
  CHECK(svl->rules[0].ends_with("-j KUBE-MARK-MASQ"));
  CHECK(f.endpointChains == 1);

  p.localEndpoints.clear();
  auto none = r.renderServicePort(p);
  CHECK(none.chains.empty());
  CHECK(dispatchOf(none, Table::kNat, "KUBE-SERVICES").empty());
  CHECK(dispatchOf(none, Table::kFilter, "KUBE-SERVICES") ==
        Rules{"-d 172.30.0.7/32 -p tcp -m comment --comment \"ns/itp:p has no local endpoints\" -m tcp --dport 80 -j "
              "DROP",
              "-d 172.30.0.7/32 -m comment --comment \"ClusterIP without a service on this port\" -j REJECT "
              "--reject-with icmp-port-unreachable"});
}

TEST_CASE("renderer: without endpoints, reject (internal and external)", "[unit]") {
  const auto r = makeRenderer();
  auto p = clusterIP("ns6", "svc6", "172.30.0.46", 80, {}, sdk::Protocol::kUDP, "p80");
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 3003;
  p.externalIPs = {"192.168.99.33"};
  auto f = r.renderServicePort(p);
  CHECK(f.chains.empty());
  CHECK(dispatchOf(f, Table::kNat, "KUBE-SERVICES").empty());
  CHECK(dispatchOf(f, Table::kNat, "KUBE-NODEPORTS").empty());
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-SERVICES") ==
        Rules{"-d 172.30.0.46/32 -p udp -m comment --comment \"ns6/svc6:p80 has no endpoints\" -m udp --dport 80 -j "
              "REJECT --reject-with icmp-port-unreachable",
              "-d 172.30.0.46/32 -m comment --comment \"ClusterIP without a service on this port\" -j REJECT "
              "--reject-with icmp-port-unreachable"});
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-EXTERNAL-SERVICES") ==
        Rules{"-d 192.168.99.33/32 -p udp -m comment --comment \"ns6/svc6:p80 has no endpoints\" -m udp --dport 80 -j "
              "REJECT --reject-with icmp-port-unreachable",
              "-p udp -m comment --comment \"ns6/svc6:p80 has no endpoints\" -m addrtype --dst-type LOCAL -m udp "
              "--dport 3003 -j REJECT --reject-with icmp-port-unreachable"});
}

TEST_CASE("renderer: session affinity records and refreshes per pool", "[unit]") {
  const auto r = makeRenderer();
  auto p = clusterIP("ns", "sticky", "172.30.0.9", 80, {endpoint("10.1.0.1", 80), endpoint("10.1.0.2", 80)});
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 600;
  auto f = r.renderServicePort(p);
  const std::string name = "ns/sticky:p";
  const std::string sep1 = backends::servicePortEndpointChain(name, "tcp", "10.1.0.1:80");
  const std::string sep2 = backends::servicePortEndpointChain(name, "tcp", "10.1.0.2:80");
  const auto* svc = chainOf(f, backends::servicePortPolicyClusterChain(name, "tcp"));
  REQUIRE(svc != nullptr);
  REQUIRE(svc->rules.size() == 5);
  CHECK(svc->rules[1] == "-m comment --comment \"ns/sticky:p -> 10.1.0.1:80\" -m recent --update --seconds 600 --reap "
                         "--name " + sep1 + " --mask 255.255.255.255 --rsource -j " + sep1);
  CHECK(svc->rules[2] == "-m comment --comment \"ns/sticky:p -> 10.1.0.2:80\" -m recent --update --seconds 600 --reap "
                         "--name " + sep2 + " --mask 255.255.255.255 --rsource -j " + sep2);
  CHECK(svc->rules[3] == "-m comment --comment \"ns/sticky:p -> 10.1.0.1:80\" -m statistic --mode random --probability "
                         "0.50000000000 -m recent --set --name " + sep1 + " --mask 255.255.255.255 --rsource -j " + sep1);
  CHECK(svc->rules[4] == "-m comment --comment \"ns/sticky:p -> 10.1.0.2:80\" -m recent --set --name " + sep2 +
                             " --mask 255.255.255.255 --rsource -j " + sep2);

  SECTION("the local pool's lists are its own") {
    p.externalPolicyLocal = true;
    p.nodePort = 30001;
    p.type = sdk::ServiceType::kNodePort;
    p.allEndpoints[0].isLocal = true;
    p.clusterEndpoints = p.allReachableEndpoints = p.allEndpoints;
    p.localEndpoints = {p.allEndpoints[0]};
    auto g = r.renderServicePort(p);
    const auto* svl = chainOf(g, backends::servicePortPolicyLocalChain(name, "tcp"));
    REQUIRE(svl != nullptr);
    REQUIRE(svl->rules.size() == 2);
    CHECK(svl->rules[0].find("--update --seconds 600 --reap --name " + sep1 + "-L ") != std::string::npos);
    CHECK(svl->rules[1].find("--set --name " + sep1 + "-L ") != std::string::npos);
  }
}

TEST_CASE("renderer: masquerade-all and the local traffic detectors", "[unit]") {
  auto p = clusterIP("ns", "m", "172.30.0.5", 80, {endpoint("10.1.0.1", 80)});
  auto masqueradeRule = [&](RenderConfig cfg, sdk::NodeInfo node = kproxy::iptables::testing::featureNode()) {
    auto r = makeRenderer(std::move(cfg), std::move(node));
    auto f = r.renderServicePort(p);
    const auto* svc = chainOf(f, backends::servicePortPolicyClusterChain("ns/m:p", "tcp"));
    REQUIRE(svc != nullptr);
    return svc->rules.front();
  };
  const std::string tail = "-d 172.30.0.5/32 -p tcp -m comment --comment \"ns/m:p cluster IP\" -m tcp --dport 80 -j "
                           "KUBE-MARK-MASQ";
  RenderConfig cfg;
  SECTION("masquerade-all") {
    cfg.common.masqueradeAll = true;
    cfg.common.clusterCIDRs = {"10.0.0.0/8"};
    CHECK(masqueradeRule(cfg) == tail);
  }
  SECTION("ClusterCIDR") {
    cfg.common.clusterCIDRs = {"10.0.0.0/8"};
    CHECK(masqueradeRule(cfg) == "! -s 10.0.0.0/8 " + tail);
  }
  SECTION("ClusterCIDR without a CIDR of the family: no masquerade rule") {
    cfg.common.clusterCIDRs = {"fd00::/64"};
    auto r = makeRenderer(cfg);
    auto f = r.renderServicePort(p);
    const auto* svc = chainOf(f, backends::servicePortPolicyClusterChain("ns/m:p", "tcp"));
    REQUIRE(svc != nullptr);
    CHECK(svc->rules.size() == 1);
    CHECK(svc->rules[0].find("KUBE-MARK-MASQ") == std::string::npos);
  }
  SECTION("NodeCIDR: the node's pod CIDR") {
    cfg.common.detectLocalMode = "NodeCIDR";
    cfg.common.clusterCIDRs = {"10.0.0.0/8"};
    auto node = kproxy::iptables::testing::featureNode();
    node.podCIDRs = {"10.244.3.0/24", "fd00:244:3::/64"};
    CHECK(masqueradeRule(cfg, node) == "! -s 10.244.3.0/24 " + tail);
  }
  SECTION("BridgeInterface") {
    cfg.common.detectLocalMode = "BridgeInterface";
    cfg.common.bridgeInterface = "cbr0";
    CHECK(masqueradeRule(cfg) == "-d 172.30.0.5/32 ! -i cbr0 -p tcp -m comment --comment \"ns/m:p cluster IP\" -m tcp "
                                 "--dport 80 -j KUBE-MARK-MASQ");
  }
  SECTION("InterfaceNamePrefix") {
    cfg.common.detectLocalMode = "InterfaceNamePrefix";
    cfg.common.interfaceNamePrefix = "veth";
    CHECK(masqueradeRule(cfg) == "-d 172.30.0.5/32 ! -i veth+ -p tcp -m comment --comment \"ns/m:p cluster IP\" -m tcp "
                                 "--dport 80 -j KUBE-MARK-MASQ");
  }
}

TEST_CASE("renderer: IPv6 forms", "[unit]") {
  const auto r = makeRenderer();
  auto p = clusterIP("ns", "v6", "fd00:30::10", 80, {endpoint("fd00:10::1", 8080), endpoint("fd00:10::2", 8080)});
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 60;
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30080;
  auto f = r.renderServicePort(p);
  CHECK(f.family == net::Family::kIPv6);
  const std::string name = "ns/v6:p";
  const std::string sep = backends::servicePortEndpointChain(name, "tcp", "[fd00:10::1]:8080");
  const auto* sepChain = chainOf(f, sep);
  REQUIRE(sepChain != nullptr);
  CHECK(sepChain->rules == Rules{"-s fd00:10::1/128 -m comment --comment \"ns/v6:p\" -j KUBE-MARK-MASQ",
                                 "-p tcp -m comment --comment \"ns/v6:p\" -m tcp -j DNAT --to-destination "
                                 "[fd00:10::1]:8080"});
  const auto* svc = chainOf(f, backends::servicePortPolicyClusterChain(name, "tcp"));
  REQUIRE(svc != nullptr);
  CHECK(svc->rules[0].starts_with("! -s fd00:10::/64 -d fd00:30::10/128 -p tcp "));
  CHECK(svc->rules[1].find("--mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource") != std::string::npos);
  CHECK(dispatchOf(f, Table::kFilter, "KUBE-SERVICES") ==
        Rules{"-d fd00:30::10/128 -m comment --comment \"ClusterIP without a service on this port\" -j REJECT "
              "--reject-with icmp6-port-unreachable"});

  auto empty = clusterIP("ns", "v6e", "fd00:30::11", 80, {});
  auto e = r.renderServicePort(empty);
  CHECK(dispatchOf(e, Table::kFilter, "KUBE-SERVICES").front().ends_with("-j REJECT --reject-with icmp6-port-unreachable"));

  auto g = r.renderGlobal(net::Family::kIPv6, kproxy::iptables::testing::featureNode());
  std::vector<std::string> natServices;
  for (const auto& d : g.dispatch)
    if (d.table == Table::kNat && d.chain == "KUBE-SERVICES") natServices.push_back(d.spec);
  CHECK(natServices == Rules{"! -d ::1/128 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the "
                             "last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"});
  // No localhost NodePorts over IPv6: no martian rule.
  for (const auto& d : g.dispatch) CHECK(d.spec.find("127.0.0.0/8") == std::string::npos);
}

TEST_CASE("renderer: comments are left out of per-endpoint rules in large-cluster mode", "[unit]") {
  auto r = makeRenderer();
  auto p = clusterIP("ns", "big", "172.30.0.8", 80, {endpoint("10.1.0.1", 80), endpoint("10.1.0.2", 80)});
  r.setLargeCluster(true);
  auto f = r.renderServicePort(p);
  const std::string name = "ns/big:p";
  const auto* svc = chainOf(f, backends::servicePortPolicyClusterChain(name, "tcp"));
  REQUIRE(svc != nullptr);
  CHECK(svc->rules == Rules{"! -s 10.0.0.0/8 -d 172.30.0.8/32 -p tcp -m comment --comment \"ns/big:p cluster IP\" -m "
                            "tcp --dport 80 -j KUBE-MARK-MASQ",
                            "-m statistic --mode random --probability 0.50000000000 -j " +
                                backends::servicePortEndpointChain(name, "tcp", "10.1.0.1:80"),
                            "-j " + backends::servicePortEndpointChain(name, "tcp", "10.1.0.2:80")});
  const auto* sep = chainOf(f, backends::servicePortEndpointChain(name, "tcp", "10.1.0.1:80"));
  REQUIRE(sep != nullptr);
  CHECK(sep->rules == Rules{"-s 10.1.0.1/32 -j KUBE-MARK-MASQ", "-p tcp -m tcp -j DNAT --to-destination 10.1.0.1:80"});
  // Dispatch rules keep theirs.
  for (const auto& d : f.dispatch) CHECK(d.spec.find("-m comment") != std::string::npos);
}

TEST_CASE("renderer: the fixed chains and the jumps from built-in chains", "[unit]") {
  auto cfg = kproxy::iptables::testing::featureConfig();
  SECTION("defaults") {
    auto r = makeRenderer(cfg);
    auto g = r.renderGlobal(net::Family::kIPv4, kproxy::iptables::testing::featureNode());
    auto chain = [&](Table t, std::string_view name) -> Rules {
      for (const auto& c : g.chains)
        if (c.table == t && c.name == name) return c.rules;
      FAIL("no chain " << name);
      return {};
    };
    CHECK(chain(Table::kNat, "KUBE-POSTROUTING") ==
          Rules{"-m mark ! --mark 0x4000/0x4000 -j RETURN", "-j MARK --set-xmark 0x4000/0x0",
                "-m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"});
    CHECK(chain(Table::kNat, "KUBE-MARK-MASQ") == Rules{"-j MARK --set-xmark 0x4000/0x4000"});
    CHECK(chain(Table::kFilter, "KUBE-FORWARD") ==
          Rules{"-m conntrack --ctstate INVALID -j DROP",
                "-m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
                "-m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate "
                "RELATED,ESTABLISHED -j ACCEPT"});
    for (Table t : kTables) CHECK(chain(t, "KUBE-PROXY-CANARY").empty());
    CHECK(g.dispatchChains.size() == 6);
    CHECK(g.jumps.size() == 12);
    CHECK(std::count(g.jumps.begin(), g.jumps.end(),
                     JumpRule{Table::kNat, "PREROUTING",
                              "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"}) == 1);
    CHECK(std::count(g.jumps.begin(), g.jumps.end(),
                     JumpRule{Table::kFilter, "INPUT",
                              "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service "
                              "portals\" -j KUBE-EXTERNAL-SERVICES"}) == 1);
    CHECK(std::count(g.dispatch.begin(), g.dispatch.end(),
                     DispatchRule{Table::kFilter, "KUBE-PROXY-FIREWALL", Section::kTail,
                                  "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet "
                                  "connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"}) == 1);
  }
  SECTION("another mark, no --random-fully, liberal conntrack, no localhost NodePorts") {
    cfg.common.masqueradeBit = 5;
    cfg.randomFully = false;
    cfg.conntrackTCPLiberal = true;
    cfg.localhostNodePorts = false;
    auto r = makeRenderer(cfg);
    auto g = r.renderGlobal(net::Family::kIPv4, kproxy::iptables::testing::featureNode());
    for (const auto& c : g.chains) {
      if (c.name == "KUBE-POSTROUTING") CHECK(c.rules.back().ends_with("-j MASQUERADE"));
      if (c.name == "KUBE-MARK-MASQ") CHECK(c.rules == Rules{"-j MARK --set-xmark 0x20/0x20"});
      if (c.name == "KUBE-FORWARD") CHECK(c.rules.size() == 2);
    }
    std::vector<std::string> tail;
    for (const auto& d : g.dispatch) tail.push_back(d.spec);
    CHECK(tail == Rules{"! -d 127.0.0.0/8 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the "
                        "last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"});
  }
  SECTION("NodePort addresses the host resolved, and ServiceCIDRs") {
    auto node = kproxy::iptables::testing::featureNode();
    node.nodePortAddresses.resolved = true;
    node.nodePortAddresses.addresses = {"192.168.50.10", "fd00:50::10"};
    auto r = makeRenderer(cfg, node);
    r.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"kubernetes", "fd00:30::/108"}, {"extra", "172.30.5.0/24"}});
    auto g = r.renderGlobal(net::Family::kIPv4, node);
    std::vector<DispatchRule> expected{
        {Table::kNat, "KUBE-SERVICES", Section::kTail,
         "-d 192.168.50.10/32 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in "
         "this chain\" -j KUBE-NODEPORTS"},
        {Table::kFilter, "KUBE-SERVICES", Section::kTail,
         "-d 172.30.0.0/16 -m comment --comment \"unallocated ClusterIPs of ServiceCIDR kubernetes,extra\" -j DROP"}};
    // No localnet guard: NodePorts do not answer on loopback with these addresses.
    CHECK(g.dispatch == expected);
    CHECK_FALSE(r.localhostNodePorts());
    // A NodePort without endpoints is rejected on exactly those addresses.
    auto p = clusterIP("ns", "np", "172.30.0.3", 80, {});
    p.type = sdk::ServiceType::kNodePort;
    p.nodePort = 30111;
    auto f = r.renderServicePort(p);
    CHECK(dispatchOf(f, Table::kFilter, "KUBE-EXTERNAL-SERVICES") ==
          Rules{"-d 192.168.50.10/32 -p tcp -m comment --comment \"ns/np:p has no endpoints\" -m tcp --dport 30111 -j "
                "REJECT --reject-with icmp-port-unreachable"});
  }
}

TEST_CASE("renderer: upstream's nfacct matches, only for the objects that exist", "[unit]") {
  auto cfg = kproxy::iptables::testing::featureConfig();
  auto nodePort = [](const std::string& ip) {
    auto p = clusterIP("ns", "np", ip, 80, {endpoint(ip.find(':') == std::string::npos ? "10.180.0.1" : "fd00:180::1", 80)});
    p.type = sdk::ServiceType::kNodePort;
    p.nodePort = 30111;
    return p;
  };
  const std::string ext = backends::serviceExternalChain("ns/np:p", "tcp");
  const std::string general = "-p tcp -m comment --comment \"ns/np:p\" -m tcp --dport 30111 -j " + ext;
  auto forwardOf = [](const IptablesRenderer& r) {
    for (const auto& c : r.renderGlobal(net::Family::kIPv4, kproxy::iptables::testing::featureNode()).chains)
      if (c.name == "KUBE-FORWARD") return c.rules.front();
    return std::string();
  };

  SECTION("both objects exist") {
    auto r = makeRenderer(cfg);
    r.setNfacct({true, true});
    CHECK(forwardOf(r) ==
          "-m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP");
    // IPv4 NodePorts answer on loopback: their packets to 127.0.0.0/8 are counted, first.
    const auto f = r.renderServicePort(nodePort("172.30.0.3"));
    CHECK(dispatchOf(f, Table::kNat, "KUBE-NODEPORTS") ==
          Rules{"-d 127.0.0.0/8 -p tcp -m comment --comment \"ns/np:p\" -m tcp --dport 30111 -m nfacct --nfacct-name  "
                "localhost_nps_accepted_pkts -j " + ext,
                general});
    // Not over IPv6 (no localhost NodePorts there).
    CHECK(dispatchOf(r.renderServicePort(nodePort("fd00:30::3")), Table::kNat, "KUBE-NODEPORTS").size() == 1);
  }
  SECTION("no localhost NodePorts") {
    cfg.localhostNodePorts = false;
    auto r = makeRenderer(cfg);
    r.setNfacct({true, true});
    CHECK(dispatchOf(r.renderServicePort(nodePort("172.30.0.3")), Table::kNat, "KUBE-NODEPORTS") == Rules{general});
  }
  SECTION("no objects: upstream's rules without the match") {
    auto r = makeRenderer(cfg);
    CHECK(forwardOf(r) == "-m conntrack --ctstate INVALID -j DROP");
    CHECK(dispatchOf(r.renderServicePort(nodePort("172.30.0.3")), Table::kNat, "KUBE-NODEPORTS") == Rules{general});
  }
}

TEST_CASE("renderer: the whole ruleset loads into an empty ruleset and reads back as rendered", "[unit]") {
  const auto r = makeRenderer();
  const auto ports = allFeatureServices();
  for (net::Family fam : {net::Family::kIPv4, net::Family::kIPv6}) {
    const std::string text = renderRuleset(r, fam, ports, kproxy::iptables::testing::featureNode());
    FakeIptables fake;
    auto restored = fake.restore(fam, text);
    INFO(text);
    REQUIRE(restored.has_value());
    std::string saved;
    for (Table t : kTables) saved += *fake.save(fam, t);
    CHECK(chainsOf(saved, true) == chainsOf(text, true));
    // Every service port's chains are there; the nat KUBE-SERVICES ends with the NodePorts jump.
    const auto chains = chainsOf(text, true);
    const auto& natServices = chains.at({"nat", "KUBE-SERVICES"});
    REQUIRE(!natServices.empty());
    CHECK(natServices.back().ends_with("-j KUBE-NODEPORTS"));
    std::size_t serviceChains = 0;
    for (const auto& [key, rules] : chains) serviceChains += backends::isServiceChainName(key.second) ? 1 : 0;
    CHECK(serviceChains >= 25);
    for (const auto& p : ports) {
      if (p.family != fam) continue;
      auto f = r.renderServicePort(p);
      for (const auto& c : f.chains) CHECK(chains.at({std::string(tableName(c.table)), c.name}) == c.rules);
    }
  }
}
