// UserspaceBackend against the in-memory nftables: what goes into table kproxy-userspace, the
// minimal diff between syncs, listeners kept across endpoint changes, dry-run.
#include "kproxy/userspace/backend.h"
#include "kproxy/userspace/kernel.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include <catch2/catch.hpp>

#include "service_ports.h"

using namespace kproxy;
using namespace kproxy::userspace;
using nftables::testing::clusterIP;
using nftables::testing::endpoint;
using nftables::testing::setEndpoints;

namespace {

UserspaceSettings settings() {
  auto s = parseUserspaceSettings({{"cluster-cidr", "10.244.0.0/16"}});
  REQUIRE(s);
  return *s;
}

struct Harness {
  nftables::FakeKernelNftables* kernel = nullptr;
  std::unique_ptr<UserspaceBackend> backend;
  /// `printTo`: as the factory does for --dry-run, the printing decorators over the fake table
  /// and the proxy.
  explicit Harness(UserspaceSettings s = settings(), std::FILE* printTo = nullptr) {
    auto k = std::make_unique<nftables::FakeKernelNftables>();
    kernel = k.get();
    std::unique_ptr<nftables::KernelNftables> table = std::move(k);
    std::unique_ptr<ProxyListeners> listeners = std::make_unique<ProxyServer>(s.proxy, nullptr);
    if (printTo != nullptr) {
      table = std::make_unique<nftables::PrintingNftables>(std::move(table), printTo, std::string(kTableName));
      listeners = std::make_unique<PrintingListeners>(std::move(listeners), printTo);
    }
    backend = std::make_unique<UserspaceBackend>(sdk::Host(nullptr), std::move(s), std::move(table),
                                                 std::move(listeners), nullptr);
  }
  /// The ops of one sync as nft text, one per line.
  std::string sync(const plan::SnapshotSource& snap, bool full = false) {
    auto out = backend->syncFrom(snap, {}, full);
    REQUIRE(out);
    return lastText;
  }
  std::string lastText;
};

sdk::ServicePort nodePortService(std::vector<sdk::Endpoint> eps) {
  auto p = clusterIP("ns", "np", "172.30.0.20", 80, std::move(eps));
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30080;
  return p;
}

std::string listenerId(const char* key) { return std::string("ipv4 tcp/") + key + " cluster"; }

}  // namespace

TEST_CASE("userspace backend: listeners and their redirects; no change, no operation", "[unit]") {
  Harness h;
  plan::VectorSnapshot snap({clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.244.1.1", 8080), endpoint("10.244.1.2", 8080)}),
                             nodePortService({})});
  auto first = h.backend->syncFrom(snap, {}, true);
  REQUIRE(first);
  CHECK(first->operations > 0);
  const auto& ports = h.backend->listenerPorts();
  REQUIRE(ports.size() == 1);  // the service without endpoints has no listener
  const auto port = ports.at(listenerId("ns/web:p"));
  CHECK(port != 0);

  const auto& table = h.kernel->tables.at(net::Family::kIPv4);
  // The ClusterIP with endpoints goes to its listener, the one without is refused.
  std::multiset<std::string> verdicts;
  for (const auto& [key, value] : table.elements.at("services")) verdicts.insert(value);
  CHECK(verdicts == std::multiset<std::string>{"goto redirect-tcp-" + std::to_string(port), "goto reject-chain"});
  CHECK(table.elements.at("nodeports").begin()->second == "goto reject-chain");
  CHECK(table.elements.at("cluster-ips").size() == 2);
  const auto& redirect = table.chains.at("redirect-tcp-" + std::to_string(port));
  REQUIRE(redirect.rules.size() == 1);
  CHECK(redirect.rules[0].text == "meta l4proto tcp redirect to :" + std::to_string(port));
  CHECK(table.chains.at("prerouting").base);
  CHECK(table.chains.at("output").base);

  auto again = h.backend->syncFrom(snap, {}, false);
  REQUIRE(again);
  CHECK(again->operations == 0);
  // A full sync reads the table back and finds nothing to change.
  auto full = h.backend->syncFrom(snap, {}, true);
  REQUIRE(full);
  CHECK(full->operations == 0);
  CHECK(h.kernel->readBacks == 2);
}

