// The nftables backend against the real kernel, each case in its own network namespace.

#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "../unit/nftables/service_ports.h"
#include "kproxy/nftables/backend.h"
#include "kproxy/nftables/kernel.h"
#include "netns.h"

using namespace kproxy;
using namespace kproxy::nftables;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::nftables::testing::manyServices;
using kproxy::nftables::testing::setEndpoints;
using kproxy::testing::FreshNetns;
using kproxy::testing::run;

namespace {

struct Harness {
  Harness() : kernel(makeNetlinkKernel()) {}
  std::unique_ptr<NftablesBackend> backend(RenderConfig cfg = {}) {
    BackendSettings s;
    s.render = std::move(cfg);
    return std::make_unique<NftablesBackend>(sdk::Host(nullptr), std::move(s), makeNetlinkKernel());
  }
  Mirror readBack() {
    NftablesRenderer r{RenderConfig{}};
    auto m = kernel->readBack(r.setSpecs(Family::kIPv4), r.setSpecs(Family::kIPv6));
    REQUIRE(m.has_value());
    return *m;
  }
  std::unique_ptr<KernelNftables> kernel;
};

RenderConfig featureConfig() {
  RenderConfig cfg;
  cfg.clusterCIDRs.push_back(*Address::parse("10.0.0.0/8"));
  cfg.nodeIPs.push_back(*Address::parse("192.168.50.10"));
  return cfg;
}

std::vector<sdk::ServicePort> featureServices() {
  std::vector<sdk::ServicePort> out;
  out.push_back(clusterIP("default", "web", "172.30.0.10", 80,
                          {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080)}));
  auto sticky = clusterIP("default", "sticky", "172.30.0.11", 80, {endpoint("10.1.0.3", 8080)});
  sticky.sessionAffinityClientIP = true;
  sticky.stickyMaxAgeSeconds = 600;
  out.push_back(sticky);
  auto np = clusterIP("default", "np", "172.30.0.12", 53,
                      {endpoint("10.1.0.4", 53, true), endpoint("10.1.0.5", 53)}, sdk::Protocol::kUDP);
  np.type = sdk::ServiceType::kNodePort;
  np.nodePort = 30053;
  np.externalPolicyLocal = true;
  out.push_back(np);
  auto lb = clusterIP("default", "lb", "172.30.0.13", 443, {endpoint("10.1.0.6", 8443)},
                      sdk::Protocol::kSCTP);
  lb.type = sdk::ServiceType::kLoadBalancer;
  lb.nodePort = 30443;
  lb.loadBalancerIPs = {"198.51.100.7"};
  lb.loadBalancerSourceRanges = {"203.0.113.0/24"};
  lb.externalIPs = {"198.51.100.8"};
  out.push_back(lb);
  out.push_back(clusterIP("default", "empty", "172.30.0.14", 80, {}));
  return out;
}

/// The kernel holds exactly what the backend's mirror says (chains, rule identities, sets and
/// elements of the sets kproxy fills).
void requireMirrorMatchesKernel(const Mirror& mirror, const Mirror& kernel) {
  for (Family fam : {Family::kIPv4, Family::kIPv6}) {
    const auto& m = mirror.of(fam);
    const auto& k = kernel.of(fam);
    REQUIRE(m.tableExists == k.tableExists);
    REQUIRE(m.chains.size() == k.chains.size());
    for (const auto& [name, chain] : m.chains) {
      INFO("chain " << name);
      auto it = k.chains.find(name);
      REQUIRE(it != k.chains.end());
      CHECK(it->second.rules == chain.rules);
      CHECK(it->second.base == chain.base);
    }
    CHECK(m.sets == k.sets);
    for (const auto& [set, elems] : k.elements) {
      INFO("set " << set);
      auto it = m.elements.find(set);
      std::size_t mine = it == m.elements.end() ? 0 : it->second.size();
      REQUIRE(mine == elems.size());
      for (const auto& [key, value] : elems) CHECK(it->second.at(key) == value);
    }
  }
}

template <typename T>
bool ok(const sdk::Expected<T>& r) {
  if (!r) UNSCOPED_INFO("sync error: " << r.error().message);
  return r.has_value();
}

}  // namespace

