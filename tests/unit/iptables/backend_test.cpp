// IptablesBackend over FakeIptables: full and partial syncs, what each restore input holds,
// refusals, repair of changes made behind the backend's back, foreign chains.

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "iptables_fixtures.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/iptables/backend.h"
#include "kproxy/kernel/process.h"

using namespace kproxy;
using namespace kproxy::iptables;
using kproxy::iptables::testing::canonical;
using kproxy::iptables::testing::ChainMap;
using kproxy::iptables::testing::chainsOf;
using kproxy::iptables::testing::clusterIP;
using kproxy::iptables::testing::countLines;
using kproxy::iptables::testing::endpoint;
using kproxy::iptables::testing::setEndpoints;
using kproxy::iptables::testing::SharedKernel;
using kproxy::iptables::testing::TempSysctls;
using plan::VectorSnapshot;

namespace {

constexpr net::Family kV4 = net::Family::kIPv4;
constexpr net::Family kV6 = net::Family::kIPv6;

struct Fixture {
  Fixture() : snap(kproxy::iptables::testing::allFeatureServices(), kproxy::iptables::testing::featureNode()) {
    snap.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"kubernetes", "fd00:30::/108"}});
    backend = make();
  }
  std::unique_ptr<IptablesBackend> make(RenderConfig cfg = kproxy::iptables::testing::featureConfig()) {
    BackendSettings s;
    s.render = std::move(cfg);
    return std::make_unique<IptablesBackend>(sdk::Host(nullptr), std::move(s), std::make_unique<SharedKernel>(fake),
                                             kernel::makeFileSysctls(sysctls.root()));
  }
  std::string saved(net::Family fam) {
    std::string out;
    for (Table t : kTables) out += *fake.save(fam, t);
    return out;
  }
  /// kproxy's chains in the fake.
  ChainMap kernel(net::Family fam) { return canonical(chainsOf(saved(fam), true)); }
  /// kproxy's chains as the renderer wants them for the current snapshot.
  ChainMap wanted(net::Family fam) {
    IptablesRenderer r(kproxy::iptables::testing::featureConfig());
    r.setNode(snap.node());
    r.setServiceCIDRs(snap.serviceCIDRs());
    return canonical(chainsOf(renderRuleset(r, fam, snap.ports(), snap.node()), true));
  }
  /// Everything in the fake that is not kproxy's: foreign chains, and the rules of built-in
  /// chains that do not jump to one of kproxy's.
  ChainMap foreign(net::Family fam) {
    ChainMap out;
    for (auto& [key, rules] : chainsOf(saved(fam), false)) {
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
  std::size_t index(const std::string& key) {
    for (std::size_t i = 0; i < snap.ports().size(); ++i)
      if (snap.ports()[i].key == key) return i;
    FAIL("no port " << key);
    return 0;
  }
  void requireSynced() {
    for (net::Family fam : {kV4, kV6}) {
      INFO((fam == kV4 ? "IPv4" : "IPv6"));
      REQUIRE(kernel(fam) == wanted(fam));
    }
  }

  TempSysctls sysctls;
  FakeIptables fake;
  VectorSnapshot snap;
  std::unique_ptr<IptablesBackend> backend;
};

template <typename T>
bool ok(const sdk::Expected<T>& r) {
  if (!r) UNSCOPED_INFO("sync error: " << r.error().message);
  return r.has_value();
}

bool contains(const std::string& text, std::string_view what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("iptables backend: the first sync is full, and a restart writes nothing", "[unit]") {
  Fixture f;
  REQUIRE(f.backend->needsFullSync());
  auto first = f.backend->syncFrom(f.snap, {}, false);  // full whatever was asked
  REQUIRE(ok(first));
  CHECK(first->summary.starts_with("iptables sync full=true "));
  CHECK(first->operations > 40);
  CHECK_FALSE(f.backend->needsFullSync());
  REQUIRE(f.fake.restores.size() == 2);  // one per family
  for (net::Family fam : {kV4, kV6}) {
    const std::string& input = f.backend->lastRestore(fam);
    CHECK(countLines(input, ":KUBE-SERVICES - [0:0]") == 2);  // filter and nat
    CHECK(contains(input, "*nat\n"));
    CHECK(contains(input, "*mangle\n:KUBE-PROXY-CANARY - [0:0]\n"));
    CHECK(countLines(input, "-I PREROUTING 1 ") == 1);
  }
  f.requireSynced();
  // The mirror holds every owned chain but the dispatch chains, which it keeps rule by rule.
  CHECK(f.backend->mirroredChains(kV4) + dispatchChainNames().size() == f.wanted(kV4).size());
  CHECK(f.sysctls.routeLocalnet() == "1");

  // The same sync again, and a new backend over the same kernel: nothing to write.
  auto again = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE(ok(again));
  CHECK(again->operations == 0);
  auto restarted = f.make();
  auto second = restarted->syncFrom(f.snap, {}, false);
  REQUIRE(ok(second));
  CHECK(second->summary.starts_with("iptables sync full=true "));
  CHECK(second->operations == 0);
  CHECK(restarted->lastRestore(kV4).empty());
  CHECK(restarted->lastRestore(kV6).empty());
  CHECK(f.fake.restores.size() == 2);
  CHECK(restarted->mirroredChains(kV6) == f.backend->mirroredChains(kV6));
}

TEST_CASE("iptables backend: a one-endpoint change rewrites that service's chains only", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  auto& web = f.snap.ports()[f.index("four/web:p")];
  setEndpoints(web, {endpoint("10.1.0.1", 8080), endpoint("10.1.0.2", 8080), endpoint("10.1.0.99", 8080)});
  auto out = f.backend->syncFrom(f.snap, {{kV4, web.key}}, false);
  REQUIRE(ok(out));
  CHECK(out->summary.starts_with("iptables sync full=false "));
  const std::string& input = f.backend->lastRestore(kV4);
  INFO(input);
  CHECK(f.fake.restores.back() == input);
  CHECK(f.backend->lastRestore(kV6).empty());
  const std::string svc = backends::servicePortPolicyClusterChain("four/web:p", "tcp");
  const std::string added = backends::servicePortEndpointChain("four/web:p", "tcp", "10.1.0.99:8080");
  const std::string gone = backends::servicePortEndpointChain("four/web:p", "tcp", "10.1.0.3:8080");
  // *nat, three declarations (the policy chain, the new endpoint chain, the one going), the
  // policy chain's 4 rules, the new endpoint chain's 2, one -X, COMMIT.
  CHECK(countLines(input) == 12);
  CHECK(countLines(input, "*") == 1);
  CHECK(countLines(input, "*nat") == 1);
  CHECK(countLines(input, ":") == 3);
  CHECK(countLines(input, ":" + svc + " ") == 1);
  CHECK(countLines(input, ":" + added + " ") == 1);
  CHECK(countLines(input, ":" + gone + " ") == 1);
  CHECK(countLines(input, "-A " + svc + " ") == 4);
  CHECK(countLines(input, "-A " + added + " ") == 2);
  CHECK(countLines(input, "-X " + gone) == 1);
  CHECK_FALSE(contains(input, "KUBE-SERVICES"));
  CHECK(out->operations == 3);
  f.requireSynced();
}

TEST_CASE("iptables backend: a new service inserts its dispatch rules within their sections", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  f.snap.ports().push_back(clusterIP("four", "added", "172.30.0.99", 80, {endpoint("10.1.0.77", 80)}));
  auto out = f.backend->syncFrom(f.snap, {{kV4, "four/added:p"}}, false);
  REQUIRE(ok(out));
  const std::string& input = f.backend->lastRestore(kV4);
  INFO(input);
  CHECK_FALSE(contains(input, ":KUBE-SERVICES"));
  CHECK_FALSE(contains(input, ":KUBE-NODEPORTS"));
  // filter: the ClusterIP's reject, before the ServiceCIDR drop; nat: the capture, before the
  // NodePorts jump.
  CHECK(countLines(input, "-I KUBE-SERVICES ") == 2);
  CHECK(countLines(input, "-A KUBE-SERVICES ") == 0);
  CHECK(countLines(input) == 12);  // *filter -I COMMIT; *nat, 2 declarations, 4 rules, -I, COMMIT
  f.requireSynced();
  const auto natServices = chainsOf(f.saved(kV4), true).at({"nat", "KUBE-SERVICES"});
  CHECK(natServices.back().ends_with("-j KUBE-NODEPORTS"));
  const auto filterServices = chainsOf(f.saved(kV4), true).at({"filter", "KUBE-SERVICES"});
  CHECK(filterServices.back().find("unallocated ClusterIPs") != std::string::npos);

  SECTION("without a tail, the rule is appended") {
    f.snap.setServiceCIDRs({});
    REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
    f.snap.ports().push_back(clusterIP("four", "more", "172.30.0.98", 80, {}));
    REQUIRE(ok(f.backend->syncFrom(f.snap, {{kV4, "four/more:p"}}, false)));
    const std::string& more = f.backend->lastRestore(kV4);
    INFO(more);
    CHECK(more.starts_with("*filter\n-I KUBE-SERVICES "));  // the port's reject, before the ClusterIP's
    CHECK(countLines(more, "-A KUBE-SERVICES ") == 1);    // the ClusterIP's reject, last
    CHECK_FALSE(contains(more, "*nat"));
    f.requireSynced();
  }
}

TEST_CASE("iptables backend: a removed service loses its chains and dispatch rules", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  const std::string key = "four/web:p";
  f.snap.ports().erase(f.snap.ports().begin() + static_cast<std::ptrdiff_t>(f.index(key)));
  auto out = f.backend->syncFrom(f.snap, {{kV4, key}}, false);
  REQUIRE(ok(out));
  const std::string& input = f.backend->lastRestore(kV4);
  INFO(input);
  CHECK(countLines(input, "-X KUBE-SVC-") == 1);
  CHECK(countLines(input, "-X KUBE-SEP-") == 3);
  CHECK(countLines(input, "-D KUBE-SERVICES ") == 2);  // nat capture, filter ClusterIP reject
  CHECK(countLines(input, "-A ") == 0);
  CHECK_FALSE(contains(input, ":KUBE-SERVICES"));
  f.requireSynced();
  for (const auto& [chain, rules] : chainsOf(f.saved(kV4), true))
    CHECK(chain.second != backends::servicePortPolicyClusterChain(key, "tcp"));

  SECTION("a rule two ports share goes with the last of them") {
    for (const std::string port : {"four/multi:http", "four/multi:https"}) {
      f.snap.ports().erase(f.snap.ports().begin() + static_cast<std::ptrdiff_t>(f.index(port)));
      REQUIRE(ok(f.backend->syncFrom(f.snap, {{kV4, port}}, false)));
      const std::string& step = f.backend->lastRestore(kV4);
      INFO(step);
      const bool last = port.ends_with("https");
      CHECK(countLines(step, "-D KUBE-SERVICES -d 172.30.0.18/32 -m comment --comment \"ClusterIP without") ==
            (last ? 1u : 0u));
      CHECK(contains(step, "*filter") == last);
      f.requireSynced();
    }
  }
}

TEST_CASE("iptables backend: a refused restore names the line and makes the next sync full", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  const std::string before = f.saved(kV4);
  auto& web = f.snap.ports()[f.index("four/web:p")];
  setEndpoints(web, {endpoint("10.1.0.1", 8080)});
  f.fake.refuseNext = true;
  f.fake.refuseLine = 2;
  auto out = f.backend->syncFrom(f.snap, {{kV4, web.key}}, false);
  REQUIRE_FALSE(out.has_value());
  const std::string& refused = f.fake.restores.back();
  const std::string line2 = refused.substr(refused.find('\n') + 1, refused.find('\n', refused.find('\n') + 1) -
                                                                       refused.find('\n') - 1);
  INFO(out.error().message);
  CHECK(line2.starts_with(":KUBE-"));
  CHECK(contains(out.error().message, "iptables-restore"));
  CHECK(contains(out.error().message, "line 2: " + line2));
  CHECK(out.error().category == sdk::ErrorCategory::kKernelRefused);
  CHECK(f.backend->needsFullSync());
  CHECK(f.saved(kV4) == before);  // nothing was committed

  // The next sync (nothing new changed, not asked to be full) is full and repairs.
  const auto restores = f.fake.restores.size();
  auto repair = f.backend->syncFrom(f.snap, {}, false);
  REQUIRE(ok(repair));
  CHECK(repair->summary.starts_with("iptables sync full=true "));
  CHECK(f.fake.restores.size() == restores + 1);  // IPv6 had nothing to repair
  const std::string& input = f.backend->lastRestore(kV4);
  INFO(input);
  CHECK(countLines(input, ":") == 1 + 2);  // the policy chain; two endpoint chains go
  CHECK(countLines(input, "-X KUBE-SEP-") == 2);
  CHECK_FALSE(f.backend->needsFullSync());
  f.requireSynced();
}

TEST_CASE("iptables backend: rules deleted behind its back come back with the next full sync", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  const std::string svc = backends::servicePortPolicyClusterChain("four/web:p", "tcp");
  int touched = 0;
  for (auto& c : f.fake.chains(kV4, Table::kNat)) {
    if (c.name == svc || c.name == "KUBE-SERVICES") {
      c.rules.erase(c.rules.begin() + 1);
      ++touched;
    }
    if (c.name == "PREROUTING") {
      REQUIRE(c.rules.size() == 1);
      c.rules.clear();
      ++touched;
    }
  }
  REQUIRE(touched == 3);
  REQUIRE(f.kernel(kV4) != f.wanted(kV4));

  // A partial sync never reads the kernel (and the canary is still there): nothing written.
  auto partial = f.backend->syncFrom(f.snap, {}, false);
  REQUIRE(ok(partial));
  CHECK(f.backend->lastRestore(kV4).empty());

  auto full = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE(ok(full));
  const std::string& input = f.backend->lastRestore(kV4);
  INFO(input);
  CHECK(input.starts_with("*nat\n"));
  CHECK(countLines(input, ":") == 2);
  CHECK(countLines(input, ":" + svc + " ") == 1);
  CHECK(countLines(input, ":KUBE-SERVICES ") == 1);
  CHECK(countLines(input, "-I PREROUTING 1 ") == 1);
  CHECK(f.backend->lastRestore(kV6).empty());
  f.requireSynced();
}

TEST_CASE("iptables backend: a flushed table is noticed by the canary and repaired", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  auto& nat = f.fake.chains(kV6, Table::kNat);
  nat.erase(std::remove_if(nat.begin(), nat.end(), [](const FakeIptables::Chain& c) { return !c.builtin; }),
            nat.end());
  for (auto& c : nat) c.rules.clear();
  auto& mangle = f.fake.chains(kV6, Table::kMangle);
  mangle.erase(std::remove_if(mangle.begin(), mangle.end(),
                              [](const FakeIptables::Chain& c) { return c.name == "KUBE-PROXY-CANARY"; }),
               mangle.end());
  auto out = f.backend->syncFrom(f.snap, {}, false);  // periodic: no changed keys
  REQUIRE(ok(out));
  CHECK(out->summary.starts_with("iptables sync full=true "));
  CHECK(f.backend->lastRestore(kV4).empty());
  CHECK(contains(f.backend->lastRestore(kV6), "*mangle\n:KUBE-PROXY-CANARY - [0:0]\n"));
  f.requireSynced();
}

TEST_CASE("iptables backend: foreign chains and rules are never touched, also by cleanup", "[unit]") {
  Fixture f;
  auto addChain = [&](net::Family fam, Table t, std::string name, std::vector<std::string> rules) {
    f.fake.chains(fam, t).push_back(FakeIptables::Chain{std::move(name), false, std::move(rules)});
  };
  auto addRule = [&](net::Family fam, Table t, const std::string& chain, std::string rule) {
    for (auto& c : f.fake.chains(fam, t))
      if (c.name == chain) c.rules.push_back(std::move(rule));
  };
  for (net::Family fam : {kV4, kV6}) {
    addChain(fam, Table::kFilter, "KUBE-FIREWALL",
             {"-m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark 0x8000/0x8000 "
              "-j DROP"});
    addChain(fam, Table::kMangle, "KUBE-KUBELET-CANARY", {});
    addChain(fam, Table::kNat, "KUBE-KUBELET-CANARY", {});
    addChain(fam, Table::kNat, "DOCKER", {"-i docker0 -j RETURN"});
    addChain(fam, Table::kFilter, "MY-CHAIN", {"-p tcp -m tcp --dport 22 -j ACCEPT"});
    addRule(fam, Table::kFilter, "INPUT", "-j KUBE-FIREWALL");
    addRule(fam, Table::kFilter, "INPUT", "-j MY-CHAIN");
    addRule(fam, Table::kNat, "PREROUTING", "-m addrtype --dst-type LOCAL -j DOCKER");
  }
  const ChainMap foreign4 = f.foreign(kV4), foreign6 = f.foreign(kV6);
  REQUIRE(foreign4.at({"nat", "DOCKER"}).size() == 1);

  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  CHECK(f.foreign(kV4) == foreign4);
  CHECK(f.foreign(kV6) == foreign6);
  f.requireSynced();
  // The jumps went in first, before the foreign rules.
  CHECK(chainsOf(f.saved(kV4), false).at({"nat", "PREROUTING"}) ==
        std::vector<std::string>{"-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                                 "-m addrtype --dst-type LOCAL -j DOCKER"});

  f.snap.ports().erase(f.snap.ports().begin());
  f.snap.ports().push_back(clusterIP("six", "late", "fd00:30::99", 80, {endpoint("fd00:10::99", 80)}));
  REQUIRE(ok(f.backend->syncFrom(f.snap, {{kV4, "four/web:p"}, {kV6, "six/late:p"}}, false)));
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
  CHECK(f.foreign(kV4) == foreign4);
  CHECK(f.foreign(kV6) == foreign6);
  f.requireSynced();

  REQUIRE(ok(f.backend->cleanup()));
  CHECK(f.backend->needsFullSync());
  for (net::Family fam : {kV4, kV6}) {
    CHECK(chainsOf(f.saved(fam), true).empty());
    // Nothing of kproxy's is left, and what is left is exactly the foreign state.
    CHECK(chainsOf(f.saved(fam), false) == (fam == kV4 ? foreign4 : foreign6));
  }
}

TEST_CASE("iptables backend: large clusters lose per-endpoint comments at the next full sync", "[unit]") {
  Fixture f;
  auto cfg = kproxy::iptables::testing::featureConfig();
  cfg.largeClusterEndpoints = 10;  // the fixture has more endpoints than that
  auto backend = f.make(cfg);
  REQUIRE(ok(backend->syncFrom(f.snap, {}, false)));
  const auto chains = chainsOf(f.saved(kV4), true);
  const std::string sep = backends::servicePortEndpointChain("four/web:p", "tcp", "10.1.0.1:8080");
  CHECK(chains.at({"nat", sep}) ==
        std::vector<std::string>{"-s 10.1.0.1/32 -j KUBE-MARK-MASQ", "-p tcp -m tcp -j DNAT --to-destination 10.1.0.1:8080"});
}

namespace {

/// Answers every run with one scripted result and records the command lines.
class ScriptedRunner final : public kernel::ProcessRunner {
 public:
  core::Result<kernel::ProcessResult> run(const std::vector<std::string>& argv,
                                            const kernel::ProcessOptions& options) override {
    calls.push_back(argv);
    stdinSeen = std::string(options.stdinData);
    return result;
  }
  kernel::ProcessResult result;
  std::vector<std::vector<std::string>> calls;
  std::string stdinSeen;
};

VariantTools fakeTools() {
  VariantTools t;
  t.save4 = "/sbin/iptables-nft-save";
  t.restore4 = "/sbin/iptables-nft-restore";
  t.iptables4 = "/sbin/iptables-nft";
  t.save6 = "/sbin/ip6tables-nft-save";
  t.restore6 = "/sbin/ip6tables-nft-restore";
  t.iptables6 = "/sbin/ip6tables-nft";
  return t;
}

}  // namespace

TEST_CASE("iptables process kernel: the canary check and refusals as the tools report them", "[unit]") {
  ScriptedRunner runner;
  auto kernel = makeProcessKernel(fakeTools(), runner);

  SECTION("a chain that exists") {
    runner.result.out = "-N KUBE-PROXY-CANARY\n";
    auto r = kernel->chainExists(kV6, Table::kMangle, "KUBE-PROXY-CANARY");
    REQUIRE(r.has_value());
    CHECK(*r);
    REQUIRE(runner.calls.size() == 1);
    CHECK(runner.calls[0] == std::vector<std::string>{"/sbin/ip6tables-nft", "-w", "5", "-t", "mangle", "-S",
                                                      "KUBE-PROXY-CANARY"});
  }
  SECTION("a missing chain, as iptables-legacy and iptables-nft 1.8.9 say it") {
    runner.result.exitCode = 1;
    for (const char* err : {"iptables: No chain/target/match by that name.\n",
                            "iptables v1.8.9 (nf_tables): chain `KUBE-PROXY-CANARY' in table `mangle' is "
                            "incompatible, use 'nft' tool.\n"}) {
      runner.result.err = err;
      auto r = kernel->chainExists(kV4, Table::kMangle, "KUBE-PROXY-CANARY");
      INFO(err);
      REQUIRE(r.has_value());
      CHECK_FALSE(*r);
    }
  }
  SECTION("the lock not taken in time is an error, not a missing chain") {
    runner.result.exitCode = 4;
    runner.result.err = "Another app is currently holding the xtables lock. Stopped waiting after 5s.\n";
    auto r = kernel->chainExists(kV4, Table::kMangle, "KUBE-PROXY-CANARY");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().message().find("xtables lock") != std::string::npos);
  }
  SECTION("a refused restore quotes the line the tool names") {
    runner.result.exitCode = 1;
    runner.result.err = "iptables-nft-restore: line 3 failed: Bad rule (does a matching rule exist in that chain?).\n";
    const std::string input = "*nat\n:KUBE-SVC-X - [0:0]\n-D KUBE-SERVICES -j KUBE-SVC-X\nCOMMIT\n";
    auto r = kernel->restore(kV4, input);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().category == core::ErrorCategory::kKernel);
    CHECK(r.error().message().find("; line 3: -D KUBE-SERVICES -j KUBE-SVC-X") != std::string::npos);
    CHECK(runner.stdinSeen == input);
    CHECK(runner.calls.back() == std::vector<std::string>{"/sbin/iptables-nft-restore", "--noflush", "-w", "5"});
  }
}

TEST_CASE("iptables backend: random partial syncs keep the kernel equal to a full render", "[unit]") {
  Fixture f;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
  const unsigned seed = GENERATE(20260126u, 7u, 1234567u, 99u, 31337u);
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  int serial = 0;
  for (int step = 0; step < 300; ++step) {
    std::vector<sdk::ChangedKey> changed;
    for (int n = 1 + step % 3; n > 0; --n) kproxy::iptables::testing::mutate(f.snap.ports(), rng, changed, serial);
    kproxy::iptables::testing::reindex(f.snap);
    auto out = f.backend->syncFrom(f.snap, changed, false);
    std::string keys;
    for (const auto& c : changed) keys += (c.family == kV6 ? " v6:" : " v4:") + c.key;
    INFO("step " << step << ", changed" << keys);
    REQUIRE(ok(out));
    REQUIRE(out->summary.starts_with("iptables sync full=false "));
    for (net::Family fam : {kV4, kV6}) {
      INFO((fam == kV4 ? "IPv4" : "IPv6") << "\n" << f.backend->lastRestore(fam));
      REQUIRE(kproxy::iptables::testing::chainDiff(f.kernel(fam), f.wanted(fam)) == "");
    }
    if (step % 50 == 49) {  // and a full sync finds nothing to repair
      auto full = f.backend->syncFrom(f.snap, {}, true);
      REQUIRE(ok(full));
      CHECK(full->operations == 0);
    }
  }
}

TEST_CASE("iptables backend: a full sync split in chunks ends where one input would", "[unit]") {
  // iptables-nft's --noflush restore is quadratic in its input's size, so its full syncs go in
  // chunks of whole service ports, the dispatch chains last.
  Fixture whole;
  REQUIRE(ok(whole.backend->syncFrom(whole.snap, {}, true)));
  const std::size_t wholeRestores = whole.fake.restores.size();

  Fixture split;
  split.fake.chunkRules = 10;
  REQUIRE(ok(split.backend->syncFrom(split.snap, {}, true)));
  CHECK(split.fake.restores.size() > wholeRestores + 2);
  split.requireSynced();
  for (net::Family fam : {kV4, kV6}) CHECK(split.kernel(fam) == whole.kernel(fam));
  // Every chunk but the last of a family declares no dispatch chain and inserts no jump.
  std::size_t chunksWithoutDispatch = 0;
  for (const auto& input : split.fake.restores)
    if (!contains(input, ":KUBE-SERVICES - [0:0]") && !contains(input, "-I PREROUTING 1 ")) ++chunksWithoutDispatch;
  CHECK(chunksWithoutDispatch + 2 == split.fake.restores.size());

  // A restart over the split result writes nothing.
  auto restarted = split.make();
  auto again = restarted->syncFrom(split.snap, {}, true);
  REQUIRE(ok(again));
  CHECK(again->operations == 0);
}

TEST_CASE("iptables backend: the rule counts follow full and partial syncs", "[unit]") {
  Fixture f;
  auto kernelRules = [&](net::Family fam, Table t) {
    std::size_t n = 0;
    for (const auto& [key, rules] : f.kernel(fam))
      if (key.first == tableName(t)) n += rules.size();
    return n;
  };
  auto check = [&] {
    for (net::Family fam : {kV4, kV6})
      for (Table t : {Table::kFilter, Table::kNat}) {
        INFO((fam == kV4 ? "IPv4 " : "IPv6 ") << tableName(t));
        CHECK(f.backend->mirroredRules(fam, t) == kernelRules(fam, t));
      }
  };
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
  check();
  // One port loses an endpoint, another goes.
  auto& first = f.snap.ports()[0];
  REQUIRE(first.clusterEndpoints.size() >= 1);
  const std::string changedKey = first.key;
  const net::Family changedFamily = first.family;
  first.clusterEndpoints.pop_back();
  first.allEndpoints = first.clusterEndpoints;
  const auto removed = f.snap.ports().back();
  f.snap.ports().pop_back();
  REQUIRE(ok(f.backend->syncFrom(f.snap, {{changedFamily, changedKey}, {removed.family, removed.key}}, false)));
  check();
}

TEST_CASE("iptables backend: the rules written by the last sync are those of its restore input", "[unit]") {
  Fixture f;
  // The "-A" and "-I" lines of `table`'s block of the last restore input.
  auto inInput = [&](net::Family fam, Table table) {
    std::size_t n = 0;
    bool inTable = false;
    const std::string& input = f.backend->lastRestore(fam);
    for (std::size_t at = 0; at < input.size();) {
      const std::size_t end = std::min(input.find('\n', at), input.size());
      const std::string_view line(input.data() + at, end - at);
      if (line.starts_with("*")) inTable = line.substr(1) == tableName(table);
      if (inTable && (line.starts_with("-A ") || line.starts_with("-I "))) ++n;
      at = end + 1;
    }
    return n;
  };
  auto check = [&] {
    for (net::Family fam : {kV4, kV6})
      for (Table t : kTables) {
        INFO((fam == kV4 ? "IPv4 " : "IPv6 ") << tableName(t));
        CHECK(f.backend->writtenRules(fam, t) == inInput(fam, t));
      }
  };
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
  check();
  // A first sync writes every owned rule, and the jumps to them from the built-in chains.
  CHECK(f.backend->writtenRules(kV4, Table::kNat) > f.backend->mirroredRules(kV4, Table::kNat));

  auto& first = f.snap.ports()[0];
  REQUIRE(first.clusterEndpoints.size() >= 1);
  first.clusterEndpoints.pop_back();
  first.allEndpoints = first.clusterEndpoints;
  REQUIRE(ok(f.backend->syncFrom(f.snap, {{first.family, first.key}}, false)));
  check();
  // A partial sync writes that service's chains only (upstream's _last is smaller too).
  CHECK(f.backend->writtenRules(first.family, Table::kNat) > 0);
  CHECK(f.backend->writtenRules(first.family, Table::kNat) < f.backend->mirroredRules(first.family, Table::kNat));

  // A full sync over an unchanged kernel writes nothing.
  REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
  for (net::Family fam : {kV4, kV6})
    for (Table t : kTables) CHECK(f.backend->writtenRules(fam, t) == 0);
}

TEST_CASE("iptables backend: a full sync ensures upstream's nfacct objects and the rules count into them", "[unit]") {
  Fixture f;
  auto nfacct = std::make_unique<kernel::FakeNfacct>();
  kernel::FakeNfacct& objects = *nfacct;
  auto forwardDrop = [&](net::Family fam) {
    return f.kernel(fam)[{"filter", "KUBE-FORWARD"}].front();
  };
  SECTION("the kernel has nfacct") {
    f.backend->useNfacct(std::move(nfacct));
    REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
    CHECK(objects.objects.size() == 2);
    CHECK(objects.objects.contains("ct_state_invalid_dropped_pkts"));
    CHECK(objects.objects.contains("localhost_nps_accepted_pkts"));
    CHECK(f.backend->nfacctObjects() == NfacctObjects{true, true});
    for (net::Family fam : {kV4, kV6})
      CHECK(forwardDrop(fam) ==
            "-m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP");
    CHECK(contains(f.saved(kV4), "-m nfacct --nfacct-name  localhost_nps_accepted_pkts"));
    CHECK_FALSE(contains(f.saved(kV6), "localhost_nps_accepted_pkts"));
    // Partial syncs do not ask again (upstream ensures them in full syncs).
    const int calls = objects.ensureCalls;
    REQUIRE(ok(f.backend->syncFrom(f.snap, {}, false)));
    CHECK(objects.ensureCalls == calls);
    // Over an unchanged kernel the next full sync writes nothing.
    auto again = f.backend->syncFrom(f.snap, {}, true);
    REQUIRE(ok(again));
    CHECK(again->operations == 0);
  }
  SECTION("creating them fails: the rules without the match") {
    objects.failEnsure = true;
    f.backend->useNfacct(std::move(nfacct));
    REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
    CHECK(f.backend->nfacctObjects() == NfacctObjects{false, false});
    CHECK(forwardDrop(kV4) == "-m conntrack --ctstate INVALID -j DROP");
    CHECK_FALSE(contains(f.saved(kV4), "nfacct"));
  }
  SECTION("no nfacct at all") {
    REQUIRE(ok(f.backend->syncFrom(f.snap, {}, true)));
    CHECK_FALSE(contains(f.saved(kV4), "nfacct"));
  }
}

TEST_CASE("iptables backend: many affinity lists with a whole-table variant warn once per crossing", "[unit]") {
  Fixture f;
  struct Captured {
    std::vector<std::string> warnings;
  } captured;
  kproxy_host_api api{};
  api.struct_size = sizeof api;
  api.host_ctx = &captured;
  api.log = [](void* ctx, int level, const char* message) {
    if (level == KPROXY_LOG_WARNING) static_cast<Captured*>(ctx)->warnings.emplace_back(message);
  };
  auto make = [&](std::size_t threshold) {
    BackendSettings s;
    s.render = kproxy::iptables::testing::featureConfig();
    s.recentListsWarning = threshold;
    return std::make_unique<IptablesBackend>(sdk::Host(&api), std::move(s), std::make_unique<SharedKernel>(f.fake),
                                             kernel::makeFileSysctls(f.sysctls.root()));
  };
  auto affinityWarnings = [&] {
    return std::count_if(captured.warnings.begin(), captured.warnings.end(),
                         [](const std::string& w) { return w.find("session-affinity lists") != std::string::npos; });
  };
  // The lists the fixture's affinity services make: one `--set` rule each, in either family.
  REQUIRE(ok(make(0)->syncFrom(f.snap, {}, true)));
  std::size_t lists = 0;
  for (net::Family fam : {kV4, kV6})
    for (const auto& [key, rules] : f.kernel(fam))
      for (const auto& r : rules) lists += r.find("-m recent --set") != std::string::npos ? 1 : 0;
  REQUIRE(lists >= 2);

  SECTION("iptables-nft's commits do not replace whole tables: no warning") {
    auto backend = make(1);
    REQUIRE(ok(backend->syncFrom(f.snap, {}, true)));
    CHECK(affinityWarnings() == 0);
  }
  SECTION("legacy, below the threshold: no warning") {
    f.fake.wholeTables = true;
    auto backend = make(lists + 1);
    REQUIRE(ok(backend->syncFrom(f.snap, {}, true)));
    CHECK(affinityWarnings() == 0);
  }
  SECTION("legacy, at the threshold: one warning naming the count, not repeated by the next full sync") {
    f.fake.wholeTables = true;
    auto backend = make(lists);
    REQUIRE(ok(backend->syncFrom(f.snap, {}, true)));
    REQUIRE(affinityWarnings() == 1);
    CHECK(captured.warnings.back().find(std::to_string(lists) + " session-affinity lists") != std::string::npos);
    REQUIRE(ok(backend->syncFrom(f.snap, {}, true)));
    CHECK(affinityWarnings() == 1);
    // Every affinity service loses its affinity: below the threshold, and warned again once
    // the lists come back.
    auto withAffinity = f.snap.ports();
    for (auto& p : f.snap.ports()) p.sessionAffinityClientIP = false;
    REQUIRE(ok(backend->syncFrom(f.snap, {}, true)));
    CHECK(affinityWarnings() == 1);
    f.snap.ports() = withAffinity;
    REQUIRE(ok(backend->syncFrom(f.snap, {}, true)));
    CHECK(affinityWarnings() == 2);
  }
}

TEST_CASE("iptables backend: --dry-run prints each restore input and applies it to the ruleset in memory only",
          "[unit]") {
  Fixture f;
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  BackendSettings s;
  s.render = kproxy::iptables::testing::featureConfig();
  s.dryRun = true;
  s.dryRunOutput = out;
  // As the factory does for --dry-run: printers over a ruleset and sysctls in memory.
  auto memory = std::make_unique<FakeIptables>();
  FakeIptables* ruleset = memory.get();
  auto fresh = std::make_unique<kernel::FakeSysctls>(freshSysctls());
  kernel::FakeSysctls* sysctls = fresh.get();
  IptablesBackend backend(sdk::Host(nullptr), std::move(s),
                          std::make_unique<PrintingIptables>(std::move(memory), out, "iptables-nft"),
                          std::make_unique<kernel::PrintingSysctls>(std::move(fresh), out));
  backend.useNfacct(std::make_unique<kernel::PrintingNfacct>(std::make_unique<kernel::FakeNfacct>(), out));
  auto first = backend.syncFrom(f.snap, {}, true);
  REQUIRE(ok(first));
  CHECK(first->summary.starts_with("iptables sync full=true "));
  CHECK(first->summary.ends_with(" dry_run=true"));
  // The periodic sync that follows finds the canary in the ruleset in memory and prints nothing.
  auto periodic = backend.syncFrom(f.snap, {}, false);
  REQUIRE(ok(periodic));
  CHECK(periodic->summary.starts_with("iptables sync full=false ops=0 "));
  std::rewind(out);
  std::string text;
  char buffer[4096];
  while (auto n = std::fread(buffer, 1, sizeof buffer, out)) text.append(buffer, n);
  INFO(text);
  CHECK(contains(text, "# ip6tables-restore --noflush\n"));
  // The localhost NodePorts' route_localnet, after the rules, as sysctl(8) would set it; the
  // periodic sync finds it set in memory and prints it no more.
  // The nfacct objects first, as nfacct(8) makes them, then the rules that count into them.
  CHECK(text == "nfacct add ct_state_invalid_dropped_pkts\nnfacct add localhost_nps_accepted_pkts\n"
                "# iptables-restore --noflush\n" + ruleset->restores.at(0) + "# ip6tables-restore --noflush\n" +
                    ruleset->restores.at(1) + "sysctl -w net.ipv4.conf.all.route_localnet=1\n");
  CHECK(contains(ruleset->restores.at(0), "--nfacct-name  ct_state_invalid_dropped_pkts"));
  CHECK(ruleset->restores.size() == 2);
  CHECK(sysctls->values.at("net/ipv4/conf/all/route_localnet") == 1);
  CHECK(sysctls->writes == 1);
  // Cleanup reads the ruleset in memory like any other kernel, and prints the removal of what the
  // dry run would have made.
  std::fseek(out, 0, SEEK_END);  // a stream read to its end is positioned again before it is written
  const long syncsEnd = std::ftell(out);
  REQUIRE(ok(backend.cleanup()));
  std::fflush(out);
  std::fseek(out, syncsEnd, SEEK_SET);
  std::string removal;
  while (auto n = std::fread(buffer, 1, sizeof buffer, out)) removal.append(buffer, n);
  std::fclose(out);
  REQUIRE(ruleset->restores.size() == 4);
  CHECK(removal == "# iptables-restore --noflush\n" + ruleset->restores.at(2) + "# ip6tables-restore --noflush\n" +
                       ruleset->restores.at(3));
  CHECK(contains(removal, "-X KUBE-SERVICES\n"));
  for (const auto& c : ruleset->chains(net::Family::kIPv4, Table::kNat)) CHECK(!c.name.starts_with("KUBE-"));
  CHECK(f.fake.restores.empty());  // the fixture's kernel was never touched
  CHECK(f.sysctls.routeLocalnet() != "1");
}
