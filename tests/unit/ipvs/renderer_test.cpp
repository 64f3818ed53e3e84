// IpvsRenderer: the service plan as upstream's IPVS mode programs it — virtual and real servers,
// kube-ipvs0 addresses, ipset entries and definitions, and the iptables rules as iptables-save
// prints them — and the places where the rendering means what the plan says instead.

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kproxy/ipvs/renderer.h"

using namespace kproxy;
using namespace kproxy::ipvs;

namespace {

using Strings = std::vector<std::string>;

sdk::Endpoint endpoint(std::string ip, int port, bool local = false) {
  sdk::Endpoint e;
  e.ip = std::move(ip);
  e.port = port;
  e.isLocal = local;
  e.ready = true;
  e.serving = true;
  return e;
}

/// A ClusterIP service port whose endpoint sets are filled as the core resolves them (every
/// endpoint ready: the cluster pool is all of them, the local pool the local ones).
sdk::ServicePort servicePort(std::string ns, std::string name, std::string clusterIP, int port,
                             std::vector<sdk::Endpoint> endpoints, sdk::Protocol protocol = sdk::Protocol::kTCP,
                             std::string portName = "p") {
  sdk::ServicePort p;
  p.family = clusterIP.find(':') == std::string::npos ? net::Family::kIPv4 : net::Family::kIPv6;
  p.protocol = protocol;
  p.ns = std::move(ns);
  p.serviceName = std::move(name);
  p.portName = std::move(portName);
  p.key = p.ns + "/" + p.serviceName + ":" + p.portName;
  p.clusterIP = std::move(clusterIP);
  p.port = port;
  p.allEndpoints = endpoints;
  p.allReachableEndpoints = endpoints;
  p.clusterEndpoints = endpoints;
  for (const auto& e : endpoints)
    if (e.isLocal) p.localEndpoints.push_back(e);
  p.hasAnyEndpoints = !endpoints.empty();
  return p;
}

RenderConfig config() {
  RenderConfig cfg;
  cfg.common.clusterCIDRs = {"10.244.0.0/16", "fd00:10:244::/56"};
  return cfg;
}

sdk::NodeInfo node() {
  sdk::NodeInfo n;
  n.name = "node-a";
  n.addresses = {"192.168.0.2", "fd00:192::2"};
  n.nodePortAddresses.resolved = true;
  n.nodePortAddresses.allLocalIPv4 = true;
  n.nodePortAddresses.allLocalIPv6 = true;
  n.nodePortAddresses.addresses = {"10.0.0.2", "127.0.0.1", "192.168.0.2", "::1", "fd00:192::2", "fe80::1"};
  return n;
}

IpvsRenderer renderer(RenderConfig cfg = config(), sdk::NodeInfo n = node()) {
  IpvsRenderer r(std::move(cfg));
  r.setNode(n);
  return r;
}

const PlannedVirtualServer* serverAt(const Fragment& f, std::string_view key) {
  for (const auto& vs : f.virtualServers)
    if (vs.key() == key) return &vs;
  return nullptr;
}

Strings keysOf(const Fragment& f) {
  Strings out;
  for (const auto& vs : f.virtualServers) out.push_back(vs.key());
  std::sort(out.begin(), out.end());
  return out;
}

Strings realServersOf(const PlannedVirtualServer* vs) {
  Strings out;
  if (!vs) return out;
  for (const auto& rs : vs->realServers) out.push_back(fmt::format("{}:{}/{}", rs.address, rs.port, rs.weight));
  return out;
}

Strings entriesOf(const Fragment& f) {
  Strings out;
  for (const auto& e : f.ipsetEntries) out.push_back(e.text());
  return out;
}

Strings rulesOf(const Fragment& f, Table table, std::string_view chain) {
  Strings out;
  for (const auto& r : f.rules)
    if (r.table == table && r.chain == chain) out.push_back(r.spec);
  return out;
}

}  // namespace

TEST_CASE("ipvs renderer: a ClusterIP is one virtual server with the cluster pool", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns1", "svc1", "172.30.0.41", 80,
                       {endpoint("10.180.0.2", 8080), endpoint("10.180.0.1", 8080, true)});
  const Fragment f = r.renderServicePort(p);
  REQUIRE(keysOf(f) == Strings{"172.30.0.41:80/TCP"});
  const PlannedVirtualServer& vs = f.virtualServers.front();
  CHECK(vs.scheduler == "rr");
  CHECK(vs.traffic == Traffic::kClusterIP);
  CHECK_FALSE(vs.persistent);
  CHECK_FALSE(vs.sourceHashFallback);
  // Sorted, weight 1.
  CHECK(realServersOf(&vs) == Strings{"10.180.0.1:8080/1", "10.180.0.2:8080/1"});
  CHECK(f.boundAddresses == Strings{"172.30.0.41"});
  // The local endpoint is in the hairpin set; the bound address in KUBE-IPVS-IPS.
  CHECK(entriesOf(f) == Strings{"add KUBE-CLUSTER-IP 172.30.0.41,tcp:80", "add KUBE-IPVS-IPS 172.30.0.41",
                                "add KUBE-LOOP-BACK 10.180.0.1,tcp:8080,10.180.0.1"});
  CHECK(f.rules.empty());
  CHECK(f.problems.empty());

  auto udp = servicePort("kube-system", "dns", "10.96.0.10", 53, {endpoint("10.244.1.5", 53)}, sdk::Protocol::kUDP);
  const Fragment fu = r.renderServicePort(udp);
  CHECK(keysOf(fu) == Strings{"10.96.0.10:53/UDP"});
  CHECK(entriesOf(fu) == Strings{"add KUBE-CLUSTER-IP 10.96.0.10,udp:53", "add KUBE-IPVS-IPS 10.96.0.10"});
}

