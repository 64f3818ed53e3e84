// The HTTP server's limits, over real loopback sockets: methods, header and body sizes, the
// read timeout and the connection cap (the longest waiting connection makes room).
#include "http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "ops_fixtures.h"

using kproxy::cli::EventLoop;
using kproxy::cli::HttpLimits;
using kproxy::cli::HttpRequest;
using kproxy::cli::HttpResponse;
using kproxy::cli::HttpServer;
using namespace std::chrono_literals;

namespace {

// How long a client waits for the server before it takes it for a hang: a ceiling, never a
// measure (the machine may be slow, loaded, or running sanitizers).
constexpr auto kHang = 60s;

// A client socket with a receive timeout of kHang, so a test that fails cannot hang.
struct Client {
  int fd = -1;
  explicit Client(std::uint16_t port) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    timeval tv{std::chrono::duration_cast<std::chrono::seconds>(kHang).count(), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~Client() { close(fd); }
  Client(const Client&) = delete;
  void send(const std::string& data) const {
    for (std::size_t off = 0; off < data.size();) {
      ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may close early; the answer says why
      off += static_cast<std::size_t>(n);
    }
  }
  /// Everything until the server closes (or kHang passes).
  std::string readAll() const {
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }
  /// True when the server has closed the connection (EOF or reset) within kHang.
  bool closedByServer() const {
    char c;
    ssize_t n = ::recv(fd, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }
};

struct Fixture {
  explicit Fixture(HttpLimits limits) : loop(limits) {
    server = std::make_unique<HttpServer>(loop, "test", [](const HttpRequest& req) {
      return HttpResponse{200, "text/plain", {}, "ok " + req.method};
    });
    REQUIRE(server->listen("127.0.0.1", 0));
    port = server->port();
    loop.start();
  }
  ~Fixture() {
    loop.stop();
    server.reset();
  }
  EventLoop loop;
  std::unique_ptr<HttpServer> server;
  std::uint16_t port = 0;
};

std::string statusLine(const std::string& response) { return response.substr(0, response.find("\r\n")); }

// `rounds` probes of /healthz, one connection each, every one answered 200.
void checkProbesAnswered(std::uint16_t port, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    Client probe(port);
    probe.send("GET /healthz HTTP/1.0\r\n\r\n");
    CHECK(statusLine(probe.readAll()) == "HTTP/1.0 200 OK");
  }
}

}  // namespace

TEST_CASE("http server: only GET and HEAD; other methods get 405 with Allow", "[unit][http]") {
  ops_test::QuietLog quiet;
  Fixture f({});
  {
    Client c(f.port);
    c.send("GET /x HTTP/1.0\r\n\r\n");
    auto r = c.readAll();
    CHECK(statusLine(r) == "HTTP/1.0 200 OK");
    CHECK(r.ends_with("ok GET"));
  }
  {
    Client c(f.port);
    c.send("HEAD /x HTTP/1.0\r\n\r\n");
    auto r = c.readAll();
    CHECK(statusLine(r) == "HTTP/1.0 200 OK");
    CHECK(r.find("ok HEAD") == std::string::npos);
  }
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
    INFO(method);
    Client c(f.port);
    c.send(std::string(method) + " /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}");
    auto r = c.readAll();
    CHECK(statusLine(r) == "HTTP/1.1 405 Method Not Allowed");
    CHECK(r.find("Allow: GET, HEAD\r\n") != std::string::npos);
    CHECK(r.find("Connection: close\r\n") != std::string::npos);
  }
}

