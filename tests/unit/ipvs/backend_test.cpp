// IpvsBackend over the fakes (FakeIpvs, FakeDummyLink, FakeIpsets, FakeIptables): full sync
// from empty, a restart that writes nothing, partial syncs of one or two netlink messages,
// foreign objects left alone, failures that force a full reconcile, graceful termination,
// cleanup, --dry-run through the printing adapters, and explain.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/ipvs/backend.h"
#include "kproxy/plugin/testing.h"

using namespace kproxy;
using namespace kproxy::ipvs;
using net::Prefix;
using plan::VectorSnapshot;

namespace {

constexpr net::Family kV4 = net::Family::kIPv4;

sdk::Endpoint endpoint(std::string ip, int port, bool local = false) {
  sdk::Endpoint e;
  e.ip = std::move(ip);
  e.port = port;
  e.isLocal = local;
  e.ready = true;
  e.serving = true;
  return e;
}

sdk::ServicePort servicePort(std::string name, std::string clusterIP, int port,
                             std::vector<sdk::Endpoint> endpoints,
                             sdk::Protocol protocol = sdk::Protocol::kTCP,
                             std::string portName = "p") {
  sdk::ServicePort p;
  p.family = clusterIP.find(':') == std::string::npos ? net::Family::kIPv4 : net::Family::kIPv6;
  p.protocol = protocol;
  p.ns = "default";
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

void setEndpoints(sdk::ServicePort& p, std::vector<sdk::Endpoint> endpoints) {
  p.allEndpoints = endpoints;
  p.allReachableEndpoints = endpoints;
  p.clusterEndpoints = endpoints;
  p.localEndpoints.clear();
  for (const auto& e : endpoints)
    if (e.isLocal) p.localEndpoints.push_back(e);
  p.hasAnyEndpoints = !endpoints.empty();
}

sdk::NodeInfo node() {
  sdk::NodeInfo n;
  n.name = "node-a";
  n.addresses = {"192.168.0.2"};
  n.nodePortAddresses.resolved = true;
  n.nodePortAddresses.addresses = {"192.168.0.2"};
  return n;
}

std::vector<sdk::ServicePort> services() {
  auto web = servicePort("web", "10.96.0.10", 80,
                         {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080)});
  auto web443 = servicePort("web", "10.96.0.10", 443, {endpoint("10.244.1.5", 8443)},
                            sdk::Protocol::kTCP, "tls");
  auto dns =
      servicePort("dns", "10.96.0.53", 53, {endpoint("10.244.1.7", 53)}, sdk::Protocol::kUDP);
  auto np = servicePort("np", "10.96.0.20", 80, {endpoint("10.244.1.8", 80, true)});
  np.type = sdk::ServiceType::kNodePort;
  np.nodePort = 30080;
  auto ext = servicePort("ext", "10.96.0.30", 80, {endpoint("10.244.2.9", 80)});
  ext.externalIPs = {"203.0.113.7"};
  return {web, web443, dns, np, ext};
}

/// A temporary /proc/sys look-alike with the sysctls IPVS mode sets, so no test writes the
/// host's.
class TempSysctls {
 public:
  TempSysctls() {
    char pattern[] = "/tmp/kproxy-ipvs-sysctl-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = made;
    for (const char* name : {"net/ipv4/vs/conntrack", "net/ipv4/vs/expire_nodest_conn",
                             "net/ipv4/vs/expire_quiescent_template", "net/ipv4/vs/conn_reuse_mode",
                             "net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce"}) {
      std::filesystem::create_directories((root_ / name).parent_path());
      std::ofstream(root_ / name) << (std::string_view(name).ends_with("conn_reuse_mode") ? "1\n"
                                                                                          : "0\n");
    }
  }
  ~TempSysctls() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  TempSysctls(const TempSysctls&) = delete;
  TempSysctls& operator=(const TempSysctls&) = delete;
  std::string root() const { return root_.string(); }
  std::string value(const std::string& name) const {
    std::ifstream in(root_ / name);
    std::string v;
    in >> v;
    return v;
  }

 private:
  std::filesystem::path root_;
};

/// The kernel the fakes hold; a backend made from it gets copies, a restart gets the state the
/// previous backend left.
struct Fixture {
  Fixture() : snap(services(), node()) { backend = make(); }

  std::unique_ptr<IpvsBackend> make(BackendSettings settings = {}) {
    settings.render.common.clusterCIDRs = {"10.244.0.0/16"};
    if (settings.kernelRelease.empty()) settings.kernelRelease = "5.4.0";
    settings.ipv6 = false;
    settings.now = [this] { return clock; };
    IpvsAdapters a;
    auto i = std::make_unique<FakeIpvs>(ipvsState);
    auto l = std::make_unique<FakeDummyLink>(linkState);
    auto s = std::make_unique<FakeIpsets>(ipsetState);
    auto t = std::make_unique<iptables::FakeIptables>(iptablesState);
    ipvs = i.get();
    link = l.get();
    ipsets = s.get();
    tables = t.get();
    if (settings.dryRun) {
      // As the factory does for --dry-run: printers over the fakes, and sysctls in memory.
      auto memory = std::make_unique<kernel::FakeSysctls>(freshSysctls());
      dryRunSysctls = memory.get();
      std::FILE* out = settings.dryRunOutput;
      a.ipvs = std::make_unique<PrintingIpvs>(std::move(i), out);
      a.link = std::make_unique<PrintingDummyLink>(std::move(l), out);
      a.ipsets = std::make_unique<PrintingIpsets>(std::move(s), out);
      a.iptables = std::make_unique<iptables::PrintingIptables>(std::move(t), out, "iptables-nft");
      a.sysctls = std::make_unique<kernel::PrintingSysctls>(std::move(memory), out);
    } else {
      a.ipvs = std::move(i);
      a.link = std::move(l);
      a.ipsets = std::move(s);
      a.iptables = std::move(t);
      a.sysctls = kernel::makeFileSysctls(sysctls.root());
    }
    return std::make_unique<IpvsBackend>(sdk::Host(nullptr), std::move(settings), std::move(a));
  }
  /// Forgets the writes made so far.
  void resetCounts() {
    ipvs->calls = ipvs->writes = 0;
    ipsets->restores.clear();
    tables->restores.clear();
  }
  /// Makes the backend a --dry-run one that prints to `out`.
  void dryRun(std::FILE* out, BackendSettings settings = {}) {
    settings.dryRun = true;
    settings.dryRunOutput = out;
    backend = make(std::move(settings));
  }
  /// Keeps the kernel as the current backend left it and makes a new backend over it.
  void restart(BackendSettings settings = {}) {
    keep();
    backend = make(std::move(settings));
  }
  void keep() {
    ipvsState = *ipvs;
    ipvsState.calls = ipvsState.writes = 0;
    linkState = *link;
    ipsetState = *ipsets;
    ipsetState.restores.clear();
    iptablesState = *tables;
    iptablesState.restores.clear();
  }