TEST_CASE("ipvs renderer: a NodePort is one virtual server per NodePort address", "[unit]") {
  auto r = renderer();
  auto p = servicePort("ns2", "np", "172.30.0.42", 80, {endpoint("10.180.0.3", 80)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30080;
  Fragment f = r.renderServicePort(p);
  // Loopback and IPv6 addresses are left out, as upstream; node IPs are never bound.
  CHECK(keysOf(f) == Strings{"10.0.0.2:30080/TCP", "172.30.0.42:80/TCP", "192.168.0.2:30080/TCP"});
  CHECK(realServersOf(serverAt(f, "10.0.0.2:30080/TCP")) == Strings{"10.180.0.3:80/1"});
  CHECK(serverAt(f, "10.0.0.2:30080/TCP")->traffic == Traffic::kNodePort);
  CHECK(f.boundAddresses == Strings{"172.30.0.42"});
  CHECK(entriesOf(f) == Strings{"add KUBE-CLUSTER-IP 172.30.0.42,tcp:80", "add KUBE-IPVS-IPS 172.30.0.42",
                                "add KUBE-NODE-PORT-TCP 30080"});

  // Addresses found on kube-ipvs0 are not node addresses.
  r.setDummyInterfaceAddresses({"10.0.0.2"});
  f = r.renderServicePort(p);
  CHECK(keysOf(f) == Strings{"172.30.0.42:80/TCP", "192.168.0.2:30080/TCP"});

  // UDP: a bitmap:port entry; SCTP: hash:ip,port, one entry per address.
  p.protocol = sdk::Protocol::kUDP;
  CHECK(entriesOf(r.renderServicePort(p)) == Strings{"add KUBE-CLUSTER-IP 172.30.0.42,udp:80",
                                                     "add KUBE-IPVS-IPS 172.30.0.42", "add KUBE-NODE-PORT-UDP 30080"});
  r.setDummyInterfaceAddresses({});
  p.protocol = sdk::Protocol::kSCTP;
  CHECK(entriesOf(r.renderServicePort(p)) ==
        Strings{"add KUBE-CLUSTER-IP 172.30.0.42,sctp:80", "add KUBE-IPVS-IPS 172.30.0.42",
                "add KUBE-NODE-PORT-SCTP-HASH 10.0.0.2,sctp:30080", "add KUBE-NODE-PORT-SCTP-HASH 192.168.0.2,sctp:30080"});

  // A host older than ABI 1.2 sends no decision: the plan decides from the node's addresses.
  auto cfg = config();
  cfg.common.nodePortAddresses = {"192.168.0.0/24"};
  sdk::NodeInfo unresolved = node();
  unresolved.nodePortAddresses = {};
  unresolved.addresses = {"192.168.0.2", "10.0.0.2"};
  const auto r2 = renderer(cfg, unresolved);
  CHECK(r2.nodePortAddresses(net::Family::kIPv4) == Strings{"192.168.0.2"});
  p.protocol = sdk::Protocol::kTCP;
  CHECK(keysOf(r2.renderServicePort(p)) == Strings{"172.30.0.42:80/TCP", "192.168.0.2:30080/TCP"});
}

TEST_CASE("ipvs renderer: externalIPs are bound unless the node holds them", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns3", "ext", "172.30.0.43", 80, {endpoint("10.180.0.4", 80)});
  p.externalIPs = {"203.0.113.7", "192.168.0.2"};
  const Fragment f = r.renderServicePort(p);
  CHECK(keysOf(f) == Strings{"172.30.0.43:80/TCP", "192.168.0.2:80/TCP", "203.0.113.7:80/TCP"});
  CHECK(serverAt(f, "203.0.113.7:80/TCP")->traffic == Traffic::kExternalIP);
  CHECK(realServersOf(serverAt(f, "203.0.113.7:80/TCP")) == Strings{"10.180.0.4:80/1"});
  CHECK(f.boundAddresses == Strings{"172.30.0.43", "203.0.113.7"});
  CHECK(entriesOf(f) == Strings{"add KUBE-CLUSTER-IP 172.30.0.43,tcp:80", "add KUBE-EXTERNAL-IP 192.168.0.2,tcp:80",
                                "add KUBE-EXTERNAL-IP 203.0.113.7,tcp:80", "add KUBE-IPVS-IPS 172.30.0.43",
                                "add KUBE-IPVS-IPS 203.0.113.7"});
  CHECK(f.rules.empty());
}

TEST_CASE("ipvs renderer: LoadBalancer source ranges", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns5", "lb", "172.30.0.45", 80, {endpoint("10.180.0.5", 80)});
  p.type = sdk::ServiceType::kLoadBalancer;
  p.loadBalancerIPs = {"5.6.7.8"};
  p.loadBalancerSourceRanges = {"203.0.113.0/25", "198.51.100.9/32"};

  SECTION("the ranges do not hold the node: its connections from the VIP are dropped after IPVS") {
    const Fragment f = r.renderServicePort(p);
    CHECK(keysOf(f) == Strings{"172.30.0.45:80/TCP", "5.6.7.8:80/TCP"});
    CHECK(serverAt(f, "5.6.7.8:80/TCP")->traffic == Traffic::kLoadBalancer);
    CHECK(f.boundAddresses == Strings{"172.30.0.45", "5.6.7.8"});
    CHECK(entriesOf(f) ==
          Strings{"add KUBE-CLUSTER-IP 172.30.0.45,tcp:80", "add KUBE-IPVS-IPS 172.30.0.45",
                  "add KUBE-IPVS-IPS 5.6.7.8", "add KUBE-LOAD-BALANCER 5.6.7.8,tcp:80",
                  "add KUBE-LOAD-BALANCER-FW 5.6.7.8,tcp:80",
                  "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,198.51.100.9/32",
                  "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,203.0.113.0/25"});
    CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-OUT-FILTER") ==
          Strings{"-s 5.6.7.8/32 -m ipvs --vproto 6 --vaddr 5.6.7.8 --vport 80 -j DROP"});
    CHECK(f.rules.size() == 1);
  }
  SECTION("a range holds a node IP: the VIP is an admitted source, no OUTPUT drop") {
    p.loadBalancerSourceRanges.push_back("192.168.0.0/24");
    const Fragment f = r.renderServicePort(p);
    CHECK(entriesOf(f) ==
          Strings{"add KUBE-CLUSTER-IP 172.30.0.45,tcp:80", "add KUBE-IPVS-IPS 172.30.0.45",
                  "add KUBE-IPVS-IPS 5.6.7.8", "add KUBE-LOAD-BALANCER 5.6.7.8,tcp:80",
                  "add KUBE-LOAD-BALANCER-FW 5.6.7.8,tcp:80",
                  "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,192.168.0.0/24",
                  "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,198.51.100.9/32",
                  "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,203.0.113.0/25",
                  "add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.8,tcp:80,5.6.7.8"});
    CHECK(f.rules.empty());
  }
  SECTION("several LB IPs: every admitted source to every LB IP (the plan)") {
    p.loadBalancerIPs = {"5.6.7.8", "5.6.7.9"};
    p.loadBalancerSourceRanges = {"192.168.0.0/24"};
    const Fragment f = r.renderServicePort(p);
    Strings sourceIP;
    for (const auto& e : entriesOf(f))
      if (e.starts_with("add KUBE-LOAD-BALANCER-SOURCE-IP ")) sourceIP.push_back(e);
    CHECK(sourceIP == Strings{"add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.8,tcp:80,5.6.7.8",
                              "add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.8,tcp:80,5.6.7.9",
                              "add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.9,tcp:80,5.6.7.8",
                              "add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.9,tcp:80,5.6.7.9"});
  }
  SECTION("no ranges: no firewall entries") {
    p.loadBalancerSourceRanges.clear();
    const Fragment f = r.renderServicePort(p);
    CHECK(entriesOf(f) == Strings{"add KUBE-CLUSTER-IP 172.30.0.45,tcp:80", "add KUBE-IPVS-IPS 172.30.0.45",
                                  "add KUBE-IPVS-IPS 5.6.7.8", "add KUBE-LOAD-BALANCER 5.6.7.8,tcp:80"});
    CHECK(f.rules.empty());
  }
}

TEST_CASE("ipvs renderer: externalTrafficPolicy=Local", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns6", "local", "172.30.0.46", 80,
                       {endpoint("10.180.0.6", 80, true), endpoint("10.180.1.6", 80)});
  p.type = sdk::ServiceType::kLoadBalancer;
  p.nodePort = 30006;
  p.externalPolicyLocal = true;
  p.loadBalancerIPs = {"5.6.7.6"};
  p.externalIPs = {"203.0.113.6"};

  SECTION("external virtual servers hold the local pool; pods and the node are short-circuited") {
    const Fragment f = r.renderServicePort(p);
    CHECK(realServersOf(serverAt(f, "172.30.0.46:80/TCP")) == Strings{"10.180.0.6:80/1", "10.180.1.6:80/1"});
    for (const auto* key : {"5.6.7.6:80/TCP", "203.0.113.6:80/TCP", "10.0.0.2:30006/TCP", "192.168.0.2:30006/TCP"})
      CHECK(realServersOf(serverAt(f, key)) == Strings{"10.180.0.6:80/1"});
    CHECK(entriesOf(f) == Strings{"add KUBE-CLUSTER-IP 172.30.0.46,tcp:80",
                                  "add KUBE-EXTERNAL-IP-LOCAL 203.0.113.6,tcp:80",
                                  "add KUBE-IPVS-IPS 172.30.0.46",
                                  "add KUBE-IPVS-IPS 203.0.113.6",
                                  "add KUBE-IPVS-IPS 5.6.7.6",
                                  "add KUBE-LOAD-BALANCER 5.6.7.6,tcp:80",
                                  "add KUBE-LOAD-BALANCER-LOCAL 5.6.7.6,tcp:80",
                                  "add KUBE-LOOP-BACK 10.180.0.6,tcp:80,10.180.0.6",
                                  "add KUBE-NODE-PORT-LOCAL-TCP 30006",
                                  "add KUBE-NODE-PORT-TCP 30006"});
    const Strings nat = rulesOf(f, Table::kNat, "KUBE-SERVICES");
    auto threeRules = [](const std::string& dst, int port) {
      return Strings{
          fmt::format("-d {} -p tcp -m comment --comment \"masquerade LOCAL traffic for ns6/local:p external "
                      "destinations\" -m tcp --dport {} -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                      dst, port),
          fmt::format("-s 10.244.0.0/16 -d {} -p tcp -m comment --comment \"pod traffic for ns6/local:p external "
                      "destinations\" -m tcp --dport {} -j DNAT --to-destination 172.30.0.46:80",
                      dst, port),
          fmt::format("-d {} -p tcp -m comment --comment \"route LOCAL traffic for ns6/local:p external "
                      "destinations\" -m tcp --dport {} -m addrtype --src-type LOCAL -j DNAT --to-destination "
                      "172.30.0.46:80",
                      dst, port)};
    };
    Strings want;
    for (auto [dst, port] : {std::pair{"203.0.113.6/32", 80}, std::pair{"5.6.7.6/32", 80},
                             std::pair{"10.0.0.2/32", 30006}, std::pair{"192.168.0.2/32", 30006}})
      for (auto& rule : threeRules(dst, port)) want.push_back(rule);
    CHECK(nat == want);
    CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-FILTER").empty());
    CHECK(f.problems.empty());
  }
  SECTION("every endpoint local: the pools are one, only the node's masquerade is added") {
    p = servicePort("ns6", "local", "172.30.0.46", 80, {endpoint("10.180.0.6", 80, true)});
    p.nodePort = 30006;
    p.externalPolicyLocal = true;
    const Fragment f = r.renderServicePort(p);
    CHECK(rulesOf(f, Table::kNat, "KUBE-SERVICES") ==
          Strings{"-d 10.0.0.2/32 -p tcp -m comment --comment \"masquerade LOCAL traffic for ns6/local:p external "
                  "destinations\" -m tcp --dport 30006 -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                  "-d 192.168.0.2/32 -p tcp -m comment --comment \"masquerade LOCAL traffic for ns6/local:p "
                  "external destinations\" -m tcp --dport 30006 -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"});
  }
  SECTION("no local endpoint: the cluster pool serves the node and pods, others are dropped") {
    p = servicePort("ns6", "local", "172.30.0.46", 80, {endpoint("10.180.1.6", 80)});
    p.nodePort = 30006;
    p.externalPolicyLocal = true;
    const Fragment f = r.renderServicePort(p);
    CHECK(realServersOf(serverAt(f, "192.168.0.2:30006/TCP")) == Strings{"10.180.1.6:80/1"});
    CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-FILTER") ==
          Strings{"! -s 10.244.0.0/16 -d 10.0.0.2/32 -p tcp -m comment --comment \"ns6/local:p has no local "
                  "endpoints\" -m tcp --dport 30006 -m addrtype ! --src-type LOCAL -j DROP",
                  "! -s 10.244.0.0/16 -d 192.168.0.2/32 -p tcp -m comment --comment \"ns6/local:p has no local "
                  "endpoints\" -m tcp --dport 30006 -m addrtype ! --src-type LOCAL -j DROP"});
    // The pools differ only by being empty: nothing to DNAT; the node is masqueraded.
    CHECK(rulesOf(f, Table::kNat, "KUBE-SERVICES").size() == 2);
    CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-OUT-FILTER").empty());
  }
  SECTION("a firewalled LB IP: pods short-circuit only from admitted sources") {
    p.loadBalancerSourceRanges = {"10.244.0.0/24"};
    p.externalIPs.clear();
    p.nodePort = 0;
    const Fragment f = r.renderServicePort(p);
    // The node is not admitted: neither masqueraded nor routed; it meets the OUTPUT drop.
    CHECK(rulesOf(f, Table::kNat, "KUBE-SERVICES") ==
          Strings{"-s 10.244.0.0/16 -d 5.6.7.6/32 -p tcp -m comment --comment \"pod traffic for ns6/local:p external "
                  "destinations\" -m tcp --dport 80 -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j "
                  "DNAT --to-destination 172.30.0.46:80"});
    CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-OUT-FILTER") ==
          Strings{"-s 5.6.7.6/32 -m ipvs --vproto 6 --vaddr 5.6.7.6 --vport 80 -j DROP"});
  }
  SECTION("iTP=Local too: no virtual server holds the cluster pool, a problem is recorded") {
    p.internalPolicyLocal = true;
    const Fragment f = r.renderServicePort(p);
    REQUIRE(f.problems.size() == 1);
    CHECK_THAT(f.problems.front(), Catch::Contains("ns6/local:p"));
    for (const auto& rule : rulesOf(f, Table::kNat, "KUBE-SERVICES")) CHECK_THAT(rule, !Catch::Contains("DNAT"));
  }
}

