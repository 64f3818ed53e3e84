// The iptables backend against the real kernel, through iptables-nft and iptables-legacy alike;
// each case runs in a network namespace of its own (FreshNetns), never the host's.

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../unit/iptables/iptables_fixtures.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/iptables/backend.h"
#include "kproxy/iptables/kernel.h"
#include "kproxy/iptables/kernel_netlink.h"
#include "kproxy/kernel/netlink_socket.h"
#include "kproxy/kernel/nfacct.h"
#include "kproxy/kernel/process.h"
#include "metrics.h"
#include "netns.h"
#include "snapshot_bridge.h"

using namespace kproxy;
using namespace kproxy::iptables;
using kproxy::iptables::testing::allFeatureServices;
using kproxy::iptables::testing::canonical;
using kproxy::iptables::testing::ChainMap;
using kproxy::iptables::testing::chainsOf;
using kproxy::iptables::testing::clusterIP;
using kproxy::iptables::testing::countLines;
using kproxy::iptables::testing::endpoint;
using kproxy::iptables::testing::featureConfig;
using kproxy::iptables::testing::featureNode;
using kproxy::iptables::testing::setEndpoints;
using kproxy::iptables::testing::TempSysctls;
using kproxy::nftables::testing::manyServices;
using kproxy::testing::FreshNetns;
using kproxy::testing::run;
using kproxy::testing::sh;
using plan::VectorSnapshot;

namespace {

constexpr net::Family kV4 = net::Family::kIPv4;
constexpr net::Family kV6 = net::Family::kIPv6;
constexpr net::Family kFamilies[] = {kV4, kV6};

const char* familyName(net::Family f) { return f == kV6 ? "IPv6" : "IPv4"; }

/// The tools of one variant and a kernel adapter over them, in the calling thread's namespace
/// (processes spawned from it inherit it).
struct Harness {
  explicit Harness(Variant v) {
    auto found = findVariantTools(v);
    if (!found) FAIL("iptables-" << variantName(v) << " is not installed: " << found.error().message());
    tools = *found;
    REQUIRE_FALSE(tools.save6.empty());
    REQUIRE_FALSE(tools.restore6.empty());
    REQUIRE_FALSE(tools.iptables6.empty());
    kernel = makeProcessKernel(tools, runner);
  }
  std::unique_ptr<IptablesBackend> backend(RenderConfig cfg = featureConfig()) {
    BackendSettings s;
    s.render = std::move(cfg);
    s.ipv6 = true;
    return std::make_unique<IptablesBackend>(sdk::Host(nullptr), std::move(s), makeProcessKernel(tools, runner),
                                             kernel::makeFileSysctls(sysctls.root()));
  }
  const std::string& iptables(net::Family f) const { return f == kV6 ? tools.iptables6 : tools.iptables4; }
  /// iptables-save of every table of `family`.
  std::string saved(net::Family f) {
    std::string out;
    for (Table t : kTables) {
      auto text = kernel->save(f, t);
      if (!text) FAIL("save: " << text.error().message());
      out += *text;
    }
    return out;
  }
  ChainMap owned(net::Family f) { return chainsOf(saved(f), true); }
  void restore(net::Family f, const std::string& input) {
    auto r = kernel->restore(f, input);
    if (!r) FAIL("restore: " << r.error().message() << "\n" << input);
  }

  kernel::SystemProcessRunner runner;
  VariantTools tools;
  std::unique_ptr<KernelIptables> kernel;
  TempSysctls sysctls;
};

/// The rules kproxy wants for `snap`, canonical.
ChainMap wanted(VectorSnapshot& snap, net::Family f, RenderConfig cfg = featureConfig(), bool large = false) {
  IptablesRenderer r(std::move(cfg));
  r.setNode(snap.node());
  r.setServiceCIDRs(snap.serviceCIDRs());
  r.setLargeCluster(large);
  return canonical(chainsOf(renderRuleset(r, f, snap.ports(), snap.node()), true));
}

/// Chain by chain, rule by rule, so a difference names the chain and the rule.
void requireSameChains(const ChainMap& actual, const ChainMap& expected) {
  for (const auto& [key, rules] : expected) {
    INFO(key.first << " " << key.second);
    auto it = actual.find(key);
    CHECK(it != actual.end());
    if (it == actual.end()) continue;
    for (std::size_t i = 0; i < std::max(rules.size(), it->second.size()); ++i) {
      INFO("rule " << i + 1);
      CHECK((i < it->second.size() ? it->second[i] : "<none>") == (i < rules.size() ? rules[i] : "<none>"));
    }
  }
  for (const auto& [key, rules] : actual) {
    INFO(key.first << " " << key.second);
    CHECK(expected.contains(key));
  }
  REQUIRE(actual == expected);
}

/// Everything not kproxy's: foreign chains whole, and the built-in chains' rules that do not
/// jump to one of kproxy's chains.
ChainMap foreign(const std::string& saved) {
  ChainMap out;
  for (auto& [key, rules] : chainsOf(saved, false)) {
    Table t = Table::kFilter;
    for (Table c : kTables)
      if (tableName(c) == key.first) t = c;
    if (isOwnedChain(t, key.second)) continue;
    auto& kept = out[key];
    for (const auto& r : rules)
      if (!isOwnedChain(t, backends::ruleJumpTarget(r))) kept.push_back(r);
  }
  return out;
}

template <typename T>
bool ok(const sdk::Expected<T>& r) {
  if (!r) UNSCOPED_INFO("sync error: " << r.error().message);
  return r.has_value();
}

VectorSnapshot featureSnapshot() {
  VectorSnapshot snap(allFeatureServices(), featureNode());
  snap.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"kubernetes", "fd00:30::/108"}});
  return snap;
}