  sdk::Expected<sdk::SyncOutcome> full() { return backend->syncFrom(snap, {}, true); }
  sdk::Expected<sdk::SyncOutcome> partial(const std::vector<std::string>& keys) {
    std::vector<sdk::ChangedKey> changed;
    for (const auto& k : keys) changed.push_back({kV4, k});
    return backend->syncFrom(snap, changed, false);
  }
  sdk::ServicePort& port(const std::string& key) {
    for (auto& p : snap.ports())
      if (p.key == key) return p;
    FAIL("no port " << key);
    return snap.ports().front();
  }
  const FakeIpvs::Entry* server(const std::string& describe) const {
    for (const auto& e : ipvs->entries)
      if (e.vs.describe() == describe) return &e;
    return nullptr;
  }
  std::vector<std::string> servers() const {
    std::vector<std::string> out;
    for (const auto& e : ipvs->entries) out.push_back(e.vs.describe());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> reals(const std::string& describe) const {
    std::vector<std::string> out;
    if (const auto* e = server(describe))
      for (const auto& rs : e->realServers)
        out.push_back(rs.describe() + " w" + std::to_string(rs.weight));
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> addresses() const {
    std::vector<std::string> out;
    for (const auto& [name, l] : link->links)
      if (name == kDummyLinkName)
        for (const auto& a : l.addresses) out.push_back(a.toString());
    std::sort(out.begin(), out.end());
    return out;
  }
  bool hasLink() const {
    return std::any_of(link->links.begin(), link->links.end(),
                       [](const auto& l) { return l.first == kDummyLinkName; });
  }
  const std::set<std::string>* entries(const std::string& set) const {
    auto it = ipsets->state.sets.find(set);
    return it == ipsets->state.sets.end() ? nullptr : &it->second.entries;
  }
  std::vector<std::string> chain(iptables::Table t, const std::string& name) {
    for (const auto& c : tables->chains(kV4, t))
      if (c.name == name) return c.rules;
    return {};
  }
  bool hasChain(iptables::Table t, const std::string& name) {
    const auto& cs = tables->chains(kV4, t);
    return std::any_of(cs.begin(), cs.end(), [&](const auto& c) { return c.name == name; });
  }

  TempSysctls sysctls;
  kernel::FakeSysctls* dryRunSysctls = nullptr;  ///< the sysctls in memory of a --dry-run backend
  VectorSnapshot snap;
  std::chrono::steady_clock::time_point clock{};
  FakeIpvs ipvsState;
  FakeDummyLink linkState;
  FakeIpsets ipsetState;
  iptables::FakeIptables iptablesState;
  FakeIpvs* ipvs = nullptr;
  FakeDummyLink* link = nullptr;
  FakeIpsets* ipsets = nullptr;
  iptables::FakeIptables* tables = nullptr;
  std::unique_ptr<IpvsBackend> backend;
};

template <typename T>
bool ok(const sdk::Expected<T>& r) {
  if (!r) UNSCOPED_INFO("sync error: " << r.error().message);
  return r.has_value();
}

std::size_t bound(const Fixture& f, const std::string& address) {
  const auto all = f.addresses();
  return static_cast<std::size_t>(std::count(all.begin(), all.end(), address));
}

VirtualServer foreignServer(const std::string& address, std::uint16_t port) {
  VirtualServer vs;
  vs.address = *net::Prefix::parse(address);
  vs.port = port;
  vs.scheduler = "wlc";
  return vs;
}

RealServer real(const std::string& address, std::uint16_t port, std::uint32_t active = 0) {
  RealServer rs;
  rs.address = *net::Prefix::parse(address);
  rs.port = port;
  rs.activeConnections = active;
  return rs;
}

}  // namespace

TEST_CASE("a full sync from empty programs every virtual server, address, set and chain",
          "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  CHECK(f.servers() == std::vector<std::string>{"TCP 10.96.0.10:443", "TCP 10.96.0.10:80",
                                                "TCP 10.96.0.20:80", "TCP 10.96.0.30:80",
                                                "TCP 192.168.0.2:30080", "TCP 203.0.113.7:80",
                                                "UDP 10.96.0.53:53"});
  CHECK(f.reals("TCP 10.96.0.10:80") ==
        std::vector<std::string>{"10.244.1.5:8080 w1", "10.244.2.6:8080 w1"});
  CHECK(f.reals("TCP 192.168.0.2:30080") == std::vector<std::string>{"10.244.1.8:80 w1"});
  CHECK(f.server("TCP 10.96.0.10:80")->vs.scheduler == "rr");
  // The ClusterIP shared by two ports is bound once; NodePort addresses are the node's.
  CHECK(f.addresses() == std::vector<std::string>{"10.96.0.10", "10.96.0.20", "10.96.0.30",
                                                  "10.96.0.53", "203.0.113.7"});
  REQUIRE(f.entries("KUBE-CLUSTER-IP") != nullptr);
  CHECK(f.entries("KUBE-CLUSTER-IP")->contains("10.96.0.10,tcp:80"));
  CHECK(f.entries("KUBE-CLUSTER-IP")->contains("10.96.0.53,udp:53"));
  CHECK(f.entries("KUBE-NODE-PORT-TCP")->contains("30080"));
  CHECK(f.entries("KUBE-EXTERNAL-IP")->contains("203.0.113.7,tcp:80"));
  REQUIRE(f.entries("KUBE-IPVS-IPS") != nullptr);
  CHECK(f.entries("KUBE-IPVS-IPS")->size() == 5);
  CHECK(f.hasChain(iptables::Table::kNat, "KUBE-SERVICES"));
  CHECK(f.hasChain(iptables::Table::kFilter, "KUBE-IPVS-FILTER"));
  const auto output = f.chain(iptables::Table::kNat, "OUTPUT");
  CHECK(std::any_of(output.begin(), output.end(), [](const std::string& r) {
    return r.find("KUBE-SERVICES") != std::string::npos;
  }));
  // The kernel's ruleset is what the renderer renders, chain by chain.
  IpvsRenderer renderer([] {
    RenderConfig c;
    c.common.clusterCIDRs = {"10.244.0.0/16"};
    return c;
  }());
  renderer.setNode(node());
  renderer.setDummyInterfaceAddresses(f.addresses());
  auto wanted = backends::parseIptablesSave(renderIptables(renderer, kV4, f.snap.ports()));
  REQUIRE(wanted);
  for (const auto& table : wanted->tables)
    for (const auto& c : table.chains) {
      if (c.builtin()) continue;
      std::vector<std::string> specs;
      for (const auto& r : c.rules) specs.push_back(r.spec);
      INFO(table.name << " " << c.name);
      CHECK(f.chain(table.name == "nat" ? iptables::Table::kNat : iptables::Table::kFilter,
                    c.name) == specs);
    }
  // Sysctls as upstream sets them on a 5.4 kernel.
  CHECK(f.sysctls.value("net/ipv4/vs/conntrack") == "1");
  CHECK(f.sysctls.value("net/ipv4/vs/expire_nodest_conn") == "1");
  CHECK(f.sysctls.value("net/ipv4/vs/expire_quiescent_template") == "1");
  CHECK(f.sysctls.value("net/ipv4/vs/conn_reuse_mode") == "0");
  CHECK(f.sysctls.value("net/ipv4/conf/all/arp_ignore") == "0");  // strictARP is off
  CHECK_FALSE(f.backend->needsFullSync());
}

