// ebpf mode against the real kernel. Everything the test programs is its own: a cgroup it
// makes under the cgroup v2 root (never the root itself), a client and a server network
// namespace joined by a veth pair, and a bpffs it mounts in a private mount namespace for the
// pins. The plugin's programs are attached to that cgroup only; the client's processes join it
// and the client's namespace before they open a socket. All of it is removed when the case
// ends, passed or failed (Testbed's destructor; the mount namespace and the namespaces' bind
// mounts die with the process, and the server pod with its parent).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "../unit/nftables/service_ports.h"
#include "kproxy/ebpf/backend.h"
#include "kproxy/ebpf/kernel.h"
#include "kproxy/core/backend.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/ebpf/tracer.h"
#include "kproxy/plugins/loader.h"
#include "kproxy/plugins/plugin_metrics.h"
#include "netns.h"
#include "service_port_states.h"

using namespace kproxy;
using namespace kproxy::ebpf;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::testing::run;
using kproxy::testing::sh;

namespace {

constexpr const char* kPodIP = "10.200.0.2";
constexpr const char* kPodIP6 = "fd00:200::2";
constexpr const char* kClientIP = "10.200.0.1";
constexpr const char* kClusterIP = "10.96.0.10";
constexpr const char* kEmptyClusterIP = "10.96.0.11";
constexpr const char* kStickyClusterIP = "10.96.0.12";  // pod-a and pod-b, ClientIP affinity
constexpr const char* kSpreadClusterIP = "10.96.0.13";  // pod-a and pod-b, no affinity
constexpr const char* kClusterIP6 = "fd00:96::10";
constexpr const char* kDnsClusterIP = "10.96.0.14";  // UDP: pod-a's 5353, pod-b's 5354 on kPodBIP
constexpr const char* kPodBIP = "10.200.0.3";         // a second address of the server namespace

/// The mount namespace of this test process becomes private once, so that its bpffs mounts
/// (and `ip netns`'s bind mounts) are never seen by the host and go away with the process; so
/// does its network namespace, where the backends it runs itself program their nftables part.
void privateMounts() {
  static bool done = false;
  if (done) return;
  if (::unshare(CLONE_NEWNS | CLONE_NEWNET) != 0)
    throw std::runtime_error(std::string("unshare(CLONE_NEWNS | CLONE_NEWNET): ") + std::strerror(errno));
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    throw std::runtime_error(std::string("making / private: ") + std::strerror(errno));
  done = true;
}

/// The pid at the end of `name` after `prefix` ("kpe-c-123" → 123), or 0.
pid_t pidAfter(const std::string& name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return 0;
  pid_t pid = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') break;
    pid = pid * 10 + (c - '0');
  }
  return pid;
}

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

/// What a run killed before its clean-up left (SIGKILL from a ctest timeout, SIGPIPE): its
/// namespaces' names, its cgroup and the processes still in it, its files in /tmp. Only names
/// of this test whose pid is gone are touched.
void sweepDeadRuns(const std::string& cgroupRoot) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/run/netns", ec)) {
    const std::string n = entry.path().filename().string();
    const pid_t pid = std::max(pidAfter(n, "kpe-c-"), pidAfter(n, "kpe-s-"));
    if (pid > 0 && !alive(pid)) run("ip netns del " + n);
  }
  for (const auto& entry : fs::directory_iterator(cgroupRoot, ec)) {
    const std::string n = entry.path().filename().string();
    const pid_t pid = pidAfter(n, "kproxy-ebpf-test-");
    if (pid == 0 || alive(pid)) continue;
    std::ifstream procs(entry.path() / "cgroup.procs");
    for (pid_t p; procs >> p;) ::kill(p, SIGKILL);
    for (int i = 0; i < 100 && ::rmdir(entry.path().c_str()) != 0 && errno == EBUSY; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& entry : fs::directory_iterator("/tmp", ec)) {
    const pid_t pid = pidAfter(entry.path().filename().string(), "kproxy-ebpf-test-");
    if (pid > 0 && !alive(pid)) fs::remove_all(entry.path(), ec);
  }
}

/// In a forked child: joins the network namespace `name` made by `ip netns add`, or exits 120.
void enterNetns(const std::string& name) {
  const std::string path = "/run/netns/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ::_exit(120);
  ::close(fd);
}

struct Testbed {
  std::string name;
  std::string cgroup;
  std::string bpffs;
  std::string pinPath;
  std::string client, server;
  std::vector<pid_t> pods;
  std::unique_ptr<sdk::BackendPlugin> plugin;
  /// More options for the backend (before its first use).
  sdk::Options extraOptions;

  /// Everything is made here, not in a constructor, so that the destructor also removes what
  /// a set-up that failed halfway made.
  void setUp() {
    REQUIRE(::geteuid() == 0);
    privateMounts();
    name = "kproxy-ebpf-test-" + std::to_string(::getpid());
    auto root = cgroupV2Root();
    REQUIRE(root.has_value());
    sweepDeadRuns(*root);
    cgroup = *root + "/" + name;
    REQUIRE(cgroup != *root);
    ::rmdir(cgroup.c_str());  // a run killed before its cleanup
    REQUIRE(::mkdir(cgroup.c_str(), 0755) == 0);
    bpffs = "/tmp/" + name + "-bpffs";
    ::mkdir(bpffs.c_str(), 0700);
    REQUIRE(::mount("bpf", bpffs.c_str(), "bpf", 0, nullptr) == 0);
    pinPath = bpffs + "/kproxy";
    client = "kpe-c-" + std::to_string(::getpid());
    server = "kpe-s-" + std::to_string(::getpid());
    sh("ip netns add " + client + " && ip netns add " + server);
    sh("ip -n " + client + " link add veth-c type veth peer name veth-s netns " + server);
    sh("ip -n " + client + " addr add " + kClientIP + "/24 dev veth-c && ip -n " + client + " link set veth-c up");
    sh("ip -n " + client + " link set lo up && ip -n " + client + " route add default via " + kPodIP);
    sh("ip -n " + server + " addr add " + kPodIP + "/24 dev veth-s && ip -n " + server + " link set veth-s up");
    sh("ip -n " + server + " link set lo up");
    sh("ip -n " + client + " addr add fd00:200::1/64 dev veth-c nodad && ip -n " + client +
       " route add default via " + kPodIP6);
    sh("ip -n " + server + " addr add " + kPodIP6 + "/64 dev veth-s nodad");
    startPod("pod-a", {"--port", "8080", "--udp-port", "5353"});
    startPod("pod-b", {"--port", "8081", "--udp-port", "5354"});
  }

  ~Testbed() {
    if (plugin) (void)plugin->cleanup();
    plugin.reset();
    for (pid_t pod : pods) {
      ::kill(pod, SIGTERM);
      ::waitpid(pod, nullptr, 0);
    }
    run("ip netns del " + client);
    run("ip netns del " + server);
    ::umount2(bpffs.c_str(), MNT_DETACH);
    ::rmdir(bpffs.c_str());
    ::rmdir(cgroup.c_str());
  }

