// Resolution rules, one case per upstream rule: service -> service ports (serviceport.go,
// servicechangetracker.go), slices -> endpoints (endpointslicecache.go) and endpoint
// categorisation (topology.go / topology_test.go).
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "kproxy/core/log.h"
#include "resolve.h"

namespace net = kproxy::net;

using namespace kproxy::core;
using namespace kproxy::core::resolve;

namespace {

// Silences the log for the duration of a test (invalid input is logged on purpose).
struct QuietLog {
  QuietLog() : previous(kproxy::log::setSink([this](kproxy::log::Severity, std::string_view line) {
                 lines.emplace_back(line);
               })) {}
  ~QuietLog() { kproxy::log::setSink(previous); }
  bool mentions(std::string_view needle) const {
    for (const auto& l : lines) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  std::vector<std::string> lines;
  kproxy::log::Sink previous;
};

Service clusterIPService(std::string name = "web") {
  Service s;
  s.ns = "default";
  s.name = std::move(name);
  s.clusterIPs = {"10.96.0.10"};
  s.ipFamilies = {net::Family::kIPv4};
  ServicePortSpec p;
  p.name = "http";
  p.port = 80;
  p.targetPort.number = 8080;
  s.ports = {p};
  return s;
}

ServicePortState portOf(const Service& svc, std::size_t i = 0, TrackerConfig config = {}) {
  auto ports = servicePorts(svc, config);
  REQUIRE(ports.size() > i);
  return ports[i];
}

EndpointPort slicePort(std::string name, std::int32_t port, Protocol protocol = Protocol::kTCP) {
  EndpointPort p;
  p.name = std::move(name);
  p.port = port;
  p.protocol = protocol;
  return p;
}

SliceEndpoint sliceEndpoint(std::string ip, std::optional<bool> ready = std::nullopt,
                            std::optional<bool> serving = std::nullopt,
                            std::optional<bool> terminating = std::nullopt,
                            std::optional<std::string> node = std::nullopt) {
  SliceEndpoint e;
  e.addresses = {std::move(ip)};
  e.conditions.ready = ready;
  e.conditions.serving = serving;
  e.conditions.terminating = terminating;
  e.nodeName = std::move(node);
  return e;
}

EndpointSlice slice(std::string name, std::vector<SliceEndpoint> endpoints,
                    std::vector<EndpointPort> ports = {slicePort("http", 8080)},
                    AddressType type = AddressType::kIPv4) {
  EndpointSlice s;
  s.ns = "default";
  s.name = std::move(name);
  s.serviceName = "web";
  s.addressType = type;
  s.ports = std::move(ports);
  s.endpoints = std::move(endpoints);
  return s;
}

std::vector<EndpointCandidate> gather(const ServicePortState& port,
                                      const std::vector<EndpointSlice>& slices,
                                      const std::string& node = "node-a") {
  std::vector<const EndpointSlice*> ptrs;
  for (const auto& s : slices) ptrs.push_back(&s);
  return gatherEndpoints(port, ptrs, node);
}

std::vector<std::string> strs(const std::vector<EndpointCandidate>& eps) {
  std::vector<std::string> out;
  for (const auto& c : eps) out.push_back(c.endpoint.str());
  return out;
}

using Set = std::set<std::string>;
Set set(const std::vector<Endpoint>& eps) {
  Set out;
  for (const auto& e : eps) out.insert(e.str());
  return out;
}

// An endpoint for categorisation tests, in upstream topology_test.go style.
struct Ep {
  std::string addr;
  bool ready = true;
  bool serving = true;
  bool terminating = false;
  bool local = false;
  std::vector<std::string> zones = {};
  std::vector<std::string> nodes = {};
};

std::vector<EndpointCandidate> candidates(const std::vector<Ep>& eps) {
  std::vector<EndpointCandidate> out;
  for (const auto& e : eps) {
    EndpointCandidate c;
    const auto colon = e.addr.rfind(':');
    c.endpoint.ip = e.addr.substr(0, colon);
    c.endpoint.port = std::stoi(e.addr.substr(colon + 1));
    c.endpoint.ready = e.ready;
    c.endpoint.serving = e.serving;
    c.endpoint.terminating = e.terminating;
    c.endpoint.isLocal = e.local;
    c.zoneHints = e.zones;
    c.nodeHints = e.nodes;
    out.push_back(std::move(c));
  }
  return out;
}

// Service port with the given policies (upstream's BaseServicePortInfo in tests).
ServicePortState policyPort(bool internalLocal, bool externalLocal, std::int32_t nodePort = 0) {
  ServicePortState p;
  p.key.name = "default/web:http";
  p.internalPolicy = internalLocal ? TrafficPolicy::kLocal : TrafficPolicy::kCluster;
  p.externalPolicy = externalLocal ? TrafficPolicy::kLocal : TrafficPolicy::kCluster;
  p.nodePort = nodePort;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Service -> service ports
// ---------------------------------------------------------------------------------------------

TEST_CASE("service port keys are ns/name:port, ns/name when the port is unnamed", "[unit][resolve]") {
  Service svc = clusterIPService();
  auto port = portOf(svc);
  CHECK(port.key.name == "default/web:http");
  CHECK(port.key.family == net::Family::kIPv4);
  CHECK(port.ns == "default");
  CHECK(port.serviceName == "web");
  CHECK(port.portName == "http");
  CHECK(port.clusterIP == "10.96.0.10");
  CHECK(port.port == 80);
  CHECK(port.protocol == Protocol::kTCP);

  svc.ports[0].name = "";
  CHECK(portOf(svc).key.name == "default/web");
}

TEST_CASE("one service port per port and per cluster IP family", "[unit][resolve]") {
  Service svc = clusterIPService();
  svc.clusterIPs = {"10.96.0.10", "fd00:0:0:0::a"};
  svc.ipFamilies = {net::Family::kIPv4, net::Family::kIPv6};
  ServicePortSpec dns;
  dns.name = "dns";
  dns.port = 53;
  dns.protocol = Protocol::kUDP;
  svc.ports.push_back(dns);
  svc.externalIPs = {"192.0.2.1", "2001:db8::1"};
  svc.loadBalancerIngress = {{"198.51.100.7", "", std::nullopt}, {"2001:db8::7", "", std::nullopt}};
  svc.loadBalancerSourceRanges = {" 203.0.113.0/24 ", "2001:db8:1::/48"};
  svc.type = ServiceType::kLoadBalancer;

  auto ports = servicePorts(svc, {});
  REQUIRE(ports.size() == 4);
  std::set<std::pair<net::Family, std::string>> keys;
  for (const auto& p : ports) {
    keys.insert({p.key.family, p.key.name});
    if (p.key.family == net::Family::kIPv4) {
      CHECK(p.clusterIP == "10.96.0.10");
      CHECK(p.externalIPs == std::vector<std::string>{"192.0.2.1"});
      CHECK(p.loadBalancerVIPs == std::vector<std::string>{"198.51.100.7"});
      CHECK(p.loadBalancerSourceRanges == std::vector<std::string>{"203.0.113.0/24"});
    } else {
      CHECK(p.clusterIP == "fd00::a");  // canonical form
      CHECK(p.externalIPs == std::vector<std::string>{"2001:db8::1"});
      CHECK(p.loadBalancerVIPs == std::vector<std::string>{"2001:db8::7"});
      CHECK(p.loadBalancerSourceRanges == std::vector<std::string>{"2001:db8:1::/48"});
    }
  }
  CHECK(keys.size() == 4);
  CHECK(keys.contains({net::Family::kIPv6, "default/web:dns"}));
}

TEST_CASE("cluster IP family comes from the address when ipFamilies is absent", "[unit][resolve]") {
  Service svc = clusterIPService();
  svc.clusterIPs = {"fd00::10"};
  svc.ipFamilies = {};
  auto port = portOf(svc);
  CHECK(port.key.family == net::Family::kIPv6);
  CHECK(port.clusterIP == "fd00::10");
}

TEST_CASE("load balancer ingress in ipMode Proxy is not a VIP", "[unit][resolve]") {
  Service svc = clusterIPService();
  svc.type = ServiceType::kLoadBalancer;
  svc.loadBalancerIngress = {{"198.51.100.1", "", LoadBalancerIPMode::kProxy},
                             {"198.51.100.2", "", LoadBalancerIPMode::kVIP},
                             {"198.51.100.3", "", std::nullopt},
                             {"", "lb.example.com", std::nullopt}};
  CHECK(portOf(svc).loadBalancerVIPs == std::vector<std::string>{"198.51.100.2", "198.51.100.3"});
}

TEST_CASE("externalTrafficPolicy Local only applies to externally accessible services", "[unit][resolve]") {
  Service svc = clusterIPService();
  svc.externalTrafficPolicy = TrafficPolicy::kLocal;

  SECTION("ClusterIP without external IPs: Cluster") {
    CHECK(portOf(svc).externalPolicy == TrafficPolicy::kCluster);
  }
  SECTION("ClusterIP with external IPs: Local") {
    svc.externalIPs = {"192.0.2.1"};
    CHECK(portOf(svc).externalPolicy == TrafficPolicy::kLocal);
  }
  SECTION("ClusterIP whose external IPs are all of the other family: still Local (service-level rule)") {
    svc.externalIPs = {"2001:db8::1"};
    auto port = portOf(svc);
    CHECK(port.externalPolicy == TrafficPolicy::kLocal);
    CHECK(port.externalIPs.empty());
    CHECK_FALSE(port.externallyAccessible());
  }
  SECTION("NodePort: Local") {
    svc.type = ServiceType::kNodePort;
    svc.ports[0].nodePort = 30080;
    auto port = portOf(svc);
    CHECK(port.externalPolicy == TrafficPolicy::kLocal);
    CHECK(port.nodePort == 30080);
    CHECK(port.healthCheckNodePort == 0);  // only load balancers get a health check
  }
  SECTION("LoadBalancer: Local with its healthCheckNodePort") {
    svc.type = ServiceType::kLoadBalancer;
    svc.healthCheckNodePort = 32000;
    auto port = portOf(svc);
    CHECK(port.externalPolicy == TrafficPolicy::kLocal);
    CHECK(port.healthCheckNodePort == 32000);
  }
  SECTION("LoadBalancer with Cluster policy: no health check port") {
    svc.type = ServiceType::kLoadBalancer;
    svc.externalTrafficPolicy = TrafficPolicy::kCluster;
    svc.healthCheckNodePort = 32000;
    CHECK(portOf(svc).healthCheckNodePort == 0);
  }
}

TEST_CASE("internalTrafficPolicy and session affinity are carried over", "[unit][resolve]") {
  Service svc = clusterIPService();
  CHECK(portOf(svc).internalPolicy == TrafficPolicy::kCluster);
  CHECK_FALSE(portOf(svc).sessionAffinityClientIP);
  CHECK(portOf(svc).stickyMaxAgeSeconds == 0);

  svc.internalTrafficPolicy = TrafficPolicy::kLocal;
  svc.sessionAffinity = SessionAffinity::kClientIP;
  svc.sessionAffinityTimeoutSeconds = 600;
  auto port = portOf(svc);
  CHECK(port.internalPolicy == TrafficPolicy::kLocal);
  CHECK(port.sessionAffinityClientIP);
  CHECK(port.stickyMaxAgeSeconds == 600);
}

TEST_CASE("services that are not proxied produce no ports", "[unit][resolve]") {
  QuietLog quiet;
  Service svc = clusterIPService();
  SECTION("headless (None)") {
    svc.clusterIPs = {"None"};
    CHECK(servicePorts(svc, {}).empty());
  }
  SECTION("no cluster IP") {
    svc.clusterIPs = {};
    CHECK(servicePorts(svc, {}).empty());
  }
  SECTION("ExternalName") {
    svc.type = ServiceType::kExternalName;
    svc.externalName = "example.com";
    CHECK(servicePorts(svc, {}).empty());
  }
  SECTION("labelled for another proxy") {
    svc.labels[kLabelServiceProxyName] = "other-proxy";
    CHECK(servicePorts(svc, {}).empty());
    TrackerConfig mine;
    mine.serviceProxyName = "kproxy";
    CHECK(servicePorts(svc, mine).empty());
    mine.serviceProxyName = "other-proxy";
    CHECK(servicePorts(svc, mine).size() == 1);
  }
}

TEST_CASE("disabled IP families are skipped", "[unit][resolve]") {
  QuietLog quiet;
  Service svc = clusterIPService();
  svc.clusterIPs = {"10.96.0.10", "fd00::a"};
  svc.ipFamilies = {net::Family::kIPv4, net::Family::kIPv6};
  TrackerConfig v4only;
  v4only.ipv6 = false;
  auto ports = servicePorts(svc, v4only);
  REQUIRE(ports.size() == 1);
  CHECK(ports[0].key.family == net::Family::kIPv4);

  TrackerConfig v6only;
  v6only.ipv4 = false;
  ports = servicePorts(svc, v6only);
  REQUIRE(ports.size() == 1);
  CHECK(ports[0].key.family == net::Family::kIPv6);
}

TEST_CASE("malformed parts are skipped with a log line, the rest is kept", "[unit][resolve]") {
  QuietLog quiet;
  Service svc = clusterIPService();

  SECTION("invalid cluster IP of one family") {
    svc.clusterIPs = {"10.96.0.10", "not-an-ip"};
    svc.ipFamilies = {net::Family::kIPv4, net::Family::kIPv6};
    auto ports = servicePorts(svc, {});
    REQUIRE(ports.size() == 1);
    CHECK(ports[0].key.family == net::Family::kIPv4);
    CHECK(quiet.mentions("default/web"));
    CHECK(quiet.mentions("not-an-ip"));
  }
  SECTION("port out of range") {
    ServicePortSpec bad;
    bad.name = "bad";
    bad.port = 70000;
    svc.ports.push_back(bad);
    auto ports = servicePorts(svc, {});
    REQUIRE(ports.size() == 1);
    CHECK(ports[0].portName == "http");
    CHECK(quiet.mentions("70000"));
  }
  SECTION("invalid external IP and source range") {
    svc.type = ServiceType::kLoadBalancer;
    svc.externalIPs = {"192.0.2.300", "192.0.2.4"};
    svc.loadBalancerSourceRanges = {"10.0.0.0/33", "10.1.2.3/16"};
    auto port = portOf(svc);
    CHECK(port.externalIPs == std::vector<std::string>{"192.0.2.4"});
    CHECK(port.loadBalancerSourceRanges == std::vector<std::string>{"10.1.0.0/16"});
    CHECK(quiet.mentions("192.0.2.300"));
  }
}

// ---------------------------------------------------------------------------------------------
// EndpointSlices -> endpoints of a service port
// ---------------------------------------------------------------------------------------------

TEST_CASE("endpoint ports are matched by name and protocol", "[unit][resolve]") {
  QuietLog quiet;
  auto port = portOf(clusterIPService());
  std::vector<EndpointSlice> slices = {
      slice("a", {sliceEndpoint("10.0.0.1")},
            {slicePort("http", 8080), slicePort("metrics", 9090), slicePort("http", 8081, Protocol::kUDP)}),
  };
  CHECK(strs(gather(port, slices)) == std::vector<std::string>{"10.0.0.1:8080"});

  // Missing protocol means TCP (API default).
  EndpointPort noProto;
  noProto.name = "http";
  noProto.port = 7070;
  slices = {slice("a", {sliceEndpoint("10.0.0.1")}, {noProto})};
  CHECK(strs(gather(port, slices)) == std::vector<std::string>{"10.0.0.1:7070"});

  // A port without a name, or without a number, is ignored.
  EndpointPort noName;
  noName.port = 8080;
  EndpointPort noNumber;
  noNumber.name = "http";
  slices = {slice("a", {sliceEndpoint("10.0.0.1")}, {noName, noNumber})};
  CHECK(gather(port, slices).empty());
}

TEST_CASE("endpoint conditions default like upstream: ready and serving true, terminating false", "[unit][resolve]") {
  auto port = portOf(clusterIPService());
  std::vector<EndpointSlice> slices = {slice(
      "a", {sliceEndpoint("10.0.0.1"), sliceEndpoint("10.0.0.2", false, std::nullopt, true),
            sliceEndpoint("10.0.0.3", false, false, true)})};
  auto eps = gather(port, slices);
  REQUIRE(eps.size() == 3);
  CHECK(eps[0].endpoint.ready);
  CHECK(eps[0].endpoint.serving);
  CHECK_FALSE(eps[0].endpoint.terminating);
  CHECK_FALSE(eps[1].endpoint.ready);
  CHECK(eps[1].endpoint.serving);
  CHECK(eps[1].endpoint.terminating);
  CHECK_FALSE(eps[2].endpoint.serving);
}

TEST_CASE("only the first address counts; locality, zone and hints are kept", "[unit][resolve]") {
  auto port = portOf(clusterIPService());
  SliceEndpoint e = sliceEndpoint("10.0.0.1", true, true, false, "node-a");
  e.addresses.push_back("10.0.0.99");
  e.zone = "zone-a";
  e.hints = EndpointHints{{"zone-a"}, {"node-a"}};
  SliceEndpoint remote = sliceEndpoint("10.0.0.2", true, true, false, "node-b");
  SliceEndpoint empty;
  std::vector<EndpointSlice> slices = {slice("a", {e, remote, empty})};
  auto eps = gather(port, slices, "node-a");
  REQUIRE(eps.size() == 2);
  CHECK(eps[0].endpoint.str() == "10.0.0.1:8080");
  CHECK(eps[0].endpoint.isLocal);
  CHECK(eps[0].endpoint.nodeName == "node-a");
  CHECK(eps[0].endpoint.zone == "zone-a");
  CHECK(eps[0].zoneHints == std::vector<std::string>{"zone-a"});
  CHECK(eps[0].nodeHints == std::vector<std::string>{"node-a"});
  CHECK_FALSE(eps[1].endpoint.isLocal);

  // No node name configured: nothing is local.
  CHECK_FALSE(gather(port, slices, "")[0].endpoint.isLocal);

  // The feature gate PreferSameTrafficDistribution off: node hints are dropped, zone hints kept,
  // as upstream's endpoint cache does.
  std::vector<const EndpointSlice*> ptrs = {&slices[0]};
  auto withoutNodeHints = gatherEndpoints(port, ptrs, "node-a", /*useNodeHints=*/false);
  CHECK(withoutNodeHints[0].nodeHints.empty());
  CHECK(withoutNodeHints[0].zoneHints == std::vector<std::string>{"zone-a"});
}

TEST_CASE("duplicates across slices: the non-terminating endpoint wins", "[unit][resolve]") {
  auto port = portOf(clusterIPService());
  std::vector<EndpointSlice> slices = {
      slice("a", {sliceEndpoint("10.0.0.1", true)}),
      slice("b", {sliceEndpoint("10.0.0.1", false, true, true)}),
  };
  auto eps = gather(port, slices);
  REQUIRE(eps.size() == 1);
  CHECK(eps[0].endpoint.ready);
  CHECK_FALSE(eps[0].endpoint.terminating);

  // Reversed order: same answer.
  std::swap(slices[0], slices[1]);
  eps = gather(port, slices);
  REQUIRE(eps.size() == 1);
  CHECK(eps[0].endpoint.ready);
}

TEST_CASE("slices of another family, FQDN slices and wrong-family addresses are ignored", "[unit][resolve]") {
  QuietLog quiet;
  auto port = portOf(clusterIPService());
  std::vector<EndpointSlice> slices = {
      slice("v6", {sliceEndpoint("fd00::1")}, {slicePort("http", 8080)}, AddressType::kIPv6),
      slice("fqdn", {sliceEndpoint("example.com")}, {slicePort("http", 8080)}, AddressType::kFQDN),
      slice("v4", {sliceEndpoint("fd00::2"), sliceEndpoint("10.0.0.3")}),
  };
  CHECK(strs(gather(port, slices)) == std::vector<std::string>{"10.0.0.3:8080"});

  Service v6 = clusterIPService();
  v6.clusterIPs = {"fd00::10"};
  v6.ipFamilies = {net::Family::kIPv6};
  CHECK(strs(gather(portOf(v6), slices)) == std::vector<std::string>{"[fd00::1]:8080"});
}

TEST_CASE("endpoints come out sorted by (ip, port)", "[unit][resolve]") {
  auto port = portOf(clusterIPService());
  std::vector<EndpointSlice> slices = {
      slice("b", {sliceEndpoint("10.0.0.9"), sliceEndpoint("10.0.0.10")}, {slicePort("http", 81)}),
      slice("a", {sliceEndpoint("10.0.0.9")}, {slicePort("http", 80)}),
  };
  CHECK(strs(gather(port, slices)) ==
        std::vector<std::string>{"10.0.0.10:81", "10.0.0.9:80", "10.0.0.9:81"});
}

// ---------------------------------------------------------------------------------------------
// CategorizeEndpoints (topology.go)
// ---------------------------------------------------------------------------------------------

TEST_CASE("CategorizeEndpoints: no endpoints", "[unit][resolve][topology]") {
  auto r = categorizeEndpoints({}, policyPort(true, false), "node-a", "zone-a");
  CHECK(r.clusterEndpoints.empty());
  CHECK(r.localEndpoints.empty());
  CHECK(r.allReachableEndpoints.empty());
  CHECK_FALSE(r.hasAnyEndpoints);
}

TEST_CASE("CategorizeEndpoints: zone hints", "[unit][resolve][topology]") {
  const auto port = policyPort(false, false);
  const std::vector<Ep> hinted = {
      {"10.1.2.3:80", true, true, false, false, {"zone-a"}},
      {"10.1.2.4:80", true, true, false, false, {"zone-b"}},
      {"10.1.2.5:80", true, true, false, false, {"zone-c"}},
      {"10.1.2.6:80", true, true, false, false, {"zone-a"}},
  };
  const Set all = {"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"};

  SECTION("every ready endpoint hinted, one for this zone: filter to the zone") {
    auto r = categorizeEndpoints(candidates(hinted), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.1.2.3:80", "10.1.2.6:80"});
    CHECK(set(r.allReachableEndpoints) == Set{"10.1.2.3:80", "10.1.2.6:80"});
    CHECK(r.localEndpoints.empty());
    CHECK(r.hasAnyEndpoints);
  }
  SECTION("one endpoint without hints: hints ignored") {
    auto eps = hinted;
    eps[2].zones.clear();
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == all);
  }
  SECTION("node without a zone label: hints ignored") {
    auto r = categorizeEndpoints(candidates(hinted), port, "node-a", "");
    CHECK(set(r.clusterEndpoints) == all);
  }
  SECTION("no endpoint hinted for this zone: hints ignored") {
    auto r = categorizeEndpoints(candidates(hinted), port, "node-a", "zone-z");
    CHECK(set(r.clusterEndpoints) == all);
  }
  SECTION("unready endpoints neither count for nor against hints") {
    auto eps = hinted;
    eps[3].ready = false;     // zone-a but unready: filtered out
    eps.push_back({"10.1.2.7:80", false, false, false, false, {}});  // unready, unhinted
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.1.2.3:80"});
  }
  SECTION("only unready endpoints in this zone: no filtering") {
    auto eps = hinted;
    eps[0].ready = false;
    eps[3].ready = false;
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.1.2.4:80", "10.1.2.5:80"});
  }
  SECTION("multiple zones per endpoint") {
    std::vector<Ep> eps = {
        {"10.1.2.3:80", true, true, false, false, {"zone-a", "zone-b", "zone-c"}},
        {"10.1.2.4:80", true, true, false, false, {"zone-b", "zone-c"}},
        {"10.1.2.5:80", true, true, false, false, {"zone-b", "zone-d"}},
        {"10.1.2.6:80", true, true, false, false, {"zone-c"}},
    };
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-c");
    CHECK(set(r.clusterEndpoints) == Set{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"});
  }
}

TEST_CASE("CategorizeEndpoints: node hints (PreferSameNode)", "[unit][resolve][topology]") {
  const auto port = policyPort(false, false);
  std::vector<Ep> eps = {
      {"10.0.0.1:80", true, true, false, true, {"zone-a"}, {"node-a"}},
      {"10.0.0.2:80", true, true, false, false, {"zone-a"}, {"node-b"}},
      {"10.0.0.3:80", true, true, false, false, {"zone-b"}, {"node-c"}},
  };
  SECTION("every endpoint has node hints and one is for this node") {
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80"});
  }
  SECTION("no node hint for this node: fall back to zone hints") {
    auto r = categorizeEndpoints(candidates(eps), port, "node-x", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80", "10.0.0.2:80"});
  }
  SECTION("one endpoint without node hints: fall back to zone hints") {
    eps[2].nodes.clear();
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80", "10.0.0.2:80"});
  }
}

TEST_CASE("CategorizeEndpoints: ready first, then serving+terminating fallback", "[unit][resolve][topology]") {
  const auto port = policyPort(false, false);
  SECTION("ready endpoints are used, terminating ones are not") {
    std::vector<Ep> eps = {{"10.0.0.1:80"}, {"10.0.0.2:80", false, true, true}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80"});
  }
  SECTION("no ready endpoint: serving terminating endpoints") {
    std::vector<Ep> eps = {{"10.0.0.1:80", false, true, true},
                           {"10.0.0.2:80", false, false, true},
                           {"10.0.0.3:80", false, false, false}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80"});
    CHECK(r.hasAnyEndpoints);
  }
  SECTION("nothing serving: no endpoints at all") {
    std::vector<Ep> eps = {{"10.0.0.2:80", false, false, true}, {"10.0.0.3:80", false, false, false}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(r.clusterEndpoints.empty());
    CHECK(r.allReachableEndpoints.empty());
    CHECK_FALSE(r.hasAnyEndpoints);
  }
}

TEST_CASE("CategorizeEndpoints: internalTrafficPolicy Local", "[unit][resolve][topology]") {
  const auto port = policyPort(true, false);
  SECTION("all endpoints remote: no local endpoints, but the service has endpoints") {
    std::vector<Ep> eps = {{"10.0.0.0:80"}, {"10.0.0.1:80"}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(r.clusterEndpoints.empty());  // not used
    CHECK(r.localEndpoints.empty());
    CHECK(r.allReachableEndpoints.empty());
    CHECK(r.hasAnyEndpoints);
  }
  SECTION("local ready endpoints") {
    std::vector<Ep> eps = {{"10.0.0.0:80", true, true, false, true}, {"10.0.0.1:80"}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.localEndpoints) == Set{"10.0.0.0:80"});
    CHECK(set(r.allReachableEndpoints) == Set{"10.0.0.0:80"});
  }
  SECTION("no local ready endpoint: local serving+terminating ones") {
    std::vector<Ep> eps = {{"10.0.0.0:80", false, true, true, true},
                           {"10.0.0.1:80", false, false, true, true},
                           {"10.0.0.2:80"}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.localEndpoints) == Set{"10.0.0.0:80"});
    CHECK(r.hasAnyEndpoints);
  }
  SECTION("local ready endpoints win over local terminating ones") {
    std::vector<Ep> eps = {{"10.0.0.0:80", false, true, true, true}, {"10.0.0.1:80", true, true, false, true}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.localEndpoints) == Set{"10.0.0.1:80"});
  }
  SECTION("topology is ignored for local endpoints (with external access)") {
    auto external = policyPort(true, false, 30080);
    std::vector<Ep> eps = {
        {"10.1.2.3:80", true, true, false, true, {"zone-a"}},
        {"10.1.2.4:80", true, true, false, true, {"zone-b"}},
        {"10.1.2.5:80", true, true, false, false, {"zone-c"}},
        {"10.1.2.6:80", true, true, false, false, {"zone-a"}},
    };
    auto r = categorizeEndpoints(candidates(eps), external, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.1.2.3:80", "10.1.2.6:80"});
    CHECK(set(r.localEndpoints) == Set{"10.1.2.3:80", "10.1.2.4:80"});
    CHECK(set(r.allReachableEndpoints) == Set{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"});
  }
}

TEST_CASE("CategorizeEndpoints: externalTrafficPolicy Local", "[unit][resolve][topology]") {
  const auto port = policyPort(false, true, 30080);
  SECTION("cluster endpoints for short-circuited traffic, local for external") {
    std::vector<Ep> eps = {{"10.0.0.0:80", true, true, false, true}, {"10.0.0.1:80"}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.0:80", "10.0.0.1:80"});
    CHECK(set(r.localEndpoints) == Set{"10.0.0.0:80"});
    CHECK(set(r.allReachableEndpoints) == Set{"10.0.0.0:80", "10.0.0.1:80"});
  }
  SECTION("only remote endpoints") {
    std::vector<Ep> eps = {{"10.0.0.1:80"}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(r.localEndpoints.empty());
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80"});
    CHECK(r.hasAnyEndpoints);
  }
  SECTION("local terminating endpoints are reachable although not in the cluster set") {
    std::vector<Ep> eps = {{"10.0.0.0:80", false, true, true, true}, {"10.0.0.1:80"}};
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.1:80"});
    CHECK(set(r.localEndpoints) == Set{"10.0.0.0:80"});
    CHECK(set(r.allReachableEndpoints) == Set{"10.0.0.0:80", "10.0.0.1:80"});
  }
  SECTION("conflicting topology and locality merge into allReachable") {
    std::vector<Ep> eps = {
        {"10.0.0.0:80", true, true, false, true, {"zone-a"}},
        {"10.0.0.1:80", true, true, false, true, {"zone-b"}},
        {"10.0.0.2:80", true, true, false, false, {"zone-a"}},
        {"10.0.0.3:80", true, true, false, false, {"zone-b"}},
    };
    auto r = categorizeEndpoints(candidates(eps), port, "node-a", "zone-a");
    CHECK(set(r.clusterEndpoints) == Set{"10.0.0.0:80", "10.0.0.2:80"});
    CHECK(set(r.localEndpoints) == Set{"10.0.0.0:80", "10.0.0.1:80"});
    CHECK(set(r.allReachableEndpoints) == Set{"10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"});
    // Sorted, no duplicates.
    REQUIRE(r.allReachableEndpoints.size() == 3);
    CHECK(r.allReachableEndpoints[0].str() == "10.0.0.0:80");
    CHECK(r.allReachableEndpoints[2].str() == "10.0.0.2:80");
  }
}

TEST_CASE("resolveService fills every endpoint set", "[unit][resolve]") {
  Service svc = clusterIPService();
  svc.type = ServiceType::kNodePort;
  svc.ports[0].nodePort = 30080;
  svc.externalTrafficPolicy = TrafficPolicy::kLocal;
  EndpointSlice s = slice("a", {sliceEndpoint("10.0.0.1", true, true, false, "node-a"),
                                sliceEndpoint("10.0.0.2", true, true, false, "node-b"),
                                sliceEndpoint("10.0.0.3", false, false, true, "node-b")});
  const EndpointSlice* ptrs[] = {&s};
  TrackerConfig config;
  config.nodeName = "node-a";
  auto states = resolveService(svc, ptrs, config, NodeInfo{});
  REQUIRE(states.size() == 1);
  const auto& st = *states[0];
  CHECK(set(st.clusterEndpoints) == Set{"10.0.0.1:8080", "10.0.0.2:8080"});
  CHECK(set(st.localEndpoints) == Set{"10.0.0.1:8080"});
  CHECK(set(st.allReachableEndpoints) == Set{"10.0.0.1:8080", "10.0.0.2:8080"});
  CHECK(set(st.allEndpoints) == Set{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"});
  CHECK(st.hasAnyEndpoints);
}

TEST_CASE("resolveService keeps equal endpoint sets once", "[unit][resolve]") {
  Service svc = clusterIPService();
  EndpointSlice s = slice("a", {sliceEndpoint("10.0.0.1", true, true, false, "node-a"),
                                sliceEndpoint("10.0.0.2", true, true, false, "node-b")});
  const EndpointSlice* ptrs[] = {&s};
  TrackerConfig config;
  config.nodeName = "node-a";
  auto states = resolveService(svc, ptrs, config, NodeInfo{});
  REQUIRE(states.size() == 1);
  const auto& st = *states[0];
  CHECK(set(st.allEndpoints) == Set{"10.0.0.1:8080", "10.0.0.2:8080"});
  CHECK(st.clusterEndpoints == st.allEndpoints);
  CHECK(st.clusterEndpoints.sharesStorage(st.allEndpoints));
  CHECK(st.allReachableEndpoints.sharesStorage(st.allEndpoints));
  CHECK(st.localEndpoints.empty());  // Cluster policy: no local set

  // Different sets keep their own storage.
  svc.internalTrafficPolicy = TrafficPolicy::kLocal;
  auto local = resolveService(svc, ptrs, config, NodeInfo{});
  REQUIRE(local.size() == 1);
  CHECK(set(local[0]->localEndpoints) == Set{"10.0.0.1:8080"});
  CHECK(set(local[0]->allEndpoints) == Set{"10.0.0.1:8080", "10.0.0.2:8080"});
  CHECK_FALSE(local[0]->localEndpoints.sharesStorage(local[0]->allEndpoints));
  CHECK(local[0]->allReachableEndpoints.sharesStorage(local[0]->localEndpoints));
}