TEST_CASE("a restart over an unchanged kernel writes nothing", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  f.restart();
  auto r = f.full();
  REQUIRE(ok(r));
  CHECK(r->operations == 0);
  CHECK(f.ipvs->writes == 0);
  CHECK(f.ipsets->restores.empty());
  CHECK(f.tables->restores.empty());
  CHECK(f.backend->lastWrites() == 0);
  // And a periodic full sync of the same backend.
  REQUIRE(ok(f.full()));
  CHECK(f.ipvs->writes == 0);
  CHECK(f.tables->restores.empty());
}

TEST_CASE("one endpoint added or removed is one or two netlink messages, without a dump",
          "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  f.resetCounts();
  auto& web = f.port("default/web:p");
  setEndpoints(web, {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080),
                     endpoint("10.244.3.1", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.ipvs->writes == 1);
  CHECK(f.ipvs->calls == 1);  // no list
  CHECK(f.reals("TCP 10.96.0.10:80").size() == 3);
  CHECK(f.ipsets->restores.empty());
  CHECK(f.tables->restores.empty());

  // A TCP real server without connections: weight 0, then deleted once its counters say idle.
  setEndpoints(web, {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080)});
  const auto before = f.ipvs->writes;
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.ipvs->writes - before == 2);
  CHECK(f.reals("TCP 10.96.0.10:80") ==
        std::vector<std::string>{"10.244.1.5:8080 w1", "10.244.2.6:8080 w1"});
  CHECK(f.backend->terminating().empty());

  // UDP: deleted at once.
  auto& dns = f.port("default/dns:p");
  setEndpoints(dns, {});
  const auto udpBefore = f.ipvs->writes;
  REQUIRE(ok(f.partial({"default/dns:p"})));
  CHECK(f.ipvs->writes - udpBefore == 1);
  CHECK(f.reals("UDP 10.96.0.53:53").empty());
  CHECK(f.server("UDP 10.96.0.53:53") != nullptr);  // no endpoints: IPVS rejects
}

TEST_CASE("services added and removed by partial syncs share the ClusterIP's address and set entry",
          "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  auto ports = f.snap.ports();
  std::erase_if(f.snap.ports(),
                [](const sdk::ServicePort& p) { return p.key == "default/web:tls"; });
  f.snap = VectorSnapshot(f.snap.ports(), node());
  REQUIRE(ok(f.partial({"default/web:tls"})));
  CHECK(f.server("TCP 10.96.0.10:443") == nullptr);
  CHECK(f.server("TCP 10.96.0.10:80") != nullptr);
  CHECK(bound(f, "10.96.0.10") == 1);  // still used by :80
  CHECK(f.entries("KUBE-IPVS-IPS")->contains("10.96.0.10"));
  CHECK_FALSE(f.entries("KUBE-CLUSTER-IP")->contains("10.96.0.10,tcp:443"));

  std::erase_if(f.snap.ports(), [](const sdk::ServicePort& p) { return p.key == "default/web:p"; });
  f.snap = VectorSnapshot(f.snap.ports(), node());
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.server("TCP 10.96.0.10:80") == nullptr);
  CHECK(bound(f, "10.96.0.10") == 0);
  CHECK_FALSE(f.entries("KUBE-IPVS-IPS")->contains("10.96.0.10"));

  // Back: both ports' servers, one address.
  f.snap = VectorSnapshot(ports, node());
  REQUIRE(ok(f.partial({"default/web:p", "default/web:tls"})));
  CHECK(f.reals("TCP 10.96.0.10:443") == std::vector<std::string>{"10.244.1.5:8443 w1"});
  CHECK(bound(f, "10.96.0.10") == 1);
  // A restart agrees with what the partial syncs left.
  f.restart();
  REQUIRE(ok(f.full()));
  CHECK(f.ipvs->writes == 0);
  CHECK(f.ipsets->restores.empty());
  CHECK(f.tables->restores.empty());
}

TEST_CASE("a virtual server that one port leaves and another renders in the same sync moves to it", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  // web:tls is renamed web:https, with the same ClusterIP and port, in one sync; whichever
  // port the sync takes first, the virtual server stays, with the new port's real servers.
  for (const bool newFirst : {true, false}) {
    INFO("new port first: " << newFirst);
    const std::string from = newFirst ? "default/web:tls" : "default/web:https";
    const std::string to = newFirst ? "default/web:https" : "default/web:tls";
    auto ports = f.snap.ports();
    for (auto& p : ports)
      if (p.key == from) {
        p.portName = to.substr(to.find(':') + 1);
        p.key = to;
        setEndpoints(p, {endpoint("10.244.1.5", 8443), endpoint("10.244.3.3", 8443)});
      }
    f.snap = VectorSnapshot(ports, node());
    const auto before = f.ipvs->writes;
    if (newFirst)
      REQUIRE(ok(f.partial({to, from})));
    else
      REQUIRE(ok(f.partial({from, to})));
    REQUIRE(f.server("TCP 10.96.0.10:443") != nullptr);
    CHECK(f.reals("TCP 10.96.0.10:443") == std::vector<std::string>{"10.244.1.5:8443 w1", "10.244.3.3:8443 w1"});
    // Taken over, not deleted and added again: one real server added (or, the second time
    // round, retired and added back), nothing else.
    CHECK(f.ipvs->writes - before <= 3);
    CHECK(bound(f, "10.96.0.10") == 1);
    // A full sync finds nothing to repair.
    f.restart();
    REQUIRE(ok(f.full()));
    CHECK(f.ipvs->writes == 0);
  }
}

