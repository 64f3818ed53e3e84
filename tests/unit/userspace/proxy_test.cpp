// ProxyServer over loopback in this process: the listeners are reached directly at their
// ports (no redirect), the endpoints are loopback servers run by the test.
#include "kproxy/userspace/proxy.h"
#include "kproxy/userspace/relay.h"

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

using namespace kproxy::userspace;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using namespace std::chrono_literals;

namespace {

class CountingObserver final : public ProxyObserver {
 public:
  void active(const std::string&, bool, int delta) override { add("active", delta); }
  void attempt(const std::string&, bool retry) override {
    add("attempts", 1);
    if (retry) add("retries", 1);
  }
  void refused(const std::string&, bool, RefusedReason reason) override { add(std::string(refusedReasonName(reason)), 1); }
  void bytes(const std::string&, bool, std::uint64_t a, std::uint64_t b) override {
    add("toEndpoint", static_cast<int>(a));
    add("toClient", static_cast<int>(b));
  }
  int get(const std::string& k) {
    std::lock_guard lock(mu_);
    return counts_[k];
  }

 private:
  void add(const std::string& k, int n) {
    std::lock_guard lock(mu_);
    counts_[k] += n;
  }
  std::mutex mu_;
  std::map<std::string, int> counts_;
};

/// A loopback TCP server on its own thread: each connection gets "NAME:" + what it sent
/// (one read), then a close; or it is held open (hold = true) until the server stops.
class EchoServer {
 public:
  EchoServer(std::string name, bool hold = false)
      : name_(std::move(name)), hold_(hold), acceptor_(io_, tcp::endpoint(asio::ip::address_v4::loopback(), 0)) {
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~EchoServer() {
    io_.stop();
    thread_.join();
  }
  Target target() const { return Target{"127.0.0.1", acceptor_.local_endpoint().port()}; }
  int accepted() const { return accepted_.load(); }

 private:
  void accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
      if (ec) return;
      ++accepted_;
      auto sock = std::make_shared<tcp::socket>(std::move(s));
      held_.push_back(sock);
      if (!hold_) {
        auto buf = std::make_shared<std::array<char, 256>>();
        sock->async_read_some(asio::buffer(*buf), [this, sock, buf](const boost::system::error_code& e, std::size_t n) {
          if (e) return;
          auto reply = std::make_shared<std::string>(name_ + ":" + std::string(buf->data(), n));
          asio::async_write(*sock, asio::buffer(*reply), [sock, reply](const boost::system::error_code&, std::size_t) {
            boost::system::error_code ignored;
            sock->shutdown(tcp::socket::shutdown_send, ignored);
          });
        });
      }
      accept();
    });
  }
  std::string name_;
  bool hold_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::vector<std::shared_ptr<tcp::socket>> held_;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

/// A loopback port nothing listens on: connections to it are refused.
Target refusingTarget() {
  asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  Target t{"127.0.0.1", a.local_endpoint().port()};
  return t;  // closed on return
}

/// How long a test waits for something before it takes it for a hang: a ceiling, never a
/// measure (the machine may be slow, loaded, or running sanitizers).
constexpr auto kHang = 60s;