TEST_CASE("nftables: a full sync is read back identically and nft lists it", "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend(featureConfig());
  VectorSnapshot snap(featureServices());
  auto out = backend->syncFrom(snap, {}, true);
  REQUIRE(ok(out));
  CHECK(out->operations > 50);
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());

  auto [rc, listing] = run("nft list table ip kube-proxy");
  INFO(listing);
  REQUIRE(rc == 0);
  for (const char* expected :
       {"chain filter-prerouting", "chain nat-prerouting", "chain services", "chain masquerading",
        "chain mark-for-masquerade", "chain cluster-ips-check", "chain nodeport-endpoints-check",
        "chain service-endpoints-check", "chain firewall-check", "chain reject-chain",
        "map service-ips", "map service-nodeports", "map no-endpoint-services",
        "map no-endpoint-nodeports", "map firewall-ips", "set cluster-ips", "set nodeport-ips",
        "map affinity", "map affinity-services", "map affinity-nodeports", "chain affinity-record",
        "update @affinity", "typeof numgen random mod 65535 : ip daddr . th dport",
        "flags interval", "dnat ip to numgen random mod 65535 offset", "10.1.0.1 . 8080",
        "set hairpin-ips", "ct status dnat ip saddr . ip daddr @hairpin-ips jump mark-for-masquerade",
        "fib saddr type local", "reject with tcp reset", "masquerade fully-random",
        "172.30.0.14 . tcp . 80 : goto reject-chain", "192.168.50.10"}) {
    INFO("expected: " << expected);
    CHECK(listing.find(expected) != std::string::npos);
  }
  CHECK(listing.find(serviceChainName(snap.ports()[0])) != std::string::npos);
  CHECK(listing.find(externalChainName(snap.ports()[2])) != std::string::npos);
  CHECK(listing.find(firewallChainName(snap.ports()[3])) != std::string::npos);
  // No IPv6 service, no ip6 table.
  CHECK(run("nft list table ip6 kube-proxy").first != 0);
}

TEST_CASE("nftables: one endpoint removal changes map elements only", "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend();
  VectorSnapshot snap(manyServices(200, 2, false));
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  const auto chainsBefore = h.readBack().ip.chains.size();

  auto& port = snap.ports()[5];
  setEndpoints(port, {port.clusterEndpoints[0]});
  auto out = backend->syncFrom(snap, {{sdk::Family::kIPv4, port.key}}, false);
  REQUIRE(out.has_value());
  // The two-interval layout out (2 starts, 2 ends), the one-interval layout in (start, end),
  // the removed endpoint's hairpin pair out: 7 element ops, no rule, no chain.
  CHECK(out->operations == 7);
  for (const auto& op : backend->lastOps())
    CHECK((op.kind == OpKind::kAddElement || op.kind == OpKind::kDeleteElement));
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  CHECK(h.readBack().ip.chains.size() == chainsBefore);

  // And back: the endpoint returns the same way; then nothing is left to do.
  setEndpoints(port, {port.clusterEndpoints[0], endpoint("10.200.0.1", 8080)});
  auto back = backend->syncFrom(snap, {{sdk::Family::kIPv4, port.key}}, false);
  REQUIRE(back.has_value());
  CHECK(back->operations == 7);
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  auto later = backend->syncFrom(snap, {}, false);
  REQUIRE(later.has_value());
  CHECK(later->operations == 0);
  auto [rc, listing] = run("nft list map ip kube-proxy " + serviceEndpointsMap(*h.readBack().ip.chains.at(serviceChainName(port)).slotBase));
  INFO(listing);
  CHECK(listing.find("10.200.0.1 . 8080") != std::string::npos);
}

TEST_CASE("nftables: a restarted backend over the same state applies nothing", "[kernel]") {
  FreshNetns ns;
  Harness h;
  VectorSnapshot snap(featureServices());
  {
    auto first = h.backend(featureConfig());
    REQUIRE(ok(first->syncFrom(snap, {}, true)));
  }
  auto second = h.backend(featureConfig());
  auto out = second->syncFrom(snap, {}, true);
  REQUIRE(out.has_value());
  CHECK(out->operations == 0);
  CHECK(second->lastOps().empty());
}

TEST_CASE("nftables: foreign tables are untouched; foreign rules in our chains are removed",
          "[kernel]") {
  FreshNetns ns;
  Harness h;
  REQUIRE(run("nft add table ip foreign && nft add chain ip foreign c "
              "'{ type filter hook input priority 0 ; }' && nft add rule ip foreign c counter")
              .first == 0);
  auto backend = h.backend(featureConfig());
  VectorSnapshot snap(featureServices());
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));

  // Someone adds a rule to our services chain and deletes one of our chains' rules.
  REQUIRE(run("nft insert rule ip kube-proxy services counter").first == 0);
  REQUIRE(run("nft flush chain ip kube-proxy " + serviceChainName(snap.ports()[0])).first == 0);
  auto out = backend->syncFrom(snap, {}, true);
  REQUIRE(out.has_value());
  CHECK(out->operations >= 3);
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  auto services = run("nft list chain ip kube-proxy services").second;
  CHECK(services.find("counter") == std::string::npos);

  REQUIRE(backend->cleanup().has_value());
  auto foreign = run("nft list table ip foreign");
  REQUIRE(foreign.first == 0);
  CHECK(foreign.second.find("counter") != std::string::npos);
}