TEST_CASE("foreign virtual servers are left alone; stale ones on kube-ipvs0 are deleted",
          "[unit]") {
  Fixture f;
  // Someone else's, on an address kproxy does not own; one inside ipvs-exclude-cidrs on
  // kube-ipvs0; and a stale one of kproxy's on kube-ipvs0 (a service deleted while it was down).
  f.ipvsState.entries.push_back({foreignServer("192.0.2.1", 80), {real("192.0.2.10", 80)}});
  f.ipvsState.entries.push_back({foreignServer("10.96.99.1", 80), {}});
  f.ipvsState.entries.push_back({foreignServer("10.96.0.99", 80), {real("10.244.9.9", 80)}});
  f.linkState.links.push_back(
      {kDummyLinkName,
       {"dummy", {*net::Prefix::parse("10.96.99.1"), *net::Prefix::parse("10.96.0.99")}}});
  BackendSettings s;
  s.excludeCIDRs = {"10.96.99.0/24"};
  f.backend = f.make(s);
  REQUIRE(ok(f.full()));
  REQUIRE(f.server("TCP 192.0.2.1:80") != nullptr);
  CHECK(f.server("TCP 192.0.2.1:80")->vs.scheduler == "wlc");
  CHECK(f.reals("TCP 192.0.2.1:80") == std::vector<std::string>{"192.0.2.10:80 w1"});
  CHECK(f.server("TCP 10.96.99.1:80") != nullptr);
  CHECK(f.server("TCP 10.96.0.99:80") == nullptr);
  CHECK(bound(f, "10.96.0.99") == 0);
  // Repaired behind kproxy's back: a real server removed, a weight changed, a set entry lost.
  auto* web = const_cast<FakeIpvs::Entry*>(f.server("TCP 10.96.0.10:80"));
  web->realServers.erase(web->realServers.begin());
  f.ipvs->entries.front().realServers.front().weight = 5;  // the foreign one
  f.ipsets->state.sets["KUBE-CLUSTER-IP"].entries.erase("10.96.0.10,tcp:80");
  f.ipvs->writes = 0;
  REQUIRE(ok(f.full()));
  CHECK(f.ipvs->writes == 1);
  CHECK(f.reals("TCP 10.96.0.10:80").size() == 2);
  CHECK(f.reals("TCP 192.0.2.1:80") == std::vector<std::string>{"192.0.2.10:80 w5"});
  CHECK(f.entries("KUBE-CLUSTER-IP")->contains("10.96.0.10,tcp:80"));
}

TEST_CASE("a failed step names the object and makes the next sync a full reconcile", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  auto& web = f.port("default/web:p");
  setEndpoints(web, {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080),
                     endpoint("10.244.3.1", 8080)});
  f.ipvs->failNext(IpvsOperation::kAddRealServer, ENOMEM);
  auto r = f.partial({"default/web:p"});
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("10.244.3.1:8080") != std::string::npos);
  CHECK(r.error().message.find("TCP 10.96.0.10:80") != std::string::npos);
  CHECK(f.backend->needsFullSync());
  // A partial sync asked for becomes full: it dumps the kernel and adds what is missing.
  f.resetCounts();
  auto again = f.partial({});
  REQUIRE(ok(again));
  CHECK(again->summary.starts_with("ipvs sync full=true "));
  CHECK(f.ipvs->writes == 1);
  CHECK(f.ipvs->calls > 8);  // it listed every virtual server
  CHECK(f.reals("TCP 10.96.0.10:80").size() == 3);
  CHECK_FALSE(f.backend->needsFullSync());

  // A refused ipset restore and a refused iptables restore do the same.
  f.ipsets->refuseNext = true;
  auto np = f.port("default/np:p");
  f.port("default/np:p").nodePort = 30081;
  REQUIRE_FALSE(f.partial({"default/np:p"}));
  CHECK(f.backend->needsFullSync());
  REQUIRE(ok(f.partial({})));
  CHECK(f.entries("KUBE-NODE-PORT-TCP")->contains("30081"));
  CHECK_FALSE(f.entries("KUBE-NODE-PORT-TCP")->contains("30080"));
  CHECK(f.server("TCP 192.168.0.2:30081") != nullptr);
  CHECK(f.server("TCP 192.168.0.2:30080") == nullptr);
}

