// NftablesTracer: the interpreter on hand-built rulesets (each statement kind, the hook walk),
// then on what the renderer emits.

#include <algorithm>
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "kproxy/nftables/renderer.h"
#include "kproxy/nftables/tracer.h"
#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::nftables;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;

namespace {

net::Prefix ip(const char* text) { return *net::Prefix::parse(text); }

Verdict jump(std::string c) { return Verdict{VerdictKind::kJump, std::move(c)}; }
Verdict goTo(std::string c) { return Verdict{VerdictKind::kGoto, std::move(c)}; }
Verdict drop() { return Verdict{VerdictKind::kDrop, {}}; }
Verdict accept() { return Verdict{VerdictKind::kAccept, {}}; }
Verdict ret() { return Verdict{VerdictKind::kReturn, {}}; }

constexpr const char* kSlots = "service-endpoints-0";
constexpr std::uint32_t kMark = 0x4000;

/// A small ruleset in the renderer's shape, built by hand so the tracer is tested on its own.
struct Ruleset {
  std::vector<SetSpec> specs;
  GlobalObjects global;
  std::vector<Fragment> fragments{Fragment{}};

  Ruleset() {
    using DT = DataType;
    specs.push_back(SetSpec{"service-ips", {DT::kIPv4Addr, DT::kInetProto, DT::kInetService}, {DT::kVerdict}});
    specs.push_back(SetSpec{"nodeport-ips", {DT::kIPv4Addr}, {}});
    specs.push_back(SetSpec{"session-affinity", {DT::kIPv4Addr, DT::kPoolId}, {DT::kIPv4Addr, DT::kInetService},
                            true, 10800});
    SetSpec slots{kSlots, {DT::kSlot}, {DT::kIPv4Addr, DT::kInetService}};
    slots.interval = true;
    specs.push_back(slots);
    global.family = net::Family::kIPv4;
    global.sets = specs;
    fragments[0].family = net::Family::kIPv4;
  }

  Chain& base(std::string name, std::string type, std::string hook, int priority) {
    return global.chains.emplace_back(Chain{std::move(name), BaseHook{std::move(type), std::move(hook), priority}, {}});
  }
  Chain& chain(std::string name) { return fragments[0].chains.emplace_back(Chain{std::move(name), std::nullopt, {}}); }
  void rule(Chain& c, std::vector<Statement> statements) { c.rules.push_back(Rule{std::move(statements)}); }

  void serviceIP(const char* address, std::uint16_t port, Verdict v, std::uint8_t proto = 6) {
    KeyBuilder k;
    k.address(ip(address)).proto(proto).port(port);
    fragments[0].elements.push_back(Element{"service-ips", k.bytes, k.text, std::move(v)});
  }
  /// Interval [first, end) of `map` → address:port, as the renderer lays it out.
  void interval(std::uint32_t first, std::uint32_t end, const char* address, std::uint16_t port,
                std::uint32_t intervals, const char* map = kSlots) {
    KeyBuilder start;
    start.slot(first);
    KeyBuilder data;
    data.address(ip(address)).port(port);
    fragments[0].elements.push_back(Element{map, start.bytes + intervalIdentity(false, intervals), start.text,
                                            std::nullopt, data.bytes, data.text, false, kIntervalIdentitySize});
    KeyBuilder stop;
    stop.slot(end);
    fragments[0].elements.push_back(Element{map, stop.bytes + intervalIdentity(true, intervals), stop.text,
                                            std::nullopt, {}, {}, true, kIntervalIdentitySize});
  }