  /// A pod server in the server namespace (it dies with this process).
  void startPod(const std::string& podName, std::vector<std::string> ports) {
    std::fflush(nullptr);
    const pid_t pod = ::fork();
    REQUIRE(pod >= 0);
    if (pod == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      enterNetns(server);
      std::vector<std::string> argv{std::string(KPROXY_TEST_TOOLS_DIR) + "/kproxy-podserver", "--name", podName};
      argv.insert(argv.end(), ports.begin(), ports.end());
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pods.push_back(pod);
    for (int i = 0; i < 100; ++i) {
      if (run("ip netns exec " + server + " ss -ltn | grep -q ':" + ports[1] + " '").first == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL("the pod server " << podName << " did not listen");
  }

  EbpfBackend& backend() {
    if (!plugin) {
      sdk::Options options{{"ebpf-cgroup-path", cgroup}, {"ebpf-pin-path", pinPath}};
      options.insert(extraOptions.begin(), extraOptions.end());
      auto made = makeEbpfBackend(sdk::Host(nullptr), options);
      INFO((made ? "" : made.error().message));
      REQUIRE(made.has_value());
      plugin = std::move(*made);
    }
    return dynamic_cast<EbpfBackend&>(*plugin);
  }

  /// Runs `body` in a child process that joined the test's cgroup and the client's namespace;
  /// returns its exit status and what it wrote to stdout and stderr.
  std::pair<int, std::string> inClient(const std::function<int()>& body) const {
    int pipeFds[2];
    REQUIRE(::pipe(pipeFds) == 0);
    std::fflush(nullptr);  // the child must not write out what this process buffered
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::dup2(pipeFds[1], 1);
      ::dup2(pipeFds[1], 2);
      ::close(pipeFds[0]);
      std::ofstream(cgroup + "/cgroup.procs") << ::getpid() << std::flush;
      enterNetns(client);
      const int rc = body();
      std::fflush(nullptr);
      ::_exit(rc);
    }
    ::close(pipeFds[1]);
    std::string out;
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::read(pipeFds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(pipeFds[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
  }

  /// A program run as a client (in the cgroup and the client's namespace).
  std::pair<int, std::string> clientCommand(std::vector<std::string> argv) const {
    return inClient([&] {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::printf("exec %s: %s\n", args[0], std::strerror(errno));
      return 127;
    });
  }
};

sockaddr_in inet(const char* ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

std::string text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

std::string text(const sockaddr_in6& a) {
  char ip[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof ip);
  std::string out(1, '[');
  out.append(ip).append("]:").append(std::to_string(ntohs(a.sin6_port)));
  return out;
}

/// On socket `fd` (TCP): a connect to `to`, getpeername, one HTTP request; prints
/// "peer=… reply=…", or the connect's error.
template <class Address>
int tcpExchange(int fd, Address to) {
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    std::printf("connect: %s\n", std::strerror(errno));
    return 1;
  }
  Address peer{};
  socklen_t length = sizeof peer;
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length);
  const char request[] = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (::write(fd, request, sizeof request - 1) < 0) return 2;
  std::string reply;
  char buf[1024];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<std::size_t>(n));
  const auto body = reply.find("pod=");
  std::printf("peer=%s reply=%s", text(peer).c_str(), body == std::string::npos ? "none\n" : reply.substr(body).c_str());
  return 0;
}

/// On socket `fd` (UDP): one datagram to `to` without a connect (sendmsg), the reply with its
/// source (recvmsg); prints "from=… reply=…", or the send's error.
template <class Address>
int udpExchange(int fd, Address to) {
  if (::sendto(fd, "hello", 5, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) < 0) {
    std::printf("sendto: %s\n", std::strerror(errno));
    return 1;
  }
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 3000) != 1) {
    std::printf("no reply\n");
    return 1;
  }
  char buf[512] = {};
  Address from{};
  socklen_t length = sizeof from;
  const ssize_t n = ::recvfrom(fd, buf, sizeof buf - 1, 0, reinterpret_cast<sockaddr*>(&from), &length);
  std::printf("from=%s reply=%s", text(from).c_str(), n > 0 ? buf : "\n");
  return 0;
}

/// In the client: tcpExchange from an IPv4 socket.
int tcpClient(const char* ip, int port) { return tcpExchange(::socket(AF_INET, SOCK_STREAM, 0), inet(ip, port)); }

/// In the client: udpExchange from an IPv4 socket.
int udpClient(const char* ip, int port) { return udpExchange(::socket(AF_INET, SOCK_DGRAM, 0), inet(ip, port)); }

/// In the client: tcpExchange or udpExchange from an IPv6 socket (dual-stack) to the
/// IPv4-mapped form of `ip4`.
int mappedClient(const char* ip4, int port, bool udp) {
  const int fd = ::socket(AF_INET6, udp ? SOCK_DGRAM : SOCK_STREAM, 0);
  const int off = 0;
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET6, (std::string("::ffff:") + ip4).c_str(), &to.sin6_addr);
  return udp ? udpExchange(fd, to) : tcpExchange(fd, to);
}

plan::VectorSnapshot snapshot() {
  auto web = clusterIP("ns", "web", kClusterIP, 80, {endpoint(kPodIP, 8080)});
  auto dns = clusterIP("ns", "web", kClusterIP, 53, {endpoint(kPodIP, 5353)}, sdk::Protocol::kUDP, "dns");
  // The hooks do not steer SCTP: the nftables part dispatches this ClusterIP port.
  auto sctp = clusterIP("ns", "web", kClusterIP, 53, {endpoint(kPodIP, 5353)}, sdk::Protocol::kSCTP, "dns-sctp");
  auto empty = clusterIP("ns", "empty", kEmptyClusterIP, 80, {});
  auto emptyUdp = clusterIP("ns", "empty", kEmptyClusterIP, 53, {}, sdk::Protocol::kUDP, "dns");
  auto sticky = clusterIP("ns", "sticky", kStickyClusterIP, 80, {endpoint(kPodIP, 8080), endpoint(kPodIP, 8081)});
  sticky.sessionAffinityClientIP = true;
  sticky.stickyMaxAgeSeconds = 60;
  auto spread = clusterIP("ns", "spread", kSpreadClusterIP, 80, {endpoint(kPodIP, 8080), endpoint(kPodIP, 8081)});
  auto web6 = clusterIP("ns", "web6", kClusterIP6, 80, {endpoint(kPodIP6, 8080)});
  return plan::VectorSnapshot({web, dns, sctp, empty, emptyUdp, sticky, spread, web6});
}

/// The pods `n` connects from one client process to `ip`:80 reached, one name per connect.
std::set<std::string> podsReached(const Testbed& t, const char* ip, int n) {
  auto [rc, out] = t.inClient([ip, n] {
    for (int i = 0; i < n; ++i)
      if (tcpClient(ip, 80) != 0) return 1;
    return 0;
  });
  INFO(out);
  REQUIRE(rc == 0);
  std::set<std::string> pods;
  for (std::size_t at = out.find("reply=pod="); at != std::string::npos; at = out.find("reply=pod=", at + 1))
    pods.insert(out.substr(at + 10, out.find(' ', at + 10) - (at + 10)));
  return pods;
}

std::size_t attachedPrograms(const std::string& cgroup) {
  auto [rc, out] = run("bpftool cgroup show " + cgroup);
  std::size_t n = 0;
  for (std::size_t at = out.find("kproxy_"); at != std::string::npos; at = out.find("kproxy_", at + 1)) ++n;
  return rc == 0 ? n : 0;
}

}  // namespace

