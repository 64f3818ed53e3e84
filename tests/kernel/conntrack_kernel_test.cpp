// Stale conntrack cleanup against the real kernel, each case in its own network namespace:
// the ctnetlink table on its own, then real UDP flows DNAT'ed by the nftables plugin (loaded
// through the plugin ABI, as kproxy runs it) and cleaned by its post-sync hook; and the
// start-up sysctls inside a namespace. The conntrack CLI is only used to look at the table.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "conntrack_sysctls.h"
#include "kproxy/core/backend.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/kernel/conntrack_table.h"
#include "kproxy/plugins/loader.h"
#include "netns.h"
#include "service_port_states.h"

using namespace kproxy;
using kproxy::testing::FreshNetns;
using kproxy::testing::run;
using kproxy::testing::sh;

namespace {

/// A veth pair in the fresh namespace: the client address, the endpoint addresses (local, so
/// DNAT'ed packets are delivered here) and a route for the service range.
void setUpAddresses() {
  sh("ip link set lo up");
  sh("ip link add kp-ct0 type veth peer name kp-ct1");
  sh("ip link set kp-ct0 up && ip link set kp-ct1 up");
  for (const char* ip : {"10.9.0.1", "10.1.0.1", "10.1.0.2"})
    sh(std::string("ip addr add ") + ip + "/32 dev kp-ct0");
  sh("ip route add 172.30.0.0/24 dev kp-ct0");
}

/// Conntrack only tracks a namespace's traffic once some rule needs it.
void enableConntrack() {
  sh("nft add table ip kp-ct-test");
  sh("nft 'add chain ip kp-ct-test out { type filter hook output priority 0; }'");
  sh("nft add rule ip kp-ct-test out ct state new counter");
}

/// Sends one UDP datagram from src:sport to dst:dport (a new flow per source port).
/// One datagram from src:sport to dst:dport: 0 when the kernel took it, else sendto's errno (a
/// reject rule in the output path refuses it at once).
int trySendUdp(const std::string& src, std::uint16_t sport, const std::string& dst, std::uint16_t dport) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_port = htons(sport);
  inet_pton(AF_INET, src.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(dport);
  inet_pton(AF_INET, dst.c_str(), &to.sin_addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
  int rc = ::sendto(fd, "x", 1, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) == 1 ? 0 : errno;
  ::close(fd);
  return rc;
}

void sendUdp(const std::string& src, std::uint16_t sport, const std::string& dst, std::uint16_t dport) {
  int err = trySendUdp(src, sport, dst, dport);
  INFO("sendto: " << std::strerror(err));
  REQUIRE(err == 0);
}

/// A bound UDP socket, so datagrams DNAT'ed to an endpoint find a listener.
struct UdpListener {
  UdpListener(const std::string& ip, std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
    ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~UdpListener() {
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
  bool ok = false;
};

/// UDP flows the kernel holds towards `dst` (per the conntrack CLI): client source port →
/// reply source address (the endpoint after DNAT, or `dst` itself when never DNAT'ed).
std::map<int, std::string> flowsTo(const std::string& dst) {
  auto [rc, out] = run("conntrack -L -p udp --orig-dst " + dst + " 2>/dev/null");
  INFO(out);
  REQUIRE(rc == 0);
  std::map<int, std::string> flows;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string w;
    std::vector<std::string> srcs;
    int sport = -1;
    while (words >> w) {
      if (w.rfind("src=", 0) == 0) srcs.push_back(w.substr(4));
      if (w.rfind("sport=", 0) == 0 && sport < 0) sport = std::stoi(w.substr(6));
    }
    if (srcs.size() == 2 && sport >= 0) flows[sport] = srcs[1];
  }
  return flows;
}

std::shared_ptr<const core::ServicePortState> dnsPort(const std::vector<std::string>& endpointIPs) {
  std::vector<core::Endpoint> endpoints;
  for (const auto& ip : endpointIPs) endpoints.push_back(kproxy::testing::servingEndpoint(ip, 5353, "node-a"));
  return kproxy::testing::udpClusterIPState("default", "dns", "172.30.0.10", 53, endpoints);
}

/// The node the plugin is created for, as the tracker resolves its Node object.
core::NodeInfo nodeA() {
  core::NodeInfo node;
  node.name = "node-a";
  node.known = true;
  return node;
}

/// A mode's plugin backend for node-a, loaded as kproxy loads it.
std::unique_ptr<core::Backend> modePlugin(plugins::PluginRegistry& registry, const std::string& mode) {
  auto loaded =
      registry.load(std::filesystem::path(KPROXY_TEST_PLUGIN_DIR) / ("kproxy-backend-" + mode + ".so"));
  INFO((loaded ? std::string() : loaded.error().message()));
  REQUIRE(loaded.has_value());
  auto created = registry.createBackend(mode, {{"node-name", "node-a"}});
  INFO((created ? std::string() : created.error().message()));
  REQUIRE(created.has_value());
  return std::move(*created);
}

std::unique_ptr<core::Backend> nftablesPlugin(plugins::PluginRegistry& registry) {
  return modePlugin(registry, "nftables");
}

}  // namespace

TEST_CASE("the ctnetlink table lists a real UDP flow and deletes exactly it", "[kernel]") {
  FreshNetns netns;
  setUpAddresses();
  enableConntrack();
  sendUdp("10.9.0.1", 40000, "172.30.0.10", 53);
  sendUdp("10.9.0.1", 40001, "172.30.0.10", 53);
  REQUIRE(flowsTo("172.30.0.10").size() == 2);

  auto table = kernel::makeNetlinkConntrackTable();
  auto flows = table->list(net::Family::kIPv4, core::Protocol::kUDP);
  REQUIRE(flows.has_value());
  const kernel::ConntrackFlow* first = nullptr;
  for (const auto& f : *flows)
    if (f.original.srcPort == 40000) first = &f;
  REQUIRE(first != nullptr);
  CHECK(first->original.srcIP == "10.9.0.1");
  CHECK(first->original.dstIP == "172.30.0.10");
  CHECK(first->original.dstPort == 53);
  CHECK(first->reply.srcIP == "172.30.0.10");  // no DNAT here
  CHECK(first->reply.dstPort == 40000);
  auto tcp = table->list(net::Family::kIPv4, core::Protocol::kTCP);
  REQUIRE(tcp.has_value());
  CHECK(tcp->empty());

  auto deleted = table->remove({*first});
  REQUIRE(deleted.has_value());
  CHECK(*deleted == 1);
  auto left = flowsTo("172.30.0.10");
  CHECK(left.size() == 1);
  CHECK(left.contains(40001));
  // Already gone: not an error, nothing deleted.
  auto again = table->remove({*first});
  REQUIRE(again.has_value());
  CHECK(*again == 0);
}

TEST_CASE("nftables plugin: after a sync, flows to a removed UDP endpoint go and flows to a kept one stay",
          "[kernel]") {
  FreshNetns netns;
  setUpAddresses();
  UdpListener e1("10.1.0.1", 5353);
  UdpListener e2("10.1.0.2", 5353);
  REQUIRE(e1.ok);
  REQUIRE(e2.ok);

  // A flow that reached the service address before any endpoint existed: never DNAT'ed.
  enableConntrack();
  sendUdp("10.9.0.1", 40000, "172.30.0.10", 53);
  REQUIRE(flowsTo("172.30.0.10") == std::map<int, std::string>{{40000, "172.30.0.10"}});
  sh("nft delete table ip kp-ct-test");

  plugins::PluginRegistry registry;
  auto created = nftablesPlugin(registry);
  core::Backend& backend = *created;

  const core::NodeInfo node = nodeA();
  std::vector<core::ServicePortKey> changed{core::ServicePortKey{net::Family::kIPv4, "default/dns:dns"}};

  // 1. The service gets endpoint E1: the never-DNAT'ed flow is stale (upstream rule for a
  //    service going from no endpoints to some).
  auto withE1 = dnsPort({"10.1.0.1"});
  core::Snapshot s1 = core::Snapshot().withNode(node).with(withE1->key, withE1).withGeneration(1);
  REQUIRE(backend.sync(core::SyncRequest{nullptr, &s1, changed, core::SyncKind::kFull}).has_value());
  CHECK(flowsTo("172.30.0.10").empty());

  sendUdp("10.9.0.1", 40001, "172.30.0.10", 53);
  REQUIRE(flowsTo("172.30.0.10") == std::map<int, std::string>{{40001, "10.1.0.1"}});

  // 2. E2 joins: nothing is stale, E1's flow stays. New flows land on either endpoint; send
  //    until one reaches E2 (random choice: 64 misses in a row is a 2^-64 event).
  auto withBoth = dnsPort({"10.1.0.1", "10.1.0.2"});
  core::Snapshot s2 = s1.with(withBoth->key, withBoth).withGeneration(2);
  REQUIRE(backend.sync(core::SyncRequest{&s1, &s2, changed, core::SyncKind::kPartial}).has_value());
  REQUIRE(flowsTo("172.30.0.10").at(40001) == "10.1.0.1");
  int toE2 = -1;
  for (int sport = 40002; sport < 40066 && toE2 < 0; ++sport) {
    sendUdp("10.9.0.1", static_cast<std::uint16_t>(sport), "172.30.0.10", 53);
    if (flowsTo("172.30.0.10").at(sport) == "10.1.0.2") toE2 = sport;
  }
  REQUIRE(toE2 > 0);
  auto before = flowsTo("172.30.0.10");

  // 3. E2 is removed: every flow DNAT'ed to E2 disappears, every flow to E1 stays.
  core::Snapshot s3 = s2.with(withE1->key, withE1).withGeneration(3);
  REQUIRE(backend.sync(core::SyncRequest{&s2, &s3, changed, core::SyncKind::kPartial}).has_value());
  auto after = flowsTo("172.30.0.10");
  CHECK_FALSE(after.contains(toE2));
  int keptToE1 = 0;
  for (const auto& [sport, endpoint] : before) {
    INFO("sport " << sport << " was answered by " << endpoint);
    if (endpoint == "10.1.0.2") {
      CHECK_FALSE(after.contains(sport));
    } else {
      REQUIRE(after.contains(sport));
      CHECK(after.at(sport) == "10.1.0.1");
      ++keptToE1;
    }
  }
  CHECK(keptToE1 >= 1);
  CHECK(after.contains(40001));

  // Upstream's reconciler metrics (served as kubeproxy_conntrack_reconciler_*): each of the
  // three syncs reconciled IPv4 once; the never-DNAT'ed flow and E2's flows were deleted.
  const std::size_t toE2Flows = std::count_if(before.begin(), before.end(),
                                              [](const auto& flow) { return flow.second == "10.1.0.2"; });
  bool sawDuration = false, sawDeleted = false;
  for (const auto& family : registry.metrics().collect()) {
    if (family.name == "kproxy_conntrack_reconciler_sync_duration_seconds") {
      sawDuration = true;
      REQUIRE(family.histograms.contains({"IPv4"}));
      CHECK(family.histograms.at({"IPv4"}).count == 3);
      CHECK_FALSE(family.histograms.contains({"IPv6"}));
    }
    if (family.name == "kproxy_conntrack_reconciler_deleted_entries_total") {
      sawDeleted = true;
      CHECK(family.samples.at({"IPv4"}) == static_cast<double>(1 + toE2Flows));
    }
  }
  CHECK(sawDuration);
  CHECK(sawDeleted);

  REQUIRE(backend.cleanup().has_value());
}

TEST_CASE("nftables and iptables plugins: a UDP service scaled to zero loses its flows, so a one-way sender "
          "is refused instead of blackholed; scaled up again, its next datagram reaches the new endpoint; "
          "deleted, its flows go",
          "[kernel]") {
  const std::string mode = GENERATE(as<std::string>{}, "nftables", "iptables");
  INFO("mode " << mode);
  FreshNetns netns;
  setUpAddresses();
  UdpListener e1("10.1.0.1", 5353);
  UdpListener e2("10.1.0.2", 5353);
  REQUIRE(e1.ok);
  REQUIRE(e2.ok);

  plugins::PluginRegistry registry;
  auto created = modePlugin(registry, mode);
  core::Backend& backend = *created;
  const core::NodeInfo node = nodeA();
  std::vector<core::ServicePortKey> changed{core::ServicePortKey{net::Family::kIPv4, "default/dns:dns"}};

  // A one-way sender (syslog, statsd): one source port, datagrams and never an answer.
  constexpr std::uint16_t kSender = 41000;
  auto withE1 = dnsPort({"10.1.0.1"});
  core::Snapshot s1 = core::Snapshot().withNode(node).with(withE1->key, withE1).withGeneration(1);
  REQUIRE(backend.sync(core::SyncRequest{nullptr, &s1, changed, core::SyncKind::kFull}).has_value());
  sendUdp("10.9.0.1", kSender, "172.30.0.10", 53);
  REQUIRE(flowsTo("172.30.0.10") == std::map<int, std::string>{{kSender, "10.1.0.1"}});

  // 1. Scaled to zero: the flow DNAT'ed to E1 goes (upstream's fix of its 1.32 regression,
  //    kubernetes#139629). Kept, it would carry the sender's datagrams on to E1 (which still
  //    listens here), refreshing itself with each one: iptables' reject rule matches the
  //    service address after the flow's DNAT. nftables' sits before DNAT and refuses even an
  //    unreplied flow, but the stale flow stays in the table until it is deleted.
  auto none = dnsPort({});
  core::Snapshot s2 = s1.with(none->key, none).withGeneration(2);
  REQUIRE(backend.sync(core::SyncRequest{&s1, &s2, changed, core::SyncKind::kPartial}).has_value());
  CHECK(flowsTo("172.30.0.10").empty());
  // The next datagram is a new flow, and the service's reject rule refuses it at once: nothing
  // is DNAT'ed, no flow is confirmed.
  int refused = trySendUdp("10.9.0.1", kSender, "172.30.0.10", 53);
  INFO("sendto: " << std::strerror(refused));
  CHECK((refused == EPERM || refused == ECONNREFUSED));
  CHECK(flowsTo("172.30.0.10").empty());

  // 2. Scaled up to a new endpoint E2: the sender's next datagram is DNAT'ed to it.
  auto withE2 = dnsPort({"10.1.0.2"});
  core::Snapshot s3 = s2.with(withE2->key, withE2).withGeneration(3);
  REQUIRE(backend.sync(core::SyncRequest{&s2, &s3, changed, core::SyncKind::kPartial}).has_value());
  CHECK(flowsTo("172.30.0.10").empty());
  sendUdp("10.9.0.1", kSender, "172.30.0.10", 53);
  CHECK(flowsTo("172.30.0.10") == std::map<int, std::string>{{kSender, "10.1.0.2"}});
  // E2 receives it (the wait is a ceiling against a hang, not a measure).
  pollfd ready{e2.fd, POLLIN, 0};
  REQUIRE(::poll(&ready, 1, 60000) == 1);
  char datagram[8];
  CHECK(::recv(e2.fd, datagram, sizeof datagram, MSG_DONTWAIT) == 1);

  // 3. The service is deleted: its flow to E2 goes too (kubernetes#141371), though E2 serves on.
  core::Snapshot s4 = s3.with(withE2->key, nullptr).withGeneration(4);
  REQUIRE(backend.sync(core::SyncRequest{&s3, &s4, changed, core::SyncKind::kPartial}).has_value());
  CHECK(flowsTo("172.30.0.10").empty());

  REQUIRE(backend.cleanup().has_value());
}

TEST_CASE("conntrack sysctls in a network namespace: per-namespace timeouts are set, the read-only maximum is "
          "only a warning", "[kernel]") {
  auto readSysctl = [](const std::string& name) {
    std::ifstream in("/proc/sys/net/netfilter/" + name);
    std::string v;
    std::getline(in, v);
    return v;
  };
  // Only read here, to prove afterwards that the namespace's writes stayed in the namespace.
  std::string hostEstablished = readSysctl("nf_conntrack_tcp_timeout_established");
  std::string hostMax = readSysctl("nf_conntrack_max");
  REQUIRE_FALSE(hostEstablished.empty());
  // The module parameters are global: point them at a scratch directory.
  auto scratch = std::filesystem::temp_directory_path() / ("kproxy-ct-params-" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  std::ofstream(scratch / "hashsize") << "1\n";
  {
    FreshNetns netns;
    cli::ConntrackConfig c;  // defaults: max from 32768 per core, TCP 24h / 1h
    c.tcpEstablishedTimeout = std::chrono::hours(20);
    c.udpTimeout = std::chrono::seconds(45);
    cli::SysctlRoots roots;
    roots.moduleParameters = scratch;
    auto outcomes = cli::applyConntrackSysctls(c, 2, roots);
    REQUIRE(outcomes.has_value());
    REQUIRE_FALSE(outcomes->empty());
    // Inside a non-initial namespace nf_conntrack_max is read-only (mode 0444, even for root).
    CHECK((*outcomes)[0].file == "/proc/sys/net/netfilter/nf_conntrack_max");
    CHECK((*outcomes)[0].status == cli::SysctlStatus::kReadOnly);
    CHECK(readSysctl("nf_conntrack_tcp_timeout_established") == "72000");
    CHECK(readSysctl("nf_conntrack_tcp_timeout_close_wait") == "3600");
    CHECK(readSysctl("nf_conntrack_udp_timeout") == "45");
  }
  CHECK(readSysctl("nf_conntrack_tcp_timeout_established") == hostEstablished);
  CHECK(readSysctl("nf_conntrack_max") == hostMax);
  std::ifstream hs(scratch / "hashsize");
  std::string hashsize;
  std::getline(hs, hashsize);
  CHECK(hashsize == "1");  // the maximum was not set, so the hash table is not resized either
  std::filesystem::remove_all(scratch);
}