TEST_CASE("userspace backend: an endpoint change keeps the listener and touches no rule", "[unit]") {
  Harness h;
  plan::VectorSnapshot snap({clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.244.1.1", 8080)})});
  REQUIRE(h.backend->syncFrom(snap, {}, true));
  const auto port = h.backend->listenerPorts().at(listenerId("ns/web:p"));
  setEndpoints(snap.ports()[0], {endpoint("10.244.1.2", 8080), endpoint("10.244.1.3", 8080)});
  auto out = h.backend->syncFrom(snap, {}, false);
  REQUIRE(out);
  CHECK(out->operations == 0);
  CHECK(h.backend->listenerPorts().at(listenerId("ns/web:p")) == port);

  // The last endpoint goes: reject instead of the listener, whose chain is flushed (and deleted
  // by the next sync, once nothing refers to it).
  setEndpoints(snap.ports()[0], {});
  REQUIRE(h.backend->syncFrom(snap, {}, false));
  CHECK(h.backend->listenerPorts().empty());
  const auto& table = h.kernel->tables.at(net::Family::kIPv4);
  CHECK(table.elements.at("services").begin()->second == "goto reject-chain");
  REQUIRE(h.backend->syncFrom(snap, {}, false));
  CHECK_FALSE(h.kernel->tables.at(net::Family::kIPv4).chains.contains("redirect-tcp-" + std::to_string(port)));
}

TEST_CASE("userspace backend: a refused batch makes the next sync full", "[unit]") {
  Harness h;
  plan::VectorSnapshot snap({clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.244.1.1", 8080)})});
  h.kernel->failNextBatchAt(0);
  CHECK_FALSE(h.backend->syncFrom(snap, {}, false));
  CHECK(h.kernel->tables.empty());
  auto out = h.backend->syncFrom(snap, {}, false);
  REQUIRE(out);
  CHECK(h.kernel->readBacks == 2);  // the first sync and the retry both read back
  CHECK(h.kernel->tables.at(net::Family::kIPv4).elements.at("services").size() == 1);
}

TEST_CASE("userspace backend: eTP=Local short-circuit and UDP listeners", "[unit]") {
  Harness h;
  auto np = nodePortService({endpoint("10.244.1.1", 8080, true), endpoint("10.244.2.1", 8080)});
  np.externalPolicyLocal = true;
  auto dns = clusterIP("ns", "dns", "172.30.0.53", 53, {endpoint("10.244.1.5", 5353)}, sdk::Protocol::kUDP);
  plan::VectorSnapshot snap({np, dns});
  REQUIRE(h.backend->syncFrom(snap, {}, true));
  const auto& ports = h.backend->listenerPorts();
  CHECK(ports.contains("ipv4 tcp/ns/np:p cluster"));
  CHECK(ports.contains("ipv4 tcp/ns/np:p local"));
  CHECK(ports.contains("ipv4 udp/ns/dns:p cluster"));
  const auto& table = h.kernel->tables.at(net::Family::kIPv4);
  CHECK(table.elements.at("nodeports").begin()->second ==
        "goto redirect-tcp-" + std::to_string(ports.at("ipv4 tcp/ns/np:p local")));
  CHECK(table.elements.at("shortcircuit-nodeports").begin()->second ==
        "goto redirect-tcp-" + std::to_string(ports.at("ipv4 tcp/ns/np:p cluster")));
  CHECK(table.chains.contains("redirect-udp-" + std::to_string(ports.at("ipv4 udp/ns/dns:p cluster"))));
  // Pod traffic (--cluster-cidr) takes the short-circuit in prerouting.
  bool podRule = false;
  for (const auto& r : table.chains.at("prerouting").rules)
    podRule = podRule || r.text == "ip saddr 10.244.0.0/16 meta l4proto . th dport vmap @shortcircuit-nodeports" ||
              r.text.find("ip saddr 10.244.0.0/16") != std::string::npos;
  CHECK(podRule);
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

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto end = text.find('\n', at);
    out.push_back(text.substr(at, end - at));
    at = end == std::string::npos ? text.size() : end + 1;
  }
  return out;
}

TEST_CASE("userspace backend: dry-run prints through the printing decorators what the table and the listeners are given",
          "[unit]") {
  auto s = settings();
  s.dryRun = true;
  s.proxy.listen = false;
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  long mark = 0;
  Harness h(std::move(s), out);
  plan::VectorSnapshot snap({clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.244.1.1", 8080)}),
                             clusterIP("ns", "api", "172.30.0.11", 443, {endpoint("10.244.1.2", 8443)})});
  auto first = h.backend->syncFrom(snap, {}, true);
  REQUIRE(first);
  CHECK(first->summary.ends_with(" dry_run=true"));
  const auto& ports = h.backend->listenerPorts();
  const auto web = std::to_string(ports.at(listenerId("ns/web:p")));
  const auto api = std::to_string(ports.at(listenerId("ns/api:p")));
  std::string text = printedSince(out, mark);
  INFO(text);
  const auto lines = linesOf(text);
  // The listeners first (the table must never point at a port nobody has), then one line of nft
  // syntax per operation, table and chains before elements, as the transaction sends them.
  REQUIRE(lines.size() == static_cast<std::size_t>(first->operations) + 2);
  CHECK(lines[0] == "# userspace: listen ipv4 tcp/ns/web:p cluster :" + web + " -> 10.244.1.1:8080");
  CHECK(lines[1] == "# userspace: listen ipv4 tcp/ns/api:p cluster :" + api + " -> 10.244.1.2:8443");
  CHECK(lines[2] == "add table ip kproxy-userspace");
  const auto firstElement = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.starts_with("add element ");
  });
  REQUIRE(firstElement != lines.end());
  CHECK(std::none_of(firstElement, lines.end(), [](const std::string& l) { return !l.starts_with("add element "); }));
  CHECK(std::count(lines.begin(), lines.end(),
                   "add element ip kproxy-userspace services { 172.30.0.10 . tcp . 80 : goto redirect-tcp-" + web +
                       " }") == 1);
  // What was printed went to the table in memory, and only there.
  CHECK(h.kernel->batches == 1);
  const auto& table = h.kernel->tables.at(net::Family::kIPv4);
  CHECK(table.elements.at("services").size() == 2);
  CHECK(table.chains.contains("redirect-tcp-" + web));

  // An endpoint change touches the proxy's pool only.
  snap.ports()[0] = clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.244.1.1", 8080), endpoint("10.244.1.3", 8080)});
  REQUIRE(h.backend->syncFrom(snap, {}, false));
  CHECK(printedSince(out, mark) ==
        "# userspace: pool of ipv4 tcp/ns/web:p cluster :" + web + " -> 10.244.1.1:8080, 10.244.1.3:8080\n");
  // A full sync reads the table in memory back and finds nothing to do.
  REQUIRE(h.backend->syncFrom(snap, {}, true));
  CHECK(printedSince(out, mark).empty());
  // A service that goes: its elements deleted and its chain flushed, then its listener closed.
  snap.ports().pop_back();
  REQUIRE(h.backend->syncFrom(snap, {}, false));
  text = printedSince(out, mark);
  INFO(text);
  CHECK(text.find("delete element ip kproxy-userspace services { 172.30.0.11 . tcp . 443 }\n") != std::string::npos);
  CHECK(text.starts_with("flush chain ip kproxy-userspace redirect-tcp-" + api + "\n"));
  CHECK(text.ends_with("# userspace: close ipv4 tcp/ns/api:p cluster :" + api + "\n"));
  CHECK(h.kernel->tables.at(net::Family::kIPv4).elements.at("services").size() == 1);
  // Cleanup deletes both tables, in memory.
  REQUIRE(h.backend->cleanup());
  CHECK(printedSince(out, mark) == "delete table ip kproxy-userspace\ndelete table ip6 kproxy-userspace\n");
  CHECK(h.kernel->tables.empty());
  std::fclose(out);
}

TEST_CASE("userspace options: bad values are refused by name", "[unit]") {
  CHECK_FALSE(parseUserspaceSettings({{"udp-timeout", "0"}}));
  CHECK_FALSE(parseUserspaceSettings({{"userspace-connect-attempts", "zero"}}));
  CHECK_FALSE(parseUserspaceSettings({{"userspace-connect-timeout", "-1"}}));
  auto bad = parseUserspaceSettings({{"userspace-max-connections", "0"}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("userspace-max-connections") != std::string::npos);
  auto ok = parseUserspaceSettings({{"udp-timeout", "0.25"}, {"userspace-idle-timeout", "0"}, {"userspace-endpoint-grace", "1.5"}});
  REQUIRE(ok);
  CHECK(ok->proxy.udpIdleTimeout == std::chrono::milliseconds(250));
  CHECK(ok->proxy.idleTimeout == std::chrono::milliseconds(0));
  CHECK(ok->proxy.removedEndpointGrace == std::chrono::milliseconds(1500));
}

TEST_CASE("userspace backend: NodePorts on the addresses --nodeport-addresses resolved to", "[unit]") {
  Harness h;
  sdk::NodeInfo node;
  node.name = "n";
  node.nodePortAddresses.resolved = true;
  node.nodePortAddresses.addresses = {"192.168.70.1", "127.0.0.1", "fd00::1"};
  plan::VectorSnapshot snap({nodePortService({endpoint("10.244.1.1", 8080)})}, node);
  REQUIRE(h.backend->syncFrom(snap, {}, true));
  const auto& table = h.kernel->tables.at(net::Family::kIPv4);
  REQUIRE(table.elements.at("nodeport-ips").size() == 1);  // loopback and IPv6 left out
  bool bySet = false, byFib = false;
  for (const auto& r : table.chains.at("prerouting").rules) {
    bySet = bySet || r.text.find("ip daddr @nodeport-ips meta l4proto . th dport vmap @nodeports") != std::string::npos;
    byFib = byFib || r.text.find("fib daddr type local") != std::string::npos;
  }
  CHECK(bySet);
  CHECK_FALSE(byFib);

  // Every local IPv4 address (0.0.0.0/0): back to `fib daddr type local`, the set emptied.
  node.nodePortAddresses.allLocalIPv4 = true;
  snap.setNode(node);
  REQUIRE(h.backend->syncFrom(snap, {}, false));
  const auto& after = h.kernel->tables.at(net::Family::kIPv4);
  CHECK(after.elements.at("nodeport-ips").empty());
  byFib = false;
  for (const auto& r : after.chains.at("prerouting").rules)
    byFib = byFib || r.text.find("ip daddr != 127.0.0.0/8 fib daddr type local meta l4proto . th dport vmap @nodeports") !=
                         std::string::npos;
  CHECK(byFib);
}

TEST_CASE("userspace backend: loadBalancerSourceRanges filter a LoadBalancer IP before its listener", "[unit]") {
  Harness h;
  auto lb = clusterIP("ns", "lb", "172.30.0.30", 80, {endpoint("10.244.1.1", 8080)});
  lb.type = sdk::ServiceType::kLoadBalancer;
  lb.nodePort = 30090;
  lb.loadBalancerIPs = {"203.0.113.9"};
  lb.loadBalancerSourceRanges = {"198.51.100.0/24"};
  plan::VectorSnapshot snap({lb});
  REQUIRE(h.backend->syncFrom(snap, {}, true));
  const auto port = std::to_string(h.backend->listenerPorts().at(listenerId("ns/lb:p")));
  const auto& table = h.kernel->tables.at(net::Family::kIPv4);
  std::multiset<std::string> verdicts;
  for (const auto& [key, value] : table.elements.at("services")) verdicts.insert(value);
  // The ClusterIP goes straight to the listener, the LoadBalancer IP through its firewall.
  CHECK(verdicts == std::multiset<std::string>{"goto redirect-tcp-" + port, "goto firewall-tcp-" + port});
  CHECK(table.elements.at("nodeports").begin()->second == "goto redirect-tcp-" + port);  // NodePorts unfiltered
  const auto& fw = table.chains.at("firewall-tcp-" + port);
  REQUIRE(fw.rules.size() == 2);
  CHECK(fw.rules[0].text == "ip saddr 198.51.100.0/24 goto redirect-tcp-" + port);
  CHECK(fw.rules[1].text == "drop");
}

TEST_CASE("userspace backend: addresses of a ServiceCIDR that no Service holds are dropped", "[unit]") {
  Harness h;
  plan::VectorSnapshot snap({clusterIP("ns", "web", "172.30.0.10", 80, {endpoint("10.244.1.1", 8080)})});
  snap.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"v6", "fd00:30::/108"}});
  REQUIRE(h.backend->syncFrom(snap, {}, true));
  const auto& check = h.kernel->tables.at(net::Family::kIPv4).chains.at("cluster-ips-check");
  REQUIRE(check.rules.size() == 1);
  CHECK(check.rules[0].text == "ip daddr 172.30.0.0/16 drop");
  // Checked after the services and the ClusterIPs' other ports.
  const auto& prerouting = h.kernel->tables.at(net::Family::kIPv4).chains.at("prerouting").rules;
  REQUIRE(prerouting.size() >= 2);
  CHECK(prerouting[prerouting.size() - 2].text == "ip daddr @cluster-ips goto reject-chain");
  CHECK(prerouting.back().text == "jump cluster-ips-check");
  snap.setServiceCIDRs({});
  REQUIRE(h.backend->syncFrom(snap, {}, false));
  CHECK(h.kernel->tables.at(net::Family::kIPv4).chains.at("cluster-ips-check").rules.empty());
}