TEST_CASE("nftables: a refused batch changes nothing and names the object", "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend();
  VectorSnapshot snap(manyServices(20, 2, false));
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  Mirror before = h.readBack();

  SECTION("an invalid op injected in a batch") {
    Op addChain;
    addChain.kind = OpKind::kAddChain;
    addChain.name = "would-be-new";
    Op badRule;
    badRule.kind = OpKind::kAddRule;
    badRule.name = "no-such-chain";
    badRule.rule.statements.push_back(Verdict{VerdictKind::kDrop, {}});
    auto r = h.kernel->apply({addChain, badRule});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().message().find("add rule ip kube-proxy no-such-chain drop") != std::string::npos);
    CHECK_FALSE(h.readBack().ip.chains.contains("would-be-new"));
  }

  SECTION("a conflicting element added behind our back") {
    auto fresh = clusterIP("ns", "late", "172.30.9.9", 80, {endpoint("10.9.9.9", 80)});
    REQUIRE(run("nft add element ip kube-proxy service-ips '{ 172.30.9.9 . tcp . 80 : drop }'").first == 0);
    snap.ports().push_back(fresh);
    auto out = backend->syncFrom(snap, {{sdk::Family::kIPv4, fresh.key}}, false);
    REQUIRE_FALSE(out.has_value());
    INFO(out.error().message);
    CHECK(out.error().message.find("add element ip kube-proxy service-ips { 172.30.9.9 . tcp . 80") !=
          std::string::npos);
    // Nothing of that batch reached the kernel (its new chains included).
    Mirror after = h.readBack();
    CHECK_FALSE(after.ip.chains.contains(serviceChainName(fresh)));
    CHECK(after.ip.chains.size() == before.ip.chains.size());
    CHECK(backend->needsFullSync());
    // The next (full) sync repairs it.
    auto repaired = backend->syncFrom(snap, {}, false);
    REQUIRE(repaired.has_value());
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
    CHECK(h.readBack().ip.chains.contains(serviceChainName(fresh)));
  }
}

TEST_CASE("nftables: dual-stack creates the ip6 table; cleanup removes both, twice", "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend();
  auto v4 = clusterIP("default", "web", "172.30.0.10", 80, {endpoint("10.1.0.1", 8080)});
  auto v6 = clusterIP("default", "web", "fd00:30::10", 80, {endpoint("fd00:1::1", 8080)});
  v6.sessionAffinityClientIP = true;  // the ip6 affinity record needs 15 of the 16 registers
  v6.stickyMaxAgeSeconds = 60;
  VectorSnapshot snap({v4, v6});
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  auto listing = run("nft list table ip6 kube-proxy");
  REQUIRE(listing.first == 0);
  INFO(listing.second);
  CHECK(listing.second.find("fd00:1::1 . 8080") != std::string::npos);
  CHECK(listing.second.find("dnat ip6 to numgen random mod 65535") != std::string::npos);
  CHECK(listing.second.find("update @affinity { ip6 saddr . ct original ip6 daddr") != std::string::npos);

  REQUIRE(backend->cleanup().has_value());
  CHECK(run("nft list table ip kube-proxy").first != 0);
  CHECK(run("nft list table ip6 kube-proxy").first != 0);
  REQUIRE(backend->cleanup().has_value());
}

TEST_CASE("nftables: affinity entries pointing at a removed endpoint are deleted", "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend();
  auto sticky = clusterIP("ns", "sticky", "172.30.5.1", 80, {endpoint("10.5.0.1", 80), endpoint("10.5.0.2", 80)});
  sticky.sessionAffinityClientIP = true;
  VectorSnapshot snap({sticky});
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  // Entries as the data path records them (userspace may add to a dynamic map too).
  REQUIRE(run("nft add element ip kube-proxy affinity '{ 192.0.2.1 . 172.30.5.1 . tcp . 80 : 10.5.0.1 . 80, "
              "192.0.2.2 . 172.30.5.1 . tcp . 80 : 10.5.0.2 . 80 }'")
              .first == 0);
  setEndpoints(snap.ports()[0], {endpoint("10.5.0.1", 80)});
  REQUIRE(ok(backend->syncFrom(snap, {{sdk::Family::kIPv4, snap.ports()[0].key}}, false)));
  auto [rc, listing] = run("nft list map ip kube-proxy affinity");
  INFO(listing);
  REQUIRE(rc == 0);
  CHECK(listing.find("192.0.2.1 . 172.30.5.1 . tcp . 80") != std::string::npos);
  CHECK(listing.find("192.0.2.2") == std::string::npos);
}
