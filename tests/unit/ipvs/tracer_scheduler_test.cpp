// IpvsConnectionScheduler: IPVS's scheduling as the iptables tracer's hook, on a small
// hand-written IPVS-mode ruleset and on what the renderer renders; and that without it the
// tracer schedules nothing.

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/iptables/tracer.h"
#include "kproxy/ipvs/renderer.h"
#include "kproxy/ipvs/tracer_scheduler.h"

#include "../iptables/trace_helpers.h"

using namespace kproxy;
using namespace kproxy::ipvs;
using iptables::IptablesTracer;
using iptables::Packet;
using iptables::Trace;
using iptables::TracedIpset;
using iptables::TraceVerdict;

using iptables::testing::eps;
using iptables::testing::metRule;
using iptables::testing::packet;

namespace {

constexpr const char* kNodeIP = "192.168.0.2";


// A small IPVS-mode ruleset: a VIP 10.96.0.10:80 on kube-ipvs0 (local), a firewalled LB IP,
// the "other ports of a VIP" reject, masquerade of what is not from the pods, and a
// firewall-mark virtual server for 10.96.0.20:80 whose masquerade goes through the connmark.
const char* kIpvsRules = R"(*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m tcp --dport 80 -j MARK --set-xmark 0x10000001/0xffffffff
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m connmark --mark 0x4000/0x4000 -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -m mark --mark 0x10000000/0x10000000 -j CONNMARK --set-xmark 0x4000/0x4000
-A KUBE-MARK-MASQ -m mark --mark 0x10000000/0x10000000 -j RETURN
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A INPUT -j KUBE-IPVS-FILTER
-A OUTPUT -j KUBE-IPVS-OUT-FILTER
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-IPVS-IPS dst -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable
-A KUBE-IPVS-OUT-FILTER -s 10.96.0.10/32 -m ipvs --vproto 6 --vaddr 10.96.0.10 --vport 80 -j DROP
COMMIT
)";

IptablesTracer ipvsTracer() {
  auto t = IptablesTracer::fromText(
      kIpvsRules, {*net::Prefix::parse(kNodeIP), *net::Prefix::parse("10.96.0.10"), *net::Prefix::parse("10.96.0.20")});
  REQUIRE(t);
  std::vector<std::pair<std::string, TracedIpset>> sets{
      {"KUBE-CLUSTER-IP", {"hash:ip,port", {"10.96.0.10,tcp:80", "10.96.0.20,tcp:80"}}},
      {"KUBE-IPVS-IPS", {"hash:ip", {"10.96.0.10", "10.96.0.20"}}}};
  TracedVirtualServer vip;
  vip.address = *net::Prefix::parse("10.96.0.10");
  vip.port = 80;
  vip.realServers = {{*net::Prefix::parse("10.244.1.5"), 8080}, {*net::Prefix::parse("10.244.2.5"), 8080}};
  vip.text = "ipvsadm -A -t 10.96.0.10:80 -s rr";
  TracedVirtualServer marked;
  marked.fwmark = 0x10000001;
  marked.realServers = {{*net::Prefix::parse("10.244.1.6"), 8080}};
  marked.text = "ipvsadm -A -f 268435457 -s rr";
  t->setIpsets(std::move(sets));
  t->setScheduler(std::make_shared<const IpvsConnectionScheduler>(std::vector<TracedVirtualServer>{vip, marked}));
  return std::move(*t);
}

}  // namespace

TEST_CASE("IPVS scheduler in the iptables tracer: a pod reaches a virtual server's real servers after filter INPUT", "[unit]") {
  const auto tracer = ipvsTracer();
  const Trace t = tracer.trace(packet("10.244.0.7", "10.96.0.10", 80));
  INFO(t.toText());
  CHECK(t.warnings.empty());
  CHECK(t.paths.size() == 2);  // one per real server
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.endpoints == eps({"10.244.1.5:8080", "10.244.2.5:8080"}));
  CHECK_FALSE(t.outcome.masqueraded);
  CHECK(metRule(t, "filter KUBE-IPVS-FILTER", "KUBE-CLUSTER-IP dst,dst -j RETURN"));
  CHECK(metRule(t, "IPVS", "ipvsadm -A -t 10.96.0.10:80"));
}

TEST_CASE("IPVS scheduler in the iptables tracer: another port of a VIP is rejected before IPVS", "[unit]") {
  const Trace t = ipvsTracer().trace(packet("10.244.0.7", "10.96.0.10", 81));
  INFO(t.toText());
  CHECK(t.outcome.verdict == TraceVerdict::kRejected);
  CHECK(t.outcome.chain == "filter KUBE-IPVS-FILTER");
}