TEST_CASE("ebpf: a client in the cgroup reaches the pod through the ClusterIP, without NAT", "[kernel][ebpf]") {
  Testbed t;
  t.setUp();
  // Without the programs the ClusterIP leads nowhere: the control for everything below.
  {
    auto [rc, out] = t.clientCommand({"curl", "-sS", "--max-time", "1", std::string("http://") + kClusterIP + "/"});
    INFO(out);
    REQUIRE(rc != 0);
  }
  auto synced = t.backend().syncFrom(snapshot(), {}, true);
  INFO((synced ? synced->summary : synced.error().message));
  REQUIRE(synced.has_value());
  CHECK(attachedPrograms(t.cgroup) == 9);

  // Conntrack runs in the client's namespace (a rule that needs it), so an entry would show.
  sh("ip netns exec " + t.client + " nft add table inet kproxy_test_ct");
  sh("ip netns exec " + t.client +
     " nft 'add chain inet kproxy_test_ct out { type filter hook output priority 0; }; add rule inet kproxy_test_ct out ct state new counter'");

  SECTION("TCP: curl gets the pod's answer, getpeername says the ClusterIP") {
    auto [rc, out] = t.clientCommand({"curl", "-sS", "--max-time", "3", std::string("http://") + kClusterIP + "/"});
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.starts_with("pod=pod-a client=10.200.0.1:"));
    auto [rc2, out2] = t.inClient([] { return tcpClient(kClusterIP, 80); });
    INFO(out2);
    CHECK(rc2 == 0);
    CHECK(out2.starts_with("peer=10.96.0.10:80 reply=pod=pod-a"));

    auto [ctRc, conntrack] = run("ip netns exec " + t.client + " conntrack -L 2>/dev/null");
    INFO(conntrack);
    CHECK(ctRc == 0);
    CHECK(conntrack.find(std::string("dst=") + kPodIP) != std::string::npos);  // conntrack saw the flow…
    CHECK(conntrack.find(kClusterIP) == std::string::npos);                    // …and never the ClusterIP
  }

  SECTION("a released connected socket takes its reverse element along; an unconnected UDP socket's stays") {
    for (int i = 0; i < 5; ++i) {
      auto [rc, out] = t.inClient([] { return tcpClient(kClusterIP, 80); });
      INFO(out);
      REQUIRE(rc == 0);
    }
    auto [rc, out] = t.inClient([] { return udpClient(kClusterIP, 53); });
    INFO(out);
    REQUIRE(rc == 0);
    // Every client has exited: its sockets are released. A full sync counts the data path's maps.
    auto counted = t.backend().syncFrom(snapshot(), {}, true);
    REQUIRE(counted.has_value());
    CHECK(t.backend().dataPathCounts().reverse == 1);
  }

  SECTION("UDP: a datagram without connect is steered, its reply comes from the ClusterIP") {
    auto [rc, out] = t.inClient([] { return udpClient(kClusterIP, 53); });
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.starts_with("from=10.96.0.10:53 reply=pod=pod-a client=10.200.0.1:"));
  }

  SECTION("a service without endpoints refuses the connect and the datagram at once") {
    auto [rc, out] = t.clientCommand({std::string(KPROXY_TEST_TOOLS_DIR) + "/kproxy-netprobe", "connect", kEmptyClusterIP, "80", "2"});
    INFO(out);
    CHECK(out.find("ECONNREFUSED") != std::string::npos);
    auto [rc2, out2] = t.inClient([] { return udpClient(kEmptyClusterIP, 53); });
    INFO(out2);
    CHECK(out2 == std::string("sendto: ") + std::strerror(ECONNREFUSED) + "\n");
  }

  SECTION("a process outside the cgroup is not steered") {
    auto [rc, out] = run("ip netns exec " + t.client + " curl -sS --max-time 1 http://" + kClusterIP + "/");
    INFO(out);
    CHECK(rc != 0);
  }

  SECTION("a restart re-adopts the pins: it writes nothing, and the programs are replaced in place") {
    t.plugin.reset();  // the process goes; its pins stay
    CHECK(attachedPrograms(t.cgroup) == 9);
    auto again = t.backend().syncFrom(snapshot(), {}, true);
    INFO((again ? again->summary : again.error().message));
    REQUIRE(again.has_value());
    CHECK(again->operations == 0);
    CHECK(attachedPrograms(t.cgroup) == 9);
    auto [rc, out] = t.inClient([] { return tcpClient(kClusterIP, 80); });
    INFO(out);
    CHECK(out.starts_with("peer=10.96.0.10:80 reply=pod=pod-a"));
  }

  SECTION("a map element deleted by hand is repaired by the next full sync") {
    sh("bpftool map delete pinned " + t.pinPath + "/kproxy_slots key hex " +
       [&] {
         // The slot key: the service id and slot 0, little-endian u32s.
         const std::uint32_t id = t.backend().idOf(net::Family::kIPv4, "ns/web:p");
         char hex[64];
         std::snprintf(hex, sizeof hex, "%02x %02x %02x %02x 00 00 00 00", id & 0xff, (id >> 8) & 0xff,
                       (id >> 16) & 0xff, id >> 24);
         return std::string(hex);
       }());
    auto repaired = t.backend().syncFrom(snapshot(), {}, true);
    REQUIRE(repaired.has_value());
    CHECK(repaired->operations == 1);
    auto [rc, out] = t.inClient([] { return tcpClient(kClusterIP, 80); });
    INFO(out);
    CHECK(out.starts_with("peer=10.96.0.10:80 reply=pod=pod-a"));
  }

  SECTION("writes go in batches in the differ's order: a refused one is named, those before it stay, "
          "none after it is made") {
    auto kernel = openLibbpfKernel(LibbpfSettings{t.cgroup, t.pinPath, {}});
    REQUIRE(kernel.has_value());
    const auto endpoint = *SocketAddress::of("10.200.1.2", 8080);
    const auto service = ServiceKey{*SocketAddress::of("10.96.0.99", 80), kProtoTCP};
    // More slots than one batch of the adapter holds, then a delete the kernel refuses (no such
    // element: ENOENT), then the count that would expose them.
    std::vector<MapOp> ops;
    for (std::uint32_t i = 0; i < 20000; ++i) ops.push_back(MapOp::updateSlot(SlotKey{4242, i}, endpoint));
    ops.push_back(MapOp::deleteSlot(SlotKey{4242, 29999}));
    ops.push_back(MapOp::updateService(service, ServiceValue{4242, 2, 0, 0, 0}));
    auto applied = (*kernel)->apply(ops);
    REQUIRE_FALSE(applied.has_value());
    CHECK(applied.error().errnum == ENOENT);
    CHECK_THAT(applied.error().message(), Catch::Contains("delete slots 4242/29999"));
    auto back = (*kernel)->readBack();
    REQUIRE(back.has_value());
    CHECK(back->slots.contains(SlotKey{4242, 0}));
    CHECK(back->slots.contains(SlotKey{4242, 19999}));
    CHECK_FALSE(back->services.contains(service));
  }

  SECTION("ClientIP affinity keeps a client on one pod; without it both pods are chosen") {
    CHECK(podsReached(t, kStickyClusterIP, 12).size() == 1);
    CHECK(podsReached(t, kSpreadClusterIP, 30) == std::set<std::string>{"pod-a", "pod-b"});
    // What the programs wrote, as the next full sync counts it: one client kept (its network
    // namespace) for the sticky service; the 42 steered sockets are closed, and their reverse
    // elements went with them.
    REQUIRE(t.backend().syncFrom(snapshot(), {}, true).has_value());
    CHECK(t.backend().dataPathCounts().affinity == 1);
    CHECK(t.backend().dataPathCounts().reverse == 0);
  }

  SECTION("explain's decision over the maps is what the program does") {
    // decideConnect over what the kernel holds (the mirror, which a full sync made equal to it).
    const MapContents held = t.backend().mirror();
    auto decide = [&](const char* ip) { return decideConnect(held, ServiceKey{*SocketAddress::of(ip, 80), kProtoTCP}); };
    std::map<std::string, std::string> podAt{{"10.200.0.2:8080", "pod-a"}, {"10.200.0.2:8081", "pod-b"}};
    std::set<std::string> drawable;
    for (const auto& choice : decide(kSpreadClusterIP).slots) {
      REQUIRE(choice.endpoint);
      drawable.insert(podAt.at(choice.endpoint->toText()));
    }
    CHECK(drawable == podsReached(t, kSpreadClusterIP, 30));
    CHECK(decide(kEmptyClusterIP).decision == Decision::kRefused);
    auto [rc, out] = t.clientCommand({std::string(KPROXY_TEST_TOOLS_DIR) + "/kproxy-netprobe", "connect", kEmptyClusterIP, "80", "2"});
    INFO(out);
    CHECK(out.find(::strerrorname_np(kRefusedErrno)) != std::string::npos);
  }

  SECTION("an endpoint change is one slot written, and the next connect meets it") {
    auto next = snapshot();
    for (auto& p : next.ports())
      if (p.key == "ns/web:p") kproxy::nftables::testing::setEndpoints(p, {endpoint(kPodIP, 8081)});
    auto changed = t.backend().syncFrom(next, {sdk::ChangedKey{net::Family::kIPv4, "ns/web:p"}}, false);
    INFO((changed ? changed->summary : changed.error().message));
    REQUIRE(changed.has_value());
    CHECK(changed->operations == 1);
    CHECK(podsReached(t, kClusterIP, 3) == std::set<std::string>{"pod-b"});
  }

  SECTION("IPv6: curl reaches the pod through the IPv6 ClusterIP") {
    auto [rc, out] = t.clientCommand({"curl", "-sS", "-g", "--max-time", "3", std::string("http://[") + kClusterIP6 + "]/"});
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.starts_with("pod=pod-a client=fd00:200::1:"));
  }

  SECTION("an IPv6 socket reaches the IPv4 ClusterIP in its IPv4-mapped form, as dual-stack clients do") {
    auto [rc, out] = t.inClient([] { return mappedClient(kClusterIP, 80, false); });
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.starts_with("peer=[::ffff:10.96.0.10]:80 reply=pod=pod-a client=10.200.0.1:"));
    auto [rc2, out2] = t.inClient([] { return mappedClient(kClusterIP, 53, true); });
    INFO(out2);
    CHECK(rc2 == 0);
    CHECK(out2.starts_with("from=[::ffff:10.96.0.10]:53 reply=pod=pod-a client=10.200.0.1:"));
    auto [rc3, out3] = t.inClient([] { return mappedClient(kEmptyClusterIP, 80, false); });
    INFO(out3);
    CHECK(out3 == std::string("connect: ") + std::strerror(ECONNREFUSED) + "\n");
    // Every client has exited: the connected socket's reverse element went with it, the
    // unconnected UDP socket's (held in the IPv4 form, as sendmsg4 wrote it) stays.
    auto counted = t.backend().syncFrom(snapshot(), {}, true);
    REQUIRE(counted.has_value());
    CHECK(t.backend().dataPathCounts().reverse == 1);
  }

  SECTION("an SCTP ClusterIP port, which no hook steers, is dispatched by the nftables part; TCP and UDP are not") {
    // This process's own network namespace holds the nftables part (privateMounts).
    auto [rc, out] = run("nft list map ip kproxy-ebpf service-ips");
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("10.96.0.10 . sctp . 53 : goto service-") != std::string::npos);
    CHECK(out.find("10.96.0.10 . tcp") == std::string::npos);
    CHECK(out.find("10.96.0.10 . udp") == std::string::npos);
  }

  SECTION("cleanup detaches every program and removes the pins") {
    REQUIRE(t.backend().cleanup().has_value());
    CHECK(attachedPrograms(t.cgroup) == 0);
    CHECK_FALSE(std::filesystem::exists(t.pinPath));
    auto [rc, out] = t.clientCommand({"curl", "-sS", "--max-time", "1", std::string("http://") + kClusterIP + "/"});
    CHECK(rc != 0);
  }
}