std::size_t indexOf(VectorSnapshot& snap, const std::string& key) {
  for (std::size_t i = 0; i < snap.ports().size(); ++i)
    if (snap.ports()[i].key == key) return i;
  FAIL("no port " << key);
  return 0;
}

}  // namespace

TEST_CASE("iptables kernel: the rendered ruleset reads back from iptables-save exactly as rendered", "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));

  struct Case {
    const char* what;
    RenderConfig cfg;
    sdk::NodeInfo node;
    bool large = false;
  };
  std::vector<Case> cases;
  cases.push_back({"ClusterCIDR, defaults", featureConfig(), featureNode()});
  {
    auto cfg = featureConfig();
    cfg.common.detectLocalMode = "BridgeInterface";
    cfg.common.bridgeInterface = "cbr0";
    cfg.common.masqueradeAll = true;
    cfg.randomFully = false;
    cfg.common.masqueradeBit = 5;
    cfg.conntrackTCPLiberal = true;
    cases.push_back({"BridgeInterface, masquerade-all, large cluster", cfg, featureNode(), true});
  }
  {
    auto cfg = featureConfig();
    cfg.common.detectLocalMode = "InterfaceNamePrefix";
    cfg.common.interfaceNamePrefix = "veth";
    cfg.localhostNodePorts = false;
    auto node = featureNode();
    node.nodePortAddresses.resolved = true;
    node.nodePortAddresses.addresses = {"192.168.50.10", "127.0.0.1", "fd00:50::10"};
    cases.push_back({"InterfaceNamePrefix, NodePort addresses", cfg, node});
  }
  {
    auto cfg = featureConfig();
    cfg.common.detectLocalMode = "NodeCIDR";
    auto node = featureNode();
    node.podCIDRs = {"10.244.3.0/24", "fd00:244:3::/64"};
    node.nodePortAddresses.resolved = true;
    node.nodePortAddresses.addresses = {"127.0.0.1", "192.168.50.10"};
    node.nodePortAddresses.allLocalIPv6 = true;
    cases.push_back({"NodeCIDR, localhost NodePorts", cfg, node});
  }

  for (const auto& c : cases) {
    INFO(c.what);
    FreshNetns ns;
    Harness h(variant);
    IptablesRenderer r(c.cfg);
    r.setNode(c.node);
    r.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"kubernetes", "fd00:30::/108"}, {"more", "172.31.0.0/24"}});
    r.setLargeCluster(c.large);
    const auto ports = allFeatureServices();
    for (net::Family fam : kFamilies) {
      INFO(familyName(fam));
      const std::string text = renderRuleset(r, fam, ports, c.node);
      h.restore(fam, text);
      const std::string saved = h.saved(fam);
      INFO(saved);
      requireSameChains(chainsOf(saved, true), chainsOf(text, true));
      // The jumps, each first in its built-in chain (the last inserted first).
      const auto all = chainsOf(saved, false);
      const auto rendered = chainsOf(text, false);
      for (const char* builtin : {"INPUT", "FORWARD", "OUTPUT"}) CHECK(all.at({"filter", builtin}) == rendered.at({"filter", builtin}));
      for (const char* builtin : {"PREROUTING", "OUTPUT", "POSTROUTING"}) CHECK(all.at({"nat", builtin}) == rendered.at({"nat", builtin}));
    }
  }
}

TEST_CASE("iptables kernel: a full sync, then a restart over the unchanged kernel writes nothing", "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  auto first = backend->syncFrom(snap, {}, false);
  REQUIRE(ok(first));
  CHECK(first->summary.starts_with("iptables sync full=true "));
  // iptables-nft: the service ports' chains went over netlink, and what follows (the restart
  // writing nothing) holds of them as of the tool's.
  INFO(first->summary);
  CHECK((first->summary.find(" netlink_commits=2") != std::string::npos) ==
        (variant == Variant::kNft));
  CHECK(h.sysctls.routeLocalnet() == "1");
  for (net::Family fam : kFamilies) {
    INFO(familyName(fam));
    CHECK_FALSE(backend->lastRestore(fam).empty());
    requireSameChains(canonical(h.owned(fam)), wanted(snap, fam));
  }
  const std::string before4 = h.saved(kV4), before6 = h.saved(kV6);

  auto again = backend->syncFrom(snap, {}, true);
  REQUIRE(ok(again));
  CHECK(again->operations == 0);
  auto restarted = h.backend();
  auto second = restarted->syncFrom(snap, {}, false);
  REQUIRE(ok(second));
  CHECK(second->summary.starts_with("iptables sync full=true "));
  CHECK(second->operations == 0);
  for (net::Family fam : kFamilies) CHECK(restarted->lastRestore(fam).empty());
  CHECK(chainsOf(h.saved(kV4), false) == chainsOf(before4, false));
  CHECK(chainsOf(h.saved(kV6), false) == chainsOf(before6, false));
  // Periodic syncs with nothing changed: the canary is there, nothing written.
  auto periodic = restarted->syncFrom(snap, {}, false);
  REQUIRE(ok(periodic));
  CHECK(periodic->summary.starts_with("iptables sync full=false "));
  CHECK(periodic->operations == 0);
}

