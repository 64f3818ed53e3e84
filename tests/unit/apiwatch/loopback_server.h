#pragma once
// A plain-HTTP listener on 127.0.0.1 (port 0) for the fake API servers of the ApiSource tests:
// the accept loop, a thread per connection, reading the request head, and shutdown. What to
// answer is the owner's handler.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "kproxy/apiwatch/kubeconfig.h"

namespace kproxy::testing {

/// Sends all of `data`; false when the peer went away first.
inline bool sendAll(int fd, std::string_view data) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

/// A whole HTTP/1.1 response with a JSON body, after which the connection closes.
/// `status` is the status line's code and reason, e.g. "200 OK".
inline std::string jsonResponse(std::string_view status, std::string_view body,
                                std::string_view extraHeaders = "") {
  return fmt::format("HTTP/1.1 {}\r\nContent-Type: application/json\r\n{}Content-Length: {}\r\n"
                     "Connection: close\r\n\r\n{}",
                     status, extraHeaders, body.size(), body);
}

/// The head of a chunked JSON response (a watch stream); chunks follow.
inline constexpr std::string_view kChunkedJsonHead =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

/// Listens on 127.0.0.1 at a port the kernel picks and calls the handler on a thread of its own
/// for each connection, with the request line's target ("/api/v1/services?limit=2"); closes the
/// connection when the handler returns. The destructor stops accepting and joins every thread:
/// an owner whose handlers block must wake them first, so declare the server as the owner's
/// last member and wake the handlers in the owner's destructor.
class LoopbackServer {
 public:
  using Handler = std::function<void(int fd, const std::string& target)>;

  explicit LoopbackServer(Handler handler) : handler_(std::move(handler)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_, 16) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~LoopbackServer() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    acceptor_.join();
    for (auto& t : connections_) t.join();
  }
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  int port() const { return port_; }

 private:
  void acceptLoop() {
    for (;;) {
      int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::lock_guard lock(mutex_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      connections_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        ::close(fd);
        return;
      }
      request.append(buf, static_cast<std::size_t>(n));
    }
    auto sp1 = request.find(' ');
    auto sp2 = request.find(' ', sp1 + 1);
    handler_(fd, request.substr(sp1 + 1, sp2 - sp1 - 1));
    ::close(fd);
  }

  Handler handler_;
  int listener_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mutex_;  // guards stopping_ and connections_
  bool stopping_ = false;
  std::vector<std::thread> connections_;
};

/// ApiSource's client settings for a server on 127.0.0.1:`port` over plain HTTP, with no rate
/// limit (qps 0): a test must not wait on the token bucket.
inline apiwatch::ClientConfig loopbackClientConfig(int port) {
  apiwatch::ClientConfig config;
  config.serverText = fmt::format("http://127.0.0.1:{}", port);
  config.server = *apiwatch::parseServerUrl(config.serverText);
  config.qps = 0;
  return config;
}

}  // namespace kproxy::testing