  NftablesTracer tracer(std::vector<net::Prefix> local = {ip("192.168.0.2")}) const {
    return NftablesTracer(global, fragments, std::move(local));
  }
};

/// nat-prerouting → services → vmap service-ips; postrouting masquerades marked packets.
Ruleset natRuleset() {
  Ruleset r;
  r.rule(r.base("nat-prerouting", "nat", "prerouting", -100), {jump("services")});
  r.rule(r.base("nat-output", "nat", "output", -100), {jump("services")});
  r.rule(r.base("nat-postrouting", "nat", "postrouting", 100), {jump("masquerading")});
  auto& services = r.chain("services");
  r.rule(services, {VmapLookup{true, "service-ips"}});
  auto& masq = r.chain("masquerading");
  r.rule(masq, {MatchMarkClear{kMark}, ret()});
  r.rule(masq, {SetMark{kMark, true}});
  r.rule(masq, {Masquerade{}});
  r.rule(r.chain("mark-for-masquerade"), {SetMark{kMark, false}});
  return r;
}

Packet packet(const char* src, const char* dst, std::uint16_t port, const char* proto = "tcp", bool fromNode = false) {
  auto p = Packet::make(src, dst, port, proto, fromNode);
  REQUIRE(p);
  return *p;
}

bool hasStep(const Trace& t, const std::string& chain, const std::string& ruleOrDetailPart) {
  for (const auto& path : t.paths)
    for (const auto& s : path.steps)
      if (s.chain == chain &&
          (s.rule.find(ruleOrDetailPart) != std::string::npos || s.detail.find(ruleOrDetailPart) != std::string::npos))
        return true;
  return false;
}

}  // namespace

TEST_CASE("tracer: Packet::make parses addresses and protocols", "[unit][tracer]") {
  auto p = Packet::make("10.0.0.2", "172.30.0.41", 80, "udp");
  REQUIRE(p);
  CHECK(p->protocol == 17);
  CHECK_FALSE(p->fromNode);
  CHECK(p->toString() == "10.0.0.2 -> 172.30.0.41:80/udp (arriving)");
  CHECK_FALSE(Packet::make("10.0.0.2", "fd00::1", 80));
  CHECK_FALSE(Packet::make("10.0.0.0/8", "10.0.0.1", 80));
  CHECK_FALSE(Packet::make("10.0.0.2", "10.0.0.1", 80, "icmp"));
}

TEST_CASE("tracer: a slot-map DNAT reaches every endpoint of the chain's range", "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("service-a"));
  r.rule(r.chain("service-a"), {MatchL4Proto{6}, DnatFromSlots{kSlots, 0}});
  r.interval(0, 21845, "10.180.0.1", 80, 3);
  r.interval(21845, 43690, "10.180.0.2", 80, 3);
  r.interval(43690, 65535, "10.180.0.3", 8080, 3);
  // Another chain's range in the same map is out of reach.
  r.interval(65536, 131071, "10.9.9.9", 80, 1);

  auto t = r.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80));
  CHECK(t.warnings.empty());
  CHECK(t.paths.size() == 3);
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.endpoints == std::vector<std::string>{"10.180.0.1:80", "10.180.0.2:80", "10.180.0.3:8080"});
  CHECK_FALSE(t.outcome.masqueraded);
  CHECK_FALSE(t.outcome.mixed);
  CHECK(t.outcome.toText() == "10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:8080");
  CHECK(hasStep(t, "services", "service-ips hit: 172.30.0.41 . tcp . 80 : goto service-a"));
  CHECK(t.paths[1].choices == std::vector<std::string>{"slots 21845-43689 (2 of 3 intervals of 0-65534) -> 10.180.0.2:80"});

  SECTION("another port, protocol or address misses the map: accepted untouched") {
    for (const auto& p : {packet("10.0.0.2", "172.30.0.41", 81), packet("10.0.0.2", "172.30.0.41", 80, "udp"),
                          packet("10.0.0.2", "172.30.0.42", 80)}) {
      auto miss = r.tracer().trace(p);
      CHECK(miss.outcome.verdict == TraceVerdict::kAccepted);
      CHECK(miss.outcome.toText().empty());
      CHECK(miss.paths.size() == 1);
    }
  }
}

TEST_CASE("tracer: slots no interval covers make the lookup miss", "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("service-a"));
  auto& svc = r.chain("service-a");
  r.rule(svc, {MatchL4Proto{6}, DnatFromSlots{kSlots, 0}});
  r.rule(svc, {drop()});
  r.interval(0, 1000, "10.180.0.1", 80, 1);

  auto t = r.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80));
  REQUIRE(t.paths.size() == 2);
  CHECK(t.paths[0].outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.paths[1].outcome.verdict == TraceVerdict::kDropped);
  CHECK(t.paths[1].outcome.chain == "service-a");
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.mixed);
  CHECK(t.outcome.endpoints == std::vector<std::string>{"10.180.0.1:80"});

  SECTION("an empty range never matches") {
    Ruleset empty = natRuleset();
    empty.serviceIP("172.30.0.41", 80, goTo("service-a"));
    auto& c = empty.chain("service-a");
    empty.rule(c, {MatchL4Proto{6}, DnatFromSlots{kSlots, 0}});
    empty.rule(c, {Reject{}});
    auto e = empty.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80));
    CHECK(e.outcome.verdict == TraceVerdict::kRejected);
    CHECK(e.outcome.toText() == "REJECT");
    CHECK_FALSE(e.outcome.mixed);
  }
}