TEST_CASE("iptables kernel: one endpoint change among 1,000 services restores that service's chains only",
          "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap(manyServices(1000, 2), featureNode());
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));
  // 1,000 ClusterIP captures and the NodePorts jump.
  REQUIRE(h.owned(kV4).at({"nat", "KUBE-SERVICES"}).size() == 1001);

  auto& port = snap.ports()[500];  // svc-500: affinity (every tenth)
  REQUIRE(port.sessionAffinityClientIP);
  const std::string name = "ns/svc-500:p";
  const std::string oldEp = port.allEndpoints[1].ip;
  setEndpoints(port, {port.allEndpoints[0], endpoint("10.200.0.1", 8080)});
  auto out = backend->syncFrom(snap, {{kV4, port.key}}, false);
  REQUIRE(ok(out));
  CHECK(out->summary.starts_with("iptables sync full=false "));
  // iptables-nft: one netlink transaction (whole nat chains only); legacy: one restore, and
  // what it cost in user space and in the kernel.
  INFO(out->summary);
  if (variant == Variant::kNft) {
    CHECK(out->summary.find(" netlink_rules=7 netlink_commits=1") != std::string::npos);
    CHECK(out->summary.find("tool_runs=") == std::string::npos);
  } else {
    CHECK(out->summary.find(" tool_runs=1 tool_user_ms=") != std::string::npos);
    CHECK(out->summary.find(" tool_kernel_ms=") != std::string::npos);
  }
  const std::string& input = backend->lastRestore(kV4);
  INFO(input);
  const std::string svc = backends::servicePortPolicyClusterChain(name, "tcp");
  const std::string added = backends::servicePortEndpointChain(name, "tcp", "10.200.0.1:8080");
  const std::string gone = backends::servicePortEndpointChain(name, "tcp", oldEp + ":8080");
  // *nat; declarations of the policy chain, the new endpoint chain and the one going; the
  // policy chain's masquerade + 2 affinity + 2 balancing rules; the new endpoint chain's 2;
  // -X of the old one; COMMIT.
  CHECK(countLines(input) == 1 + 3 + 5 + 2 + 1 + 1);
  CHECK(countLines(input, ":") == 3);
  CHECK(countLines(input, ":" + svc + " ") == 1);
  CHECK(countLines(input, ":" + added + " ") == 1);
  CHECK(countLines(input, "-X " + gone) == 1);
  CHECK(input.find("KUBE-SERVICES") == std::string::npos);
  CHECK(input.find("KUBE-NODEPORTS") == std::string::npos);
  CHECK(input.find("*filter") == std::string::npos);
  CHECK(backend->lastRestore(kV6).empty());

  // The kernel holds exactly what a full render wants (2,000 endpoints: no per-endpoint
  // comments, as upstream's large-cluster mode).
  requireSameChains(canonical(h.owned(kV4)), wanted(snap, kV4, featureConfig(), true));
  const auto chains = h.owned(kV4);
  CHECK_FALSE(chains.contains({"nat", gone}));
  CHECK(chains.at({"nat", added}).size() == 2);

  // A restart over it (large-cluster mode decided again from the snapshot) writes nothing.
  auto restarted = h.backend();
  auto again = restarted->syncFrom(snap, {}, false);
  REQUIRE(ok(again));
  CHECK(again->summary.starts_with("iptables sync full=true "));
  CHECK(again->operations == 0);
  CHECK(restarted->lastRestore(kV4).empty());
}

TEST_CASE("iptables kernel: foreign chains and rules stay as they were through syncs and cleanup", "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  for (net::Family fam : kFamilies) {
    const std::string ipt = h.iptables(fam) + " -w 5 ";
    // kubelet's chains.
    for (const char* table : {"mangle", "nat", "filter"}) sh(ipt + "-t " + table + " -N KUBE-KUBELET-CANARY");
    sh(ipt + "-N KUBE-FIREWALL");
    sh(ipt + "-A KUBE-FIREWALL -m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark "
             "0x8000/0x8000 -j DROP");
    sh(ipt + "-I INPUT -j KUBE-FIREWALL");
    sh(ipt + "-I OUTPUT -j KUBE-FIREWALL");
    // A user's chain.
    sh(ipt + "-N MY-CHAIN");
    sh(ipt + "-A MY-CHAIN -p tcp --dport 22 -j ACCEPT");
    sh(ipt + "-A INPUT -j MY-CHAIN");
    // Docker's.
    sh(ipt + "-t nat -N DOCKER");
    sh(ipt + "-t nat -A DOCKER -i docker0 -j RETURN");
    sh(ipt + "-t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER");
    sh(ipt + "-t nat -A OUTPUT -m addrtype --dst-type LOCAL -j DOCKER");
    sh(ipt + "-t nat -A POSTROUTING -s " + (fam == kV6 ? "fd00:17::/64" : "172.17.0.0/16") +
       " ! -o docker0 -j MASQUERADE");
    sh(ipt + "-N DOCKER");
    sh(ipt + "-N DOCKER-USER");
    sh(ipt + "-A DOCKER-USER -j RETURN");
    sh(ipt + "-A FORWARD -j DOCKER-USER");
    sh(ipt + "-A FORWARD -o docker0 -j DOCKER");
  }
  const ChainMap foreign4 = foreign(h.saved(kV4)), foreign6 = foreign(h.saved(kV6));
  REQUIRE(foreign4.at({"nat", "DOCKER"}).size() == 1);
  REQUIRE(foreign6.at({"filter", "KUBE-FIREWALL"}).size() == 1);
  auto requireForeignIntact = [&] {
    CHECK(foreign(h.saved(kV4)) == foreign4);
    CHECK(foreign(h.saved(kV6)) == foreign6);
  };

  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));
  requireForeignIntact();

  // Partial syncs: an endpoint change, a new service, a removed one, in both families.
  auto& web = snap.ports()[indexOf(snap, "four/web:p")];
  setEndpoints(web, {endpoint("10.1.0.1", 8080)});
  snap.ports().push_back(clusterIP("six", "late", "fd00:30::99", 80, {endpoint("fd00:10::99", 80)}));
  snap.ports().erase(snap.ports().begin() + static_cast<std::ptrdiff_t>(indexOf(snap, "six/sticky:p")));
  REQUIRE(ok(backend->syncFrom(snap, {{kV4, "four/web:p"}, {kV6, "six/late:p"}, {kV6, "six/sticky:p"}}, false)));
  requireForeignIntact();
  for (net::Family fam : kFamilies) requireSameChains(canonical(h.owned(fam)), wanted(snap, fam));
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  requireForeignIntact();

  REQUIRE(ok(backend->cleanup()));
  for (net::Family fam : kFamilies) {
    INFO(familyName(fam));
    CHECK(h.owned(fam).empty());
    CHECK(chainsOf(h.saved(fam), false) == (fam == kV4 ? foreign4 : foreign6));
  }
}