TEST_CASE("ebpf: start-up names what the kernel or the node lacks", "[kernel][ebpf]") {
  privateMounts();
  SECTION("a cgroup path that is not cgroup v2") {
    auto made = makeEbpfBackend(sdk::Host(nullptr), {{"ebpf-cgroup-path", "/tmp"}, {"ebpf-pin-path", "/tmp/x/kproxy"}});
    REQUIRE_FALSE(made.has_value());
    CHECK(made.error().message.find("is not a cgroup v2 directory") != std::string::npos);
  }
  SECTION("a pin path outside bpffs") {
    auto root = cgroupV2Root();
    REQUIRE(root.has_value());
    auto made = makeEbpfBackend(sdk::Host(nullptr), {{"ebpf-cgroup-path", *root}, {"ebpf-pin-path", "/tmp/kproxy-not-bpffs"}});
    REQUIRE_FALSE(made.has_value());
    CHECK(made.error().message.find("not on a bpf filesystem") != std::string::npos);
  }
}

namespace {

/// A client process in the cgroup and the client's namespace that lives across syncs: it runs
/// `steps` one after the other, each when the test says `next()`, and reports what each printed.
class LongClient {
 public:
  LongClient(const Testbed& t, std::vector<std::function<void()>> steps) {
    int toChild[2], fromChild[2];
    REQUIRE(::pipe(toChild) == 0);
    REQUIRE(::pipe(fromChild) == 0);
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(fromChild[1], 1);
      ::close(toChild[1]);
      ::close(fromChild[0]);
      std::ofstream(t.cgroup + "/cgroup.procs") << ::getpid() << std::flush;
      enterNetns(t.client);
      for (auto& step : steps) {
        char go = 0;
        if (::read(toChild[0], &go, 1) != 1) ::_exit(1);
        step();
        std::printf("end\n");
        std::fflush(stdout);
      }
      ::_exit(0);
    }
    ::close(toChild[0]);
    ::close(fromChild[1]);
    toChild_ = toChild[1];
    fromChild_ = ::fdopen(fromChild[0], "r");
  }
  ~LongClient() {
    ::close(toChild_);
    if (fromChild_ != nullptr) std::fclose(fromChild_);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  LongClient(const LongClient&) = delete;
  LongClient& operator=(const LongClient&) = delete;

  /// Runs the next step; its lines ("s1=pod-a"), in order.
  std::vector<std::string> next() {
    REQUIRE(::write(toChild_, "n", 1) == 1);
    std::vector<std::string> lines;
    char buf[512];
    while (std::fgets(buf, sizeof buf, fromChild_) != nullptr) {
      std::string line(buf);
      if (!line.empty() && line.back() == '\n') line.pop_back();
      if (line == "end") return lines;
      lines.push_back(line);
    }
    std::string said;
    for (const auto& line : lines) said += line + " | ";
    FAIL("the client died; it said: " << said);
    return lines;
  }

 private:
  pid_t pid_ = -1;
  int toChild_ = -1;
  std::FILE* fromChild_ = nullptr;
};

/// In the client: a UDP socket connected to `ip`:`port` (-1 when the connect fails).
int connectedUdp(const char* ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in to = inet(ip, port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// In the client: one datagram on `fd` (to its peer, or to `to` when given) and the pod that
/// answered ("pod-a"), or what failed ("send: ECONNABORTED", "recv: …", "no reply").
std::string exchange(int fd, const sockaddr_in* to = nullptr) {
  const ssize_t sent = to == nullptr ? ::send(fd, "x", 1, 0)
                                     : ::sendto(fd, "x", 1, 0, reinterpret_cast<const sockaddr*>(to), sizeof *to);
  if (sent < 0) return std::string("send: ") + ::strerrorname_np(errno);
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 3000) != 1) return "no reply";
  char buf[512] = {};
  const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
  if (n < 0) return std::string("recv: ") + ::strerrorname_np(errno);
  const std::string reply(buf, static_cast<std::size_t>(n));  // "pod=pod-a client=…"
  return reply.starts_with("pod=") ? reply.substr(4, reply.find(' ') - 4) : reply;
}

/// The UDP service of the stale-socket case with `eps`.
sdk::ServicePort dnsService(std::vector<sdk::Endpoint> eps) {
  return clusterIP("ns", "dns", kDnsClusterIP, 53, std::move(eps), sdk::Protocol::kUDP, "dns");
}

}  // namespace