TEST_CASE("tracer: jump comes back to the next rule, goto to the caller's caller", "[unit][tracer]") {
  Ruleset r;
  auto& base = r.base("filter-prerouting", "filter", "prerouting", -110);
  r.rule(base, {MatchDestPort{1}, jump("via-goto")});
  r.rule(base, {MatchDestPort{2}, jump("via-jump")});
  r.rule(base, {drop()});
  auto& viaGoto = r.chain("via-goto");
  r.rule(viaGoto, {goTo("returns")});
  r.rule(viaGoto, {Reject{}});  // never reached: goto does not come back here
  auto& viaJump = r.chain("via-jump");
  r.rule(viaJump, {jump("returns")});
  r.rule(viaJump, {accept()});  // reached: the jump came back
  r.rule(r.chain("returns"), {ret()});

  auto viaG = r.tracer().trace(packet("10.0.0.2", "10.1.0.1", 1));
  CHECK(viaG.outcome.verdict == TraceVerdict::kDropped);
  CHECK(viaG.outcome.chain == "filter-prerouting");
  CHECK(viaG.outcome.rule == "drop");
  CHECK(viaG.outcome.toText() == "DROP");

  auto viaJ = r.tracer().trace(packet("10.0.0.2", "10.1.0.1", 2));
  CHECK(viaJ.outcome.verdict == TraceVerdict::kAccepted);
  CHECK(hasStep(viaJ, "via-jump", "accept"));
}

TEST_CASE("tracer: the masquerade mark is set, read and cleared", "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("service-a"));
  auto& svc = r.chain("service-a");
  r.rule(svc, {MatchAddress{true, true, ip("10.0.0.0/8")}, jump("mark-for-masquerade")});
  r.rule(svc, {MatchL4Proto{6}, DnatTo{ip("10.180.0.1"), 80}});

  auto fromPod = r.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80));
  CHECK(fromPod.outcome.endpoints == std::vector<std::string>{"10.180.0.1:80"});
  CHECK_FALSE(fromPod.outcome.masqueraded);

  auto fromOutside = r.tracer().trace(packet("203.0.113.2", "172.30.0.41", 80));
  CHECK(fromOutside.outcome.endpoints == std::vector<std::string>{"10.180.0.1:80"});
  CHECK(fromOutside.outcome.masqueraded);
  CHECK(hasStep(fromOutside, "mark-for-masquerade", "mark is now 0x00004000"));
  CHECK(hasStep(fromOutside, "masquerading", "mark is now 0x00000000"));
  CHECK(hasStep(fromOutside, "masquerading", "masquerade fully-random"));
}

TEST_CASE("tracer: after DNAT a local destination takes input, others forward and postrouting",
          "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("to-local"));
  r.serviceIP("172.30.0.42", 80, goTo("to-remote"));
  r.rule(r.chain("to-local"), {MatchL4Proto{6}, jump("mark-for-masquerade")});
  r.rule(r.chain("to-local"), {MatchL4Proto{6}, DnatTo{ip("192.168.0.2"), 8080}});
  r.rule(r.chain("to-remote"), {MatchL4Proto{6}, DnatTo{ip("10.180.0.1"), 80}});
  r.rule(r.base("filter-input", "filter", "input", 0), {MatchCtStatusDnat{}, MatchDestPort{8080}, Reject{true}});
  r.rule(r.base("filter-forward", "filter", "forward", 0), {MatchCtStatusDnat{}, MatchDestPort{80}, drop()});

  auto local = r.tracer().trace(packet("203.0.113.2", "172.30.0.41", 80));
  CHECK(local.outcome.verdict == TraceVerdict::kRejected);
  CHECK(local.outcome.rule == "ct status dnat th dport 8080 reject with tcp reset");
  CHECK_FALSE(local.outcome.masqueraded);  // rejected on input: postrouting is never reached
  CHECK_FALSE(hasStep(local, "filter-forward", "hook"));

  auto remote = r.tracer().trace(packet("203.0.113.2", "172.30.0.42", 80));
  CHECK(remote.outcome.verdict == TraceVerdict::kDropped);
  CHECK(remote.outcome.chain == "filter-forward");
}