TEST_CASE("iptables kernel: cleanup removes every chain and jump of kproxy's", "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));
  REQUIRE(h.owned(kV4).size() > 30);
  // A leftover of an earlier run that nothing wants any more: cleanup takes it too.
  h.restore(kV4, "*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-MARK-MASQ\nCOMMIT\n");

  auto fresh = h.backend();  // cleanup as `kproxy --cleanup` runs it: a backend that never synced
  REQUIRE(ok(fresh->cleanup()));
  for (net::Family fam : kFamilies) {
    INFO(familyName(fam));
    const std::string saved = h.saved(fam);
    INFO(saved);
    CHECK(saved.find("KUBE-") == std::string::npos);
    for (const auto& [key, rules] : chainsOf(saved, false)) CHECK(rules.empty());
  }
  // Cleaning an empty ruleset again is no error and writes nothing.
  REQUIRE(ok(fresh->cleanup()));
}

TEST_CASE("iptables kernel: a refused restore names the line, keeps the table, and the next sync repairs",
          "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));

  // Someone deletes the service's capture by hand; the backend does not know, so its partial
  // sync's -D of that rule fails.
  const std::string key = "four/ext:p";
  const std::string svc = backends::servicePortPolicyClusterChain(key, "tcp");
  std::string capture;
  const auto natServices = h.owned(kV4).at({"nat", "KUBE-SERVICES"});
  for (const auto& r : natServices)
    if (r.ends_with("-j " + svc)) capture = r;
  REQUIRE_FALSE(capture.empty());
  h.restore(kV4, "*nat\n-D KUBE-SERVICES " + capture + "\nCOMMIT\n");
  const ChainMap natBefore = [&] {
    ChainMap nat;
    for (auto& [k, rules] : chainsOf(h.saved(kV4), false))
      if (k.first == "nat") nat[k] = rules;
    return nat;
  }();

  snap.ports().erase(snap.ports().begin() + static_cast<std::ptrdiff_t>(indexOf(snap, key)));
  auto out = backend->syncFrom(snap, {{kV4, key}}, false);
  REQUIRE_FALSE(out.has_value());
  INFO(out.error().message);
  CHECK(out.error().category == sdk::ErrorCategory::kKernelRefused);
  CHECK(out.error().message.find("-restore") != std::string::npos);
  // The message quotes the line the tool named: the deletion of the missing rule.
  CHECK(out.error().message.find(": -D KUBE-SERVICES " + capture) != std::string::npos);
  CHECK(backend->needsFullSync());
  // The nat table is as it was (iptables-restore commits each table on its own).
  ChainMap natAfter;
  for (auto& [k, rules] : chainsOf(h.saved(kV4), false))
    if (k.first == "nat") natAfter[k] = rules;
  CHECK(natAfter == natBefore);
  CHECK(natAfter.contains({"nat", svc}));

  // The next sync, periodic, is full and repairs.
  auto repair = backend->syncFrom(snap, {}, false);
  REQUIRE(ok(repair));
  CHECK(repair->summary.starts_with("iptables sync full=true "));
  CHECK_FALSE(backend->needsFullSync());
  for (net::Family fam : kFamilies) requireSameChains(canonical(h.owned(fam)), wanted(snap, fam));

  // A restore the kernel refuses outright (a jump to a chain that does not exist) is named by
  // its line too, and leaves nothing behind.
  auto bad = h.kernel->restore(kV4, "*nat\n:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]\n-A KUBE-SVC-BBBBBBBBBBBBBBBB -j "
                                    "KUBE-NO-SUCH-CHAIN\nCOMMIT\n");
  REQUIRE_FALSE(bad.has_value());
  INFO(bad.error().message());
  if (variant == Variant::kLegacy) {
    CHECK(bad.error().message().find("line 3: -A KUBE-SVC-BBBBBBBBBBBBBBBB -j KUBE-NO-SUCH-CHAIN") != std::string::npos);
  } else {
    // iptables-nft resolves jumps when it commits the table, and names the COMMIT line.
    CHECK(bad.error().message().find("Chain 'KUBE-NO-SUCH-CHAIN' does not exist") != std::string::npos);
    CHECK(bad.error().message().find("line 4: COMMIT") != std::string::npos);
  }
  CHECK_FALSE(h.owned(kV4).contains({"nat", "KUBE-SVC-BBBBBBBBBBBBBBBB"}));
}