TEST_CASE("ebpf: a connected UDP socket steered to an endpoint that is removed is ended; the others are not",
          "[kernel][ebpf]") {
  Testbed t;
  t.setUp();
  // pod-b's endpoint has an address of its own: the cleanup tells endpoints apart by address,
  // as conntrack's does.
  sh("ip -n " + t.server + " addr add " + kPodBIP + "/24 dev veth-s");
  const sdk::Endpoint a = endpoint(kPodIP, 5353);   // pod-a
  const sdk::Endpoint b = endpoint(kPodBIP, 5354);  // pod-b
  const std::vector<sdk::ChangedKey> changed{{net::Family::kIPv4, "ns/dns:dns"}};
  std::vector<sdk::ServicePort> applied;
  // A sync as the host runs it: the maps, then the stale-socket cleanup over the two snapshots.
  auto sync = [&](std::vector<sdk::ServicePort> next, bool full) {
    auto synced = t.backend().syncFrom(plan::VectorSnapshot(next), full ? std::vector<sdk::ChangedKey>{} : changed, full);
    INFO((synced ? synced->summary : synced.error().message));
    REQUIRE(synced.has_value());
    auto report = t.backend().endStaleSockets(applied, next, full ? std::vector<sdk::ChangedKey>{} : changed, full);
    INFO((report ? "" : report.error().message()));
    REQUIRE(report.has_value());
    applied = std::move(next);
    return *report;
  };

  // Sockets of the client, kept across the syncs: s1 and s2 through the ClusterIP, s3 connected
  // to pod-a's own address, s4 never connected, s6 an IPv6 socket through the ClusterIP's
  // IPv4-mapped form.
  int s1 = -1, s2 = -1, s3 = -1, s4 = -1, s5 = -1, s6 = -1;
  auto connectMapped = [] {
    const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
    sockaddr_in6 to{};
    to.sin6_family = AF_INET6;
    to.sin6_port = htons(53);
    ::inet_pton(AF_INET6, (std::string("::ffff:") + kDnsClusterIP).c_str(), &to.sin6_addr);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 ? fd : -1;
  };
  const sockaddr_in service = inet(kDnsClusterIP, 53);
  LongClient client(t, {
      [&] {
        s1 = connectedUdp(kDnsClusterIP, 53);
        s3 = connectedUdp(kPodIP, 5353);
        s4 = ::socket(AF_INET, SOCK_DGRAM, 0);
        s6 = connectMapped();
        std::printf("s1=%s\ns3=%s\ns4=%s\ns6=%s\n", exchange(s1).c_str(), exchange(s3).c_str(),
                    exchange(s4, &service).c_str(), exchange(s6).c_str());
      },
      [&] {
        s2 = connectedUdp(kDnsClusterIP, 53);
        std::printf("s1=%s\ns2=%s\n", exchange(s1).c_str(), exchange(s2).c_str());
      },
      [&] {
        // The ended socket, as a sender that never reads would find it, then its pending error.
        std::printf("s1 send=%s\n", ::send(s1, "x", 1, 0) < 0 ? ::strerrorname_np(errno) : "sent");
        char byte = 0;
        const ssize_t n = ::recv(s1, &byte, 1, MSG_DONTWAIT);
        std::printf("s1 recv=%s\n", n < 0 ? ::strerrorname_np(errno) : "data");
        const ssize_t m = ::recv(s6, &byte, 1, MSG_DONTWAIT);
        std::printf("s6 recv=%s\n", m < 0 ? ::strerrorname_np(errno) : "data");
        s5 = connectedUdp(kDnsClusterIP, 53);
        std::printf("s5=%s\ns2=%s\ns3=%s\ns4=%s\n", exchange(s5).c_str(), exchange(s2).c_str(),
                    exchange(s3).c_str(), exchange(s4, &service).c_str());
      },
      [&] { std::printf("s2=%s\ns5=%s\n", exchange(s2).c_str(), exchange(s5).c_str()); },
  });

  // 1. pod-a alone: s1 is steered to it.
  auto first = sync({dnsService({a})}, true);
  CHECK(first.ran);
  CHECK(first.listed == 0);
  CHECK(client.next() == std::vector<std::string>{"s1=pod-a", "s3=pod-a", "s4=pod-a", "s6=pod-a"});

  // 2. pod-a terminating but still serving, pod-b ready: new connects go to pod-b (s2), and s1
  //    is not ended (a serving endpoint keeps its flows, as in conntrack).
  sdk::Endpoint terminating = a;
  terminating.ready = false;
  terminating.terminating = true;
  auto both = dnsService({terminating, b});
  both.clusterEndpoints = {b};
  both.allReachableEndpoints = {b};
  auto second = sync({both}, false);
  CHECK(second.listed == 2);  // s1, s6; s3 has no reverse element, s4 is not connected
  CHECK(second.stale.empty());
  CHECK(client.next() == std::vector<std::string>{"s1=pod-a", "s2=pod-b"});

  // 3. pod-a removed: s1 and s6 are ended, and only they.
  auto third = sync({dnsService({b})}, false);
  CHECK(third.listed == 3);  // s1, s6, s2
  CHECK(third.stale.size() == 2);
  CHECK(third.deleted == 2);
  CHECK(client.next() == std::vector<std::string>{"s1 send=EDESTADDRREQ", "s1 recv=ECONNABORTED", "s6 recv=ECONNABORTED", "s5=pod-b",
                                                  "s2=pod-b", "s3=pod-a", "s4=pod-b"});

  // 4. A full sync after it finds s2 and s5 steered to pod-b, which serves: nothing more ends.
  auto fourth = sync({dnsService({b})}, true);
  CHECK(fourth.listed == 2);
  CHECK(fourth.deleted == 0);
  CHECK(client.next() == std::vector<std::string>{"s2=pod-b", "s5=pod-b"});
}