TEST_CASE("tracer: locally originated packets take the output hooks, by priority", "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("service-a"));
  r.rule(r.chain("service-a"), {MatchL4Proto{6}, DnatTo{ip("10.180.0.1"), 80}});
  // Before nat-output the destination is the service; after it, the endpoint.
  auto& pre = r.base("filter-output", "filter", "output", -110);
  r.rule(pre, {MatchAddress{false, false, ip("10.180.0.1")}, drop()});
  auto& post = r.base("filter-output-post-dnat", "filter", "output", -90);
  r.rule(post, {MatchCtStatusDnat{}, MatchAddress{false, false, ip("10.180.0.1")}, jump("mark-for-masquerade")});
  // Prerouting chains do not see locally originated packets.
  r.rule(r.base("filter-prerouting", "filter", "prerouting", -110), {drop()});

  auto t = r.tracer().trace(packet("192.168.0.2", "172.30.0.41", 80, "tcp", true));
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.endpoints == std::vector<std::string>{"10.180.0.1:80"});
  CHECK(t.outcome.masqueraded);
  CHECK(hasStep(t, "nat-output", "hook output"));
  CHECK_FALSE(hasStep(t, "nat-prerouting", "hook"));

  SECTION("arriving, the same packet meets prerouting") {
    auto in = r.tracer().trace(packet("192.168.0.2", "172.30.0.41", 80));
    CHECK(in.outcome.verdict == TraceVerdict::kDropped);
    CHECK(in.outcome.chain == "filter-prerouting");
  }
}

TEST_CASE("tracer: a connection's destination NAT is set up once", "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("service-a"));
  r.rule(r.chain("service-a"), {MatchL4Proto{6}, DnatTo{ip("192.168.0.2"), 10250}});
  // Were nat-prerouting evaluated again when the packet loops back in, this would drop it.
  auto& again = r.base("nat-prerouting-late", "nat", "prerouting", -50);
  r.rule(again, {drop()});
  auto& input = r.base("filter-input", "filter", "input", 0);
  r.rule(input, {MatchCtStatusDnat{}, MatchDestPort{10250}, accept()});

  auto t = r.tracer().trace(packet("192.168.0.2", "172.30.0.41", 80, "tcp", true));
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.endpoints == std::vector<std::string>{"192.168.0.2:10250"});
  CHECK(hasStep(t, "filter-input", "accept"));
  CHECK(hasStep(t, "nat-prerouting-late", "already set up"));
}

TEST_CASE("tracer: fib saddr type local is true for the node's addresses and loopback", "[unit][tracer]") {
  Ruleset r;
  r.rule(r.base("filter-prerouting", "filter", "prerouting", -110), {MatchFibSourceLocal{}, drop()});
  auto tracer = r.tracer({ip("192.168.0.2"), ip("192.168.1.2")});
  CHECK(tracer.trace(packet("192.168.1.2", "10.1.0.1", 80)).outcome.verdict == TraceVerdict::kDropped);
  CHECK(tracer.trace(packet("127.0.0.1", "10.1.0.1", 80)).outcome.verdict == TraceVerdict::kDropped);
  CHECK(tracer.trace(packet("192.168.0.3", "10.1.0.1", 80)).outcome.verdict == TraceVerdict::kAccepted);
}

