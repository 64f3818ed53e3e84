#include "healthcheck_nodeports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <future>

#include "ops_fixtures.h"

using kproxy::cli::EventLoop;
using kproxy::cli::ServiceHealthServers;
using ops_test::LocalEndpoint;

namespace {

// Runs `fn` on the loop thread and waits for it.
template <typename Fn>
auto onLoop(EventLoop& loop, Fn fn) {
  std::promise<decltype(fn())> done;
  auto result = done.get_future();
  loop.post([&] {
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      done.set_value();
    } else {
      done.set_value(fn());
    }
  });
  return result.get();
}

// A loopback TCP port held for the whole test: a socket bound to port 0 with SO_REUSEADDR and
// never listening. The kernel hands a bound port to no other bind(0) or connect(), so no other
// process can take it, while a server that also sets SO_REUSEADDR (as HttpServer does) can
// still bind and listen on it. Releasing the port before use instead would leave a window in
// which anyone could take it.
class ReservedPort {
 public:
  ReservedPort() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd_ >= 0);
    const int on = 1;
    REQUIRE(setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
  }
  ~ReservedPort() { close(fd_); }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// GET / over plain HTTP/1.0; the whole response, or "" when nothing listens.
std::string httpGet(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET / HTTP/1.0\r\nHost: x\r\n\r\n";
  REQUIRE(write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

}  // namespace

TEST_CASE("targets: eTP=Local services with a health-check port, distinct local ready IPs", "[unit][healthcheck]") {
  ops_test::QuietLog quiet;
  auto lbTwoPorts = ops_test::localLoadBalancer("web", 32001, "10.96.0.10");
  lbTwoPorts.ports.push_back(lbTwoPorts.ports[0]);
  lbTwoPorts.ports[1].name = "https";
  lbTwoPorts.ports[1].port = 443;
  lbTwoPorts.ports[1].nodePort = 30443;
  auto webSlice = ops_test::sliceFor("web", {{"10.244.1.1"},                      // local, ready
                                             {"10.244.1.2", true, false, true},   // local, terminating
                                             {"10.244.1.3", true, false},         // local, not ready
                                             {"10.244.2.1", false}});             // remote
  kproxy::core::EndpointPort https;
  https.name = "https";
  https.port = 8443;
  https.protocol = kproxy::core::Protocol::kTCP;
  webSlice.ports.push_back(https);  // the same pod on two ports counts once

  auto cluster = ops_test::localLoadBalancer("cluster", 32002, "10.96.0.11");
  cluster.externalTrafficPolicy = kproxy::core::TrafficPolicy::kCluster;
  auto empty = ops_test::localLoadBalancer("empty", 32003, "10.96.0.12");

  auto snapshot = ops_test::snapshotOf({lbTwoPorts, cluster, empty}, {webSlice});
  auto targets = kproxy::cli::serviceHealthTargets(*snapshot);
  REQUIRE(targets.size() == 2);
  CHECK(targets.at("default/web") == kproxy::cli::ServiceHealthTarget{"default", "web", 32001, 1});
  CHECK(targets.at("default/empty") == kproxy::cli::ServiceHealthTarget{"default", "empty", 32003, 0});
}

TEST_CASE("listeners open, answer, follow endpoint changes and close with the service", "[unit][healthcheck]") {
  ops_test::QuietLog quiet;
  EventLoop loop;
  loop.start();
  std::atomic<bool> proxyHealthy = true;
  ServiceHealthServers servers(loop, [&] { return proxyHealthy.load(); }, {"127.0.0.1"});
  const ReservedPort reserved;
  const int port = reserved.port();
  auto svc = ops_test::localLoadBalancer("web", port, "10.96.0.10");

  onLoop(loop, [&] { servers.reconcile(*ops_test::snapshotOf({svc}, {ops_test::sliceFor("web", {{"10.244.1.1"}})})); });
  CHECK(onLoop(loop, [&] { return servers.openPorts(); }) == std::vector<std::uint16_t>{static_cast<std::uint16_t>(port)});
  std::string r = httpGet(port);
  CHECK(r.rfind("HTTP/1.0 200", 0) == 0);
  CHECK(r.find("X-Load-Balancing-Endpoint-Weight: 1\r\n") != std::string::npos);
  CHECK(r.find("\"localEndpoints\": 1") != std::string::npos);

  proxyHealthy = false;
  r = httpGet(port);
  CHECK(r.rfind("HTTP/1.0 503", 0) == 0);
  CHECK(r.find("\"serviceProxyHealthy\": false") != std::string::npos);
  proxyHealthy = true;

  onLoop(loop, [&] { servers.reconcile(*ops_test::snapshotOf({svc}, {ops_test::sliceFor("web", {{"10.244.2.1", false}})})); });
  r = httpGet(port);
  CHECK(r.rfind("HTTP/1.0 503", 0) == 0);
  CHECK(r.find("\"localEndpoints\": 0") != std::string::npos);

  onLoop(loop, [&] { servers.reconcile(*ops_test::snapshotOf({}, {})); });
  CHECK(onLoop(loop, [&] { return servers.openPorts(); }).empty());
  CHECK(httpGet(port).empty());
  onLoop(loop, [&] { servers.closeAll(); });
  loop.stop();
}

TEST_CASE("a port already taken is reported, not fatal, and retried on the next reconcile", "[unit][healthcheck]") {
  ops_test::QuietLog quiet;
  EventLoop loop;
  loop.start();
  ServiceHealthServers servers(loop, [] { return true; }, {"127.0.0.1"});
  const ReservedPort reserved;
  const int port = reserved.port();
  kproxy::cli::HttpServer squatter(loop, "squatter", [](const kproxy::cli::HttpRequest&) {
    return kproxy::cli::HttpResponse{200, "text/plain", {}, "squatter"};
  });
  REQUIRE(onLoop(loop, [&] { return squatter.listen("127.0.0.1", static_cast<std::uint16_t>(port)).has_value(); }));

  auto snapshot = ops_test::snapshotOf({ops_test::localLoadBalancer("web", port, "10.96.0.10")},
                                       {ops_test::sliceFor("web", {{"10.244.1.1"}})});
  onLoop(loop, [&] { servers.reconcile(*snapshot); });
  CHECK(onLoop(loop, [&] { return servers.openPorts(); }).empty());
  CHECK(httpGet(port).find("squatter") != std::string::npos);

  onLoop(loop, [&] { squatter.close(); });
  onLoop(loop, [&] { servers.reconcile(*snapshot); });
  CHECK(onLoop(loop, [&] { return servers.openPorts(); }).size() == 1);
  CHECK(httpGet(port).rfind("HTTP/1.0 200", 0) == 0);
  onLoop(loop, [&] { servers.closeAll(); });
  loop.stop();
}