namespace {

/// The UDP service port of the plugin case, as the host's snapshot holds it.
std::shared_ptr<const core::ServicePortState> dnsState(const char* ip, int port) {
  return kproxy::testing::udpClusterIPState("ns", "dns", kDnsClusterIP, 53,
                                            {kproxy::testing::servingEndpoint(ip, port)});
}

}  // namespace

TEST_CASE("ebpf: the plugin, loaded as kproxy loads it, ends a stale connected UDP socket after the host's sync",
          "[kernel][ebpf]") {
  Testbed t;
  t.setUp();
  sh("ip -n " + t.server + " addr add " + kPodBIP + "/24 dev veth-s");
  plugins::PluginRegistry registry;
  auto loaded = registry.load(std::filesystem::path(KPROXY_TEST_PLUGIN_DIR) / "kproxy-backend-ebpf.so");
  INFO((loaded ? std::string() : loaded.error().message()));
  REQUIRE(loaded.has_value());
  auto created = registry.createBackend(
      "ebpf", {{"node-name", "node-a"}, {"ebpf-cgroup-path", t.cgroup}, {"ebpf-pin-path", t.pinPath}});
  INFO((created ? std::string() : created.error().message()));
  REQUIRE(created.has_value());
  core::Backend& backend = **created;
  struct CleanUp {
    core::Backend& backend;
    ~CleanUp() { (void)backend.cleanup(); }
  } cleanUp{backend};

  core::NodeInfo node;
  node.name = "node-a";
  node.known = true;
  const std::vector<core::ServicePortKey> changed{core::ServicePortKey{net::Family::kIPv4, "ns/dns:dns"}};
  auto withA = dnsState(kPodIP, 5353);
  const core::Snapshot s1 = core::Snapshot().withNode(node).with(withA->key, withA).withGeneration(1);
  REQUIRE(backend.sync(core::SyncRequest{nullptr, &s1, changed, core::SyncKind::kFull}).has_value());

  int s = -1;
  LongClient client(t, {
      [&] {
        s = connectedUdp(kDnsClusterIP, 53);
        std::printf("s=%s\n", exchange(s).c_str());
      },
      [&] {
        char byte = 0;
        const ssize_t n = ::recv(s, &byte, 1, MSG_DONTWAIT);
        std::printf("s recv=%s\nnew=%s\n", n < 0 ? ::strerrorname_np(errno) : "data",
                    exchange(connectedUdp(kDnsClusterIP, 53)).c_str());
      },
  });
  CHECK(client.next() == std::vector<std::string>{"s=pod-a"});

  // pod-a replaced by pod-b: the partial sync's cleanup ends the socket.
  auto withB = dnsState(kPodBIP, 5354);
  const core::Snapshot s2 = s1.with(withB->key, withB).withGeneration(2);
  REQUIRE(backend.sync(core::SyncRequest{&s1, &s2, changed, core::SyncKind::kPartial}).has_value());
  CHECK(client.next() == std::vector<std::string>{"s recv=ECONNABORTED", "new=pod-b"});
  const std::string metrics = [&] {
    std::string out;
    for (const auto& family : registry.metrics().collect())
      for (const auto& [labels, value] : family.samples)
        if (family.name.starts_with("kproxy_ebpf_socket_"))
          out += family.name + "{" + (labels.empty() ? "" : labels.front()) + "}=" + std::to_string(int(value)) + " ";
    return out;
  }();
  INFO(metrics);
  CHECK(metrics.find("kproxy_ebpf_socket_operations_total{ended}=1 ") != std::string::npos);
  CHECK(metrics.find("kproxy_ebpf_socket_operations_total{listed}=1 ") != std::string::npos);
}

TEST_CASE("ebpf: a steered socket whose process kproxy cannot see in the cgroup is found through --ebpf-netns-dir",
          "[kernel][ebpf]") {
  const bool withDir = GENERATE(false, true);
  Testbed t;
  t.setUp();
  sh("ip -n " + t.server + " addr add " + kPodBIP + "/24 dev veth-s");
  // A directory as /var/run/netns holding the client's namespace; and a cgroup beside the
  // test's, where the client goes after its connect, as a pod's processes are to a kproxy
  // without the host's PID namespace: not among the cgroup's processes it can see.
  struct Scratch {
    std::string dir, outside;
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      if (!outside.empty()) ::rmdir(outside.c_str());
    }
  } scratch;
  char pattern[] = "/tmp/kproxy-netns-dir-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  scratch.dir = pattern;
  std::filesystem::create_symlink("/run/netns/" + t.client, scratch.dir + "/client");
  scratch.outside = t.cgroup + "-outside";
  REQUIRE(::mkdir(scratch.outside.c_str(), 0755) == 0);
  const std::vector<sdk::ChangedKey> changed{{net::Family::kIPv4, "ns/dns:dns"}};
  const auto withA = dnsService({endpoint(kPodIP, 5353)});
  const auto withB = dnsService({endpoint(kPodBIP, 5354)});
  const std::string outsideProcs = scratch.outside + "/cgroup.procs";

  int s = -1;
  LongClient client(t, {
      [&] {
        s = connectedUdp(kDnsClusterIP, 53);
        std::printf("s=%s\n", exchange(s).c_str());
        std::ofstream(outsideProcs) << ::getpid() << std::flush;
      },
      [&] {
        char byte = 0;
        const ssize_t n = ::recv(s, &byte, 1, MSG_DONTWAIT);
        std::printf("s recv=%s\n", n < 0 ? ::strerrorname_np(errno) : "nothing pending");
      },
  });
  // Without the directory the socket is not found (the control); with it, it is found in its
  // namespace and ended.
  if (withDir) t.extraOptions["ebpf-netns-dir"] = scratch.dir;
  INFO("--ebpf-netns-dir " << (withDir ? scratch.dir : "not given"));
  REQUIRE(t.backend().syncFrom(plan::VectorSnapshot({withA}), {}, true).has_value());
  CHECK(client.next() == std::vector<std::string>{"s=pod-a"});
  REQUIRE(t.backend().syncFrom(plan::VectorSnapshot({withB}), changed, false).has_value());
  auto report = t.backend().endStaleSockets({withA}, {withB}, changed, false);
  REQUIRE(report.has_value());
  CHECK(report->listed == (withDir ? 1 : 0));
  CHECK(report->deleted == (withDir ? 1 : 0));
  CHECK(client.next() == std::vector<std::string>{withDir ? "s recv=ECONNABORTED" : "s recv=EAGAIN"});
}