TEST_CASE("tracer: an affinity lookup hits only a recorded client", "[unit][tracer]") {
  Ruleset r = natRuleset();
  r.serviceIP("172.30.0.41", 80, goTo("service-a"));
  auto& svc = r.chain("service-a");
  r.rule(svc, {MatchL4Proto{6}, DnatFromAffinity{"session-affinity", 7}});
  r.rule(svc, {MatchL4Proto{6}, DnatFromSlots{kSlots, 0}});
  r.interval(0, 32767, "10.180.0.1", 80, 2);
  r.interval(32767, 65535, "10.180.0.2", 80, 2);

  auto empty = r.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80));
  CHECK(empty.outcome.endpoints == std::vector<std::string>{"10.180.0.1:80", "10.180.0.2:80"});

  // An entry of another pool is not this chain's.
  KeyBuilder v;
  v.address(ip("10.180.0.2")).port(80);
  KeyBuilder other;
  other.address(ip("10.0.0.2")).poolId(8);
  r.fragments[0].elements.push_back(
      Element{"session-affinity", other.bytes, other.text, std::nullopt, v.bytes, v.text});
  CHECK(r.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80)).outcome.endpoints.size() == 2);

  KeyBuilder k;
  k.address(ip("10.0.0.2")).poolId(7);
  r.fragments[0].elements.push_back(Element{"session-affinity", k.bytes, k.text, std::nullopt, v.bytes, v.text});
  auto recorded = r.tracer().trace(packet("10.0.0.2", "172.30.0.41", 80));
  CHECK(recorded.paths.size() == 1);
  CHECK(recorded.outcome.endpoints == std::vector<std::string>{"10.180.0.2:80"});
  // Another client still balances.
  CHECK(r.tracer().trace(packet("10.0.0.3", "172.30.0.41", 80)).outcome.endpoints.size() == 2);
}

TEST_CASE("tracer: numgen explores both branches", "[unit][tracer]") {
  Ruleset r;
  auto& base = r.base("filter-prerouting", "filter", "prerouting", -110);
  r.rule(base, {MatchNumgen{2}, drop()});
  auto t = r.tracer().trace(packet("10.0.0.2", "10.1.0.1", 80));
  REQUIRE(t.paths.size() == 2);
  CHECK(t.paths[0].outcome.verdict == TraceVerdict::kDropped);
  CHECK(t.paths[1].outcome.verdict == TraceVerdict::kAccepted);
  CHECK(t.outcome.mixed);
}

TEST_CASE("tracer: unknown chains and maps are warnings, not crashes", "[unit][tracer]") {
  Ruleset r;
  auto& base = r.base("filter-prerouting", "filter", "prerouting", -110);
  r.rule(base, {VmapLookup{true, "no-such-map"}});
  r.rule(base, {jump("no-such-chain")});
  auto t = r.tracer().trace(packet("10.0.0.2", "10.1.0.1", 80));
  CHECK(t.outcome.verdict == TraceVerdict::kAccepted);
  CHECK(t.warnings == std::vector<std::string>{"jump to unknown chain no-such-chain: treated as an empty chain",
                                               "lookup in unknown set or map no-such-map: treated as empty"});
}

TEST_CASE("tracer: a packet of the other family is untouched", "[unit][tracer]") {
  Ruleset r;
  r.rule(r.base("filter-prerouting", "filter", "prerouting", -110), {drop()});
  auto t = r.tracer().trace(packet("fd00::2", "fd00::1", 80));
  CHECK(t.outcome.verdict == TraceVerdict::kAccepted);
}

TEST_CASE("tracer: the outcome prints as text and JSON", "[unit][tracer]") {
  TraceOutcome o;
  CHECK(o.toText().empty());
  CHECK(o.toJson() == R"({"verdict":"accept","endpoints":[],"masqueraded":false,"mixed":false,"chain":"","rule":""})");
  o.verdict = TraceVerdict::kDnat;
  o.endpoints = {"10.180.0.1:80", "[fd00::1]:80"};
  o.masqueraded = true;
  CHECK(o.toText() == "10.180.0.1:80, [fd00::1]:80");
  CHECK(o.toJson() ==
        R"({"verdict":"dnat","endpoints":["10.180.0.1:80","[fd00::1]:80"],"masqueraded":true,"mixed":false,"chain":"","rule":""})");
  o = TraceOutcome{TraceVerdict::kDropped, {}, "firewall-X", "ip saddr \"q\" drop", false, false};
  CHECK(o.toText() == "DROP");
  CHECK(o.toJson() ==
        R"({"verdict":"drop","endpoints":[],"masqueraded":false,"mixed":false,"chain":"firewall-X","rule":"ip saddr \"q\" drop"})");
  CHECK(verdictName(TraceVerdict::kRejected) == "reject");
}

// ---- on the renderer's output ------------------------------------------------------------

namespace {

RenderConfig renderConfig() {
  RenderConfig cfg;
  cfg.common.clusterCIDRs.push_back("10.0.0.0/8");
  return cfg;
}

sdk::NodeInfo node() {
  sdk::NodeInfo n;
  n.name = "node-a";
  n.addresses = {"192.168.0.2"};
  return n;
}

}  // namespace

