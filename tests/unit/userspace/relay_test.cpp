// TcpRelay over loopback sockets in this process.
#include "kproxy/userspace/relay.h"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/ip/tcp.hpp>

using namespace kproxy::userspace;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

/// How long a test waits for the relay to finish before it takes it for a hang: a ceiling,
/// never a measure (the machine may be slow, loaded, or running sanitizers).
constexpr auto kHang = std::chrono::seconds(60);

/// A connected pair of loopback TCP sockets.
std::pair<tcp::socket, tcp::socket> connectedPair(asio::io_context& io) {
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  tcp::socket a(io), b(io);
  a.connect(acceptor.local_endpoint());
  acceptor.accept(b);
  return {std::move(a), std::move(b)};
}

std::string readAll(tcp::socket& s) {
  std::string out;
  char buf[4096];
  boost::system::error_code ec;
  for (;;) {
    auto n = s.read_some(asio::buffer(buf), ec);
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

struct Fixture {
  asio::io_context io;
  // The application's ends (blocking, used from the test thread) and the relay's ends.
  tcp::socket client{io}, endpoint{io};
  std::shared_ptr<TcpRelay> relay;
  std::atomic<std::uint64_t> toEndpoint{0}, toClient{0};
  std::promise<void> done;

  explicit Fixture(bool splice) {
    auto [c, relayClient] = connectedPair(io);
    auto [relayEndpoint, e] = connectedPair(io);
    client = std::move(c);
    endpoint = std::move(e);
    TcpRelay::Options options;
    options.splice = splice;
    relay = std::make_shared<TcpRelay>(
        std::move(relayClient), std::move(relayEndpoint), options,
        [this](std::uint64_t a, std::uint64_t b) {
          toEndpoint += a;
          toClient += b;
        },
        [this] { done.set_value(); });
  }
};

/// Runs the io_context on its own thread for the test's duration.
struct Runner {
  explicit Runner(asio::io_context& io)
      : io_(io), guard_(asio::make_work_guard(io)), thread_([&io] {
          blockSigpipeOnThisThread();
          io.run();
        }) {}
  ~Runner() {
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  asio::io_context& io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("relay: both directions, half-close passed on, end when both sides closed", "[unit]") {
  for (bool splice : {true, false}) {
    DYNAMIC_SECTION((splice ? "splice" : "buffer")) {
      Fixture f(splice);
      auto finished = f.done.get_future();
      f.relay->start();
      Runner run(f.io);
      // A request larger than a pipe, then the client's half-close.
      std::string request(300000, 'q');
      asio::write(f.client, asio::buffer(request));
      f.client.shutdown(tcp::socket::shutdown_send);
      CHECK(readAll(f.endpoint) == request);  // EOF reached the endpoint
      // The endpoint still answers after the client's FIN, then closes.
      std::string reply = "reply after half-close";
      asio::write(f.endpoint, asio::buffer(reply));
      f.endpoint.shutdown(tcp::socket::shutdown_send);
      CHECK(readAll(f.client) == reply);
      REQUIRE(finished.wait_for(kHang) == std::future_status::ready);
      CHECK(f.toEndpoint.load() == request.size());
      CHECK(f.toClient.load() == reply.size());
    }
  }
}

TEST_CASE("relay: a reset on one side resets the other", "[unit]") {
  Fixture f(true);
  auto finished = f.done.get_future();
  f.relay->start();
  Runner run(f.io);
  asio::write(f.client, asio::buffer(std::string("hello")));
  char buf[5];
  asio::read(f.endpoint, asio::buffer(buf));
  f.endpoint.set_option(asio::socket_base::linger(true, 0));
  f.endpoint.close();
  REQUIRE(finished.wait_for(kHang) == std::future_status::ready);
  boost::system::error_code ec;
  char one;
  f.client.read_some(asio::buffer(&one, 1), ec);
  CHECK(ec == asio::error::connection_reset);
}

TEST_CASE("relay: the idle timeout closes a silent connection", "[unit]") {
  asio::io_context io;
  auto [c, relayClient] = connectedPair(io);
  auto [relayEndpoint, e] = connectedPair(io);
  std::promise<void> done;
  TcpRelay::Options options;
  options.idleTimeout = std::chrono::milliseconds(100);
  auto relay = std::make_shared<TcpRelay>(std::move(relayClient), std::move(relayEndpoint), options, nullptr,
                                          [&] { done.set_value(); });
  relay->start();
  Runner run(io);
  REQUIRE(done.get_future().wait_for(kHang) == std::future_status::ready);
  CHECK(readAll(c).empty());  // closed without data
  CHECK(readAll(e).empty());
}