TEST_CASE("ipvs renderer: internalTrafficPolicy=Local", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns7", "itp", "172.30.0.47", 80, {endpoint("10.180.0.7", 80, true), endpoint("10.180.1.7", 80)});
  p.internalPolicyLocal = true;
  Fragment f = r.renderServicePort(p);
  CHECK(realServersOf(serverAt(f, "172.30.0.47:80/TCP")) == Strings{"10.180.0.7:80/1"});
  CHECK(f.rules.empty());

  // No local endpoint (but some elsewhere): dropped, not sent to the cluster pool as upstream
  // IPVS does; no virtual server, so the node's own packets meet the OUTPUT drop.
  p = servicePort("ns7", "itp", "172.30.0.47", 80, {endpoint("10.180.1.7", 80)});
  p.internalPolicyLocal = true;
  f = r.renderServicePort(p);
  CHECK(f.virtualServers.empty());
  CHECK(f.boundAddresses == Strings{"172.30.0.47"});
  const std::string drop =
      "-d 172.30.0.47/32 -p tcp -m comment --comment \"ns7/itp:p has no local endpoints\" -m tcp --dport 80 -j DROP";
  CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-FILTER") == Strings{drop});
  CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-OUT-FILTER") == Strings{drop});
}

TEST_CASE("ipvs renderer: no endpoints at all is a virtual server without real servers", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns8", "none", "172.30.0.48", 80, {});
  p.nodePort = 30008;
  p.loadBalancerIPs = {"5.6.7.48"};
  const Fragment f = r.renderServicePort(p);
  // IPVS answers a new connection to a server without destinations with ICMP port
  // unreachable: the plan's reject.
  CHECK(keysOf(f) == Strings{"10.0.0.2:30008/TCP", "172.30.0.48:80/TCP", "192.168.0.2:30008/TCP", "5.6.7.48:80/TCP"});
  for (const auto& vs : f.virtualServers) CHECK(vs.realServers.empty());
  CHECK(f.rules.empty());
  p.externalPolicyLocal = true;
  CHECK(r.renderServicePort(p).rules.empty());
}

