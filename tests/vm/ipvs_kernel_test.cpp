// The IPVS adapters against a real kernel: run inside the test VM (tests/vm/run-in-vm.sh), as
// root, every case in a network namespace of its own (IPVS tables, timeouts and links are per
// namespace). Some cases compare with what ipvsadm and ip print, to prove the adapter and the
// tools agree.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <linux/ip_vs.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>
#include <netlink/socket.h>

#include "ipvs_wire.h"
#include "kproxy/ipvs/kernel.h"
#include "netns.h"

namespace net = kproxy::net;

using namespace kproxy::ipvs;
using kproxy::core::ErrorCategory;
using kproxy::testing::FreshNetns;
using kproxy::testing::run;
using kproxy::testing::sh;

namespace {

VirtualServer service(const std::string& address, std::uint16_t port, Protocol protocol = Protocol::kTcp) {
  VirtualServer vs;
  auto parsed = net::Prefix::parse(address);
  REQUIRE(parsed);
  vs.address = *parsed;
  vs.family = vs.address.v6() ? net::Family::kIPv6 : net::Family::kIPv4;
  vs.port = port;
  vs.protocol = protocol;
  return vs;
}

RealServer backend(const std::string& address, std::uint16_t port, std::int32_t weight = 1) {
  auto parsed = net::Prefix::parse(address);
  REQUIRE(parsed);
  return RealServer{.address = *parsed, .port = port, .weight = weight};
}

std::unique_ptr<KernelIpvs> openIpvs() {
  auto ipvs = makeNetlinkIpvs();
  INFO((ipvs ? std::string("ok") : ipvs.error().message()));
  REQUIRE(ipvs);
  return std::move(*ipvs);
}

std::unique_ptr<KernelDummyLink> openLink() {
  auto link = makeNetlinkDummyLink();
  INFO((link ? std::string("ok") : link.error().message()));
  REQUIRE(link);
  return std::move(*link);
}

#define REQUIRE_OK(expr)                                               \
  do {                                                                 \
    auto _r = (expr);                                                  \
    INFO(#expr << ": " << (_r ? std::string("ok") : _r.error().message())); \
    REQUIRE(_r);                                                       \
  } while (0)

template <typename T>
void requireErrno(const kproxy::core::Result<T>& r, int errnum) {
  INFO((r ? std::string("succeeded") : r.error().message()));
  REQUIRE_FALSE(r);
  CHECK(r.error().errnum == errnum);
}

bool moduleLoaded(const std::string& name) {
  std::ifstream modules("/proc/modules");
  std::string line;
  while (std::getline(modules, line))
    if (line.rfind(name + " ", 0) == 0) return true;
  return false;
}

std::string collapse(const std::string& line) {
  std::istringstream in(line);
  std::string word, out;
  while (in >> word) out += (out.empty() ? "" : " ") + word;
  return out;
}

/// `ipvsadm -Ln` as "service" and "service | -> real server" lines, sorted.
std::vector<std::string> ipvsadmListing() {
  auto [rc, out] = run("ipvsadm -Ln");
  INFO(out);
  REQUIRE(rc == 0);
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line, current;
  while (std::getline(in, line)) {
    std::string c = collapse(line);
    if (c.starts_with("TCP ") || c.starts_with("UDP ") || c.starts_with("SCTP ") || c.starts_with("FWM ")) {
      current = c;
      lines.push_back(c);
    } else if (c.starts_with("-> ") && !c.starts_with("-> RemoteAddress")) {
      lines.push_back(current + " | " + c);
    }
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

/// The same listing made from what the adapter reads back, in ipvsadm's words.
std::vector<std::string> adapterListing(KernelIpvs& ipvs) {
  auto services = ipvs.listVirtualServers();
  REQUIRE(services);
  std::vector<std::string> lines;
  for (const auto& vs : *services) {
    std::string line = vs.describe() + " " + vs.scheduler;
    if (vs.flags & kFlagPersistent) line += fmt::format(" persistent {}", vs.timeout);
    lines.push_back(line);
    auto reals = ipvs.listRealServers(vs);
    REQUIRE(reals);
    for (const auto& rs : *reals) {
      const char* method = rs.forwarding == ForwardingMethod::kMasquerade ? "Masq"
                           : rs.forwarding == ForwardingMethod::kLocal    ? "Local"
                           : rs.forwarding == ForwardingMethod::kTunnel   ? "Tunnel"
                                                                          : "Route";
      lines.push_back(fmt::format("{} | -> {} {} {} {} {}", line, rs.describe(), method, rs.weight,
                                  rs.activeConnections, rs.inactiveConnections));
    }
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace

TEST_CASE("virtual servers: add, list, update, delete for TCP, UDP and SCTP over IPv4 and IPv6", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  const std::pair<std::string, Protocol> cases[] = {
      {"10.96.0.10", Protocol::kTcp}, {"10.96.0.10", Protocol::kUdp}, {"10.96.0.10", Protocol::kSctp},
      {"fd00::10", Protocol::kTcp},   {"fd00::10", Protocol::kUdp},   {"fd00::10", Protocol::kSctp}};
  for (const auto& [address, protocol] : cases) {
    auto vs = service(address, 80, protocol);
    INFO(vs.describe());
    REQUIRE_OK(ipvs->addVirtualServer(vs));
    auto listed = ipvs->listVirtualServers();
    REQUIRE(listed);
    REQUIRE(listed->size() == 1);
    CHECK(listed->front() == vs);
    requireErrno(ipvs->addVirtualServer(vs), EEXIST);

    vs.scheduler = "wrr";
    REQUIRE_OK(ipvs->updateVirtualServer(vs));
    listed = ipvs->listVirtualServers();
    REQUIRE(listed);
    REQUIRE(listed->size() == 1);
    CHECK(listed->front().scheduler == "wrr");

    REQUIRE_OK(ipvs->deleteVirtualServer(vs));
    CHECK(ipvs->listVirtualServers()->empty());
    auto gone = ipvs->deleteVirtualServer(vs);
    requireErrno(gone, ESRCH);
    CHECK(gone.error().category == ErrorCategory::kNotFound);
    CHECK(gone.error().context.find("no such virtual server") != std::string::npos);
    requireErrno(ipvs->updateVirtualServer(vs), ESRCH);
  }
}

TEST_CASE("firewall-mark virtual servers round-trip", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  VirtualServer mark;
  mark.fwmark = 0x4000;
  REQUIRE_OK(ipvs->addVirtualServer(mark));
  mark.family = net::Family::kIPv6;
  REQUIRE_OK(ipvs->addVirtualServer(mark));
  auto listed = ipvs->listVirtualServers();
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  for (const auto& vs : *listed) CHECK(vs.fwmark == 0x4000);
  REQUIRE_OK(ipvs->addRealServer(mark, backend("fd00::1:5", 8080)));
  CHECK(ipvs->listRealServers(mark)->size() == 1);
}

TEST_CASE("real servers: add, list, update, delete; ESRCH, EEXIST and ENOENT", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  for (const auto& [vip, pod] : {std::pair<std::string, std::string>{"10.96.0.10", "10.244.1.5"},
                                 std::pair<std::string, std::string>{"fd00::10", "fd00::1:5"}}) {
    auto vs = service(vip, 443);
    auto rs = backend(pod, 8443, 2);
    INFO(vs.describe() << " -> " << rs.describe());
    auto noService = ipvs->addRealServer(vs, rs);
    requireErrno(noService, ESRCH);
    requireErrno(ipvs->listRealServers(vs), ESRCH);

    REQUIRE_OK(ipvs->addVirtualServer(vs));
    auto none = ipvs->listRealServers(vs);
    REQUIRE(none);
    CHECK(none->empty());
    REQUIRE_OK(ipvs->addRealServer(vs, rs));
    requireErrno(ipvs->addRealServer(vs, rs), EEXIST);
    auto other = backend(pod, 9000);
    auto missing = ipvs->updateRealServer(vs, other);
    requireErrno(missing, ENOENT);
    CHECK(missing.error().context.find("no such real server") != std::string::npos);
    requireErrno(ipvs->deleteRealServer(vs, other), ENOENT);

    auto listed = ipvs->listRealServers(vs);
    REQUIRE(listed);
    REQUIRE(listed->size() == 1);
    CHECK(listed->front().sameSettings(rs));
    CHECK(listed->front().forwarding == ForwardingMethod::kMasquerade);

    rs.weight = 5;
    rs.upperThreshold = 100;
    rs.lowerThreshold = 10;
    REQUIRE_OK(ipvs->updateRealServer(vs, rs));
    listed = ipvs->listRealServers(vs);
    REQUIRE(listed);
    REQUIRE(listed->size() == 1);
    CHECK(listed->front().sameSettings(rs));

    REQUIRE_OK(ipvs->deleteRealServer(vs, rs));
    CHECK(ipvs->listRealServers(vs)->empty());
    // Deleting the virtual server takes its real servers with it.
    REQUIRE_OK(ipvs->addRealServer(vs, rs));
    REQUIRE_OK(ipvs->deleteVirtualServer(vs));
    requireErrno(ipvs->listRealServers(vs), ESRCH);
  }
}

// The kernel checks an IPv4 real server's address type in the local routing table, which a
// namespace only has once it holds a local route (lo up, or any address); before that every
// IPv4 real server is EINVAL. A node always has one; the cases above bring lo up.
TEST_CASE("an IPv4 real server is EINVAL until the namespace has a local routing table", "[vm]") {
  FreshNetns netns;
  auto ipvs = openIpvs();
  auto vs = service("10.96.0.10", 80);
  REQUIRE_OK(ipvs->addVirtualServer(vs));
  requireErrno(ipvs->addRealServer(vs, backend("10.244.1.5", 80)), EINVAL);
  sh("ip link set lo up");
  REQUIRE_OK(ipvs->addRealServer(vs, backend("10.244.1.5", 80)));
}

namespace {

struct DumpOutcome {
  int messages = 0;
  int errnum = 0;
};

/// A raw IPVS_CMD_GET_DEST dump of `vs`, as the adapter sends it: how many destinations came
/// back and the kernel's errno.
DumpOutcome rawDestDump(const VirtualServer& vs) {
  std::unique_ptr<nl_sock, void (*)(nl_sock*)> sock(nl_socket_alloc(), nl_socket_free);
  REQUIRE(sock);
  REQUIRE(genl_connect(sock.get()) == 0);
  const int family = genl_ctrl_resolve(sock.get(), IPVS_GENL_NAME);
  REQUIRE(family > 0);
  auto msg = wire::newRequest(family, IPVS_CMD_GET_DEST, NLM_F_DUMP);
  REQUIRE(msg);
  REQUIRE(wire::putService(msg->get(), vs, false));
  DumpOutcome out;
  nl_socket_modify_cb(sock.get(), NL_CB_VALID, NL_CB_CUSTOM,
                      [](nl_msg*, void* arg) -> int { ++static_cast<DumpOutcome*>(arg)->messages; return NL_OK; }, &out);
  nl_socket_modify_err_cb(sock.get(), NL_CB_CUSTOM,
                          [](sockaddr_nl*, nlmsgerr* err, void* arg) -> int {
                            static_cast<DumpOutcome*>(arg)->errnum = -err->error;
                            return NL_STOP;
                          },
                          &out);
  REQUIRE(nl_send_auto(sock.get(), msg->get()) >= 0);
  nl_recvmsgs_default(sock.get());
  return out;
}

}  // namespace

// Why listRealServers asks for the service when a dump comes back empty: the kernel answers a
// destination dump of a missing service with an empty dump, not with an error.
TEST_CASE("the kernel's destination dump of a missing virtual server is empty, not an error", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  auto vs = service("10.96.0.10", 80);
  auto missing = rawDestDump(vs);
  CHECK(missing.messages == 0);
  CHECK(missing.errnum == 0);
  REQUIRE_OK(ipvs->addVirtualServer(vs));
  REQUIRE_OK(ipvs->addRealServer(vs, backend("10.244.1.5", 80)));
  auto present = rawDestDump(vs);
  CHECK(present.messages == 1);
  CHECK(present.errnum == 0);
  requireErrno(ipvs->listRealServers(service("10.96.0.11", 80)), ESRCH);
}

TEST_CASE("a real server of the other family is refused for masquerading", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  auto vs = service("10.96.0.10", 80);
  REQUIRE_OK(ipvs->addVirtualServer(vs));
  auto r = ipvs->addRealServer(vs, backend("fd00::5", 80));
  INFO((r ? std::string("ok") : r.error().message()));
  REQUIRE_FALSE(r);
  CHECK(r.error().errnum == EINVAL);
}

TEST_CASE("persistence: timeout, flags and netmask round-trip", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  auto v4 = service("10.96.0.10", 80);
  v4.flags = kFlagPersistent;
  v4.timeout = 10800;
  v4.netmask = 24;
  auto v6 = service("fd00::10", 80);
  v6.flags = kFlagPersistent;
  v6.timeout = 60;
  v6.netmask = 64;
  auto sourceHash = service("10.96.0.11", 80);
  sourceHash.scheduler = "sh";
  sourceHash.flags = kFlagSourceHashFallback | kFlagSourceHashPort;
  for (const auto& vs : {v4, v6, sourceHash}) REQUIRE_OK(ipvs->addVirtualServer(vs));
  auto listed = ipvs->listVirtualServers();
  REQUIRE(listed);
  REQUIRE(listed->size() == 3);
  for (const auto& vs : {v4, v6, sourceHash}) {
    INFO(vs.describe());
    auto it = std::find_if(listed->begin(), listed->end(), [&](const VirtualServer& l) { return l.sameIdentity(vs); });
    REQUIRE(it != listed->end());
    CHECK(*it == vs);
  }
  {
    // ipvsadm reads the same netmasks: a mask for IPv4, a prefix length for IPv6.
    auto [rc, out] = run("ipvsadm -Ln");
    INFO(out);
    CHECK(out.find("10.96.0.10:80 rr persistent 10800 mask 255.255.255.0") != std::string::npos);
    CHECK(out.find("[fd00::10]:80 rr persistent 60 mask 64") != std::string::npos);
  }
  // Persistence off again: the flags are replaced, not merged.
  v4.flags = 0;
  v4.timeout = 0;
  v4.netmask.reset();
  REQUIRE_OK(ipvs->updateVirtualServer(v4));
  listed = ipvs->listVirtualServers();
  auto it = std::find_if(listed->begin(), listed->end(), [&](const VirtualServer& l) { return l.sameIdentity(v4); });
  REQUIRE(it != listed->end());
  CHECK(*it == v4);
  auto [rc, out] = run("ipvsadm -Ln");
  INFO(out);
  CHECK(out.find("[fd00::10]:80 rr persistent 60 mask 64") != std::string::npos);
}

TEST_CASE("schedulers rr, wrr, lc and sh; lc loads on demand; a missing one is ENOENT, named", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  const bool lcBefore = moduleLoaded("ip_vs_lc");
  std::uint16_t port = 80;
  for (const char* sched : {"rr", "wrr", "lc", "sh"}) {
    auto vs = service("10.96.0.10", port++);
    vs.scheduler = sched;
    REQUIRE_OK(ipvs->addVirtualServer(vs));
  }
  auto listed = ipvs->listVirtualServers();
  REQUIRE(listed);
  std::vector<std::string> names;
  for (const auto& vs : *listed) names.push_back(vs.scheduler);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"lc", "rr", "sh", "wrr"});
  INFO("ip_vs_lc loaded before the test: " << lcBefore);
  CHECK(moduleLoaded("ip_vs_lc"));

  auto vs = service("10.96.0.10", 99);
  vs.scheduler = "nosuch";
  auto r = ipvs->addVirtualServer(vs);
  requireErrno(r, ENOENT);
  CHECK(r.error().category == ErrorCategory::kNotFound);
  CHECK(r.error().context ==
        "ipvs: add virtual server TCP 10.96.0.10:99: scheduler 'nosuch' is not available (the kernel could "
        "not load module ip_vs_nosuch)");
  // Switching an existing service to it fails the same way and leaves it as it was.
  auto rr = service("10.96.0.10", 80);
  rr.scheduler = "nosuch";
  requireErrno(ipvs->updateVirtualServer(rr), ENOENT);
  listed = ipvs->listVirtualServers();
  auto it = std::find_if(listed->begin(), listed->end(), [&](const VirtualServer& l) { return l.sameIdentity(rr); });
  REQUIRE(it != listed->end());
  CHECK(it->scheduler == "rr");
}

TEST_CASE("timeouts: kernel defaults, set, 0 leaves a value, ipvsadm agrees", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  auto t = ipvs->timeouts();
  REQUIRE(t);
  CHECK(*t == Timeouts{900, 120, 300});
  REQUIRE_OK(ipvs->setTimeouts({600, 60, 120}));
  CHECK(*ipvs->timeouts() == Timeouts{600, 60, 120});
  REQUIRE_OK(ipvs->setTimeouts({0, 30, 0}));
  CHECK(*ipvs->timeouts() == Timeouts{600, 30, 120});
  auto [rc, out] = run("ipvsadm -L --timeout");
  INFO(out);
  CHECK(out.find("Timeout (tcp tcpfin udp): 600 30 120") != std::string::npos);
}

TEST_CASE("flush removes every virtual server", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  REQUIRE_OK(ipvs->addVirtualServer(service("10.96.0.10", 80)));
  REQUIRE_OK(ipvs->addVirtualServer(service("fd00::10", 53, Protocol::kUdp)));
  REQUIRE_OK(ipvs->addRealServer(service("10.96.0.10", 80), backend("10.244.1.5", 80)));
  sh("ipvsadm -A -t 10.96.0.20:80 -s rr");  // someone else's: flush takes it too
  CHECK(ipvs->listVirtualServers()->size() == 3);
  REQUIRE_OK(ipvs->flush());
  CHECK(ipvs->listVirtualServers()->empty());
  CHECK(ipvsadmListing().empty());
  REQUIRE_OK(ipvs->flush());  // flushing nothing is fine
}

TEST_CASE("dumps are read completely: 1000 virtual servers, 300 real servers", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  for (int i = 0; i < 1000; ++i)
    REQUIRE_OK(ipvs->addVirtualServer(service(fmt::format("10.96.{}.{}", i / 250, i % 250 + 1), 80)));
  auto big = service("fd00::10", 80);
  REQUIRE_OK(ipvs->addVirtualServer(big));
  for (int i = 0; i < 300; ++i)
    REQUIRE_OK(ipvs->addRealServer(big, backend(fmt::format("fd00::1:{:x}", i + 1), 8080)));
  auto listed = ipvs->listVirtualServers();
  REQUIRE(listed);
  CHECK(listed->size() == 1001);
  auto reals = ipvs->listRealServers(big);
  REQUIRE(reals);
  CHECK(reals->size() == 300);
  auto [rc, out] = run("ipvsadm -Ln | grep -c -- '->'");
  CHECK(collapse(out) == "301");  // the header line and 300 real servers
}

TEST_CASE("ipvsadm -Ln shows what the adapter reads back", "[vm]") {
  FreshNetns netns;
  sh("ip link set lo up");
  auto ipvs = openIpvs();
  auto web = service("10.96.0.10", 80);
  auto dns = service("10.96.0.53", 53, Protocol::kUdp);
  dns.scheduler = "wrr";
  dns.flags = kFlagPersistent;
  dns.timeout = 300;
  auto sctp6 = service("fd00::10", 3868, Protocol::kSctp);
  sctp6.scheduler = "lc";
  for (const auto& vs : {web, dns, sctp6}) REQUIRE_OK(ipvs->addVirtualServer(vs));
  REQUIRE_OK(ipvs->addRealServer(web, backend("10.244.1.5", 8080)));
  REQUIRE_OK(ipvs->addRealServer(web, backend("10.244.2.7", 8080, 0)));
  REQUIRE_OK(ipvs->addRealServer(dns, backend("10.244.1.9", 53, 3)));
  REQUIRE_OK(ipvs->addRealServer(sctp6, backend("fd00::1:5", 3868)));
  auto ours = adapterListing(*ipvs);
  auto theirs = ipvsadmListing();
  CHECK(ours.size() == 7);
  CHECK(ours == theirs);
  // And the other way round: what ipvsadm adds, the adapter reads.
  sh("ipvsadm -A -u [fd00::53]:53 -s sh -p 120 && ipvsadm -a -u [fd00::53]:53 -r [fd00::2:1]:5353 -m -w 4");
  ours = adapterListing(*ipvs);
  theirs = ipvsadmListing();
  CHECK(ours.size() == 9);
  CHECK(ours == theirs);
}

TEST_CASE("weight 0 keeps the real server and its connections; active connections are read back", "[vm]") {
  FreshNetns netns;
  const std::string pod = fmt::format("kp-pod-{}", ::getpid());
  auto ipvs = openIpvs();
  auto link = openLink();
  sh("ip netns add " + pod);
  struct Cleanup {
    std::string pod;
    ~Cleanup() {
      run("for p in $(cat /tmp/" + pod + ".pids); do kill -- -$p; done 2>/dev/null");
      run("ip netns del " + pod);
    }
  } cleanup{pod};
  sh("ip link add veth-" + std::to_string(::getpid() % 10000) + " type veth peer name eth0 netns " + pod);
  const std::string veth = "veth-" + std::to_string(::getpid() % 10000);
  sh("ip link set " + veth + " up && ip addr add 10.244.1.1/24 dev " + veth);
  sh("ip -n " + pod + " link set lo up && ip -n " + pod + " link set eth0 up && ip -n " + pod +
     " addr add 10.244.1.2/24 dev eth0 && ip -n " + pod + " route add default via 10.244.1.1");
  REQUIRE_OK(link->ensureLink(kDummyLinkName));
  REQUIRE_OK(link->addAddress(kDummyLinkName, *net::Prefix::parse("10.96.0.10")));

  auto vs = service("10.96.0.10", 80);
  auto rs = backend("10.244.1.2", 8080);
  REQUIRE_OK(ipvs->addVirtualServer(vs));
  REQUIRE_OK(ipvs->addRealServer(vs, rs));

  // A server in the pod and a client that both keep the connection open (nc closes it at the
  // end of its input); each in a session of its own, killed as a group afterwards.
  sh("setsid /bin/sh -c 'sleep 60 | ip netns exec " + pod + " busybox nc -l -p 8080' >/dev/null 2>&1 & echo $! >>/tmp/" +
     pod + ".pids");
  for (int i = 0; i < 50 && run("ip netns exec " + pod + " busybox netstat -tln | grep -q ':8080 '").first != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  sh("ip netns exec " + pod + " busybox netstat -tln | grep ':8080 '");
  sh("setsid /bin/sh -c 'sleep 60 | busybox nc 10.96.0.10 80' >/dev/null 2>&1 & echo $! >>/tmp/" + pod + ".pids");

  std::uint32_t active = 0;
  for (int i = 0; i < 100 && active == 0; ++i) {
    auto listed = ipvs->listRealServers(vs);
    REQUIRE(listed);
    REQUIRE(listed->size() == 1);
    active = listed->front().activeConnections;
    if (active == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(run("ipvsadm -Ln; ipvsadm -Lnc").second);
  CHECK(active == 1);

  rs.weight = 0;
  REQUIRE_OK(ipvs->updateRealServer(vs, rs));
  auto listed = ipvs->listRealServers(vs);
  REQUIRE(listed);
  REQUIRE(listed->size() == 1);
  CHECK(listed->front().weight == 0);
  CHECK(listed->front().activeConnections == 1);  // the established connection stays
  auto [rc, out] = run("ipvsadm -Ln");
  INFO(out);
  CHECK(collapse(out).find("-> 10.244.1.2:8080 Masq 0 1 0") != std::string::npos);
}

TEST_CASE("kube-ipvs0: created once, left down, addresses bound and unbound, deleted", "[vm]") {
  FreshNetns netns;
  auto link = openLink();
  auto created = link->ensureLink(kDummyLinkName);
  REQUIRE(created);
  CHECK_FALSE(*created);
  auto again = link->ensureLink(kDummyLinkName);
  REQUIRE(again);
  CHECK(*again);
  auto [rc, details] = run("ip -d link show kube-ipvs0");
  INFO(details);
  REQUIRE(rc == 0);
  CHECK(details.find("dummy") != std::string::npos);
  CHECK(details.find("state DOWN") != std::string::npos);

  auto none = link->listAddresses(kDummyLinkName);
  REQUIRE(none);
  CHECK(none->empty());
  const auto v4 = *net::Prefix::parse("10.96.0.10");
  const auto v6 = *net::Prefix::parse("fd00::10");
  REQUIRE_OK(link->addAddress(kDummyLinkName, v4));
  REQUIRE_OK(link->addAddress(kDummyLinkName, v6));
  requireErrno(link->addAddress(kDummyLinkName, v4), EEXIST);
  requireErrno(link->addAddress(kDummyLinkName, v6), EEXIST);
  auto listed = link->listAddresses(kDummyLinkName);
  REQUIRE(listed);
  for (const auto& a : *listed) UNSCOPED_INFO("listed " << a.toString() << "/" << int(a.length));
  std::sort(listed->begin(), listed->end(), [](const net::Prefix& a, const net::Prefix& b) { return a.v6() < b.v6(); });
  CHECK(*listed == std::vector<net::Prefix>{v4, v6});

  auto [rc2, addrs] = run("ip addr show dev kube-ipvs0");
  INFO(addrs);
  CHECK(addrs.find("inet 10.96.0.10/32 scope global kube-ipvs0") != std::string::npos);
  CHECK(addrs.find("inet6 fd00::10/128 scope global") != std::string::npos);
  // A down link still gets the local routes of its addresses (IPv6 too, on 6.1): the node
  // accepts packets for the virtual addresses.
  auto [rc3, local] = run("ip route show table local; ip -6 route show table local");
  INFO(local);
  CHECK(local.find("local 10.96.0.10 dev kube-ipvs0") != std::string::npos);
  CHECK(local.find("local fd00::10 dev kube-ipvs0") != std::string::npos);

  REQUIRE_OK(link->deleteAddress(kDummyLinkName, v4));
  requireErrno(link->deleteAddress(kDummyLinkName, v4), EADDRNOTAVAIL);
  listed = link->listAddresses(kDummyLinkName);
  REQUIRE(listed);
  CHECK(*listed == std::vector<net::Prefix>{v6});

  REQUIRE_OK(link->deleteLink(kDummyLinkName));
  CHECK(run("ip link show kube-ipvs0").first != 0);
  REQUIRE_OK(link->deleteLink(kDummyLinkName));  // already gone: fine
  requireErrno(link->listAddresses(kDummyLinkName), ENODEV);
  requireErrno(link->addAddress(kDummyLinkName, v4), ENODEV);
}

TEST_CASE("kube-ipvs0: a link of another type with that name is left alone", "[vm]") {
  FreshNetns netns;
  auto link = openLink();
  sh("ip link add kube-ipvs0 type veth peer name kp-peer0");
  auto r = link->ensureLink(kDummyLinkName);
  requireErrno(r, EEXIST);
  CHECK(r.error().context.find("not dummy") != std::string::npos);
  auto d = link->deleteLink(kDummyLinkName);
  requireErrno(d, EINVAL);
  CHECK(run("ip link show kube-ipvs0").first == 0);
}

// Run on its own (ctest vm_ipvs_kernel_no_ipvs): the guest unloads ip_vs and hides the modules
// first, so the family cannot appear.
TEST_CASE("without IPVS in the kernel the adapter says so", "[vm][.noipvs]") {
  REQUIRE_FALSE(moduleLoaded("ip_vs"));
  auto ipvs = makeNetlinkIpvs();
  REQUIRE_FALSE(ipvs);
  INFO(ipvs.error().message());
  CHECK(ipvs.error().category == ErrorCategory::kNotFound);
  CHECK(ipvs.error().context.starts_with(
      "the kernel has no IPVS: modprobe ip_vs failed or the module is missing"));
}

TEST_CASE("kube-ipvs0: an address bound with two prefix lengths is listed once", "[vm]") {
  FreshNetns netns;
  auto link = openLink();
  REQUIRE_OK(link->ensureLink(kDummyLinkName));
  const auto v4 = *net::Prefix::parse("10.96.0.10");
  REQUIRE_OK(link->addAddress(kDummyLinkName, v4));
  sh("ip addr add 10.96.0.10/24 dev kube-ipvs0");
  auto listed = link->listAddresses(kDummyLinkName);
  REQUIRE(listed);
  CHECK(*listed == std::vector<net::Prefix>{v4});
  // The host prefix goes; the /24 someone else bound stays.
  REQUIRE_OK(link->deleteAddress(kDummyLinkName, v4));
  auto [rc, out] = run("ip -4 addr show dev kube-ipvs0");
  INFO(out);
  CHECK(out.find("10.96.0.10/24") != std::string::npos);
  CHECK(out.find("10.96.0.10/32") == std::string::npos);
}