TEST_CASE("iptables kernel: a refused netlink transaction applies nothing, names the chain, and the full sync "
          "after it repairs",
          "[kernel]") {
  FreshNetns ns;
  Harness h(Variant::kNft);
  VectorSnapshot snap(manyServices(100, 2), featureNode());
  auto backend = h.backend();
  auto first = backend->syncFrom(snap, {}, false);
  REQUIRE(ok(first));
  INFO(first->summary);
  REQUIRE(first->summary.find(" netlink_rules=") != std::string::npos);

  // An operator's rule jumps to one of the service's endpoint chains; the partial sync that
  // replaces that endpoint deletes the chain, which the kernel refuses while it is referenced.
  auto& port = snap.ports()[50];
  const std::string name = "ns/svc-50:p";
  const std::string gone =
      backends::servicePortEndpointChain(name, "tcp", backends::endpointHostPort(port.allEndpoints[1].ip, 8080));
  REQUIRE(h.owned(kV4).contains({"nat", gone}));
  h.restore(kV4, "*nat\n-A PREROUTING -s 203.0.113.9/32 -j " + gone + "\nCOMMIT\n");
  const std::string before = h.saved(kV4);
  setEndpoints(port, {port.allEndpoints[0], endpoint("10.200.0.7", 8080)});
  auto out = backend->syncFrom(snap, {{kV4, port.key}}, false);
  REQUIRE_FALSE(out.has_value());
  INFO(out.error().message);
  CHECK(out.error().category == sdk::ErrorCategory::kKernelRefused);
  CHECK(out.error().message.find("over netlink") != std::string::npos);
  CHECK(out.error().message.find("chain " + gone) != std::string::npos);
  CHECK(backend->needsFullSync());
  // Nothing of the transaction applied: the service's chains are as they were.
  CHECK(chainsOf(h.saved(kV4), false) == chainsOf(before, false));

  // While the operator's rule stays, the full sync writes the service's new chains (over
  // netlink) but the tool's deletion of the busy chain fails, and the chain stays.
  auto stuck = backend->syncFrom(snap, {}, false);
  REQUIRE_FALSE(stuck.has_value());
  INFO(stuck.error().message);
  CHECK(stuck.error().message.find("-X " + gone) != std::string::npos);
  CHECK(h.owned(kV4).contains({"nat", gone}));
  // The operator's rule goes; the next sync is full and repairs (deleting the chain).
  h.restore(kV4, "*nat\n-D PREROUTING -s 203.0.113.9/32 -j " + gone + "\nCOMMIT\n");
  auto repair = backend->syncFrom(snap, {}, false);
  REQUIRE(ok(repair));
  INFO(repair->summary);
  CHECK(repair->summary.starts_with("iptables sync full=true "));
  requireSameChains(canonical(h.owned(kV4)), wanted(snap, kV4));
  CHECK_FALSE(h.owned(kV4).contains({"nat", gone}));
  // The refusal was the state's (the chain was busy), not the encoding's, so changes go over
  // netlink again; and deleting a chain someone deleted already is no error.
  const std::string next = backends::servicePortEndpointChain(name, "tcp", "10.200.0.7:8080");
  const std::string svc = backends::servicePortPolicyClusterChain(name, "tcp");
  REQUIRE(h.owned(kV4).contains({"nat", next}));
  h.restore(kV4, "*nat\n:" + svc + " - [0:0]\n:" + next + " - [0:0]\n-X " + next + "\nCOMMIT\n");
  REQUIRE_FALSE(h.owned(kV4).contains({"nat", next}));
  setEndpoints(port, {port.allEndpoints[0], endpoint("10.200.0.8", 8080)});
  auto after = backend->syncFrom(snap, {{kV4, port.key}}, false);
  REQUIRE(ok(after));
  INFO(after->summary);
  CHECK(after->summary.find(" netlink_commits=1") != std::string::npos);
  requireSameChains(canonical(h.owned(kV4)), wanted(snap, kV4));
}

TEST_CASE("iptables kernel: a flushed nat table and a lost canary are repaired by the next periodic sync",
          "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));
  const std::string before = h.saved(kV4);

  sh(h.iptables(kV4) + " -w 5 -t nat -F");
  sh(h.iptables(kV4) + " -w 5 -t mangle -X KUBE-PROXY-CANARY");
  REQUIRE(h.owned(kV4).at({"nat", "KUBE-SERVICES"}).empty());

  auto out = backend->syncFrom(snap, {}, false);  // periodic: no changed keys
  REQUIRE(ok(out));
  CHECK(out->summary.starts_with("iptables sync full=true "));
  CHECK(backend->lastRestore(kV6).empty());
  const std::string& input = backend->lastRestore(kV4);
  CHECK(input.find("*filter") == std::string::npos);  // the filter table was not touched
  CHECK(input.find("*mangle\n:KUBE-PROXY-CANARY - [0:0]\n") != std::string::npos);
  requireSameChains(canonical(h.owned(kV4)), wanted(snap, kV4));
  CHECK(chainsOf(h.saved(kV4), false) == chainsOf(before, false));
}

TEST_CASE("iptables kernel: rules deleted by hand are restored by a full sync", "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));
  const std::string before4 = h.saved(kV4), before6 = h.saved(kV6);

  const std::string svc4 = backends::servicePortPolicyClusterChain("four/web:p", "tcp");
  const std::string fw6 = backends::serviceFirewallChain("six/lb:p", "sctp");
  sh(h.iptables(kV4) + " -w 5 -t nat -D " + svc4 + " 2");
  sh(h.iptables(kV4) + " -w 5 -t nat -D PREROUTING 1");
  sh(h.iptables(kV4) + " -w 5 -t filter -D KUBE-FORWARD 1");
  sh(h.iptables(kV6) + " -w 5 -t nat -D " + fw6 + " 1");
  sh(h.iptables(kV6) + " -w 5 -t filter -D KUBE-EXTERNAL-SERVICES 1");
  REQUIRE(h.saved(kV4) != before4);

  auto out = backend->syncFrom(snap, {}, true);
  REQUIRE(ok(out));
  const std::string& in4 = backend->lastRestore(kV4);
  const std::string& in6 = backend->lastRestore(kV6);
  INFO(in4 << in6);
  CHECK(countLines(in4, ":") == 2);  // KUBE-FORWARD and the policy chain are rewritten
  CHECK(countLines(in4, ":" + svc4 + " ") == 1);
  CHECK(countLines(in4, ":KUBE-FORWARD ") == 1);
  CHECK(countLines(in4, "-I PREROUTING 1 ") == 1);
  CHECK(countLines(in6, ":") == 2);
  CHECK(countLines(in6, ":" + fw6 + " ") == 1);
  CHECK(countLines(in6, ":KUBE-EXTERNAL-SERVICES ") == 1);
  CHECK(chainsOf(h.saved(kV4), false) == chainsOf(before4, false));
  for (net::Family fam : kFamilies) requireSameChains(canonical(h.owned(fam)), wanted(snap, fam));
  CHECK(canonical(chainsOf(h.saved(kV6), false)) == canonical(chainsOf(before6, false)));
}