TEST_CASE("ipvs renderer: ClientIP affinity is one persistent firewall-mark virtual server per port", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns9", "sticky", "172.30.0.49", 80, {endpoint("10.180.0.9", 8080)});
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 600;
  p.nodePort = 30009;
  p.externalIPs = {"203.0.113.9"};
  Fragment f = r.renderServicePort(p);
  const std::uint32_t mark = r.config().fwmarkOf(net::Family::kIPv4, "ns9/sticky:p", "cluster");
  CHECK((mark & r.config().fwmarkTag()) != 0);
  CHECK((mark & (r.config().mark() | 0x8000u)) == 0);
  // Every address of the port meets one virtual server, so a client sticks across them.
  REQUIRE(f.virtualServers.size() == 1);
  const auto& vs = f.virtualServers.front();
  CHECK(vs.fwmark == mark);
  CHECK(vs.key() == fmt::format("FWM {} IPv4", mark));
  CHECK(vs.persistent);
  CHECK(vs.timeoutSeconds == 600);
  CHECK(realServersOf(&vs) == Strings{"10.180.0.9:8080/1"});
  CHECK(vs.marked == std::vector<MarkedAddress>{{"172.30.0.49", 80, Traffic::kClusterIP},
                                                {"203.0.113.9", 80, Traffic::kExternalIP},
                                                {"10.0.0.2", 30009, Traffic::kNodePort},
                                                {"192.168.0.2", 30009, Traffic::kNodePort}});
  CHECK(vs.answers("192.168.0.2", 30009));
  CHECK_FALSE(vs.answers("192.168.0.2", 80));
  // The marks come first among the port's rules in nat KUBE-SERVICES (then the NodePorts'
  // masquerade, which KUBE-NODE-PORT would have decided after the port changed); the ports
  // become the endpoints' in KUBE-IPVS-FWMARK-PORTS (a persistent firewall-mark service keeps
  // the packet's port). The addresses are bound and in the same sets as without affinity.
  const std::string target = fmt::format("-j MARK --set-xmark {:#x}/0xffffffff", mark);
  const std::string comment = "-m comment --comment \"ns9/sticky:p sessionAffinity ClientIP\"";
  const std::string nodePort = "-m comment --comment \"ns9/sticky:p NodePort\"";
  CHECK(rulesOf(f, Table::kNat, "KUBE-SERVICES") ==
        Strings{"-d 172.30.0.49/32 -p tcp " + comment + " -m tcp --dport 80 " + target,
                "-d 203.0.113.9/32 -p tcp " + comment + " -m tcp --dport 80 " + target,
                "-d 10.0.0.2/32 -p tcp " + comment + " -m tcp --dport 30009 " + target,
                "-d 192.168.0.2/32 -p tcp " + comment + " -m tcp --dport 30009 " + target,
                "-d 10.0.0.2/32 -p tcp " + nodePort + " -m tcp --dport 30009 -j KUBE-MARK-MASQ",
                "-d 192.168.0.2/32 -p tcp " + nodePort + " -m tcp --dport 30009 -j KUBE-MARK-MASQ"});
  CHECK(rulesOf(f, Table::kNat, "KUBE-IPVS-FWMARK-PORTS") ==
        Strings{"-d 172.30.0.49/32 -p tcp " + comment + " -m tcp --dport 80 -j DNAT --to-destination :8080",
                "-d 203.0.113.9/32 -p tcp " + comment + " -m tcp --dport 80 -j DNAT --to-destination :8080",
                "-d 10.0.0.2/32 -p tcp " + comment + " -m tcp --dport 30009 -j DNAT --to-destination :8080",
                "-d 192.168.0.2/32 -p tcp " + comment + " -m tcp --dport 30009 -j DNAT --to-destination :8080"});
  auto plain = p;
  plain.sessionAffinityClientIP = false;
  const Fragment without = r.renderServicePort(plain);
  CHECK(f.ipsetEntries == without.ipsetEntries);
  CHECK(f.boundAddresses == without.boundAddresses);
  CHECK(without.virtualServers.size() == 4);
  for (const auto& w : without.virtualServers) CHECK(w.fwmark == 0);
  CHECK(rulesOf(without, Table::kNat, "KUBE-SERVICES").empty());

  p.stickyMaxAgeSeconds = 0;
  f = r.renderServicePort(p);
  CHECK(f.virtualServers.front().timeoutSeconds == 10800);
  CHECK(toIpvsadm(f.virtualServers) ==
        fmt::format("-A -f {0} -s rr -p 10800\n-a -f {0} -r 10.180.0.9:8080 -m -w 1\n", mark));
  CHECK(toIpvsadm(f.virtualServers, IpvsadmStyle::kList).find(fmt::format("FWM  {} rr persistent 10800\n", mark)) !=
        std::string::npos);
  // Endpoints on two ports cannot share one: one virtual server per address, and a problem.
  p.allEndpoints.push_back(endpoint("10.180.1.9", 9090));
  p.clusterEndpoints = p.allEndpoints;
  f = r.renderServicePort(p);
  CHECK(f.virtualServers.size() == 4);
  CHECK(f.virtualServers.front().fwmark == 0);
  CHECK(f.virtualServers.front().persistent);
  CHECK(f.problems.size() == 1);
  CHECK(rulesOf(f, Table::kNat, "KUBE-IPVS-FWMARK-PORTS").empty());
  // The mark is the port's own: stable, and another port's differs.
  CHECK(r.config().fwmarkOf(net::Family::kIPv4, "ns9/sticky:p", "cluster") == mark);
  CHECK(r.config().fwmarkOf(net::Family::kIPv6, "ns9/sticky:p", "cluster") != mark);
  CHECK(r.config().fwmarkOf(net::Family::kIPv4, "ns9/sticky:q", "cluster") != mark);
}