/// Blocking reads on `s` give up after kHang (a test fails instead of hanging). Asio's own
/// blocking reads wait again on a timeout, so the tests read with recv(2).
template <typename Socket>
void readTimeout(Socket& s) {
  timeval tv{std::chrono::duration_cast<std::chrono::seconds>(kHang).count(), 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/// recv(2) on `s`: bytes read, 0 at the end, -1 with errno (EAGAIN after the timeout).
template <typename Socket>
ssize_t receive(Socket& s, char* buf, std::size_t size) {
  return ::recv(s.native_handle(), buf, size, 0);
}

/// Polls `done` until it holds or kHang passes (reports of the proxy's thread may come just
/// after a reply).
template <typename Fn>
bool eventually(Fn done) {
  const auto deadline = std::chrono::steady_clock::now() + kHang;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

/// One request through the proxy: the reply, or "ERROR: ..." when the connection failed.
std::string request(std::uint16_t port, const std::string& body = "hi") {
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(asio::ip::address_v4::loopback(), port), ec);
  if (ec) return "ERROR: " + ec.message();
  readTimeout(s);
  asio::write(s, asio::buffer(body), ec);
  // A reset that comes before the write is reported by the write (recv then sees the end).
  if (ec) return "ERROR: " + ec.message();
  std::string out;
  char buf[512];
  for (;;) {
    auto n = receive(s, buf, sizeof buf);
    // A read that waited out kHang is a hang, not an answer (not even a reset).
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "HUNG: no answer within the ceiling";
    if (n < 0) return std::string("ERROR: ") + std::strerror(errno);
    if (n == 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

ListenerSpec spec(std::string id, std::vector<Target> endpoints, bool udp = false) {
  return ListenerSpec{std::move(id), false, udp, "ns/svc:p", std::move(endpoints), 0s};
}

/// Ends this run as skipped (exit status 77: the test's SKIP_RETURN_CODE in CMakeLists.txt),
/// saying why. Only for a test case that runs alone in its ctest entry (its tag is a MAY_SKIP
/// tag of kproxy_add_test), so that no other case's result is lost.
[[noreturn]] void skipRun(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  std::_Exit(77);
}

/// While it lives, the calling thread is in a network namespace of its own with lo up (so ::1
/// and 127.0.0.1 exist), as are the threads it starts meanwhile; the thread's namespace before
/// is restored after. Never the host's namespace: a fresh one, gone with its last thread.
class OwnLoopback {
 public:
  /// Null, with the reason in `why`, where this process cannot have one (it needs
  /// CAP_SYS_ADMIN).
  static std::unique_ptr<OwnLoopback> enter(std::string& why) {
    const int before = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (before < 0) {
      why = std::string("/proc/thread-self/ns/net: ") + std::strerror(errno);
      return nullptr;
    }
    if (::unshare(CLONE_NEWNET) != 0) {
      why = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
      ::close(before);
      return nullptr;
    }
    std::unique_ptr<OwnLoopback> own(new OwnLoopback(before));
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    bool up = fd >= 0 && ::ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    if (up) {
      ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
      up = ::ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    }
    const int err = errno;
    if (fd >= 0) ::close(fd);
    // Having unshared, the thread is no longer in the host's namespace: a failure here is the
    // test's, not a reason to skip.
    if (!up) FAIL("bringing lo up in our own network namespace: " << std::strerror(err));
    return own;
  }
  ~OwnLoopback() {
    if (::setns(before_, CLONE_NEWNET) != 0) {
      std::cerr << "cannot return to the network namespace before: " << std::strerror(errno) << std::endl;
      std::abort();  // the rest of the run would not be where it believes it is
    }
    ::close(before_);
  }
  OwnLoopback(const OwnLoopback&) = delete;
  OwnLoopback& operator=(const OwnLoopback&) = delete;

 private:
  explicit OwnLoopback(int before) : before_(before) {}
  int before_;
};

}  // namespace

TEST_CASE("proxy: a refused endpoint is retried on the next; every connection succeeds", "[unit]") {
  EchoServer b("b");
  auto observer = std::make_shared<CountingObserver>();
  ProxyServer proxy(ProxySettings{}, observer);
  auto ports = proxy.update({spec("l", {refusingTarget(), b.target()})});
  REQUIRE(ports);
  const auto port = ports->at("l");
  for (int i = 0; i < 4; ++i) CHECK(request(port, "x" + std::to_string(i)) == "b:x" + std::to_string(i));
  CHECK(b.accepted() == 4);
  // Round robin puts the refusing endpoint first for every other connection.
  CHECK(observer->get("attempts") == 6);
  CHECK(observer->get("retries") == 2);
  CHECK(observer->get("endpoints_failed") == 0);
  CHECK(eventually([&] { return observer->get("toEndpoint") == 8 && observer->get("toClient") == 16; }));
}

// Not in a sanitizer build (KPROXY_SANITIZE), where CI's Release build runs it: with no
// descriptor free, the sanitizers' checks of virtual calls cannot open the pipe they probe memory
// with, and report false errors (fmt's buffer, std::packaged_task) in the window until the limit
// is restored.
#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("proxy: out of descriptors, the error names the limit and what the mode needs", "[unit]") {
  auto observer = std::make_shared<CountingObserver>();
  ProxyServer proxy(ProxySettings{}, observer);
  std::size_t open = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++open;
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &before) == 0);
  rlimit low = before;
  low.rlim_cur = open + 4;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<ListenerSpec> specs;
  for (int i = 0; i < 16; ++i) specs.push_back(spec("l" + std::to_string(i), {refusingTarget()}));
  auto ports = proxy.update(specs);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &before) == 0);
  REQUIRE_FALSE(ports);
  INFO(ports.error().message());
  CHECK(ports.error().errnum == EMFILE);
  CHECK_THAT(ports.error().message(), Catch::Contains("TCP listener for l") &&
                                          Catch::Contains(fmt::format("may open {} descriptors", low.rlim_cur)) &&
                                          Catch::Contains("LimitNOFILE"));
}
#endif