TEST_CASE("iptables kernel: random partial syncs keep the kernel equal to a full render", "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  Harness h(variant);
  VectorSnapshot snap = featureSnapshot();
  auto backend = h.backend();
  REQUIRE(ok(backend->syncFrom(snap, {}, false)));
  std::mt19937 rng(424242);
  int serial = 0;
  for (int step = 0; step < 40; ++step) {
    std::vector<sdk::ChangedKey> changed;
    for (int n = 1 + step % 3; n > 0; --n) kproxy::iptables::testing::mutate(snap.ports(), rng, changed, serial);
    kproxy::iptables::testing::reindex(snap);
    auto out = backend->syncFrom(snap, changed, false);
    INFO("step " << step);
    REQUIRE(ok(out));
    REQUIRE(out->summary.starts_with("iptables sync full=false "));
    for (net::Family fam : kFamilies) {
      INFO(familyName(fam) << "\n" << backend->lastRestore(fam));
      REQUIRE(kproxy::iptables::testing::chainDiff(canonical(h.owned(fam)), wanted(snap, fam)) == "");
    }
  }
  auto full = backend->syncFrom(snap, {}, true);
  REQUIRE(ok(full));
  CHECK(full->operations == 0);
}

// ---- iptables-nft's rules written over netlink (NftRuleBatch) ----

namespace {

/// The objects of table `nat` of `family` as the kernel dumps them: chains, and per chain its
/// rules, each as the hex of its attributes less the kernel's own bookkeeping (handles, use
/// counts, positions), so that two namespaces built the same way compare equal.
struct NatDump {
  std::map<std::string, std::string> chains;
  std::map<std::string, std::vector<std::string>> rules;
};

NatDump dumpNat(net::Family family) {
  auto socket = kernel::NetlinkSocket::open(NETLINK_NETFILTER);
  REQUIRE(socket.has_value());
  NatDump out;
  for (std::uint16_t msg : {NFT_MSG_GETCHAIN, NFT_MSG_GETRULE}) {
    std::array<char, 512> buf{};
    nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
    nlh->nlmsg_type = static_cast<std::uint16_t>((NFNL_SUBSYS_NFTABLES << 8) | msg);
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    nlh->nlmsg_seq = socket->nextSeq();
    auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
    nfg->nfgen_family = family == kV6 ? NFPROTO_IPV6 : NFPROTO_IPV4;
    nfg->version = NFNETLINK_V0;
    auto dumped = socket->dump(nlh, [&](const nlmsghdr* reply) {
      std::string table, chain, hex;
      const char* end = static_cast<const char*>(mnl_nlmsg_get_payload_tail(reply));
      for (auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(reply, sizeof(nfgenmsg)));
           mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
        const auto type = mnl_attr_get_type(a);
        const bool isRule = msg == NFT_MSG_GETRULE;
        if ((isRule && type == NFTA_RULE_TABLE) || (!isRule && type == NFTA_CHAIN_TABLE)) table = mnl_attr_get_str(a);
        if ((isRule && type == NFTA_RULE_CHAIN) || (!isRule && type == NFTA_CHAIN_NAME)) chain = mnl_attr_get_str(a);
        if (isRule ? (type == NFTA_RULE_HANDLE || type == NFTA_RULE_POSITION || type == NFTA_RULE_ID ||
                      type == NFTA_RULE_POSITION_ID)
                   : (type == NFTA_CHAIN_HANDLE || type == NFTA_CHAIN_USE || type == NFTA_CHAIN_ID))
          continue;
        hex += fmt::format(" {}:", type);
        const auto* bytes = static_cast<const unsigned char*>(static_cast<const void*>(a));
        for (std::size_t i = 0; i < a->nla_len; ++i) hex += fmt::format("{:02x}", bytes[i]);
      }
      if (table != "nat") return true;
      if (msg == NFT_MSG_GETRULE)
        out.rules[chain].push_back(hex);
      else
        out.chains[chain] = hex;
      return true;
    });
    REQUIRE(dumped.has_value());
  }
  return out;
}

/// The owned nat chains of a full render (the dispatch chains too: they hold every shape the
/// renderer writes for nat), in the order rendered.
std::vector<std::pair<std::string, std::vector<std::string>>> natChains(VectorSnapshot& snap, net::Family f,
                                                                       RenderConfig cfg, bool large,
                                                                       NfacctObjects nfacct = {}) {
  IptablesRenderer r(std::move(cfg));
  r.setNfacct(nfacct);
  r.setNode(snap.node());
  r.setServiceCIDRs(snap.serviceCIDRs());
  r.setLargeCluster(large);
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (auto& [key, rules] : chainsOf(renderRuleset(r, f, snap.ports(), snap.node()), true))
    if (key.first == "nat") out.emplace_back(key.second, rules);
  return out;
}

}  // namespace