TEST_CASE("tracer: rendered ClusterIP services", "[unit][tracer]") {
  NftablesRenderer renderer(renderConfig());
  std::vector<sdk::ServicePort> ports{
      clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80), endpoint("10.180.2.1", 80)}),
      clusterIP("ns2", "empty", "172.30.0.42", 80, {}),
  };
  auto tracer = NftablesTracer::fromServicePorts(renderer, net::Family::kIPv4, ports, node());

  auto pod = tracer.trace(packet("10.0.0.2", "172.30.0.41", 80));
  CHECK(pod.warnings.empty());
  CHECK(pod.outcome.toText() == "10.180.0.1:80, 10.180.2.1:80");
  CHECK_FALSE(pod.outcome.masqueraded);

  auto outside = tracer.trace(packet("203.0.113.2", "172.30.0.41", 80));
  CHECK(outside.outcome.toText() == "10.180.0.1:80, 10.180.2.1:80");
  CHECK(outside.outcome.masqueraded);

  // An endpoint reaching itself through the service is masqueraded (hairpin), the other not.
  auto hairpin = tracer.trace(packet("10.180.0.1", "172.30.0.41", 80));
  CHECK(hairpin.outcome.masqueraded);
  REQUIRE(hairpin.paths.size() == 2);
  CHECK(hairpin.paths[0].outcome.masqueraded);
  CHECK_FALSE(hairpin.paths[1].outcome.masqueraded);

  auto wrongPort = tracer.trace(packet("10.0.0.2", "172.30.0.41", 443));
  CHECK(wrongPort.outcome.verdict == TraceVerdict::kRejected);
  CHECK(wrongPort.outcome.chain == names::kClusterIPsCheckChain);

  auto noEndpoints = tracer.trace(packet("10.0.0.2", "172.30.0.42", 80));
  CHECK(noEndpoints.outcome.verdict == TraceVerdict::kRejected);
  CHECK(noEndpoints.outcome.chain == names::kRejectChain);
  CHECK(noEndpoints.outcome.rule == "meta l4proto tcp reject with tcp reset");

  auto fromNode = tracer.trace(packet("192.168.0.2", "172.30.0.41", 80, "tcp", true));
  CHECK(fromNode.outcome.toText() == "10.180.0.1:80, 10.180.2.1:80");
  CHECK(fromNode.outcome.masqueraded);

  auto notAService = tracer.trace(packet("10.0.0.2", "10.0.0.3", 80));
  CHECK(notAService.outcome.verdict == TraceVerdict::kAccepted);
  CHECK(notAService.toText().find("outcome: ACCEPT (untouched)") != std::string::npos);
}

TEST_CASE("tracer: rendered session affinity records the client after DNAT", "[unit][tracer]") {
  NftablesRenderer renderer(renderConfig());
  auto p = clusterIP("ns1", "sticky", "172.30.0.45", 80, {endpoint("10.180.0.3", 80)});
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 600;
  std::vector<sdk::ServicePort> ports{p};
  auto tracer = NftablesTracer::fromServicePorts(renderer, net::Family::kIPv4, ports, node());
  auto t = tracer.trace(packet("10.0.0.2", "172.30.0.45", 80));
  CHECK(t.outcome.toText() == "10.180.0.3:80");
  const std::uint32_t id = affinityPoolId(*renderer.slots(net::Family::kIPv4).baseOf(serviceChainName(p)), p,
                                          plan::Pool::kCluster);
  CHECK(hasStep(t, affinityChainName(p), fmt::format("would record 10.0.0.2 . {} : 10.180.0.3:80 for 600s", id)));
  CHECK(hasStep(t, names::kAffinityRecordChain, "affinity-services hit: 172.30.0.45 . tcp . 80"));
}