TEST_CASE("proxy: when every endpoint refuses, the client is reset", "[unit]") {
  auto observer = std::make_shared<CountingObserver>();
  ProxyServer proxy(ProxySettings{}, observer);
  auto ports = proxy.update({spec("l", {refusingTarget(), refusingTarget()}), spec("empty", {})});
  REQUIRE(ports);
  CHECK(request(ports->at("l")).starts_with("ERROR"));
  CHECK(request(ports->at("empty")).starts_with("ERROR"));
  CHECK(eventually([&] { return observer->get("endpoints_failed") == 1 && observer->get("no_endpoints") == 1; }));
  CHECK(observer->get("retries") == 1);
}

TEST_CASE("proxy: the connection cap resets connections over it", "[unit]") {
  EchoServer held("held", true);
  auto observer = std::make_shared<CountingObserver>();
  ProxySettings settings;
  settings.maxConnections = 2;
  ProxyServer proxy(settings, observer);
  auto ports = proxy.update({spec("l", {held.target()})});
  REQUIRE(ports);
  asio::io_context io;
  std::vector<tcp::socket> open;
  for (int i = 0; i < 2; ++i) {
    open.emplace_back(io);
    open.back().connect(tcp::endpoint(asio::ip::address_v4::loopback(), ports->at("l")));
  }
  REQUIRE(eventually([&] { return held.accepted() >= 2; }));
  REQUIRE(held.accepted() == 2);
  CHECK(proxy.tcpConnections() == 2);
  CHECK(request(ports->at("l")).starts_with("ERROR"));
  CHECK(eventually([&] { return observer->get("connection_limit") == 1; }));
  CHECK(held.accepted() == 2);
}

TEST_CASE("proxy: a new pool keeps the listener; connections to a removed endpoint close after the grace", "[unit]") {
  EchoServer held("held", true), other("other");
  ProxySettings settings;
  settings.removedEndpointGrace = 100ms;
  ProxyServer proxy(settings, nullptr);
  auto ports = proxy.update({spec("l", {held.target()})});
  REQUIRE(ports);
  asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::address_v4::loopback(), ports->at("l")));
  readTimeout(s);
  REQUIRE(eventually([&] { return held.accepted() >= 1; }));
  REQUIRE(proxy.tcpConnections() == 1);
  auto again = proxy.update({spec("l", {other.target()})});
  REQUIRE(again);
  CHECK(again->at("l") == ports->at("l"));
  char c;
  CHECK(receive(s, &c, 1) == 0);  // blocks until the proxy closes it (-1 after kHang: it did not)
  CHECK(request(ports->at("l")) == "other:hi");
  proxy.retain({});
  CHECK(request(ports->at("l")).starts_with("ERROR"));
}