TEST_CASE("iptables kernel: nat chains written over netlink are the kernel objects iptables-nft-restore builds",
          "[kernel]") {
  Harness h(Variant::kNft);
  struct Case {
    const char* name;
    RenderConfig cfg;
    bool large = false;
    NfacctObjects nfacct = {};
  };
  std::vector<Case> cases;
  cases.push_back({"ClusterCIDR", featureConfig()});
  // Localhost NodePorts counted into upstream's nfacct object (which each namespace gets).
  cases.push_back({"nfacct", featureConfig(), false, {true, true}});
  cases.push_back({"large cluster (no comments)", featureConfig(), true});
  RenderConfig masq = featureConfig();
  masq.common.masqueradeAll = true;
  cases.push_back({"masquerade-all", masq});
  RenderConfig prefix = featureConfig();
  prefix.common.detectLocalMode = "InterfaceNamePrefix";
  prefix.common.interfaceNamePrefix = "veth";
  cases.push_back({"InterfaceNamePrefix", prefix});
  RenderConfig bridge = featureConfig();
  bridge.common.detectLocalMode = "BridgeInterface";
  bridge.common.bridgeInterface = "cbr0";
  cases.push_back({"BridgeInterface", bridge});
  for (const auto& c : cases) {
    for (net::Family f : kFamilies) {
      INFO(c.name << ", " << familyName(f));
      VectorSnapshot snap = featureSnapshot();
      const auto chains = natChains(snap, f, c.cfg, c.large, c.nfacct);
      REQUIRE(chains.size() > 10);
      NatDump byTool, byNetlink;
      std::string saveByTool, saveByNetlink;
      // A rule that counts into an nfacct object needs the object in the namespace.
      auto ensureNfacct = [&] {
        if (!c.nfacct.localhostNodePorts) return;
        auto nfacct = kernel::makeNetlinkNfacct();
        REQUIRE(nfacct.has_value());
        REQUIRE((*nfacct)->ensure(std::string(backends::kNfacctLocalhostNodePorts)).has_value());
      };
      {
        FreshNetns ns;
        ensureNfacct();
        std::string input = "*nat\n";
        for (const auto& [name, rules] : chains) input += ":" + name + " - [0:0]\n";
        for (const auto& [name, rules] : chains)
          for (const auto& r : rules) input += "-A " + name + " " + r + "\n";
        h.restore(f, input + "COMMIT\n");
        byTool = dumpNat(f);
        saveByTool = *h.kernel->save(f, Table::kNat);
      }
      {
        FreshNetns ns;
        ensureNfacct();
        // The table as iptables-nft creates it, with one of the chains already there and
        // holding a rule the batch must flush.
        h.restore(f, "*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j RETURN\nCOMMIT\n");
        NftRuleBatch batch(f);
        std::vector<NftChainRewrite> rewrites;
        for (const auto& [name, rules] : chains) rewrites.push_back({name, rules});
        auto added = batch.add(rewrites);
        INFO((added ? std::string() : added.error().message()));
        REQUIRE(added.has_value());
        CHECK(batch.chains() == chains.size());
        auto committed = batch.commit();
        INFO((committed ? std::string() : committed.error().message()));
        REQUIRE(committed.has_value());
        CHECK(batch.empty());
        byNetlink = dumpNat(f);
        saveByNetlink = *h.kernel->save(f, Table::kNat);
      }
      std::size_t rules = 0;
      for (const auto& [chain, list] : byTool.rules) {
        INFO("chain " << chain);
        rules += list.size();
        REQUIRE(byNetlink.rules.contains(chain));
        const auto& other = byNetlink.rules.at(chain);
        for (std::size_t i = 0; i < std::max(list.size(), other.size()); ++i) {
          INFO("rule " << i + 1);
          CHECK((i < other.size() ? other[i] : "<none>") == (i < list.size() ? list[i] : "<none>"));
        }
      }
      CHECK(rules > 40);
      if (c.nfacct.localhostNodePorts && f == kV4)
        CHECK(saveByTool.find("-m nfacct --nfacct-name  localhost_nps_accepted_pkts") != std::string::npos);
      CHECK(byNetlink.rules == byTool.rules);
      CHECK(byNetlink.chains == byTool.chains);
      // The save texts less their "# Generated by ... on DATE" lines.
      auto uncommented = [](const std::string& text) {
        std::string out;
        std::istringstream in(text);
        for (std::string line; std::getline(in, line);)
          if (!line.starts_with("#")) out += line + "\n";
        return out;
      };
      CHECK(uncommented(saveByNetlink) == uncommented(saveByTool));
    }
  }
}

TEST_CASE("iptables kernel: a rule the kernel refuses over netlink is named, and nothing of the batch applies",
          "[kernel]") {
  Harness h(Variant::kNft);
  FreshNetns ns;
  h.restore(kV4, "*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n");
  const std::string before = *h.kernel->save(kV4, Table::kNat);
  NftRuleBatch batch(kV4);
  const std::vector<std::string> good{"-j KUBE-MARK-MASQ"};
  // A jump to a chain that does not exist: the kernel refuses it (ENOENT).
  const std::vector<std::string> bad{"-s 10.1.0.1/32 -j KUBE-MARK-MASQ", "-j KUBE-SEP-MISSING"};
  const NftChainRewrite chains[] = {{"KUBE-SVC-A", good}, {"KUBE-SVC-B", bad}};
  REQUIRE(batch.add(chains).has_value());
  auto committed = batch.commit();
  REQUIRE_FALSE(committed.has_value());
  INFO(committed.error().message());
  CHECK(committed.error().message().find("rule 2 of chain KUBE-SVC-B") !=
        std::string::npos);
  CHECK(*h.kernel->save(kV4, Table::kNat) == before);
}

