// The nftables backend against the real kernel, each case in its own network namespace.

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cctype>
#include <thread>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

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

/// The netlink kernel without its ruleset generation: a foreign change is then met only when a
/// batch runs into it, as when it lands between a sync's generation check and its commit.
class BlindKernel final : public KernelNftables {
 public:
  explicit BlindKernel(std::unique_ptr<KernelNftables> inner) : inner_(std::move(inner)) {}
  core::Result<void> apply(const std::vector<Op>& ops) override { return inner_->apply(ops); }
  std::unique_ptr<KernelBatch> beginBatch() override { return inner_->beginBatch(); }
  core::Result<Mirror> readBack(const std::vector<SetSpec>& ip4Sets, const std::vector<SetSpec>& ip6Sets) override {
    return inner_->readBack(ip4Sets, ip6Sets);
  }
  core::Result<void> deleteTables() override { return inner_->deleteTables(); }
  core::Result<std::vector<std::pair<std::string, std::string>>> listMap(net::Family family,
                                                                         const std::string& map) override {
    return inner_->listMap(family, map);
  }

 private:
  std::unique_ptr<KernelNftables> inner_;
};

struct Harness {
  Harness() : kernel(makeNetlinkKernel()) {}
  /// `blind`: the backend cannot read the ruleset generation (see BlindKernel).
  std::unique_ptr<NftablesBackend> backend(RenderConfig cfg = {}, bool blind = false) {
    BackendSettings s;
    s.render = std::move(cfg);
    std::unique_ptr<KernelNftables> k = makeNetlinkKernel();
    if (blind) k = std::make_unique<BlindKernel>(std::move(k));
    return std::make_unique<NftablesBackend>(sdk::Host(nullptr), std::move(s), std::move(k));
  }
  Mirror readBack() {
    NftablesRenderer r{RenderConfig{}};
    auto m = kernel->readBack(r.setSpecs(net::Family::kIPv4), r.setSpecs(net::Family::kIPv6));
    REQUIRE(m.has_value());
    return *m;
  }
  std::unique_ptr<KernelNftables> kernel;
};