TEST_CASE("http server: PUT reaches the handler, with its body, only on an allowed path", "[unit][http]") {
  ops_test::QuietLog quiet;
  EventLoop loop;
  HttpServer server(loop, "test", [](const HttpRequest& req) {
    return HttpResponse{200, "text/plain", {}, req.method + " " + req.path() + " body=" + req.body};
  });
  server.allowPut("/debug/flags/v");
  REQUIRE(server.listen("127.0.0.1", 0));
  loop.start();
  {
    Client c(server.port());
    c.send("PUT /debug/flags/v HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 1\r\n\r\n4");
    auto r = c.readAll();
    CHECK(statusLine(r) == "HTTP/1.1 200 OK");
    CHECK(r.ends_with("PUT /debug/flags/v body=4"));
  }
  for (const char* path : {"/debug/flags/vv", "/debug/flags", "/metrics"}) {
    INFO(path);
    Client c(server.port());
    c.send(std::string("PUT ") + path + " HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\n4");
    CHECK(statusLine(c.readAll()) == "HTTP/1.1 405 Method Not Allowed");
  }
  {
    Client c(server.port());
    c.send("GET /debug/flags/v HTTP/1.0\r\n\r\n");
    auto r = c.readAll();
    CHECK(r.ends_with("GET /debug/flags/v body="));  // a GET's body is never handed over
  }
  loop.stop();
}

TEST_CASE("http server: oversized headers 431, bodies 413, garbage 400", "[unit][http]") {
  ops_test::QuietLog quiet;
  HttpLimits limits;
  limits.maxHeaderBytes = 1024;
  limits.maxBodyBytes = 16;
  Fixture f(limits);
  {
    Client c(f.port);
    c.send("GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n");
    CHECK(statusLine(c.readAll()) == "HTTP/1.1 431 Request Header Fields Too Large");
  }
  {
    Client c(f.port);
    c.send("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, 'b'));
    CHECK(statusLine(c.readAll()) == "HTTP/1.1 413 Payload Too Large");
  }
  {
    Client c(f.port);  // a small body is read and ignored
    c.send("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbody");
    CHECK(statusLine(c.readAll()) == "HTTP/1.1 200 OK");
  }
  {
    Client c(f.port);
    c.send("NOT HTTP AT ALL\r\n\r\n");
    CHECK(statusLine(c.readAll()).find(" 400 ") != std::string::npos);
  }
}

TEST_CASE("http server: a request that does not arrive within the read timeout is cut off", "[unit][http]") {
  ops_test::QuietLog quiet;
  HttpLimits limits;
  limits.readTimeout = 300ms;
  Fixture f(limits);
  Client slow(f.port);
  auto t0 = std::chrono::steady_clock::now();
  slow.send("GET / HTTP/1.1\r\n");
  // One header byte every 50 ms, until the server closes, keeps the connection busy but never
  // completes the request: a timeout that each byte restarted would never cut it off, and the
  // read below would wait out kHang.
  std::atomic<bool> stop{false};
  auto sender = std::async(std::launch::async, [&] {
    while (!stop) {
      std::this_thread::sleep_for(50ms);
      if (::send(slow.fd, "X", 1, MSG_NOSIGNAL) != 1) return;
    }
  });
  CHECK(slow.closedByServer());
  auto elapsed = std::chrono::steady_clock::now() - t0;
  stop = true;
  sender.get();
  CHECK(elapsed >= 250ms);  // not before the timeout (a lower bound holds on any machine)
}

TEST_CASE("http server: at the connection cap the longest waiting connection makes room", "[unit][http]") {
  ops_test::QuietLog quiet;
  HttpLimits limits;
  limits.maxConnections = 3;
  Fixture f(limits);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(std::make_unique<Client>(f.port));
    std::this_thread::sleep_for(20ms);  // accepted in this order
  }
  checkProbesAnswered(f.port, 5);
  // The first idle connection was the longest waiting: it went first.
  CHECK(idle[0]->closedByServer());
}

// 500 client sockets (and at most 64 accepted ones) stay within the common soft limit of 1024
// descriptors; tests/program/http_limits.sh holds a thousand against the real binary.
TEST_CASE("http server: hundreds of idle connections cannot starve a probe", "[unit][http]") {
  ops_test::QuietLog quiet;
  HttpLimits limits;
  limits.maxConnections = 64;
  Fixture f(limits);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 500; ++i) idle.push_back(std::make_unique<Client>(f.port));
  checkProbesAnswered(f.port, 10);
}