TEST_CASE("tracer: an eTP=Local service records each pool's choices under that pool", "[unit][tracer]") {
  // The short-circuit (pods, the node) picks from the cluster pool and must record there; an
  // outside client picks a local endpoint and records under the local pool.
  NftablesRenderer renderer(renderConfig());
  auto p = clusterIP("ns1", "sticky", "172.30.0.46", 80,
                     {endpoint("10.180.0.4", 80, true), endpoint("10.180.0.5", 80)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30046;
  p.externalPolicyLocal = true;
  p.sessionAffinityClientIP = true;
  p.stickyMaxAgeSeconds = 600;
  std::vector<sdk::ServicePort> ports{p};
  auto tracer = NftablesTracer::fromServicePorts(renderer, net::Family::kIPv4, ports, node());
  auto& slots = renderer.slots(net::Family::kIPv4);
  const auto cluster = affinityPoolId(*slots.baseOf(serviceChainName(p)), p, plan::Pool::kCluster);
  const auto local = affinityPoolId(*slots.baseOf(externalChainName(p)), p, plan::Pool::kLocal);
  auto outside = tracer.trace(packet("203.0.113.9", "192.168.0.2", 30046));
  CHECK(outside.outcome.toText() == "10.180.0.4:80");
  CHECK(hasStep(outside, externalAffinityChainName(p),
                fmt::format("would record 203.0.113.9 . {} : 10.180.0.4:80 for 600s", local)));
  auto pod = tracer.trace(packet("10.0.0.2", "192.168.0.2", 30046));
  REQUIRE_FALSE(pod.paths.empty());
  for (const auto& path : pod.paths) {
    bool recordedCluster = false, recordedLocal = false;
    for (const auto& st : path.steps) {
      recordedCluster = recordedCluster || st.detail.find(fmt::format("10.0.0.2 . {} :", cluster)) != std::string::npos;
      recordedLocal = recordedLocal || st.detail.find(fmt::format("10.0.0.2 . {} :", local)) != std::string::npos;
    }
    CHECK(recordedCluster);
    CHECK_FALSE(recordedLocal);
  }
}

TEST_CASE("tracer: fib daddr type local is true for the node's addresses and loopback", "[unit][tracer]") {
  Ruleset r;
  r.rule(r.base("filter-prerouting", "filter", "prerouting", -110), {MatchFibDestLocal{}, drop()});
  auto tracer = r.tracer({ip("192.168.0.2"), ip("192.168.1.2")});
  CHECK(tracer.trace(packet("203.0.113.2", "192.168.1.2", 80)).outcome.verdict == TraceVerdict::kDropped);
  CHECK(tracer.trace(packet("203.0.113.2", "127.0.0.1", 80)).outcome.verdict == TraceVerdict::kDropped);
  CHECK(tracer.trace(packet("203.0.113.2", "192.168.0.3", 80)).outcome.verdict == TraceVerdict::kAccepted);
}

TEST_CASE("tracer: NodePorts on the addresses the host resolved, or on every local one", "[unit][tracer]") {
  NftablesRenderer renderer(renderConfig());
  auto p = clusterIP("ns1", "svc1", "172.30.0.41", 80, {endpoint("10.180.0.1", 80)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 3001;
  std::vector<sdk::ServicePort> ports{p};
  sdk::NodeInfo n = node();  // the Node object says 192.168.0.2
  n.nodePortAddresses.resolved = true;
  n.nodePortAddresses.addresses = {"127.0.0.1", "192.168.5.5"};

  auto tracer = NftablesTracer::fromServicePorts(renderer, net::Family::kIPv4, ports, n);
  CHECK(tracer.trace(packet("203.0.113.2", "192.168.5.5", 3001)).outcome.toText() == "10.180.0.1:80");
  CHECK(tracer.trace(packet("203.0.113.2", "192.168.0.2", 3001)).outcome.toText().empty());
  CHECK(tracer.trace(packet("10.0.0.2", "127.0.0.1", 3001)).outcome.toText().empty());

  n.nodePortAddresses.allLocalIPv4 = true;
  auto all = NftablesTracer::fromServicePorts(renderer, net::Family::kIPv4, ports, n);
  CHECK(all.trace(packet("203.0.113.2", "192.168.5.5", 3001)).outcome.toText() == "10.180.0.1:80");
  CHECK(all.trace(packet("203.0.113.2", "192.168.0.2", 3001)).outcome.toText() == "10.180.0.1:80");
  CHECK(all.trace(packet("10.0.0.2", "127.0.0.1", 3001)).outcome.toText().empty());  // no localhost NodePorts
  CHECK(all.trace(packet("203.0.113.2", "192.168.9.9", 3001)).outcome.toText().empty());  // not local
}