TEST_CASE("ebpf: an IPv6 connected UDP socket steered to an endpoint that is removed is ended", "[kernel][ebpf]") {
  Testbed t;
  t.setUp();
  constexpr const char* kPodBIP6 = "fd00:200::3";
  sh("ip -n " + t.server + " addr add " + std::string(kPodBIP6) + "/64 dev veth-s nodad");
  const std::vector<sdk::ChangedKey> changed{{net::Family::kIPv6, "ns/dns6:dns"}};
  auto dns6 = [](std::vector<sdk::Endpoint> eps) {
    return clusterIP("ns", "dns6", "fd00:96::14", 53, std::move(eps), sdk::Protocol::kUDP, "dns");
  };
  const auto a = dns6({endpoint(kPodIP6, 5353)});
  const auto b = dns6({endpoint(kPodBIP6, 5354)});
  REQUIRE(t.backend().syncFrom(plan::VectorSnapshot({a}), {}, true).has_value());

  auto connect6 = [] {
    const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
    sockaddr_in6 to{};
    to.sin6_family = AF_INET6;
    to.sin6_port = htons(53);
    ::inet_pton(AF_INET6, "fd00:96::14", &to.sin6_addr);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 ? fd : -1;
  };
  int s1 = -1;
  LongClient client(t, {
      [&] {
        s1 = connect6();
        std::printf("s1=%s\n", exchange(s1).c_str());
      },
      [&] {
        char byte = 0;
        const ssize_t n = ::recv(s1, &byte, 1, MSG_DONTWAIT);
        std::printf("s1 recv=%s\ns2=%s\n", n < 0 ? ::strerrorname_np(errno) : "data", exchange(connect6()).c_str());
      },
  });
  CHECK(client.next() == std::vector<std::string>{"s1=pod-a"});
  REQUIRE(t.backend().syncFrom(plan::VectorSnapshot({b}), changed, false).has_value());
  auto report = t.backend().endStaleSockets({a}, {b}, changed, false);
  INFO((report ? "" : report.error().message()));
  REQUIRE(report.has_value());
  CHECK(report->listed == 1);
  REQUIRE(report->stale.size() == 1);
  CHECK(report->stale.front().original.dstIP == "fd00:96::14");
  CHECK(report->stale.front().reply.srcIP == kPodIP6);
  CHECK(report->deleted == 1);
  CHECK(client.next() == std::vector<std::string>{"s1 recv=ECONNABORTED", "s2=pod-b"});
}

namespace {

constexpr const char* kManifest = R"(apiVersion: v1
kind: Node
metadata:
  name: ebpf-node
status:
  addresses:
  - type: InternalIP
    address: 10.200.0.1
---
apiVersion: v1
kind: Service
metadata:
  namespace: demo
  name: web
spec:
  type: ClusterIP
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ipFamilies: [IPv4]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-abcde
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
- addresses: [10.200.0.2]
  conditions: {ready: true, serving: true, terminating: false}
)";

/// Starts `kproxy ARGS…` in the client's namespace (never the host's: --cleanup there would
/// remove the host's own rules), its output to `log`.
pid_t startKproxy(const Testbed& t, std::vector<std::string> args, const std::string& log) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(out, 1);
    ::dup2(out, 2);
    enterNetns(t.client);
    args.insert(args.begin(), KPROXY_TEST_KPROXY);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return child;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The flags every kproxy run of these cases shares: ebpf mode on the test's cgroup and bpffs,
/// no listener on the host's ports.
std::vector<std::string> ebpfFlags(const Testbed& t) {
  return {"--proxy-mode=ebpf",
          "--ebpf-cgroup-path=" + t.cgroup,
          "--ebpf-pin-path=" + t.pinPath,
          "--hostname-override=ebpf-node",
          "--metrics-bind-address=",
          "--healthz-bind-address=",
          "--conntrack-max-per-core=0"};
}

/// The daemon from the manifests in `dir`.
std::vector<std::string> daemonFlags(const Testbed& t, const std::string& dir) {
  auto flags = ebpfFlags(t);
  flags.insert(flags.end(), {"--manifests=" + dir, "-v=2"});
  return flags;
}

/// Removes the case's files (manifest directories, logs) when it ends, passed or failed.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) std::filesystem::remove_all(p);
  }
};

/// Stops the kproxy `pid` names, if any, when the case ends (SIGTERM: it leaves its pins).
struct StopKproxy {
  pid_t& pid;
  ~StopKproxy() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

/// Polls `done` until it holds or `ceiling` passes (the ceiling only stops a hang).
bool waitUntil(const std::function<bool()>& done, std::chrono::seconds ceiling = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + ceiling;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace

TEST_CASE("ebpf: the kproxy program serves a Service from manifests, and --cleanup removes what it pinned",
          "[kernel][ebpf]") {
  Testbed t;
  t.setUp();
  const std::string manifests = "/tmp/" + t.name + "-manifests";
  std::filesystem::create_directories(manifests);
  std::ofstream(manifests + "/web.yaml") << kManifest;
  const std::string log = "/tmp/" + t.name + "-kproxy.log";
  TempFiles files{{manifests, log}};
  pid_t kproxy = startKproxy(t, daemonFlags(t, manifests), log);
  StopKproxy stop{kproxy};

  std::pair<int, std::string> reply{-1, ""};
  for (int i = 0; i < 100 && reply.first != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    reply = t.clientCommand({"curl", "-sS", "--max-time", "1", "http://10.96.0.20/"});
  }
  INFO(slurp(log));
  INFO(reply.second);
  REQUIRE(reply.first == 0);
  CHECK(reply.second.starts_with("pod=pod-a client=10.200.0.1:"));
  CHECK(slurp(log).find("ebpf sync full=true") != std::string::npos);

  // Stopped, kproxy leaves its programs serving (a restart re-adopts them)...
  ::kill(kproxy, SIGTERM);
  ::waitpid(kproxy, nullptr, 0);
  kproxy = -1;
  CHECK(attachedPrograms(t.cgroup) == 9);
  CHECK(t.clientCommand({"curl", "-sS", "--max-time", "1", "http://10.96.0.20/"}).first == 0);

  // ...and --cleanup detaches them and removes the pins.
  std::vector<std::string> cleanup = ebpfFlags(t);
  cleanup.push_back("--cleanup");
  pid_t cleaner = startKproxy(t, cleanup, log);
  int status = 0;
  ::waitpid(cleaner, &status, 0);
  INFO(slurp(log));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(attachedPrograms(t.cgroup) == 0);
  CHECK_FALSE(std::filesystem::exists(t.pinPath));
}

namespace {

/// kManifest with a second endpoint for its Service: pod-b (8081), in a slice of its own as its
/// port differs from pod-a's (8080); the slice is kManifest's, renamed and on pod-b's port.
std::string twoEndpointsManifest() {
  const std::string manifest = kManifest;
  std::string slice = manifest.substr(manifest.rfind("apiVersion: discovery.k8s.io/v1"));
  slice.replace(slice.find("name: web-abcde"), 15, "name: web-b");
  slice.replace(slice.find("port: 8080"), 10, "port: 8081");
  return manifest + "---\n" + slice;
}
constexpr const char* kLoadClusterIP = "10.96.0.20";

/// What the client load counts, in memory shared with the test process (it reads it live).
struct LoadCounters {
  std::atomic<bool> stop{false};
  std::atomic<long> ok{0}, failed{0}, wrongPeer{0}, podA{0}, podB{0};
  std::atomic<long> streamLines{0};
  std::atomic<int> stream{0};  // 0 opening, 1 open, 2 broken
  char firstError[256] = {};
  std::atomic<bool> errorNoted{false};

  void note(const std::string& what) {
    if (!errorNoted.exchange(true)) std::snprintf(firstError, sizeof firstError, "%s", what.c_str());
  }
};

/// A TCP socket to the load's ClusterIP, connected, with 2 s timeouts; -1 (noted) when not.
int connectToService(LoadCounters& c) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in to = inet(kLoadClusterIP, 80);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    c.note(std::string("connect: ") + std::strerror(errno));
    ::close(fd);
    return -1;
  }
  sockaddr_in peer{};
  socklen_t length = sizeof peer;
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length);
  if (text(peer) != std::string(kLoadClusterIP) + ":80") {
    ++c.wrongPeer;
    c.note("getpeername answered " + text(peer));
  }
  return fd;
}