TEST_CASE("ipvs renderer: ClientIP affinity with externalTrafficPolicy=Local: one mark per pool", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns6", "local", "172.30.0.46", 80, {endpoint("10.180.0.6", 80, true), endpoint("10.180.1.6", 80)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30006;
  p.externalPolicyLocal = true;
  p.sessionAffinityClientIP = true;
  const std::uint32_t cluster = r.config().fwmarkOf(net::Family::kIPv4, "ns6/local:p", "cluster");
  const std::uint32_t external = r.config().fwmarkOf(net::Family::kIPv4, "ns6/local:p", "external");
  CHECK(cluster != external);
  Fragment f = r.renderServicePort(p);
  REQUIRE(f.virtualServers.size() == 2);
  CHECK(f.virtualServers[0].fwmark == cluster);
  CHECK(realServersOf(&f.virtualServers[0]) == Strings{"10.180.0.6:80/1", "10.180.1.6:80/1"});
  CHECK(f.virtualServers[1].fwmark == external);
  CHECK(realServersOf(&f.virtualServers[1]) == Strings{"10.180.0.6:80/1"});
  CHECK(f.virtualServers[1].marked.size() == 2);
  // The short-circuit to the ClusterIP carries the ClusterIP's mark: each DNAT is preceded by
  // a rule of the same match that marks it so.
  const Strings nat = rulesOf(f, Table::kNat, "KUBE-SERVICES");
  const std::string toCluster = fmt::format("-j MARK --set-xmark {:#x}/0xffffffff", cluster);
  std::size_t dnats = 0;
  for (std::size_t i = 0; i < nat.size(); ++i) {
    if (nat[i].find("-j DNAT") == std::string::npos) continue;
    ++dnats;
    REQUIRE(i > 0);
    CHECK(nat[i - 1].substr(0, nat[i - 1].find(" -j ")) == nat[i].substr(0, nat[i].find(" -j ")));
    CHECK(nat[i - 1].ends_with(toCluster));
  }
  CHECK(dnats == 4);  // pods and node, on each NodePort address
  // Every endpoint local: the pools are one, and so is the virtual server.
  p = servicePort("ns6", "local", "172.30.0.46", 80, {endpoint("10.180.0.6", 80, true)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30006;
  p.externalPolicyLocal = true;
  p.sessionAffinityClientIP = true;
  f = r.renderServicePort(p);
  REQUIRE(f.virtualServers.size() == 1);
  CHECK(f.virtualServers[0].fwmark == cluster);
  CHECK(f.virtualServers[0].marked.size() == 3);
}

TEST_CASE("ipvs renderer: IPv6 names, entries and rules", "[unit]") {
  const auto r = renderer();
  auto p = servicePort("ns10", "v6", "fd00:10:96::a", 80,
                       {endpoint("fd00:10:244::5", 8080, true), endpoint("10.180.0.10", 8080)});
  p.nodePort = 30010;
  p.protocol = sdk::Protocol::kSCTP;
  p.loadBalancerIPs = {"2001:db8::10", "5.6.7.10"};
  p.loadBalancerSourceRanges = {"2001:db8:1::/48"};
  const Fragment f = r.renderServicePort(p);
  // Endpoints and addresses of the other family are left out; link-local and ::1 are no
  // NodePort addresses.
  CHECK(keysOf(f) == Strings{"[2001:db8::10]:80/SCTP", "[fd00:10:96::a]:80/SCTP", "[fd00:192::2]:30010/SCTP"});
  CHECK(realServersOf(serverAt(f, "[fd00:10:96::a]:80/SCTP")) == Strings{"fd00:10:244::5:8080/1"});
  CHECK(entriesOf(f) ==
        Strings{"add KUBE-6-CLUSTER-IP fd00:10:96::a,sctp:80", "add KUBE-6-IPVS-IPS 2001:db8::10",
                "add KUBE-6-IPVS-IPS fd00:10:96::a", "add KUBE-6-LOAD-BALANCER 2001:db8::10,sctp:80",
                "add KUBE-6-LOAD-BALANCER-FW 2001:db8::10,sctp:80",
                "add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::10,sctp:80,2001:db8:1::/48",
                "add KUBE-6-LOOP-BACK fd00:10:244::5,sctp:8080,fd00:10:244::5",
                "add KUBE-6-NODE-PORT-SCTP-HASH fd00:192::2,sctp:30010"});
  CHECK(rulesOf(f, Table::kFilter, "KUBE-IPVS-OUT-FILTER") ==
        Strings{"-s 2001:db8::10/128 -m ipvs --vproto 132 --vaddr 2001:db8::10 --vport 80 -j DROP"});
  CHECK(toIpvsadm(std::span(f.virtualServers).first(1)) ==
        "-A --sctp-service [fd00:10:96::a]:80 -s rr\n"
        "-a --sctp-service [fd00:10:96::a]:80 -r [fd00:10:244::5]:8080 -m -w 1\n");
}

TEST_CASE("ipvs renderer: set names, types and definitions", "[unit]") {
  CHECK(allSets().size() == 17);
  CHECK(setName(SetId::kClusterIP, net::Family::kIPv4) == "KUBE-CLUSTER-IP");
  CHECK(setName(SetId::kClusterIP, net::Family::kIPv6) == "KUBE-6-CLUSTER-IP");
  // "KUBE-6-" + upstream's name, cut to 31 characters.
  CHECK(setName(SetId::kLoadBalancerSourceCIDR, net::Family::kIPv6) == "KUBE-6-LOAD-BALANCER-SOURCE-CID");
  CHECK(setName(SetId::kNodePortLocalSCTP, net::Family::kIPv6) == "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS");
  CHECK(setName(SetId::kLoadBalancerSourceIP, net::Family::kIPv6) == "KUBE-6-LOAD-BALANCER-SOURCE-IP");
  for (SetId id : allSets())
    for (auto fam : {net::Family::kIPv4, net::Family::kIPv6}) CHECK(setName(id, fam).size() <= 31);

  CHECK(setDefinition(SetId::kClusterIP, net::Family::kIPv4).createText() ==
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536");
  CHECK(setDefinition(SetId::kLoopBack, net::Family::kIPv6).createText() ==
        "create KUBE-6-LOOP-BACK hash:ip,port,ip family inet6 hashsize 1024 maxelem 65536");
  CHECK(setDefinition(SetId::kLoadBalancerSourceCIDR, net::Family::kIPv4).createText() ==
        "create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536");
  CHECK(setDefinition(SetId::kNodePortTCP, net::Family::kIPv4).createText() ==
        "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535");
  CHECK(setDefinition(SetId::kIPVSIPs, net::Family::kIPv4).createText() ==
        "create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536");
  CHECK(setDefinition(SetId::kHealthCheckNodePort, net::Family::kIPv4).comment == "Kubernetes health check node port");

  // The whole ipset restore input: creates, then the entries sorted and each once.
  const auto r = renderer();
  auto a = servicePort("ns", "a", "10.96.0.20", 80, {endpoint("10.244.0.20", 80)});
  a.healthCheckNodePort = 32000;
  auto b = servicePort("ns", "a", "10.96.0.20", 443, {endpoint("10.244.0.20", 443)}, sdk::Protocol::kTCP, "https");
  const std::vector<sdk::ServicePort> ports{a, b};
  const std::string text = renderIpsets(r, net::Family::kIPv4, ports);
  CHECK_THAT(text, Catch::StartsWith("create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536\n"
                                     "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n"));
  CHECK_THAT(text, Catch::EndsWith("create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536\n"
                                   "add KUBE-CLUSTER-IP 10.96.0.20,tcp:443\n"
                                   "add KUBE-CLUSTER-IP 10.96.0.20,tcp:80\n"
                                   "add KUBE-HEALTH-CHECK-NODE-PORT 32000\n"
                                   "add KUBE-IPVS-IPS 10.96.0.20\n"));
}

TEST_CASE("ipvs renderer: the scheduler option", "[unit]") {
  auto cfg = parseRenderConfig({{"ipvs-scheduler", "wlc"}, {"cluster-cidr", "10.244.0.0/16"}});
  REQUIRE(cfg);
  CHECK(cfg->scheduler == "wlc");
  CHECK(cfg->common.clusterCIDRs == Strings{"10.244.0.0/16"});
  auto p = servicePort("ns", "s", "10.96.0.30", 80, {endpoint("10.244.0.30", 80)});
  CHECK(IpvsRenderer(*cfg).renderServicePort(p).virtualServers.front().scheduler == "wlc");

  auto defaulted = parseRenderConfig({});
  REQUIRE(defaulted);
  CHECK(defaulted->scheduler == "rr");
  CHECK(parseRenderConfig({{"ipvs-scheduler", ""}})->scheduler == "rr");

  auto bad = parseRenderConfig({{"ipvs-scheduler", "random"}});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("ipvs-scheduler") && Catch::Contains("random"));
  CHECK_FALSE(parseRenderConfig({{"cluster-cidr", "not-a-cidr"}}));

  // mh carries the fallback flag, as upstream sets it.
  auto mh = parseRenderConfig({{"ipvs-scheduler", "mh"}});
  REQUIRE(mh);
  const Fragment f = IpvsRenderer(*mh).renderServicePort(p);
  CHECK(f.virtualServers.front().sourceHashFallback);
  CHECK(toIpvsadm(f.virtualServers) ==
        "-A -t 10.96.0.30:80 -s mh -b mh-fallback\n-a -t 10.96.0.30:80 -r 10.244.0.30:80 -m -w 1\n");
  CHECK(toIpvsadm(f.virtualServers, IpvsadmStyle::kList) ==
        "Prot LocalAddress:Port Scheduler Flags\n"
        "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
        "TCP  10.96.0.30:80 mh (mh-fallback)\n"
        "  -> 10.244.0.30:80               Masq    1      0          0         \n");
}

TEST_CASE("ipvs renderer: upstream's iptables rules, as iptables-save prints them", "[unit]") {
  const auto r = renderer();
  const std::string want = R"(*nat
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-IPVS-FWMARK-PORTS - [0:0]
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m mark --mark 0x10000000/0x10000000 -j KUBE-IPVS-FWMARK-PORTS
-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m addrtype --dst-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m connmark --mark 0x4000/0x4000 -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-UDP dst -j RETURN
-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ
-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type \'hash ip:port\'" -m set --match-set KUBE-NODE-PORT-LOCAL-SCTP-HASH dst,dst -j RETURN
-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port for masquerade purpose with type \'hash ip:port\'" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ
-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -m mark --mark 0x10000000/0x10000000 -j CONNMARK --set-xmark 0x4000/0x4000
-A KUBE-MARK-MASQ -m mark --mark 0x10000000/0x10000000 -j RETURN
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
COMMIT
*filter
:FORWARD ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-A OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port + source cidr for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port + source IP for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-IP dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m mark --mark 0x10000000/0x10000000 -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
COMMIT
)";
  CHECK(renderIptables(r, net::Family::kIPv4, {}) == want);

  SECTION("a port's rules go between a chain's fixed head and tail") {
    auto p = servicePort("ns7", "itp", "172.30.0.47", 80, {endpoint("10.180.1.7", 80)});
    p.internalPolicyLocal = true;
    auto q = servicePort("ns6", "local", "172.30.0.46", 80, {endpoint("10.180.0.6", 80, true), endpoint("10.180.1.6", 80)});
    q.externalPolicyLocal = true;
    q.externalIPs = {"203.0.113.6"};
    const std::vector<sdk::ServicePort> ports{p, q};
    const std::string text = renderIptables(r, net::Family::kIPv4, ports);
    const auto at = [&](std::string_view line) { return text.find(line); };
    const std::string drop =
        "-d 172.30.0.47/32 -p tcp -m comment --comment \"ns7/itp:p has no local endpoints\" -m tcp --dport 80 -j DROP";
    CHECK(at("-A KUBE-IPVS-OUT-FILTER " + drop + "\n") != std::string::npos);
    CHECK(at("-A KUBE-IPVS-FILTER " + drop + "\n") < at("-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER"));
    const auto loopback = at("-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN\n");
    const auto dnat = at("-A KUBE-SERVICES -s 10.244.0.0/16 -d 203.0.113.6/32 -p tcp");
    const auto firstSet = at("-A KUBE-SERVICES -m comment --comment \"Kubernetes service lb portal\"");
    CHECK(loopback < dnat);
    CHECK(dnat < firstSet);
    CHECK(firstSet != std::string::npos);
  }
}

TEST_CASE("ipvs renderer: the ClusterIP masquerade rule follows the pod detector", "[unit]") {
  auto clusterIPRule = [](const RenderConfig& cfg, net::Family family) {
    for (const auto& c : IpvsRenderer(cfg).renderGlobal(family).chains)
      if (c.table == Table::kNat && c.name == "KUBE-SERVICES")
        for (const auto& rule : c.tail)
          if (rule.find("KUBE-MARK-MASQ") != std::string::npos && rule.find("CLUSTER-IP") != std::string::npos)
            return rule;
    return std::string();
  };
  const std::string comment =
      "-m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set ";
  RenderConfig cfg = config();
  CHECK(clusterIPRule(cfg, net::Family::kIPv6) ==
        "! -s fd00:10:244::/56 " + comment + "KUBE-6-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ");
  cfg.common.masqueradeAll = true;
  CHECK(clusterIPRule(cfg, net::Family::kIPv4) == comment + "KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ");
  // No detector: the node's connections, which leave from a VIP on kube-ipvs0.
  CHECK(clusterIPRule(RenderConfig{}, net::Family::kIPv4) == comment + "KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ");
  RenderConfig bridge;
  bridge.common.detectLocalMode = "InterfaceNamePrefix";
  bridge.common.interfaceNamePrefix = "veth";
  CHECK(clusterIPRule(bridge, net::Family::kIPv4) == "! -i veth+ " + comment + "KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ");

  const GlobalObjects v6 = IpvsRenderer(config()).renderGlobal(net::Family::kIPv6);
  CHECK(v6.chains.front().head == Strings{"-s ::1/128 -j RETURN"});
  CHECK(v6.chains.back().name == "KUBE-IPVS-FWMARK-PORTS");
  CHECK(v6.sets.at(1).name == "KUBE-6-CLUSTER-IP");
}

TEST_CASE("ipvs renderer: the chains kproxy owns in IPVS mode", "[unit]") {
  CHECK(ipvs::isOwnedChain(Table::kNat, "KUBE-SERVICES"));
  CHECK(ipvs::isOwnedChain(Table::kNat, "KUBE-LOAD-BALANCER"));
  CHECK(ipvs::isOwnedChain(Table::kFilter, "KUBE-IPVS-OUT-FILTER"));
  CHECK(ipvs::isOwnedChain(Table::kFilter, "KUBE-SOURCE-RANGES-FIREWALL"));
  // kubelet's, and the iptables mode's.
  CHECK_FALSE(ipvs::isOwnedChain(Table::kFilter, "KUBE-FIREWALL"));
  CHECK_FALSE(ipvs::isOwnedChain(Table::kNat, "KUBE-NODEPORTS"));
  CHECK_FALSE(ipvs::isOwnedChain(Table::kFilter, "KUBE-SERVICES"));
  CHECK_FALSE(ipvs::isOwnedChain(Table::kNat, "KUBE-SVC-XPGD46QRK7WJZT7O"));
}

TEST_CASE("ipvs renderer: pod detection by interface or by the node's pod CIDRs", "[unit]") {
  auto p = servicePort("ns6", "local", "172.30.0.46", 80, {endpoint("10.180.1.6", 80)});
  p.nodePort = 30006;
  p.externalPolicyLocal = true;
  sdk::NodeInfo n = node();
  n.nodePortAddresses.addresses = {"192.168.0.2"};

  RenderConfig bridge;
  bridge.common.detectLocalMode = "BridgeInterface";
  bridge.common.bridgeInterface = "cbr0";
  CHECK(rulesOf(renderer(bridge, n).renderServicePort(p), Table::kFilter, "KUBE-IPVS-FILTER") ==
        Strings{"-d 192.168.0.2/32 ! -i cbr0 -p tcp -m comment --comment \"ns6/local:p has no local endpoints\" -m tcp "
                "--dport 30006 -m addrtype ! --src-type LOCAL -j DROP"});

  RenderConfig nodeCIDR;
  nodeCIDR.common.detectLocalMode = "NodeCIDR";
  n.podCIDRs = {"10.244.3.0/24"};
  CHECK(rulesOf(renderer(nodeCIDR, n).renderServicePort(p), Table::kFilter, "KUBE-IPVS-FILTER") ==
        Strings{"! -s 10.244.3.0/24 -d 192.168.0.2/32 -p tcp -m comment --comment \"ns6/local:p has no local endpoints\" "
                "-m tcp --dport 30006 -m addrtype ! --src-type LOCAL -j DROP"});

  // No detector: pods are not told apart, so they are dropped like other sources (the plan).
  CHECK(rulesOf(renderer(RenderConfig{}, n).renderServicePort(p), Table::kFilter, "KUBE-IPVS-FILTER") ==
        Strings{"-d 192.168.0.2/32 -p tcp -m comment --comment \"ns6/local:p has no local endpoints\" -m tcp "
                "--dport 30006 -m addrtype ! --src-type LOCAL -j DROP"});
}

TEST_CASE("ipvs renderer: IPv6 global rules", "[unit]") {
  const std::string text = renderIptables(renderer(), net::Family::kIPv6, {});
  CHECK_THAT(text, Catch::Contains("-A KUBE-SERVICES -s ::1/128 -j RETURN\n"));
  CHECK_THAT(text, Catch::Contains("-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-6-IPVS-IPS "
                                   "dst -j REJECT --reject-with icmp6-port-unreachable\n"));
  CHECK_THAT(text, Catch::Contains("-m set --match-set KUBE-6-LOAD-BALANCER-SOURCE-CID dst,dst,src -j RETURN\n"));
  CHECK_THAT(text, !Catch::Contains(" KUBE-CLUSTER-IP "));
}

TEST_CASE("ipvs renderer: unallocated ClusterIPs of the ServiceCIDRs are dropped where pods and the node send", "[unit]") {
  auto drops = [](const IpvsRenderer& r, net::Family family) {
    Strings out;
    for (const auto& c : r.renderGlobal(family).chains)
      for (const auto& rule : c.tail)
        if (rule.find("unallocated ClusterIPs") != std::string::npos) out.push_back(c.name + " " + rule);
    return out;
  };
  IpvsRenderer r(config());
  CHECK(drops(r, net::Family::kIPv4).empty());
  r.setServiceCIDRs({{"kubernetes", "10.96.0.0/16"}, {"extra", "10.96.8.0/24"}, {"v6", "fd00:10:96::/112"}});
  const std::string v4 =
      " -d 10.96.0.0/16 -m comment --comment \"unallocated ClusterIPs of ServiceCIDR kubernetes,extra\" "
      "-m addrtype ! --dst-type LOCAL -j DROP";
  CHECK(drops(r, net::Family::kIPv4) == Strings{"KUBE-PROXY-FIREWALL" + v4, "KUBE-IPVS-OUT-FILTER" + v4});
  // Each is tagged for the tracer, by its identity in the ruleset.
  Strings tagged;
  for (const auto& tag : r.renderGlobal(net::Family::kIPv4).tags)
    if (tag.reason == plan::DropReason::kUnallocatedClusterIP) tagged.push_back(tag.chain + " " + tag.spec);
  CHECK(tagged == drops(r, net::Family::kIPv4));
  const auto v6 = drops(r, net::Family::kIPv6);
  REQUIRE(v6.size() == 2);
  CHECK(v6[0].find("-d fd00:10:96::/112 ") != std::string::npos);
  // Removed ServiceCIDRs take their drops with them.
  r.setServiceCIDRs({});
  CHECK(drops(r, net::Family::kIPv4).empty());
}

TEST_CASE("ipvs renderer: ClientIP affinity: filter rules that see the endpoints' port", "[unit]") {
  const auto r = renderer();
  // eTP=Local without a local endpoint: the external virtual server holds the cluster pool for
  // the short-circuit; what is not short-circuited is dropped by its mark (its port changed).
  auto p = servicePort("ns11", "fw", "172.30.0.51", 80, {endpoint("10.180.1.11", 8080)});
  p.type = sdk::ServiceType::kLoadBalancer;
  p.nodePort = 30011;
  p.externalPolicyLocal = true;
  p.sessionAffinityClientIP = true;
  p.loadBalancerIPs = {"5.6.7.11"};
  p.loadBalancerSourceRanges = {"203.0.113.0/25"};
  const Fragment f = r.renderServicePort(p);
  REQUIRE(f.virtualServers.size() == 1);  // both pools are the cluster's here
  const std::uint32_t mark = f.virtualServers.front().fwmark;
  const Strings drops = rulesOf(f, Table::kFilter, "KUBE-IPVS-FILTER");
  CHECK(drops.size() == 3);  // the LB IP and the two NodePort addresses
  for (const auto& d : drops) {
    CHECK(d.find(fmt::format("-m mark --mark {:#x} ", mark)) != std::string::npos);
    CHECK(d.find("--dport") == std::string::npos);
  }
  // The source ranges hold the LB IP with the service's port and with the endpoints'.
  const Strings entries = entriesOf(f);
  for (const auto* e : {"add KUBE-LOAD-BALANCER-FW 5.6.7.11,tcp:80", "add KUBE-LOAD-BALANCER-FW 5.6.7.11,tcp:8080",
                        "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.11,tcp:80,203.0.113.0/25",
                        "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.11,tcp:8080,203.0.113.0/25"})
    CHECK(std::find(entries.begin(), entries.end(), e) != entries.end());
  // The short-circuit goes to the ClusterIP with the endpoints' port.
  for (const auto& rule : rulesOf(f, Table::kNat, "KUBE-SERVICES"))
    if (rule.find("-j DNAT") != std::string::npos) CHECK(rule.ends_with("--to-destination 172.30.0.51:8080"));
}

TEST_CASE("IPVS renderer: KUBE-IPVS-FILTER's reject of a service address's other ports is tagged", "[unit]") {
  for (net::Family family : {net::Family::kIPv4, net::Family::kIPv6}) {
    const GlobalObjects g = renderer().renderGlobal(family);
    Strings tagged;
    for (const auto& tag : g.tags)
      if (tag.reason == plan::DropReason::kServiceAddressPort) tagged.push_back(tag.chain + " " + tag.spec);
    REQUIRE(tagged.size() == 1);
    CHECK(tagged[0].starts_with("KUBE-IPVS-FILTER "));
    CHECK(tagged[0].find("-m conntrack --ctstate NEW -m set --match-set ") != std::string::npos);
    CHECK(tagged[0].find("IPVS-IPS dst -j REJECT") != std::string::npos);
    CHECK(tagged[0].find("-j REJECT --reject-with icmp") != std::string::npos);
    // The tag names a rule of the chain as the kernel is given it.
    Strings filter;
    for (const auto& c : g.chains)
      if (c.name == "KUBE-IPVS-FILTER")
        for (const auto& r : c.tail) filter.push_back("KUBE-IPVS-FILTER " + r);
    CHECK(std::find(filter.begin(), filter.end(), tagged[0]) != filter.end());
  }
}