namespace {

/// The value of the sample line of `series` (name and labels) in a scrape, or "".
std::string sampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(series + " ", 0) == 0) return line.substr(series.size() + 1);
  return "";
}

/// A TCP socket of the calling thread's namespace, closed on scope exit.
struct Socket {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
  static sockaddr_in address(const char* ip, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
  }
};

}  // namespace

TEST_CASE("iptables kernel: upstream's nfacct objects count localhost NodePort packets, and the scrape shows them",
          "[kernel]") {
  const Variant variant = GENERATE(Variant::kNft, Variant::kLegacy);
  INFO("iptables-" << variantName(variant));
  FreshNetns ns;
  // The endpoint is an address of this namespace; route_localnet lets 127.0.0.1 reach it.
  sh("ip link set lo up && ip addr add 10.180.0.1/32 dev lo && sysctl -qw net.ipv4.conf.all.route_localnet=1");
  Harness h(variant);

  // The backend as the plugin makes it, on the host's metrics.
  plugins::PluginMetrics registry;
  registry.reservePrefixes(cli::hostMetricPrefixes());
  const kproxy_host_api api = plugins::makeHostApi(&registry);
  const sdk::Host host(&api);
  BackendSettings settings;
  settings.render = featureConfig();
  settings.ipv6 = false;
  auto backend = std::make_unique<IptablesBackend>(host, std::move(settings), makeProcessKernel(h.tools, h.runner),
                                                   kernel::makeFileSysctls(h.sysctls.root()));
  auto metrics = IptablesBackend::registerMetrics(host);
  REQUIRE(metrics.has_value());
  backend->useMetrics(*metrics);
  auto nfacct = kernel::makeNetlinkNfacct();
  REQUIRE(nfacct.has_value());
  backend->useNfacct(std::move(*nfacct));

  auto web = clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.180.0.1", 8080)});
  web.type = sdk::ServiceType::kNodePort;
  web.nodePort = 30080;
  VectorSnapshot snap({web}, featureNode());
  REQUIRE(ok(backend->syncFrom(snap, {}, true)));
  CHECK(backend->nfacctObjects() == NfacctObjects{true, true});

  // A connection from the node to 127.0.0.1:NodePort reaches the endpoint; its first packet
  // (the only one the nat table sees) is counted.
  Socket listener;
  const sockaddr_in endpointAddress = Socket::address("10.180.0.1", 8080);
  REQUIRE(::bind(listener.fd, reinterpret_cast<const sockaddr*>(&endpointAddress), sizeof endpointAddress) == 0);
  REQUIRE(::listen(listener.fd, 4) == 0);
  Socket client;
  const timeval timeout{3, 0};
  REQUIRE(::setsockopt(client.fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) == 0);
  const sockaddr_in nodePort = Socket::address("127.0.0.1", 30080);
  const int connected = ::connect(client.fd, reinterpret_cast<const sockaddr*>(&nodePort), sizeof nodePort);
  INFO("connect: " << (connected == 0 ? "ok" : std::strerror(errno)));
  REQUIRE(connected == 0);
  Socket accepted;
  ::close(accepted.fd);
  accepted.fd = ::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(accepted.fd >= 0);

  // The scrape, as kproxy serves it in iptables mode.
  auto reader = kernel::makeNetlinkNfacct();
  REQUIRE(reader.has_value());
  const cli::NfacctMetrics nfacctMetrics(std::move(*reader));
  const std::string scrape = nfacctMetrics.render() + cli::renderUpstreamAliases("iptables", registry.collect());
  INFO(scrape);
  CHECK(sampleValue(scrape, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total") == "1");
  CHECK(sampleValue(scrape, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total") == "0");
  CHECK(sampleValue(scrape, "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"}") ==
        std::to_string(backend->mirroredRules(kV4, Table::kNat)));

  // The rules read back as rendered: the next full sync writes nothing, and says so.
  auto again = backend->syncFrom(snap, {}, true);
  REQUIRE(ok(again));
  CHECK(again->operations == 0);
  CHECK(sampleValue(cli::renderUpstreamAliases("iptables", registry.collect()),
                    "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"nat\"}") == "0");

  // Cleanup takes the rules, as upstream's; the objects stay (upstream never deletes them).
  REQUIRE(ok(backend->cleanup()));
  CHECK(h.saved(kV4).find("nfacct") == std::string::npos);
  auto left = kernel::makeNetlinkNfacct();
  REQUIRE(left.has_value());
  CHECK((*left)->get(std::string(backends::kNfacctLocalhostNodePorts)).has_value());
}

TEST_CASE("nfacct kernel: objects belong to the namespace that made them", "[kernel]") {
  {
    FreshNetns first;
    auto nfacct = kernel::makeNetlinkNfacct();
    REQUIRE(nfacct.has_value());
    REQUIRE((*nfacct)->ensure("kproxy_test_counter").has_value());
    auto made = (*nfacct)->get("kproxy_test_counter");
    REQUIRE(made.has_value());
    CHECK(made->packets == 0);
    // Ensuring an existing object keeps it (no EBUSY).
    CHECK((*nfacct)->ensure("kproxy_test_counter").has_value());
  }
  FreshNetns second;
  auto nfacct = kernel::makeNetlinkNfacct();
  REQUIRE(nfacct.has_value());
  auto absent = (*nfacct)->get("kproxy_test_counter");
  REQUIRE_FALSE(absent.has_value());
  CHECK(absent.error().errnum == ENOENT);
}