TEST_CASE("IPVS scheduler in the iptables tracer: the node is scheduled at LOCAL_OUT, -m ipvs sees the virtual server", "[unit]") {
  const auto tracer = ipvsTracer();
  const Trace t = tracer.trace(packet(kNodeIP, "10.96.0.10", 80, true));
  INFO(t.toText());
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.masqueraded);
  // From the VIP itself: refused by the -m ipvs rule in filter OUTPUT, after scheduling.
  const Trace fromVip = tracer.trace(packet("10.96.0.10", "10.96.0.10", 80, true));
  INFO(fromVip.toText());
  CHECK(fromVip.outcome.verdict == TraceVerdict::kDropped);
  CHECK(fromVip.outcome.chain == "filter KUBE-IPVS-OUT-FILTER");
}

TEST_CASE("IPVS scheduler in the iptables tracer: a firewall mark selects its virtual server; masquerade via the connmark",
          "[unit]") {
  const auto tracer = ipvsTracer();
  const Trace t = tracer.trace(packet("203.0.113.2", "10.96.0.20", 80));
  INFO(t.toText());
  CHECK(t.warnings.empty());
  CHECK(t.outcome.verdict == TraceVerdict::kDnat);
  CHECK(t.outcome.endpoints == eps({"10.244.1.6:8080"}));
  CHECK(t.outcome.masqueraded);
  CHECK(metRule(t, "nat KUBE-MARK-MASQ", "CONNMARK --set-xmark 0x4000/0x4000"));
  CHECK(metRule(t, "IPVS", "ipvsadm -A -f 268435457"));
  // From a pod: marked, not masqueraded.
  const Trace pod = tracer.trace(packet("10.244.0.7", "10.96.0.20", 80));
  CHECK(pod.outcome.endpoints == eps({"10.244.1.6:8080"}));
  CHECK_FALSE(pod.outcome.masqueraded);
}

TEST_CASE("IPVS scheduler in the iptables tracer: without it, no virtual server is reached", "[unit]") {
  auto tracer = ipvsTracer();
  tracer.setScheduler(nullptr);
  const Trace t = tracer.trace(packet("10.244.0.7", "10.96.0.10", 80));
  INFO(t.toText());
  CHECK(t.outcome.verdict == TraceVerdict::kAccepted);
  CHECK_FALSE(metRule(t, "IPVS", "ipvsadm"));
}

TEST_CASE("IPVS scheduler: a virtual server without real servers refuses the connection", "[unit]") {
  TracedVirtualServer empty;
  empty.address = *net::Prefix::parse("10.96.0.10");
  empty.port = 80;
  empty.text = "ipvsadm -A -t 10.96.0.10:80 -s rr";
  const IpvsConnectionScheduler scheduler({empty});
  plan::ChoiceExplorer choices;
  iptables::TracePath path;
  iptables::ConnectionScheduler::Connection c;
  c.destination = *net::Prefix::parse("10.96.0.10");
  c.destinationPort = 80;
  const auto d = scheduler.schedule(c, choices, path);
  CHECK(d.kind == iptables::ConnectionScheduler::Decision::Kind::kRejected);
  CHECK(d.chain == "IPVS");
  CHECK(d.rule == "ipvsadm -A -t 10.96.0.10:80 -s rr (no real servers)");
  // Another port: not a virtual server, not scheduled.
  c.destinationPort = 81;
  CHECK(scheduler.schedule(c, choices, path).kind == iptables::ConnectionScheduler::Decision::Kind::kPass);
}

TEST_CASE("IPVS scheduler: a rendered virtual server without real servers refuses for want of endpoints",
          "[unit]") {
  RenderConfig cfg;
  cfg.common.clusterCIDRs = {"10.244.0.0/16"};
  IpvsRenderer renderer(cfg);
  sdk::NodeInfo n;
  n.name = "node-a";
  n.addresses = {"192.168.0.2"};
  renderer.setNode(n);
  sdk::ServicePort p;
  p.family = net::Family::kIPv4;
  p.ns = "default";
  p.serviceName = "empty";
  p.portName = "p";
  p.key = "default/empty:p";
  p.clusterIP = "10.96.0.40";
  p.port = 80;
  const std::vector<Fragment> fragments{renderer.renderServicePort(p)};
  const auto servers = tracedVirtualServers(fragments);
  REQUIRE(servers.size() == 1);
  CHECK(servers[0].realServers.empty());
  CHECK(servers[0].emptyReason == plan::DropReason::kNoEndpoints);
  const IpvsConnectionScheduler scheduler(servers);
  plan::ChoiceExplorer choices;
  iptables::TracePath path;
  iptables::ConnectionScheduler::Connection c;
  c.destination = *net::Prefix::parse("10.96.0.40");
  c.destinationPort = 80;
  const auto d = scheduler.schedule(c, choices, path);
  CHECK(d.kind == iptables::ConnectionScheduler::Decision::Kind::kRejected);
  CHECK(d.reason == plan::DropReason::kNoEndpoints);
}