TEST_CASE("proxy: UDP flows, replies from the listener's port, one endpoint per client", "[unit]") {
  asio::io_context eio;
  auto echo = [&](const std::string& name) {
    auto s = std::make_shared<udp::socket>(eio, udp::endpoint(asio::ip::address_v4::loopback(), 0));
    auto buf = std::make_shared<std::array<char, 512>>();
    auto from = std::make_shared<udp::endpoint>();
    auto loop = std::make_shared<std::function<void()>>();
    // The function holds itself only weakly (no cycle): the pending receive keeps it alive,
    // and the io_context's end destroys that.
    std::weak_ptr<std::function<void()>> weak = loop;
    *loop = [s, buf, from, name, weak] {
      auto self = weak.lock();
      if (!self) return;
      s->async_receive_from(asio::buffer(*buf), *from, [s, buf, from, name, self](const boost::system::error_code& ec, std::size_t n) {
        if (ec) return;
        s->send_to(asio::buffer(name + ":" + std::string(buf->data(), n)), *from);
        (*self)();
      });
    };
    (*loop)();
    return s;
  };
  auto a = echo("a"), b = echo("b");
  std::thread t([&] { eio.run(); });
  auto observer = std::make_shared<CountingObserver>();
  ProxySettings settings;
  settings.udpIdleTimeout = 200ms;
  ProxyServer proxy(settings, observer);
  auto ports = proxy.update({spec("u", {Target{"127.0.0.1", a->local_endpoint().port()},
                                        Target{"127.0.0.1", b->local_endpoint().port()}},
                                  true)});
  REQUIRE(ports);
  asio::io_context io;
  std::map<std::string, int> seen;
  for (int i = 0; i < 4; ++i) {
    udp::socket c(io, udp::endpoint(asio::ip::address_v4::loopback(), 0));
    c.connect(udp::endpoint(asio::ip::address_v4::loopback(), ports->at("u")));  // replies only from there
    readTimeout(c);
    for (int k = 0; k < 2; ++k) {
      c.send(asio::buffer(std::string("ping")));
      char buf[64];
      auto n = receive(c, buf, sizeof buf);
      REQUIRE(n > 0);
      std::string reply(buf, static_cast<std::size_t>(n));
      ++seen[reply.substr(0, reply.find(':'))];
      CHECK(reply.ends_with(":ping"));
    }
  }
  CHECK(seen["a"] == 4);  // a client stays with its endpoint; clients alternate
  CHECK(seen["b"] == 4);
  CHECK(proxy.udpFlows() == 4);
  CHECK(eventually([&] { return proxy.udpFlows() == 0; }));  // idle timeout
  eio.stop();
  t.join();
}

/// Threads of this process that block SIGPIPE (/proc/self/task/*/status, SigBlk).
int threadsBlockingSigpipe() {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line))
      if (line.starts_with("SigBlk:") && ((std::stoull(line.substr(7), nullptr, 16) >> (SIGPIPE - 1)) & 1) != 0) ++n;
  }
  return n;
}

TEST_CASE("proxy: its thread blocks SIGPIPE, which splice(2) into a closed peer would raise", "[unit]") {
  // With the default disposition a SIGPIPE ends the whole process (kproxy), so the relays' thread
  // must block it; the host's own disposition stays as it is.
  const int before = threadsBlockingSigpipe();
  {
    ProxyServer proxy(ProxySettings{}, nullptr);
    // The thread blocks it first thing, but it may not have run yet: wait for it.
    CHECK(eventually([&] { return threadsBlockingSigpipe() == before + 1; }));
  }
  // And a write to a closed peer on such a thread fails with EPIPE instead.
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
  ::close(pair[1]);
  int err = 0;
  std::thread([&] {
    blockSigpipeOnThisThread();
    if (::write(pair[0], "x", 1) < 0) err = errno;
  }).join();
  ::close(pair[0]);
  CHECK(err == EPIPE);
}