RenderConfig featureConfig() {
  RenderConfig cfg;
  cfg.common.clusterCIDRs.push_back("10.0.0.0/8");
  cfg.common.nodeIPs.push_back("192.168.50.10");
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
  for (net::Family fam : {net::Family::kIPv4, net::Family::kIPv6}) {
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

/// A sync of `snap` as a partial one with nothing changed: whether the backend made it full
/// (it noticed a transaction not its own) is checked against `full`.
sdk::SyncOutcome unchangedSync(NftablesBackend& backend, const VectorSnapshot& snap, bool full) {
  auto out = backend.syncFrom(snap, {}, false);
  REQUIRE(ok(out));
  CHECK(out->summary.find(full ? "full=true" : "full=false") != std::string::npos);
  return *out;
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
        "map session-affinity", "typeof ip saddr . numgen random mod 1 : ip daddr . th dport",
        "map affinity-services", "map affinity-nodeports", "chain affinity-record",
        "update @session-affinity { ip saddr . numgen random mod 1 offset ",
        "dnat ip to ip saddr . numgen random mod 1 offset ", "typeof numgen random mod 65535 : ip daddr . th dport",
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
  auto out = backend->syncFrom(snap, {{net::Family::kIPv4, port.key}}, false);
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
  auto back = backend->syncFrom(snap, {{net::Family::kIPv4, port.key}}, false);
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

TEST_CASE("nftables: a table flushed or deleted by hand is repaired by the next partial sync",
          "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend(featureConfig());
  VectorSnapshot snap(featureServices());
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  // kproxy's own transactions (the full sync and its affinity clean-up) are not taken for
  // someone else's: the next partial sync stays partial and has nothing to do.
  CHECK(unchangedSync(*backend, snap, false).operations == 0);

  for (const char* breakage : {"nft flush table ip kube-proxy", "nft delete table ip kube-proxy"}) {
    INFO(breakage);
    REQUIRE(run(breakage).first == 0);
    // A partial sync with nothing changed in the snapshot notices the foreign transaction.
    CHECK(unchangedSync(*backend, snap, true).operations > 0);
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
    CHECK(unchangedSync(*backend, snap, false).operations == 0);
  }
}

TEST_CASE("nftables: other programs' transactions on other tables do not force a full sync", "[kernel]") {
  FreshNetns ns;
  Harness h;
  auto backend = h.backend(featureConfig());
  VectorSnapshot snap(featureServices());
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  // kproxy's own notifications (a full sync's thousands) are not taken for anyone else's.
  unchangedSync(*backend, snap, false);

  // A CNI plugin's iptables-nft rule, another table, kproxy's table name in another family.
  for (const char* other : {"iptables-nft -w -t nat -A POSTROUTING -s 10.9.0.0/16 -j MASQUERADE",
                            "nft add table ip other && nft add chain ip other c && nft delete table ip other",
                            "nft add table inet kube-proxy && nft add chain inet kube-proxy services",
                            "nft delete table inet kube-proxy"}) {
    INFO(other);
    REQUIRE(run(other).first == 0);
    CHECK(unchangedSync(*backend, snap, false).operations == 0);
  }

  // Someone's change to kproxy's own table, in a transaction with another table's: repaired.
  REQUIRE(run("printf 'add table ip other\\nadd chain ip kube-proxy intruder\\n' | nft -f -").first == 0);
  unchangedSync(*backend, snap, true);
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  unchangedSync(*backend, snap, false);
}

TEST_CASE("nftables: a refused batch changes nothing and names the object", "[kernel]") {
  FreshNetns ns;
  Harness h;
  // Blind to the generation, so that the conflict below is met by a partial batch.
  auto backend = h.backend({}, true);
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

  SECTION("a refusal deep in a big batch is named from the message itself") {
    // Past the first 4096 messages a batch keeps no op texts (a full sync's would cost as much
    // as a tenth of the batch): the refused message is decoded instead.
    std::vector<Op> ops;
    for (int i = 0; i < 5000; ++i) {
      Op c;
      c.kind = OpKind::kAddChain;
      c.name = "filler-" + std::to_string(i);
      ops.push_back(c);
    }
    Op badRule;
    badRule.kind = OpKind::kAddRule;
    badRule.name = "no-such-chain";
    badRule.rule.statements.push_back(Verdict{VerdictKind::kDrop, {}});
    ops.push_back(badRule);
    auto r = h.kernel->apply(ops);
    REQUIRE_FALSE(r.has_value());
    INFO(r.error().message());
    CHECK(r.error().message().find("op 5001 of 5001 \"add rule ip kube-proxy no-such-chain") != std::string::npos);

    ops.pop_back();
    Op badElement;
    badElement.kind = OpKind::kDeleteElement;
    badElement.name = names::kServiceIPsMap;
    KeyBuilder k;
    k.address(*net::Prefix::parse("172.31.255.254")).proto(6).port(8);
    badElement.element = std::make_shared<const Element>(Element{names::kServiceIPsMap, k.bytes, k.text, std::nullopt});
    ops.push_back(badElement);
    r = h.kernel->apply(ops);
    REQUIRE_FALSE(r.has_value());
    INFO(r.error().message());
    // Element deletions go after every chain: op 5001 is the deletion of a missing element.
    CHECK(r.error().message().find("op 5001 of 5001 \"delete element ip kube-proxy service-ips { 0xac1ffffe") !=
          std::string::npos);
    CHECK_FALSE(h.readBack().ip.chains.contains("filler-0"));
  }

  SECTION("a conflicting element added behind our back") {
    auto fresh = clusterIP("ns", "late", "172.30.9.9", 80, {endpoint("10.9.9.9", 80)});
    REQUIRE(run("nft add element ip kube-proxy service-ips '{ 172.30.9.9 . tcp . 80 : drop }'").first == 0);
    snap.ports().push_back(fresh);
    auto out = backend->syncFrom(snap, {{net::Family::kIPv4, fresh.key}}, false);
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
  v6.sessionAffinityClientIP = true;  // the ip6 affinity record needs 13 of the 16 registers
  v6.stickyMaxAgeSeconds = 60;
  VectorSnapshot snap({v4, v6});
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  auto listing = run("nft list table ip6 kube-proxy");
  REQUIRE(listing.first == 0);
  INFO(listing.second);
  CHECK(listing.second.find("fd00:1::1 . 8080") != std::string::npos);
  CHECK(listing.second.find("dnat ip6 to numgen random mod 65535") != std::string::npos);
  CHECK(listing.second.find("update @session-affinity { ip6 saddr . numgen random mod 1 offset ") != std::string::npos);
  CHECK(listing.second.find("typeof ip6 saddr . numgen random mod 1 : ip6 daddr . th dport") != std::string::npos);

  REQUIRE(backend->cleanup().has_value());
  CHECK(run("nft list table ip kube-proxy").first != 0);
  CHECK(run("nft list table ip6 kube-proxy").first != 0);
  REQUIRE(backend->cleanup().has_value());
}

namespace {

/// A node for the data path inside the test's namespace: loopback, and a veth interface with
/// the node's address, client addresses 192.168.50.11-19 and a default route. Packets the node
/// sends pass the output hooks (DNAT, then the filter hook that records affinity) and go
/// nowhere (no neighbour answers), so no endpoint has to exist.
void nodeNetwork() {
  std::string cmd = "ip link set lo up && ip link add d0 type veth peer name d1 && ip link set d1 up && ip link set d0 up && "
                    "ip addr add 192.168.50.10/24 dev d0";
  for (int i = 11; i <= 19; ++i) cmd += " && ip addr add 192.168.50." + std::to_string(i) + "/24 dev d0";
  cmd += " && ip route add default via 192.168.50.1 dev d0 src 192.168.50.10";
  auto [rc, out] = run(cmd);
  INFO(out);
  REQUIRE(rc == 0);
}

/// One UDP datagram from a new socket bound to `source`: a new connection each time.
void sendUdp(const std::string& source, const std::string& destination, int port) {
  auto [rc, out] = run("python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                       "s.bind(('" + source + "', 0)); s.sendto(b'x', ('" + destination + "', " +
                       std::to_string(port) + "))\"");
  INFO(out);
  REQUIRE(rc == 0);
}

/// The session-affinity entries of `client` as nft lists them, one per element, and the
/// milliseconds until each expires.
struct AffinityListing {
  std::vector<std::string> entries;
  std::vector<std::int64_t> expiresMs;
};
AffinityListing affinityEntriesOf(const std::string& client) {
  auto [rc, listing] = run("nft list map ip kube-proxy session-affinity");
  INFO(listing);
  REQUIRE(rc == 0);
  AffinityListing out;
  const std::string prefix = client + " . ";
  for (std::size_t at = listing.find(prefix); at != std::string::npos; at = listing.find(prefix, at + 1)) {
    auto end = listing.find_first_of(",}\n", at);
    std::string entry = listing.substr(at, end - at);
    out.entries.push_back(entry);
    // "expires 9m59s990ms", "expires 1h2m", ...
    std::int64_t ms = -1;
    if (auto e = entry.find("expires "); e != std::string::npos) {
      ms = 0;
      std::size_t i = e + 8;
      while (i < entry.size() && std::isdigit(static_cast<unsigned char>(entry[i]))) {
        std::int64_t n = 0;
        while (i < entry.size() && std::isdigit(static_cast<unsigned char>(entry[i]))) n = n * 10 + (entry[i++] - '0');
        std::string unit;
        while (i < entry.size() && std::isalpha(static_cast<unsigned char>(entry[i]))) unit += entry[i++];
        ms += n * (unit == "d" ? 86400000 : unit == "h" ? 3600000 : unit == "m" ? 60000 : unit == "s" ? 1000 : 1);
      }
    }
    out.expiresMs.push_back(ms);
  }
  return out;
}

}  // namespace

TEST_CASE("nftables: session affinity holds across a service port's addresses, and a hit refreshes it",
          "[kernel]") {
  FreshNetns ns;
  nodeNetwork();
  Harness h;
  auto backend = h.backend(featureConfig());
  auto sticky = clusterIP("ns", "sticky", "172.30.5.1", 53, {endpoint("10.5.0.1", 53), endpoint("10.5.0.2", 53)},
                          sdk::Protocol::kUDP);
  sticky.type = sdk::ServiceType::kNodePort;
  sticky.nodePort = 30053;
  sticky.externalIPs = {"198.51.100.5"};
  sticky.sessionAffinityClientIP = true;
  sticky.stickyMaxAgeSeconds = 600;
  VectorSnapshot snap({sticky});
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));

  // The same client through the ClusterIP, the externalIP and a NodePort: one entry, as
  // upstream's per-endpoint sets hold one element per client.
  sendUdp("192.168.50.11", "172.30.5.1", 53);
  REQUIRE(affinityEntriesOf("192.168.50.11").entries.size() == 1);
  const std::string first = affinityEntriesOf("192.168.50.11").entries[0];
  const std::string endpoint = first.substr(first.rfind(": ") + 2);
  sendUdp("192.168.50.11", "198.51.100.5", 53);
  sendUdp("192.168.50.11", "192.168.50.10", 30053);
  auto after = affinityEntriesOf("192.168.50.11");
  INFO(first);
  REQUIRE(after.entries.size() == 1);
  CHECK(after.entries[0].ends_with(": " + endpoint));
  // The DNAT followed the entry: conntrack shows each connection going to that endpoint.
  auto [crc, conns] = run("conntrack -L -p udp -s 192.168.50.11");
  INFO(conns);
  REQUIRE(crc == 0);
  const std::string to = endpoint.substr(0, endpoint.find(' '));
  std::size_t n = 0;
  for (std::size_t at = conns.find("src=" + to + " "); at != std::string::npos; at = conns.find("src=" + to + " ", at + 1)) ++n;
  CHECK(n == 3);

  // A new connection that hits the entry restarts its timeout (upstream's `update` in the
  // endpoint chain does the same).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const std::int64_t before = affinityEntriesOf("192.168.50.11").expiresMs.at(0);
  CHECK(before <= 600000 - 2000);
  const auto sent = std::chrono::steady_clock::now();
  sendUdp("192.168.50.11", "172.30.5.1", 53);
  auto refreshed = affinityEntriesOf("192.168.50.11");
  const std::int64_t sinceSent =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - sent).count();
  REQUIRE(refreshed.entries.size() == 1);
  // Refreshed, the entry has the whole timeout less the time since the packet (and the kernel's
  // rounding); not refreshed, it would have at least the 2.5 s slept above less. Measured, not
  // assumed: however slow the machine, only a refresh passes.
  CHECK(refreshed.expiresMs.at(0) >= 600000 - sinceSent - 500);
  CHECK(refreshed.expiresMs.at(0) > before);
  CHECK(refreshed.entries[0].ends_with(": " + endpoint));
}

TEST_CASE("nftables: affinity entries pointing at a removed endpoint are deleted", "[kernel]") {
  FreshNetns ns;
  nodeNetwork();
  Harness h;
  auto backend = h.backend(featureConfig());
  auto sticky = clusterIP("ns", "sticky", "172.30.5.1", 53, {endpoint("10.5.0.1", 53)}, sdk::Protocol::kUDP);
  sticky.sessionAffinityClientIP = true;
  VectorSnapshot snap({sticky});
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  sendUdp("192.168.50.11", "172.30.5.1", 53);
  REQUIRE(affinityEntriesOf("192.168.50.11").entries.size() == 1);
  CHECK(affinityEntriesOf("192.168.50.11").entries[0].find(": 10.5.0.1 . ") != std::string::npos);
  // An endpoint joins: the entry stays valid.
  setEndpoints(snap.ports()[0], {endpoint("10.5.0.1", 53), endpoint("10.5.0.2", 53)});
  REQUIRE(ok(backend->syncFrom(snap, {{net::Family::kIPv4, snap.ports()[0].key}}, false)));
  CHECK(affinityEntriesOf("192.168.50.11").entries.size() == 1);
  // Its endpoint leaves: the entry goes, and the client is balanced afresh.
  setEndpoints(snap.ports()[0], {endpoint("10.5.0.2", 53)});
  REQUIRE(ok(backend->syncFrom(snap, {{net::Family::kIPv4, snap.ports()[0].key}}, false)));
  CHECK(affinityEntriesOf("192.168.50.11").entries.empty());
  sendUdp("192.168.50.11", "172.30.5.1", 53);
  REQUIRE(affinityEntriesOf("192.168.50.11").entries.size() == 1);
  CHECK(affinityEntriesOf("192.168.50.11").entries[0].find(": 10.5.0.2 . ") != std::string::npos);
}

TEST_CASE("nftables: the dry-run batch loads with nft -f", "[kernel]") {
  // --dry-run prints nft syntax for humans and for `nft -f`: the affinity rules' pool IDs
  // (numgen random mod 1 offset ID) included, eTP=Local's record chain too.
  FreshNetns ns;
  BackendSettings s;
  s.render = featureConfig();
  s.dryRun = true;
  char* buf = nullptr;
  std::size_t len = 0;
  s.dryRunOutput = open_memstream(&buf, &len);
  auto services = featureServices();
  auto local = clusterIP("default", "sticky-local", "172.30.0.15", 80,
                         {endpoint("10.1.0.7", 8080, true), endpoint("10.1.0.8", 8080)});
  local.type = sdk::ServiceType::kLoadBalancer;
  local.nodePort = 30080;
  local.loadBalancerIPs = {"198.51.100.15"};
  local.externalPolicyLocal = true;
  local.sessionAffinityClientIP = true;
  services.push_back(local);
  // An ip6 service without affinity: nft 1.0.6 (Debian 12) aborts on any `update` whose data
  // is `ip6 daddr . th dport` (netlink_gen_expr: dreg < reg_low), so ip6 affinity rules load
  // through kproxy's own netlink encoding only (see the dual-stack case).
  services.push_back(clusterIP("default", "web6", "fd00:30::15", 80, {endpoint("fd00:1::7", 8080)}));
  {
    // As the factory does for --dry-run: the printer over tables in memory.
    NftablesBackend backend(sdk::Host(nullptr), s,
                            std::make_unique<PrintingNftables>(std::make_unique<FakeKernelNftables>(), s.dryRunOutput));
    VectorSnapshot snap(services);
    REQUIRE(ok(backend.syncFrom(snap, {}, true)));
  }
  std::fclose(s.dryRunOutput);
  std::string text(buf, len);
  std::free(buf);
  CHECK(text.find("affinity-external-") != std::string::npos);
  const std::string file = "/tmp/kproxy-dry-run-" + std::to_string(::getpid()) + ".nft";
  {
    std::FILE* out = std::fopen(file.c_str(), "w");
    REQUIRE(out != nullptr);
    std::fwrite(text.data(), 1, text.size(), out);
    std::fclose(out);
  }
  auto [rc, err] = run("nft -f " + file);
  if (rc == 0) std::remove(file.c_str());
  INFO(err);
  REQUIRE(rc == 0);
  auto [lrc, listing] = run("nft list ruleset");
  CHECK(lrc == 0);
  CHECK(listing.find("update @session-affinity { ip saddr . numgen random mod 1 offset ") != std::string::npos);
  CHECK(listing.find("fib saddr type local update @session-affinity") != std::string::npos);
}

namespace {

/// The cluster the randomized test below mutates: services of one or two ports whose endpoints
/// come from one pool of pods per family, so a pod sits behind several ports (and services) as
/// EndpointSlices put it there. Randomness is `rng() % n` on a fixed seed: the standard
/// distributions may differ between standard libraries, and a failing step must replay.
class RandomCluster {
 public:
  /// `maxChanged`: the most service ports one step() changes.
  explicit RandomCluster(std::uint32_t seed, std::size_t maxChanged = 3) : rng_(seed), maxChanged_(maxChanged) {
    for (int i = 1; i <= 40; ++i) {
      // Every third pod runs on this node (endpoints of eTP/iTP=Local services).
      pods4_.push_back({"10.1.0." + std::to_string(i), i % 3 == 0});
      pods6_.push_back({"fd00:1::" + std::to_string(i), i % 3 == 0});
    }
    // The first shapes in a fixed pattern, so every kind is there from the full sync on.
    for (int i = 0; i < 30; ++i) add(makeService(net::Family::kIPv4, i));
    for (int i = 0; i < 3; ++i) add(makeService(net::Family::kIPv6, i));
  }

  /// The snapshot as the core would hand it over.
  std::vector<sdk::ServicePort> ports() const {
    std::vector<sdk::ServicePort> out;
    for (const auto& [name, svc] : services_)
      out.insert(out.end(), svc.ports.begin(), svc.ports.end());
    return out;
  }

  /// Changes 1-3 service ports (one at random, or all ports of a service when the change is
  /// service-wide) and returns their keys, deleted ones included.
  std::vector<sdk::ChangedKey> step() {
    const std::size_t wanted = 1 + pick(maxChanged_);
    std::vector<sdk::ChangedKey> changed;
    auto touch = [&](const sdk::ServicePort& p) {
      for (const auto& c : changed)
        if (c.family == p.family && c.key == p.key) return;
      changed.push_back({p.family, p.key});
    };
    while (changed.size() < wanted) {
      const auto mutation = static_cast<Mutation>(pick(kMutations));
      if (mutation == Mutation::kAddService) {
        Service svc = nextService();
        if (changed.size() + svc.ports.size() > maxChanged_) continue;
        for (const auto& p : svc.ports) touch(p);
        add(std::move(svc));
        continue;
      }
      if (services_.empty()) continue;  // every service deleted: only adding one is left
      auto it = std::next(services_.begin(), static_cast<std::ptrdiff_t>(pick(services_.size())));
      Service& svc = it->second;
      const bool serviceWide = mutation >= Mutation::kPodLeaves;
      if (changed.size() + (serviceWide ? svc.ports.size() : 1) > maxChanged_) continue;
      if (!serviceWide) {
        sdk::ServicePort& p = svc.ports[pick(svc.ports.size())];
        changeEndpoints(svc, p, mutation);
        touch(p);
        continue;
      }
      for (const auto& p : svc.ports) touch(p);
      changeService(svc, mutation);
      if (mutation == Mutation::kDeleteService) {
        deleted_.push_back(std::move(svc));
        services_.erase(it);
      }
    }
    return changed;
  }

 private:
  struct Pod {
    std::string ip;
    bool local = false;
  };
  struct Service {
    net::Family family = net::Family::kIPv4;
    std::vector<sdk::ServicePort> ports;
  };
  // Port-level changes first, then service-wide ones (see step()).
  enum class Mutation {
    kRemoveEndpoint,
    kAddEndpoint,
    kReplaceEndpoints,
    kClearEndpoints,
    kPodLeaves,
    kPodJoins,
    kToggleAffinity,
    kFlipExternalPolicy,
    kFlipInternalPolicy,
    kDeleteService,
    kAddService,
  };
  static constexpr std::size_t kMutations = static_cast<std::size_t>(Mutation::kAddService) + 1;

  std::size_t pick(std::size_t n) { return rng_() % n; }
  const std::vector<Pod>& pods(net::Family fam) const {
    return fam == net::Family::kIPv4 ? pods4_ : pods6_;
  }
  static int targetPort(const sdk::ServicePort& p) { return p.port + 8000; }
  sdk::Endpoint endpointOf(const Pod& pod, const sdk::ServicePort& p) const {
    return endpoint(pod.ip, targetPort(p), pod.local);
  }
  bool hasPod(const sdk::ServicePort& p, const Pod& pod) const {
    return std::any_of(p.allEndpoints.begin(), p.allEndpoints.end(),
                       [&](const sdk::Endpoint& e) { return e.ip == pod.ip; });
  }
  std::vector<const Pod*> randomPods(net::Family fam, std::size_t count) {
    std::vector<const Pod*> out;
    while (out.size() < count) {
      const Pod* pod = &pods(fam)[pick(pods(fam).size())];
      if (std::find(out.begin(), out.end(), pod) == out.end()) out.push_back(pod);
    }
    return out;
  }
  void setPods(sdk::ServicePort& p, const std::vector<const Pod*>& chosen) const {
    std::vector<sdk::Endpoint> eps;
    for (const Pod* pod : chosen) eps.push_back(endpointOf(*pod, p));
    setEndpoints(p, std::move(eps));
  }

  /// Service `variant` of a fixed pattern: two ports for every third, NodePort or
  /// LoadBalancer for two in five, affinity for one in four, eTP=Local for half the external
  /// ones, iTP=Local for one in eight, source ranges for some load balancers.
  Service makeService(net::Family fam, int variant) {
    const int id = nextId_++;
    const bool v4 = fam == net::Family::kIPv4;
    const std::string name = (v4 ? "svc-" : "svc6-") + std::to_string(id);
    const std::string address =
        v4 ? "172.30." + std::to_string(id / 250) + "." + std::to_string(id % 250 + 1)
           : "fd00:30::" + std::to_string(id + 1);
    struct PortSpec {
      const char* name;
      sdk::Protocol protocol;
      int port;
    };
    std::vector<PortSpec> specs;
    if (variant % 3 != 0)
      specs = {{"http", sdk::Protocol::kTCP, 80}};
    else if (variant % 2 == 0)
      specs = {{"http", sdk::Protocol::kTCP, 80}, {"metrics", sdk::Protocol::kTCP, 9090}};
    else
      specs = {{"dns", sdk::Protocol::kUDP, 53}, {"dns-tcp", sdk::Protocol::kTCP, 53}};
    // Both ports select the same pods (one in ten selects none yet).
    const auto chosen = randomPods(fam, variant % 10 == 9 ? 0 : 1 + pick(4));
    Service svc{fam, {}};
    for (const auto& spec : specs) {
      auto p = clusterIP("ns", name, address, spec.port, {}, spec.protocol, spec.name);
      setPods(p, chosen);
      if (variant % 5 == 1 || variant % 5 == 2) {
        p.type = variant % 5 == 1 ? sdk::ServiceType::kNodePort : sdk::ServiceType::kLoadBalancer;
        p.nodePort = nextNodePort_++;
        p.externalPolicyLocal = (variant / 2) % 2 == 0;
      }
      if (p.type == sdk::ServiceType::kLoadBalancer) {
        p.loadBalancerIPs = {v4 ? "198.51.100." + std::to_string(id % 250 + 1)
                                : "2001:db8:1::" + std::to_string(id + 1)};
        if (variant % 3 == 2)
          p.loadBalancerSourceRanges = {v4 ? "203.0.113.0/24" : "2001:db8:2::/64"};
      }
      p.sessionAffinityClientIP = variant % 4 == 1;
      p.stickyMaxAgeSeconds = 600;
      p.internalPolicyLocal = variant % 8 == 7;
      svc.ports.push_back(std::move(p));
    }
    return svc;
  }

  /// A new service, or now and then one deleted earlier coming back under its old name.
  Service nextService() {
    if (!deleted_.empty() && pick(3) == 0) {
      auto it = std::next(deleted_.begin(), static_cast<std::ptrdiff_t>(pick(deleted_.size())));
      Service svc = std::move(*it);
      deleted_.erase(it);
      return svc;
    }
    return makeService(pick(6) == 0 ? net::Family::kIPv6 : net::Family::kIPv4,
                       static_cast<int>(pick(120)));
  }

  void add(Service svc) {
    std::string id = svc.ports.front().key;
    services_.emplace(id.substr(0, id.find(':')), std::move(svc));
  }

  void changeEndpoints(const Service& svc, sdk::ServicePort& p, Mutation mutation) {
    std::vector<sdk::Endpoint> eps = p.allEndpoints;
    switch (mutation) {
      case Mutation::kRemoveEndpoint:
        if (!eps.empty()) eps.erase(eps.begin() + static_cast<std::ptrdiff_t>(pick(eps.size())));
        setEndpoints(p, std::move(eps));
        break;
      case Mutation::kAddEndpoint: {
        const Pod& pod = pods(svc.family)[pick(pods(svc.family).size())];
        if (!hasPod(p, pod)) eps.push_back(endpointOf(pod, p));
        setEndpoints(p, std::move(eps));
        break;
      }
      case Mutation::kReplaceEndpoints:
        setPods(p, randomPods(svc.family, pick(6)));
        break;
      default:
        setEndpoints(p, {});
        break;
    }
  }

  void changeService(Service& svc, Mutation mutation) {
    const Pod& pod = pods(svc.family)[pick(pods(svc.family).size())];
    for (auto& p : svc.ports) {
      std::vector<sdk::Endpoint> eps = p.allEndpoints;
      switch (mutation) {
        case Mutation::kPodLeaves:
          std::erase_if(eps, [&](const sdk::Endpoint& e) { return e.ip == pod.ip; });
          setEndpoints(p, std::move(eps));
          break;
        case Mutation::kPodJoins:
          if (!hasPod(p, pod)) eps.push_back(endpointOf(pod, p));
          setEndpoints(p, std::move(eps));
          break;
        case Mutation::kToggleAffinity:
          p.sessionAffinityClientIP = !p.sessionAffinityClientIP;
          break;
        case Mutation::kFlipExternalPolicy:
          p.externalPolicyLocal = !p.externalPolicyLocal;
          break;
        case Mutation::kFlipInternalPolicy:
          p.internalPolicyLocal = !p.internalPolicyLocal;
          break;
        default:
          break;  // kDeleteService: the caller removes it
      }
    }
  }

  std::mt19937 rng_;
  std::size_t maxChanged_;
  std::vector<Pod> pods4_;
  std::vector<Pod> pods6_;
  std::map<std::string, Service> services_;  ///< by "ns/name"
  std::vector<Service> deleted_;
  int nextId_ = 0;
  int nextNodePort_ = 30000;
};

RenderConfig dualStackConfig() {
  RenderConfig cfg = featureConfig();
  cfg.common.clusterCIDRs.push_back("fd00:1::/64");
  cfg.common.nodeIPs.push_back("fd00:50::10");
  return cfg;
}

std::string opsText(const std::vector<Op>& ops) {
  std::string out;
  for (const auto& op : ops) out += op.toText() + "\n";
  return out;
}

std::string keysText(const std::vector<sdk::ChangedKey>& keys) {
  std::string out;
  for (const auto& k : keys) out += (k.family == net::Family::kIPv4 ? " ip:" : " ip6:") + k.key;
  return out;
}

}  // namespace

TEST_CASE("nftables: random partial syncs match the kernel; full syncs then change nothing",
          "[kernel]") {
  constexpr std::uint32_t kSeed = 0x6b70726f;
  constexpr int kSteps = 150;
  constexpr int kCheckEvery = 25;
  FreshNetns ns;
  Harness h;
  RandomCluster cluster(kSeed);
  auto backend = h.backend(dualStackConfig());
  {
    VectorSnapshot snap(cluster.ports());
    REQUIRE(snap.ports().size() >= 44);
    REQUIRE(ok(backend->syncFrom(snap, {}, true)));
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  }
  for (int step = 1; step <= kSteps; ++step) {
    INFO("seed " << kSeed << " step " << step);
    const auto changed = cluster.step();
    INFO("changed keys:" << keysText(changed));
    VectorSnapshot snap(cluster.ports());
    REQUIRE(ok(backend->syncFrom(snap, changed, false)));
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
    if (step % kCheckEvery != 0) continue;

    // A full sync finds nothing to change. It may only delete the chains the partial sync just
    // flushed: a chain goes in the batch after the one that empties it (see differ.h).
    std::set<std::pair<net::Family, std::string>> flushed;
    for (const auto& op : backend->lastOps())
      if (op.kind == OpKind::kFlushChain) flushed.emplace(op.family, op.name);
    auto full = backend->syncFrom(snap, {}, true);
    REQUIRE(ok(full));
    for (const auto& op : backend->lastOps()) {
      INFO("full sync op: " << op.toText());
      CHECK(op.kind == OpKind::kDeleteChain);
      CHECK(flushed.contains({op.family, op.name}));
    }
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
    auto again = backend->syncFrom(snap, {}, true);
    REQUIRE(ok(again));
    INFO("second full sync:\n" << opsText(backend->lastOps()));
    CHECK(again->operations == 0);

    // A restart over the same kernel: nothing to do either; it carries on from here.
    auto restarted = h.backend(dualStackConfig());
    auto first = restarted->syncFrom(snap, {}, true);
    REQUIRE(ok(first));
    INFO("restart:\n" << opsText(restarted->lastOps()));
    CHECK(first->operations == 0);
    requireMirrorMatchesKernel(restarted->mirror(), h.readBack());
    backend = std::move(restarted);
  }
}

TEST_CASE("nftables: a restart after missed changes converges in one full sync", "[kernel]") {
  // kproxy was down while services changed: the new process's full sync meets a kernel that
  // holds the old layouts (endpoint counts changed in place, ports gone, new ports), built a
  // chunk of ports at a time. It must be accepted, leave exactly what it wants, and be final.
  constexpr std::uint32_t kSeed = 0x72657374;
  FreshNetns ns;
  Harness h;
  RandomCluster cluster(kSeed);
  for (int round = 1; round <= 6; ++round) {
    INFO("seed " << kSeed << " round " << round);
    {
      auto before = h.backend(dualStackConfig());
      VectorSnapshot snap(cluster.ports());
      REQUIRE(ok(before->syncFrom(snap, {}, true)));
    }
    std::set<std::string> missed;
    for (int i = 0; i < 10 * round; ++i)
      for (const auto& c : cluster.step()) missed.insert(c.key);
    INFO(missed.size() << " ports changed while down");
    VectorSnapshot snap(cluster.ports());
    auto restarted = h.backend(dualStackConfig());
    auto first = restarted->syncFrom(snap, {}, true);
    REQUIRE(ok(first));
    CHECK(first->operations > 0);
    requireMirrorMatchesKernel(restarted->mirror(), h.readBack());
    auto again = restarted->syncFrom(snap, {}, true);
    REQUIRE(ok(again));
    INFO("second full sync:\n" << opsText(restarted->lastOps()));
    for (const auto& op : restarted->lastOps()) CHECK(op.kind == OpKind::kDeleteChain);
    auto third = restarted->syncFrom(snap, {}, true);
    REQUIRE(ok(third));
    CHECK(third->operations == 0);
    // And a fresh process agrees.
    auto fresh = h.backend(dualStackConfig());
    auto none = fresh->syncFrom(snap, {}, true);
    REQUIRE(ok(none));
    CHECK(none->operations == 0);
  }
}

TEST_CASE("nftables: a full sync over objects of the table that kproxy does not render", "[kernel]") {
  // Left by another version or by hand (a set of upstream kube-proxy's shape, a base chain):
  // the full sync must be accepted, leave a mirror that matches the kernel, and the stale
  // chain must go in a later sync.
  FreshNetns ns;
  Harness h;
  auto backend = h.backend(featureConfig());
  VectorSnapshot snap(featureServices());
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  REQUIRE(run("nft add set ip kube-proxy affinity-legacy '{ type ipv4_addr ; flags dynamic,timeout ; timeout 3h ; }' && "
              "nft add element ip kube-proxy affinity-legacy '{ 10.1.0.1 }' && "
              "nft add set ip kube-proxy legacy-ips '{ type ipv4_addr ; }' && "
              "nft add element ip kube-proxy legacy-ips '{ 10.1.0.2, 10.1.0.3 }' && "
              "nft add chain ip kube-proxy filter-legacy '{ type filter hook output priority 0 ; }' && "
              "nft add rule ip kube-proxy filter-legacy counter")
              .first == 0);
  auto full = backend->syncFrom(snap, {}, true);
  REQUIRE(ok(full));
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  auto restarted = h.backend(featureConfig());
  auto later = restarted->syncFrom(snap, {}, true);
  REQUIRE(ok(later));
  requireMirrorMatchesKernel(restarted->mirror(), h.readBack());
  CHECK_FALSE(h.readBack().ip.chains.contains("filter-legacy"));
  auto none = restarted->syncFrom(snap, {}, true);
  REQUIRE(ok(none));
  CHECK(none->operations == 0);
}

TEST_CASE("nftables: random partial syncs of up to 100 changed ports are accepted", "[kernel]") {
  // As under API churn (the soak): many ports per batch, so that slot ranges are freed and
  // allocated in one batch. Taking over a range in the batch that deletes its old elements
  // made the kernel refuse the batch (EEXIST) at step 231.
  constexpr std::uint32_t kSeed = 0x6b70726f;
  FreshNetns ns;
  Harness h;
  RandomCluster cluster(kSeed, 100);
  auto backend = h.backend(dualStackConfig());
  {
    VectorSnapshot snap(cluster.ports());
    REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  }
  for (int step = 1; step <= 300; ++step) {
    INFO("seed " << kSeed << " step " << step);
    const auto changed = cluster.step();
    VectorSnapshot snap(cluster.ports());
    auto out = backend->syncFrom(snap, changed, false);
    INFO((out ? std::string() : out.error().message));
    REQUIRE(out.has_value());
    if (step % 50 == 0) requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  }
}

TEST_CASE("nftables: a slot range freed in a batch is taken over only after it", "[kernel]") {
  // One port loses its endpoints (its range is freed) while another gets a range in the same
  // batch, in both orders of the two: the new port does not take over the range whose old
  // elements that batch deletes (see the test above for what that led to); the next batch may.
  for (const bool freedFirst : {true, false}) {
    INFO("freed port rendered " << (freedFirst ? "first" : "second"));
    FreshNetns ns;
    Harness h;
    auto backend = h.backend();
    auto freed = clusterIP("ns", freedFirst ? "a" : "z", "172.30.0.1", 80,
                           {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080)});
    std::vector<sdk::ServicePort> ports{freed};
    VectorSnapshot before(ports);
    REQUIRE(ok(backend->syncFrom(before, {}, true)));
    setEndpoints(freed, {});
    auto taker = clusterIP("ns", "m", "172.30.0.2", 80,
                           {endpoint("10.1.0.3", 8080), endpoint("10.1.0.4", 8080), endpoint("10.1.0.5", 8080),
                            endpoint("10.1.0.6", 8080)});
    VectorSnapshot after(std::vector<sdk::ServicePort>{freed, taker});
    auto out = backend->syncFrom(after, {{net::Family::kIPv4, freed.key}, {net::Family::kIPv4, taker.key}}, false);
    INFO((out ? std::string() : out.error().message));
    REQUIRE(out.has_value());
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
    // The range is free again once that batch is in: a third port may take it.
    auto third = clusterIP("ns", "n", "172.30.0.3", 80, {endpoint("10.1.0.7", 8080)});
    VectorSnapshot last(std::vector<sdk::ServicePort>{freed, taker, third});
    REQUIRE(ok(backend->syncFrom(last, {{net::Family::kIPv4, third.key}}, false)));
    CHECK(*h.readBack().ip.chains.at(serviceChainName(third)).slotBase == 0u);
    requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  }
}

TEST_CASE("nftables: endpoints replaced in place in several ranges of one map", "[kernel]") {
  // An endpoint replaced by another keeps the layout: only the interval's start changes data.
  // A start sent without its end in a message that carries more elements was refused by the
  // kernel (EEXIST), which the soak's churn hit about once in five syncs.
  FreshNetns ns;
  Harness h;
  auto backend = h.backend();
  VectorSnapshot snap(manyServices(300, 2, false));
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  // The ports whose ranges are in one map, in the order of their ranges.
  const auto m = h.readBack();
  std::map<std::uint32_t, std::size_t> byRange;
  for (std::size_t i = 0; i < snap.ports().size(); ++i) {
    const auto& chain = m.ip.chains.at(serviceChainName(snap.ports()[i]));
    REQUIRE(chain.slotBase);
    if (serviceEndpointsMap(*chain.slotBase) == serviceEndpointsMap(0)) byRange[*chain.slotBase >> 16] = i;
  }
  REQUIRE(byRange.size() >= 4);
  std::vector<sdk::ChangedKey> changed;
  int n = 0;
  for (const auto& [range, i] : byRange) {
    auto& port = snap.ports()[i];
    // The first endpoint replaced; the first port also gets its second replaced.
    std::vector<sdk::Endpoint> eps = port.clusterEndpoints;
    eps[0] = endpoint("10.9.0." + std::to_string(++n), 8080);
    if (n == 1) eps[1] = endpoint("10.9.1.1", 8080);
    setEndpoints(port, eps);
    changed.push_back({net::Family::kIPv4, port.key});
  }
  auto out = backend->syncFrom(snap, changed, false);
  INFO((out ? std::string() : out.error().message));
  REQUIRE(out.has_value());
  requireMirrorMatchesKernel(backend->mirror(), h.readBack());
  auto full = backend->syncFrom(snap, {}, true);
  REQUIRE(full.has_value());
  CHECK(full->operations == 0);
}