TEST_CASE("a leaving TCP real server drains at weight 0 until idle or the timeout", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  auto* web = const_cast<FakeIpvs::Entry*>(f.server("TCP 10.96.0.10:80"));
  for (auto& rs : web->realServers)
    if (rs.describe() == "10.244.2.6:8080") rs.activeConnections = 3;
  auto& port = f.port("default/web:p");
  setEndpoints(port, {endpoint("10.244.1.5", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.reals("TCP 10.96.0.10:80") ==
        std::vector<std::string>{"10.244.1.5:8080 w1", "10.244.2.6:8080 w0"});
  CHECK(f.backend->terminating() == std::vector<std::string>{"TCP 10.96.0.10:80/10.244.2.6:8080"});

  // Still busy: kept, also by a full sync (which does not bring its weight back).
  f.clock += std::chrono::minutes(1);
  REQUIRE(ok(f.partial({})));
  REQUIRE(ok(f.full()));
  CHECK(f.reals("TCP 10.96.0.10:80").size() == 2);

  // The endpoint comes back while draining: weight 1 again, no longer draining.
  setEndpoints(port, {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.reals("TCP 10.96.0.10:80") ==
        std::vector<std::string>{"10.244.1.5:8080 w1", "10.244.2.6:8080 w1"});
  CHECK(f.backend->terminating().empty());

  // Leaves again; the connections end: deleted on the next sync.
  setEndpoints(port, {endpoint("10.244.1.5", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.backend->terminating().size() == 1);
  web = const_cast<FakeIpvs::Entry*>(f.server("TCP 10.96.0.10:80"));
  for (auto& rs : web->realServers) rs.activeConnections = 0, rs.inactiveConnections = 0;
  REQUIRE(ok(f.partial({})));
  CHECK(f.reals("TCP 10.96.0.10:80") == std::vector<std::string>{"10.244.1.5:8080 w1"});
  CHECK(f.backend->terminating().empty());

  // Busy past the timeout: deleted anyway.
  auto& tls = f.port("default/web:tls");
  web = const_cast<FakeIpvs::Entry*>(f.server("TCP 10.96.0.10:443"));
  web->realServers.front().inactiveConnections = 7;
  setEndpoints(tls, {});
  REQUIRE(ok(f.partial({"default/web:tls"})));
  CHECK(f.reals("TCP 10.96.0.10:443") == std::vector<std::string>{"10.244.1.5:8443 w0"});
  f.clock += std::chrono::minutes(14);
  REQUIRE(ok(f.partial({})));
  CHECK(f.reals("TCP 10.96.0.10:443").size() == 1);
  f.clock += std::chrono::minutes(2);
  REQUIRE(ok(f.partial({})));
  CHECK(f.reals("TCP 10.96.0.10:443").empty());
}

TEST_CASE("a restart finds a leaving real server and drains it", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  auto* web = const_cast<FakeIpvs::Entry*>(f.server("TCP 10.96.0.10:80"));
  web->realServers.back().activeConnections = 2;  // 10.244.2.6
  setEndpoints(f.port("default/web:p"), {endpoint("10.244.1.5", 8080)});
  f.restart();
  REQUIRE(ok(f.full()));
  CHECK(f.reals("TCP 10.96.0.10:80") ==
        std::vector<std::string>{"10.244.1.5:8080 w1", "10.244.2.6:8080 w0"});
  CHECK(f.backend->terminating().size() == 1);
  // Restarted again while it drains: nothing is written, it keeps draining.
  f.restart();
  REQUIRE(ok(f.full()));
  CHECK(f.ipvs->writes == 0);
  CHECK(f.backend->terminating().size() == 1);
  for (auto& e : f.ipvs->entries)
    for (auto& rs : e.realServers) rs.activeConnections = 0;
  REQUIRE(ok(f.partial({})));
  CHECK(f.reals("TCP 10.96.0.10:80") == std::vector<std::string>{"10.244.1.5:8080 w1"});
}

TEST_CASE("cleanup removes what IPVS mode created and nothing else", "[unit]") {
  Fixture f;
  f.ipvsState.entries.push_back({foreignServer("192.0.2.1", 80), {}});
  f.ipsetState.state.sets["OTHER"].createLine = "create OTHER hash:ip family inet";
  f.backend = f.make();
  REQUIRE(ok(f.full()));
  REQUIRE(
      f.tables->restore(kV4, "*filter\n:OTHER-CHAIN - [0:0]\n-A INPUT -j OTHER-CHAIN\nCOMMIT\n"));
  REQUIRE(ok(f.backend->cleanup()));
  CHECK(f.servers() == std::vector<std::string>{"TCP 192.0.2.1:80"});
  CHECK_FALSE(f.hasLink());
  CHECK(f.ipsets->state.sets.size() == 1);
  CHECK(f.ipsets->state.sets.contains("OTHER"));
  CHECK_FALSE(f.hasChain(iptables::Table::kNat, "KUBE-SERVICES"));
  CHECK_FALSE(f.hasChain(iptables::Table::kFilter, "KUBE-IPVS-FILTER"));
  CHECK(f.hasChain(iptables::Table::kFilter, "OTHER-CHAIN"));
  CHECK(f.chain(iptables::Table::kFilter, "INPUT") == std::vector<std::string>{"-j OTHER-CHAIN"});
  CHECK(f.chain(iptables::Table::kNat, "OUTPUT").empty());
  // Twice is fine, and a later sync programs everything again.
  REQUIRE(ok(f.backend->cleanup()));
  REQUIRE(ok(f.full()));
  CHECK(f.server("TCP 10.96.0.10:80") != nullptr);
  CHECK(f.hasLink());
}

TEST_CASE("settings: scheduler, affinity, timeouts and strict ARP", "[unit]") {
  Fixture f;
  auto& web = f.port("default/web:p");
  web.sessionAffinityClientIP = true;
  web.stickyMaxAgeSeconds = 600;
  BackendSettings s;
  s.render.scheduler = "wlc";
  s.strictARP = true;
  s.timeouts = {3600, 0, 60};
  s.kernelRelease = "6.1.0-56-cloud-amd64";
  f.backend = f.make(s);
  REQUIRE(ok(f.full()));
  // ClientIP affinity: one firewall-mark virtual server for the port's addresses.
  const std::uint32_t mark = s.render.fwmarkOf(net::Family::kIPv4, "default/web:p", "cluster");
  const std::string fwm = "FWM " + std::to_string(mark) + " IPv4";
  CHECK(f.server("TCP 10.96.0.10:80") == nullptr);
  REQUIRE(f.server(fwm) != nullptr);
  const auto& vs = f.server(fwm)->vs;
  CHECK(vs.fwmark == mark);
  CHECK(vs.scheduler == "wlc");
  CHECK(vs.flags == kFlagPersistent);
  CHECK(vs.timeout == 600);
  CHECK(f.reals(fwm).size() == 2);
  // A restart over it writes nothing; a full sync keeps it.
  {
    f.resetCounts();
    REQUIRE(ok(f.full()));
    CHECK(f.ipvs->writes == 0);
    f.restart(s);
    REQUIRE(ok(f.full()));
    CHECK(f.ipvs->writes == 0);
  }
  CHECK(f.ipvs->currentTimeouts == Timeouts{3600, 120, 60});
  CHECK(f.sysctls.value("net/ipv4/conf/all/arp_ignore") == "1");
  CHECK(f.sysctls.value("net/ipv4/conf/all/arp_announce") == "2");
  CHECK(f.sysctls.value("net/ipv4/vs/conn_reuse_mode") == "1");  // left alone from 5.9 on
  // Affinity off: the firewall-mark virtual server gives way to the address's.
  web.sessionAffinityClientIP = false;
  const auto before = f.ipvs->writes;
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.ipvs->writes - before == 4);  // add, its two real servers, delete the marked one
  CHECK(f.server(fwm) == nullptr);
  CHECK(f.server("TCP 10.96.0.10:80")->vs.flags == 0);
  CHECK(f.reals("TCP 10.96.0.10:80").size() == 2);
  // Affinity on again, then kproxy restarts without the service: its firewall-mark virtual
  // server is found by its tag bit and deleted; a foreign one stays.
  web.sessionAffinityClientIP = true;
  REQUIRE(ok(f.partial({"default/web:p"})));
  REQUIRE(f.server(fwm) != nullptr);
  VirtualServer foreign;
  foreign.fwmark = 7;
  REQUIRE(f.ipvs->addVirtualServer(foreign));
  auto kept = f.snap.ports();
  std::erase_if(f.snap.ports(), [](const sdk::ServicePort& p) { return p.key == "default/web:p"; });
  f.restart(s);
  REQUIRE(ok(f.full()));
  CHECK(f.server(fwm) == nullptr);
  CHECK(f.server("FWM 7 IPv4") != nullptr);
  // --cleanup likewise, by a process that applied nothing.
  f.snap.ports() = kept;
  REQUIRE(ok(f.full()));
  REQUIRE(f.server(fwm) != nullptr);
  f.restart(s);
  REQUIRE(ok(f.backend->cleanup()));
  CHECK(f.server(fwm) == nullptr);
  CHECK(f.server("FWM 7 IPv4") != nullptr);
}

/// What was written to `out` since `from`, and where it ends.
std::string printedSince(std::FILE* out, long& from) {
  std::fflush(out);
  const long end = std::ftell(out);
  std::string text(static_cast<std::size_t>(end - from), '\0');
  std::fseek(out, from, SEEK_SET);
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fseek(out, end, SEEK_SET);
  from = end;
  return text;
}

std::size_t countOf(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

TEST_CASE(
    "--dry-run prints through the printing adapters exactly what they hand the kernel, in ipvsadm, ip, "
    "ipset, iptables and sysctl notation",
    "[unit]") {
  Fixture f;
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  long mark = 0;
  BackendSettings s;
  s.timeouts = Timeouts{3600, 0, 0};
  f.dryRun(out, s);
  auto first = f.full();
  REQUIRE(ok(first));
  CHECK(first->summary.ends_with(" dry_run=true"));
  std::string text = printedSince(out, mark);
  INFO(text);
  CHECK(text.starts_with("sysctl -w net.ipv4.vs.conntrack=1\n"));
  CHECK(text.find("sysctl -w net.ipv4.vs.conn_reuse_mode=0\n") != std::string::npos);  // kernel 5.4
  CHECK(text.find("ipvsadm --set 3600 0 0\n") != std::string::npos);
  CHECK(countOf(text, "ip link add kube-ipvs0 type dummy\n") == 1);
  CHECK(text.find("ipvsadm -A -t 10.96.0.10:80 -s rr\n") != std::string::npos);
  CHECK(text.find("ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1\n") != std::string::npos);
  CHECK(text.find("ipvsadm -A -u 10.96.0.53:53 -s rr\n") != std::string::npos);
  CHECK(text.find("ip addr add 10.96.0.10/32 dev kube-ipvs0\n") != std::string::npos);
  // One line per change the kernel adapters were handed, and nothing else.
  REQUIRE(f.ipvs->entries.size() > 0);
  std::size_t realServers = 0;
  for (const auto& e : f.ipvs->entries) {
    CHECK(countOf(text, ipvsadmCommand('A', e.vs) + "\n") == 1);
    for (const auto& rs : e.realServers) CHECK(countOf(text, ipvsadmCommand('a', e.vs, &rs) + "\n") == 1);
    realServers += e.realServers.size();
  }
  CHECK(countOf(text, "ipvsadm -A ") == f.ipvs->entries.size());
  CHECK(countOf(text, "ipvsadm -a ") == realServers);
  CHECK(countOf(text, "ip addr add ") == f.addresses().size());
  REQUIRE(f.ipsets->restores.size() == 1);
  CHECK(text.find("# ipset restore -exist\n" + f.ipsets->restores[0]) != std::string::npos);
  CHECK(f.ipsets->restores[0].find("add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n") != std::string::npos);
  REQUIRE(f.tables->restores.size() == 1);
  CHECK(text.find("# iptables-restore --noflush\n" + f.tables->restores[0]) != std::string::npos);
  CHECK(f.tables->restores[0].starts_with("*nat\n"));
  // Made before it serves: the sets, then the chains (whose nat rules switch conntrack on),
  // then the virtual servers, then the addresses that make them answer.
  const auto sets = text.find("# ipset restore -exist\n");
  const auto chains = text.find("# iptables-restore --noflush\n");
  const auto servers = text.find("ipvsadm -A ");
  const auto addresses = text.find("ip addr add ");
  CHECK(sets < chains);
  CHECK(chains < servers);
  CHECK(servers < addresses);
  CHECK(text.rfind("ipvsadm -a ") < addresses);
  // The sysctls went to memory only.
  CHECK(f.dryRunSysctls->values.at("net/ipv4/vs/conntrack") == 1);
  CHECK(f.sysctls.value("net/ipv4/vs/conntrack") == "0");

  // A later sync prints its own changes only: one endpoint more is one line.
  setEndpoints(f.port("default/web:p"),
               {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080), endpoint("10.244.3.3", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(printedSince(out, mark) == "ipvsadm -a -t 10.96.0.10:80 -r 10.244.3.3:8080 -m -w 1\n");
  // And a full sync over what the dry run would have made prints nothing.
  REQUIRE(ok(f.full()));
  CHECK(printedSince(out, mark).empty());
  // An endpoint that leaves a TCP service drains at weight 0 first; without connections (none
  // in memory) it is deleted in the same sync.
  setEndpoints(f.port("default/web:p"), {endpoint("10.244.1.5", 8080), endpoint("10.244.2.6", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(printedSince(out, mark) ==
        "ipvsadm -e -t 10.96.0.10:80 -r 10.244.3.3:8080 -m -w 0\nipvsadm -d -t 10.96.0.10:80 -r 10.244.3.3:8080\n");
  std::fclose(out);
}

TEST_CASE("a partial sync makes before it serves and stops serving before it unmakes", "[unit]") {
  Fixture f;
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  long mark = 0;
  f.dryRun(out);
  REQUIRE(ok(f.full()));
  printedSince(out, mark);

  // A new NodePort Service: its set entries and chains first, then its virtual servers, then
  // its address.
  auto added = servicePort("new", "10.96.0.77", 80, {endpoint("10.244.1.9", 8080)});
  added.type = sdk::ServiceType::kNodePort;
  added.nodePort = 30077;
  auto ports = f.snap.ports();
  ports.push_back(added);
  f.snap = VectorSnapshot(ports, node());
  REQUIRE(ok(f.partial({"default/new:p"})));
  // Each pair: the first line printed before the second.
  const auto inOrder = [](const std::string& text, const std::vector<std::pair<std::string, std::string>>& pairs) {
    INFO(text);
    for (const auto& [first, then] : pairs) {
      INFO(first << " before " << then);
      const auto a = text.find(first);
      const auto b = text.find(then);
      REQUIRE(a != std::string::npos);
      REQUIRE(b != std::string::npos);
      CHECK(a < b);
    }
  };
  inOrder(printedSince(out, mark), {{"add KUBE-CLUSTER-IP 10.96.0.77,tcp:80\n", "ipvsadm -A -t 10.96.0.77:80 "},
                                    {"add KUBE-NODE-PORT-TCP 30077\n", "ipvsadm -A -t 192.168.0.2:30077 "},
                                    {"ipvsadm -A -t 10.96.0.77:80 ", "ip addr add 10.96.0.77/32 dev kube-ipvs0\n"}});

  // And gone: its address first, then its virtual servers, then its set entries.
  ports.pop_back();
  f.snap = VectorSnapshot(ports, node());
  REQUIRE(ok(f.partial({"default/new:p"})));
  inOrder(printedSince(out, mark),
          {{"ip addr del 10.96.0.77/32 dev kube-ipvs0\n", "ipvsadm -D -t 10.96.0.77:80\n"},
           {"ipvsadm -D -t 10.96.0.77:80\n", "del KUBE-CLUSTER-IP 10.96.0.77,tcp:80\n"},
           {"ipvsadm -D -t 192.168.0.2:30077\n", "del KUBE-NODE-PORT-TCP 30077\n"}});
  std::fclose(out);
}

TEST_CASE("the printing adapters print each change, hand it on, and say what the inner adapter answers",
          "[unit]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  long mark = 0;
  auto fakeIpvs = std::make_unique<FakeIpvs>();
  FakeIpvs* ipvsInner = fakeIpvs.get();
  PrintingIpvs ipvs(std::move(fakeIpvs), out);
  VirtualServer vs = foreignServer("10.96.0.10", 80);
  vs.scheduler = "rr";
  const RealServer rs = real("10.244.1.5", 8080);
  REQUIRE(ipvs.addVirtualServer(vs));
  REQUIRE(ipvs.addRealServer(vs, rs));
  CHECK(printedSince(out, mark) ==
        "ipvsadm -A -t 10.96.0.10:80 -s rr\nipvsadm -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1\n");
  REQUIRE(ipvsInner->entries.size() == 1);
  CHECK(ipvsInner->entries[0].realServers.size() == 1);
  // A refusal is printed (the kernel would have been sent it) and returned as the inner's.
  auto again = ipvs.addVirtualServer(vs);
  REQUIRE_FALSE(again);
  CHECK(again.error().errnum == EEXIST);
  CHECK(printedSince(out, mark) == "ipvsadm -A -t 10.96.0.10:80 -s rr\n");
  REQUIRE(ipvs.deleteRealServer(vs, rs));
  REQUIRE(ipvs.deleteVirtualServer(vs));
  REQUIRE(ipvs.setTimeouts(Timeouts{10, 20, 30}));
  CHECK(printedSince(out, mark) ==
        "ipvsadm -d -t 10.96.0.10:80 -r 10.244.1.5:8080\nipvsadm -D -t 10.96.0.10:80\nipvsadm --set 10 20 30\n");
  CHECK(ipvsInner->entries.empty());
  CHECK(ipvsInner->currentTimeouts == Timeouts{10, 20, 30});
  // Reads print nothing.
  REQUIRE(ipvs.listVirtualServers());
  REQUIRE(ipvs.timeouts());
  CHECK(printedSince(out, mark).empty());

  auto fakeLink = std::make_unique<FakeDummyLink>();
  FakeDummyLink* linkInner = fakeLink.get();
  PrintingDummyLink link(std::move(fakeLink), out);
  auto created = link.ensureLink(kDummyLinkName);
  REQUIRE(created);
  CHECK_FALSE(*created);
  auto existing = link.ensureLink(kDummyLinkName);  // there already: nothing to do, nothing printed
  REQUIRE(existing);
  CHECK(*existing);
  REQUIRE(link.addAddress(kDummyLinkName, *net::Prefix::parse("10.96.0.10")));
  REQUIRE(link.addAddress(kDummyLinkName, *net::Prefix::parse("fd00::10")));
  REQUIRE(link.deleteAddress(kDummyLinkName, *net::Prefix::parse("10.96.0.10")));
  CHECK(printedSince(out, mark) ==
        "ip link add kube-ipvs0 type dummy\nip addr add 10.96.0.10/32 dev kube-ipvs0\n"
        "ip addr add fd00::10/128 dev kube-ipvs0\nip addr del 10.96.0.10/32 dev kube-ipvs0\n");
  REQUIRE(link.listAddresses(kDummyLinkName));
  CHECK(linkInner->links.at(0).second.addresses.size() == 1);
  REQUIRE(link.deleteLink(kDummyLinkName));
  CHECK(printedSince(out, mark) == "ip link del kube-ipvs0\n");
  CHECK(linkInner->links.empty());

  auto fakeSets = std::make_unique<FakeIpsets>();
  FakeIpsets* setsInner = fakeSets.get();
  PrintingIpsets sets(std::move(fakeSets), out);
  REQUIRE(sets.restore(""));  // nothing to restore: nothing printed
  REQUIRE(sets.restore("create S hash:ip family inet\nadd S 10.0.0.1\n"));
  CHECK(printedSince(out, mark) == "# ipset restore -exist\ncreate S hash:ip family inet\nadd S 10.0.0.1\n");
  CHECK(setsInner->state.sets.at("S").entries == std::set<std::string>{"10.0.0.1"});
  CHECK_FALSE(sets.restore("add NOPE 1\n"));
  CHECK(printedSince(out, mark) == "# ipset restore -exist\nadd NOPE 1\n");

  auto fakeSysctls = std::make_unique<kernel::FakeSysctls>(freshSysctls());
  kernel::FakeSysctls* sysctlsInner = fakeSysctls.get();
  kernel::PrintingSysctls sysctls(std::move(fakeSysctls), out);
  REQUIRE(sysctls.writeInt("net/ipv4/vs/conntrack", 1));
  CHECK(printedSince(out, mark) == "sysctl -w net.ipv4.vs.conntrack=1\n");
  CHECK(sysctlsInner->values.at("net/ipv4/vs/conntrack") == 1);
  auto read = sysctls.readInt("net/ipv4/vs/conntrack");
  REQUIRE(read);
  CHECK(*read == 1);
  auto missing = sysctls.writeInt("net/ipv4/vs/no_such", 1);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().errnum == ENOENT);
  CHECK(printedSince(out, mark) == "sysctl -w net.ipv4.vs.no_such=1\n");
  std::fclose(out);
}

TEST_CASE("ipvsadmCommand and the ipset save parser", "[unit]") {
  auto vs = foreignServer("fd00::10", 53);
  vs.family = net::Family::kIPv6;
  vs.protocol = Protocol::kUdp;
  vs.scheduler = "rr";
  auto rs = real("fd00::5", 5353);
  CHECK(ipvsadmCommand('A', vs) == "ipvsadm -A -u [fd00::10]:53 -s rr");
  CHECK(ipvsadmCommand('d', vs, &rs) == "ipvsadm -d -u [fd00::10]:53 -r [fd00::5]:5353");
  auto parsed = parseIpsetSave(
      "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 "
      "initval 0x1\n"
      "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n"
      "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n"
      "add KUBE-NODE-PORT-TCP 30080\n");
  REQUIRE(parsed);
  CHECK(parsed->sets.size() == 2);
  CHECK(parsed->sets["KUBE-CLUSTER-IP"].entries == std::set<std::string>{"10.96.0.10,tcp:80"});
  CHECK(parsed->sets["KUBE-NODE-PORT-TCP"].entries == std::set<std::string>{"30080"});
  CHECK_FALSE(parseIpsetSave("add NOPE 1\n"));
}

TEST_CASE("a partial sync rewrites the iptables chains only when a port's rules change", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.full()));
  f.resetCounts();
  // eTP=Local without a local endpoint: the port gets rules of its own (the short-circuit and
  // the drop of other external traffic).
  auto& ext = f.port("default/ext:p");
  ext.externalPolicyLocal = true;
  REQUIRE(ok(f.partial({"default/ext:p"})));
  REQUIRE(f.tables->restores.size() == 1);
  CHECK(f.tables->restores.front().find("203.0.113.7") != std::string::npos);
  const auto services = f.chain(iptables::Table::kNat, "KUBE-SERVICES");
  CHECK(std::any_of(services.begin(), services.end(), [](const std::string& r) {
    return r.find("203.0.113.7") != std::string::npos;
  }));
  // An endpoint change elsewhere writes no iptables input.
  setEndpoints(f.port("default/web:p"), {endpoint("10.244.1.5", 8080)});
  REQUIRE(ok(f.partial({"default/web:p"})));
  CHECK(f.tables->restores.size() == 1);
  // Back to Cluster: the rules go, and a restart agrees with the kernel.
  ext.externalPolicyLocal = false;
  REQUIRE(ok(f.partial({"default/ext:p"})));
  CHECK(f.tables->restores.size() == 2);
  const auto after = f.chain(iptables::Table::kNat, "KUBE-SERVICES");
  CHECK(std::none_of(after.begin(), after.end(), [](const std::string& r) {
    return r.find("203.0.113.7") != std::string::npos;
  }));
  f.restart();
  REQUIRE(ok(f.full()));
  CHECK(f.tables->restores.empty());
  CHECK(f.ipvs->writes == 0);
}

TEST_CASE("the plugin's options: bad values are refused naming the option; dry-run needs no kernel",
          "[unit]") {
  const sdk::Options good{{"dry-run", "true"},
                          {"ipvs-scheduler", "wlc"},
                          {"ipvs-strict-arp", "true"},
                          {"ipvs-tcp-timeout", "3600"},
                          {"ipvs-tcpfin-timeout", "0.5"},
                          {"ipvs-udp-timeout", "0"},
                          {"ipvs-exclude-cidrs", "10.96.99.0/24, fd00::/64"},
                          {"some-later-key", "ignored"}};
  auto made = makeIpvsBackend(sdk::Host(nullptr), good);
  INFO((made ? std::string("ok") : made.error().message));
  CHECK(made);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"ipvs-scheduler", "fastest"},
                                                        {"ipvs-strict-arp", "yes"},
                                                        {"ipvs-tcp-timeout", "1h"},
                                                        {"ipvs-udp-timeout", "-5"},
                                                        {"ipvs-exclude-cidrs", "10.96.99.0/33"},
                                                        {"masquerade-bit", "40"}}) {
    sdk::Options bad = good;
    bad[key] = value;
    auto refused = makeIpvsBackend(sdk::Host(nullptr), bad);
    INFO(key << "=" << value);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().message.find(key) != std::string::npos);
    CHECK(refused.error().message.find(value) != std::string::npos);
  }
}

TEST_CASE("explain: IPVS schedules a ClusterIP's connections to its real servers; none is a reject", "[unit]") {
  Fixture f;
  auto ports = services();
  auto empty = servicePort("empty", "10.96.0.40", 80, {});
  ports.push_back(empty);
  sdk::testing::FakeHost host;
  const sdk::testing::FakeSnapshot snapshot(node(), ports);
  const sdk::SnapshotView view(host.api(), snapshot.handle());
  auto ask = [&](const char* destination) {
    sdk::ExplainRequest r;
    r.sourceIP = "10.244.0.7";
    r.destinationIP = destination;
    r.destinationPort = 80;
    r.json = true;
    auto answer = f.backend->explain(view, r);
    REQUIRE(answer);
    return *answer;
  };
  // Without IPVS's scheduler in the tracer the ClusterIP would only be accepted, not DNAT'ed.
  const std::string scheduled = ask("10.96.0.10");
  INFO(scheduled);
  CHECK(scheduled.find(R"("verdict":"dnat")") != std::string::npos);
  CHECK(scheduled.find("10.244.1.5:8080") != std::string::npos);
  CHECK(scheduled.find("10.244.2.6:8080") != std::string::npos);
  const std::string refused = ask("10.96.0.40");
  INFO(refused);
  CHECK(refused.find(R"("verdict":"reject")") != std::string::npos);
  CHECK(refused.find("no real servers") != std::string::npos);
}