TEST_CASE("proxy: an endpoint that goes away mid-transfer ends the connection, not the process", "[unit]") {
  // splice(2) into the closed endpoint raises SIGPIPE unless the proxy's thread blocks it; with
  // the default disposition this test binary would die here.
  asio::io_context eio;
  tcp::acceptor acceptor(eio, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  std::thread closer([&] {
    tcp::socket s(eio);
    acceptor.accept(s);
    char buf[1024];
    s.read_some(asio::buffer(buf));  // some data arrived: the relay is writing
    s.close();
  });
  ProxyServer proxy(ProxySettings{}, nullptr);
  auto ports = proxy.update({spec("l", {Target{"127.0.0.1", acceptor.local_endpoint().port()}})});
  REQUIRE(ports);
  asio::io_context io;
  tcp::socket c(io);
  c.connect(tcp::endpoint(asio::ip::address_v4::loopback(), ports->at("l")));
  std::string chunk(1 << 16, 'x');
  boost::system::error_code ec;
  for (int i = 0; i < 2000 && !ec; ++i) asio::write(c, asio::buffer(chunk), ec);
  CHECK(ec);  // the proxy reset the client
  closer.join();
  CHECK(eventually([&] { return proxy.tcpConnections() == 0; }));
}

TEST_CASE("proxy: IPv6 listeners (v6 only) relay TCP and UDP over ::1", "[unit][ipv6-loopback]") {
  // A loopback of its own where it can (root), so that the host's IPv6 setup does not matter;
  // else the host's ::1; else this ctest entry is skipped, saying why.
  std::string noOwn;
  auto own = OwnLoopback::enter(noOwn);
  asio::io_context eio;
  boost::system::error_code probe;
  tcp::acceptor acceptor(eio);
  acceptor.open(tcp::v6(), probe);
  if (!probe) acceptor.bind(tcp::endpoint(asio::ip::address_v6::loopback(), 0), probe);
  if (probe && own) FAIL("no ::1 in a network namespace of our own with lo up: " << probe.message());
  if (probe) skipRun("no IPv6 loopback here (" + probe.message() + "), and no namespace of our own: " + noOwn);
  acceptor.listen();
  udp::socket echo(eio, udp::endpoint(asio::ip::address_v6::loopback(), 0));
  std::thread server([&] {
    tcp::socket s(eio);
    acceptor.accept(s);
    char buf[64];
    auto n = s.read_some(asio::buffer(buf));
    asio::write(s, asio::buffer("v6:" + std::string(buf, n)));
    s.shutdown(tcp::socket::shutdown_send);
    udp::endpoint from;
    n = echo.receive_from(asio::buffer(buf), from);
    echo.send_to(asio::buffer("v6:" + std::string(buf, n)), from);
  });
  ProxyServer proxy(ProxySettings{}, nullptr);
  ListenerSpec t{"t6", true, false, "ns/svc:p", {Target{"::1", acceptor.local_endpoint().port()}}, 0s};
  ListenerSpec u{"u6", true, true, "ns/svc:p", {Target{"::1", echo.local_endpoint().port()}}, 0s};
  auto ports = proxy.update({t, u});
  REQUIRE(ports);
  asio::io_context io;
  tcp::socket c(io);
  c.connect(tcp::endpoint(asio::ip::address_v6::loopback(), ports->at("t6")));
  readTimeout(c);
  asio::write(c, asio::buffer(std::string("hi")));
  char buf[64];
  std::string got;
  for (ssize_t n; (n = receive(c, buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  CHECK(got == "v6:hi");
  // v6 only: the IPv4 wildcard does not answer on the same port.
  tcp::socket c4(io);
  boost::system::error_code ec;
  c4.connect(tcp::endpoint(asio::ip::address_v4::loopback(), ports->at("t6")), ec);
  CHECK(ec);
  udp::socket uc(io, udp::endpoint(asio::ip::address_v6::loopback(), 0));
  uc.connect(udp::endpoint(asio::ip::address_v6::loopback(), ports->at("u6")));
  readTimeout(uc);
  uc.send(asio::buffer(std::string("ping")));
  auto n = receive(uc, buf, sizeof buf);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<std::size_t>(n)) == "v6:ping");
  server.join();
}