/// One short connection: connect, one request, the whole reply; counted.
void shortConnection(LoadCounters& c) {
  const int fd = connectToService(c);
  if (fd < 0) {
    ++c.failed;
    return;
  }
  const char request[] = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string reply;
  if (::write(fd, request, sizeof request - 1) == static_cast<ssize_t>(sizeof request - 1)) {
    char buf[1024];
    ssize_t n = 0;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (reply.find("pod=pod-a ") != std::string::npos) {
    ++c.ok;
    ++c.podA;
  } else if (reply.find("pod=pod-b ") != std::string::npos) {
    ++c.ok;
    ++c.podB;
  } else {
    ++c.failed;
    c.note("reply: " + reply.substr(0, 120));
  }
}

/// One long-lived connection (podserver's /stream) read until the load stops; broken when it
/// ends or fails before.
void streamConnection(LoadCounters& c) {
  const int fd = connectToService(c);
  if (fd < 0) {
    c.stream = 2;
    return;
  }
  const char request[] = "GET /stream?seconds=300&interval=0.05 HTTP/1.1\r\nHost: x\r\n\r\n";
  if (::write(fd, request, sizeof request - 1) != static_cast<ssize_t>(sizeof request - 1)) {
    c.note("stream: request not sent");
    c.stream = 2;
    ::close(fd);
    return;
  }
  c.stream = 1;
  char buf[4096];
  while (!c.stop) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      c.note(n == 0 ? std::string("stream: closed") : std::string("stream: ") + std::strerror(errno));
      c.stream = 2;
      break;
    }
    const std::string_view chunk(buf, static_cast<std::size_t>(n));
    for (std::size_t at = chunk.find(" seq="); at != std::string_view::npos; at = chunk.find(" seq=", at + 1))
      ++c.streamLines;
  }
  ::close(fd);
}

/// The first line of `log` with "ebpf sync full=true", or "".
std::string firstFullSync(const std::string& log) {
  const std::string all = slurp(log);
  const auto at = all.find("ebpf sync full=true");
  return at == std::string::npos ? "" : all.substr(at, all.find('\n', at) - at);
}

}  // namespace

TEST_CASE("ebpf: kproxy restarted twice under load breaks no connection and writes nothing", "[kernel][ebpf]") {
  Testbed t;
  t.setUp();
  const std::string manifests = "/tmp/" + t.name + "-restart-manifests";
  std::filesystem::create_directories(manifests);
  std::ofstream(manifests + "/web.yaml") << twoEndpointsManifest();
  const std::vector<std::string> logs{"/tmp/" + t.name + "-restart-0.log", "/tmp/" + t.name + "-restart-1.log",
                                      "/tmp/" + t.name + "-restart-2.log"};
  TempFiles files{{manifests, logs[0], logs[1], logs[2]}};

  pid_t kproxy = startKproxy(t, daemonFlags(t, manifests), logs[0]);
  StopKproxy stopKproxy{kproxy};
  if (!waitUntil([&] { return !firstFullSync(logs[0]).empty(); })) FAIL("kproxy did not sync: " << slurp(logs[0]));

  // The load: a loop of short connections and one stream, in a child in the cgroup and the
  // client's namespace, counting into shared memory.
  void* shared = ::mmap(nullptr, sizeof(LoadCounters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  auto& load = *new (shared) LoadCounters;
  std::fflush(nullptr);
  pid_t client = ::fork();
  REQUIRE(client >= 0);
  if (client == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::ofstream(t.cgroup + "/cgroup.procs") << ::getpid() << std::flush;
    enterNetns(t.client);
    std::thread stream([&] { streamConnection(load); });
    const auto ceiling = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!load.stop && std::chrono::steady_clock::now() < ceiling) shortConnection(load);
    load.stop = true;
    stream.join();
    ::_exit(0);
  }
  struct StopLoad {
    pid_t& pid;
    LoadCounters& load;
    void* shared;
    ~StopLoad() {
      load.stop = true;
      if (pid > 0) ::waitpid(pid, nullptr, 0);
      ::munmap(shared, sizeof(LoadCounters));
    }
  } stopLoad{client, load, shared};

  auto counts = [&] {
    return "ok=" + std::to_string(load.ok) + " failed=" + std::to_string(load.failed) +
           " wrong-peer=" + std::to_string(load.wrongPeer) + " pod-a=" + std::to_string(load.podA) +
           " pod-b=" + std::to_string(load.podB) + " stream=" + std::to_string(load.stream) +
           " stream-lines=" + std::to_string(load.streamLines) + " first-error=\"" +
           (load.errorNoted ? load.firstError : "") + "\"";
  };
  if (!waitUntil([&] { return load.ok >= 50 && load.streamLines >= 2; })) FAIL("the load did not start: " << counts());

  std::vector<std::string> restartedSyncs;
  for (std::size_t round = 1; round <= 2; ++round) {
    ::kill(kproxy, SIGTERM);
    ::waitpid(kproxy, nullptr, 0);
    kproxy = startKproxy(t, daemonFlags(t, manifests), logs[round]);
    if (!waitUntil([&] { return !firstFullSync(logs[round]).empty(); }))
      FAIL("restart " << round << " did not sync: " << slurp(logs[round]));
    restartedSyncs.push_back(firstFullSync(logs[round]));
    // The load goes on over the restarted kproxy before the next step.
    const long ok = load.ok, lines = load.streamLines;
    if (!waitUntil([&] { return load.ok >= ok + 50 && load.streamLines >= lines + 2; }))
      FAIL("the load stalled after restart " << round << ": " << counts());
  }
  load.stop = true;
  ::waitpid(client, nullptr, 0);
  client = -1;

  INFO(counts());
  CHECK(load.failed == 0);
  CHECK(load.wrongPeer == 0);
  CHECK(load.stream == 1);
  CHECK(load.podA > 0);
  CHECK(load.podB > 0);
  for (const auto& line : restartedSyncs) {
    INFO(line);
    CHECK(line.find(" ops=0 ") != std::string::npos);
  }
}
