#include "kproxy/userspace/proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "asio.h"
#include "kproxy/userspace/relay.h"

namespace kproxy::userspace {

std::string_view refusedReasonName(RefusedReason reason) {
  switch (reason) {
    case RefusedReason::kNoEndpoints: return "no_endpoints";
    case RefusedReason::kConnectionLimit: return "connection_limit";
    case RefusedReason::kEndpointsFailed: return "endpoints_failed";
  }
  return "unknown";
}

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using Clock = std::chrono::steady_clock;

/// A listener that could not be opened. Out of descriptors (EMFILE, ENFILE), the error says
/// what the mode needs and the limit it met: one socket per listener, and at 30,000 Service
/// ports a default limit is reached before the first connection.
std::unexpected<core::Error> listenerError(std::string_view what, std::string_view id, int errnum) {
  std::string context = fmt::format("userspace: {} for {}", what, id);
  if (errnum == EMFILE || errnum == ENFILE) {
    rlimit limit{};
    if (errnum == EMFILE && ::getrlimit(RLIMIT_NOFILE, &limit) == 0)
      context += fmt::format(" (this process may open {} descriptors", limit.rlim_cur);
    else
      context += " (the system's open files are exhausted";
    context += "; userspace mode holds one socket for each Service port and address, and two sockets and two "
               "pipes for each relayed connection: raise the limit, LimitNOFILE or the container runtime's)";
  }
  return core::makeError(core::ErrorCategory::kKernel, std::move(context), errnum);
}

/// What every listener of one server shares; touched on the io thread only (the counters are
/// read by tests from others).
struct Shared {
  asio::io_context& io;
  const ProxySettings& settings;
  ProxyObserver* observer;
  std::atomic<std::size_t> tcpConnections{0};
  std::atomic<std::size_t> udpFlows{0};
};

std::optional<asio::ip::address> parseAddress(const std::string& ip) {
  boost::system::error_code ec;
  auto a = asio::ip::make_address(ip, ec);
  if (ec) return std::nullopt;
  return a;
}

template <typename Socket>
void resetAndClose(Socket& s) {
  boost::system::error_code ec;
  s.set_option(asio::socket_base::linger(true, 0), ec);
  s.close(ec);
}

class Listener {
 public:
  virtual ~Listener() = default;
  virtual void setPool(const ListenerSpec& spec) = 0;
  virtual void close() = 0;
  virtual std::uint16_t port() const = 0;
  virtual bool udp() const = 0;
};

// ---- TCP -------------------------------------------------------------------------------

class TcpListener;

/// One accepted connection: its endpoint attempts, then its relay.
class TcpSession : public std::enable_shared_from_this<TcpSession> {
 public:
  TcpSession(std::shared_ptr<TcpListener> owner, tcp::socket client, std::string clientIP,
             std::vector<Target> targets);
  void start() { tryNext(); }
  /// Closes the connection after `grace` unless it ends before.
  void closeAfter(std::chrono::milliseconds grace);
  void close();
  const Target& target() const { return target_; }

 private:
  void tryNext();
  void connected();
  void end();

  std::shared_ptr<TcpListener> owner_;
  Shared& shared_;
  tcp::socket client_;
  std::string clientIP_;
  std::vector<Target> targets_;
  std::size_t next_ = 0;
  Target target_;
  tcp::socket upstream_;
  asio::steady_timer timer_;
  asio::steady_timer grace_;
  bool graceArmed_ = false;
  std::shared_ptr<TcpRelay> relay_;
  bool closed_ = false;
  bool ended_ = false;
};

class TcpListener final : public Listener, public std::enable_shared_from_this<TcpListener> {
 public:
  TcpListener(Shared& shared, const ListenerSpec& spec) : shared_(shared), spec_(spec), acceptor_(shared.io) {}

  core::Result<void> open() {
    boost::system::error_code ec;
    const auto protocol = spec_.ipv6 ? tcp::v6() : tcp::v4();
    acceptor_.open(protocol, ec);
    if (!ec && spec_.ipv6) acceptor_.set_option(asio::ip::v6_only(true), ec);
    if (!ec) acceptor_.bind(tcp::endpoint(protocol, 0), ec);
    if (!ec && shared_.settings.listen) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return listenerError("TCP listener", spec_.id, ec.value());
    port_ = acceptor_.local_endpoint(ec).port();
    setPool(spec_);
    if (shared_.settings.listen) accept();
    return {};
  }

  void setPool(const ListenerSpec& spec) override {
    spec_ = spec;
    chooser_.setEndpoints(spec.endpoints, spec.affinityTimeout);
    chooser_.expire(Clock::now());  // clients that did not come back (at least once a sync period)
    // Connecting sessions too: one whose endpoint left while it connected must not stay.
    for (const auto& s : sessions_)
      if (std::find(spec.endpoints.begin(), spec.endpoints.end(), s->target()) == spec.endpoints.end())
        s->closeAfter(shared_.settings.removedEndpointGrace);
  }

  void close() override {
    closed_ = true;
    boost::system::error_code ec;
    acceptor_.close(ec);
    auto sessions = sessions_;
    for (const auto& s : sessions) s->close();
  }
  std::uint16_t port() const override { return port_; }
  bool udp() const override { return false; }

  Shared& shared() { return shared_; }
  const std::string& service() const { return spec_.service; }
  void served(const std::string& client, const Target& target) { chooser_.served(client, target, Clock::now()); }
  void sessionEnded(const std::shared_ptr<TcpSession>& session) {
    if (sessions_.erase(session) == 0) return;
    shared_.tcpConnections.fetch_sub(1);
    if (shared_.observer) shared_.observer->active(spec_.service, false, -1);
  }

 private:
  void accept() {
    acceptor_.async_accept([self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
      if (self->closed_) return;
      if (!ec) self->handle(std::move(socket));
      // EMFILE and the like: keep accepting (the next connection may fit).
      self->accept();
    });
  }

  void handle(tcp::socket socket) {
    auto refuse = [&](RefusedReason reason) {
      resetAndClose(socket);
      if (shared_.observer) shared_.observer->refused(spec_.service, false, reason);
    };
    if (shared_.tcpConnections.load() >= shared_.settings.maxConnections) return refuse(RefusedReason::kConnectionLimit);
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    if (ec) return;  // already gone
    std::string client = remote.address().to_string();
    auto targets = chooser_.order(client, Clock::now(), shared_.settings.connectAttempts);
    if (targets.empty()) return refuse(RefusedReason::kNoEndpoints);
    auto session = std::make_shared<TcpSession>(shared_from_this(), std::move(socket), std::move(client),
                                                std::move(targets));
    sessions_.insert(session);
    shared_.tcpConnections.fetch_add(1);
    if (shared_.observer) shared_.observer->active(spec_.service, false, 1);
    session->start();
  }

  Shared& shared_;
  ListenerSpec spec_;
  tcp::acceptor acceptor_;
  EndpointChooser chooser_;
  std::set<std::shared_ptr<TcpSession>> sessions_;
  std::uint16_t port_ = 0;
  bool closed_ = false;
};

TcpSession::TcpSession(std::shared_ptr<TcpListener> owner, tcp::socket client, std::string clientIP,
                       std::vector<Target> targets)
    : owner_(std::move(owner)),
      shared_(owner_->shared()),
      client_(std::move(client)),
      clientIP_(std::move(clientIP)),
      targets_(std::move(targets)),
      upstream_(shared_.io),
      timer_(shared_.io),
      grace_(shared_.io) {}

void TcpSession::tryNext() {
  if (closed_) return;
  if (next_ >= targets_.size()) {
    // Every endpoint tried refused or timed out: the client sees a reset, as from a dead pod.
    if (shared_.observer) shared_.observer->refused(owner_->service(), false, RefusedReason::kEndpointsFailed);
    closed_ = true;
    resetAndClose(client_);
    end();
    return;
  }
  const bool retry = next_ > 0;
  target_ = targets_[next_++];
  if (shared_.observer) shared_.observer->attempt(owner_->service(), retry);
  auto address = parseAddress(target_.ip);
  if (!address) return tryNext();
  boost::system::error_code ec;
  upstream_.close(ec);
  upstream_ = tcp::socket(shared_.io);
  timer_.expires_after(shared_.settings.connectTimeout);
  timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
    if (e) return;
    boost::system::error_code ignored;
    self->upstream_.close(ignored);  // the pending connect completes with operation_aborted
  });
  upstream_.async_connect(tcp::endpoint(*address, target_.port),
                          [self = shared_from_this()](const boost::system::error_code& e) {
                            self->timer_.cancel();
                            if (self->closed_) return;
                            // The timeout may have closed the socket just as the connect completed.
                            if (e || !self->upstream_.is_open()) return self->tryNext();
                            self->connected();
                          });
}

void TcpSession::connected() {
  owner_->served(clientIP_, target_);
  boost::system::error_code ec;
  client_.set_option(tcp::no_delay(true), ec);
  upstream_.set_option(tcp::no_delay(true), ec);
  TcpRelay::Options options;
  options.idleTimeout = shared_.settings.idleTimeout;
  options.splice = shared_.settings.splice;
  auto* observer = shared_.observer;
  std::string service = owner_->service();
  relay_ = std::make_shared<TcpRelay>(
      std::move(client_), std::move(upstream_), options,
      [observer, service](std::uint64_t toEndpoint, std::uint64_t toClient) {
        if (observer) observer->bytes(service, false, toEndpoint, toClient);
      },
      [weak = weak_from_this()] {
        if (auto self = weak.lock()) self->end();
      });
  relay_->start();
}

void TcpSession::closeAfter(std::chrono::milliseconds grace) {
  if (graceArmed_ || ended_) return;
  graceArmed_ = true;
  grace_.expires_after(grace);
  grace_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (!ec) self->close();
  });
}

void TcpSession::close() {
  if (relay_) {
    relay_->close(false);  // ends the session through the relay's done callback
    return;
  }
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  timer_.cancel();
  upstream_.close(ec);
  client_.close(ec);
  end();
}

void TcpSession::end() {
  if (ended_) return;
  ended_ = true;
  grace_.cancel();
  auto self = shared_from_this();
  owner_->sessionEnded(self);
  // Break the cycle listener -> session -> listener on a later turn (we may be inside a
  // handler the relay still runs).
  asio::post(shared_.io, [self] { self->owner_.reset(); self->relay_.reset(); });
}

// ---- UDP -------------------------------------------------------------------------------

class UdpListener;

/// One client's datagrams to one endpoint and back.
class UdpFlow : public std::enable_shared_from_this<UdpFlow> {
 public:
  UdpFlow(std::shared_ptr<UdpListener> owner, std::string key, Target target, sockaddr_storage client,
          socklen_t clientLen, sockaddr_storage local);
  core::Result<void> open();
  void toEndpoint(const char* data, std::size_t size);
  void close();
  const Target& target() const { return target_; }

 private:
  void receive();
  void armIdle();

  std::shared_ptr<UdpListener> owner_;
  Shared& shared_;
  std::string key_;
  Target target_;
  sockaddr_storage client_;
  socklen_t clientLen_;
  sockaddr_storage local_;  ///< the address the client's datagrams were redirected to
  udp::socket upstream_;
  asio::steady_timer idle_;
  Clock::time_point last_;
  bool closed_ = false;
};

class UdpListener final : public Listener, public std::enable_shared_from_this<UdpListener> {
 public:
  UdpListener(Shared& shared, const ListenerSpec& spec) : shared_(shared), spec_(spec), socket_(shared.io) {}

  core::Result<void> open() {
    boost::system::error_code ec;
    const auto protocol = spec_.ipv6 ? udp::v6() : udp::v4();
    socket_.open(protocol, ec);
    if (!ec && spec_.ipv6) socket_.set_option(asio::ip::v6_only(true), ec);
    if (!ec) socket_.bind(udp::endpoint(protocol, 0), ec);
    if (!ec) socket_.non_blocking(true, ec);
    if (ec)
      return listenerError("UDP listener", spec_.id, ec.value());
    const int on = 1;
    const int fd = socket_.native_handle();
    if (spec_.ipv6 ? ::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on)
                   : ::setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on))
      return core::makeError(core::ErrorCategory::kKernel, fmt::format("userspace: packet info on {}", spec_.id), errno);
    port_ = socket_.local_endpoint(ec).port();
    buffer_.resize(65536);
    setPool(spec_);
    if (shared_.settings.listen) receive();
    return {};
  }

  void setPool(const ListenerSpec& spec) override {
    spec_ = spec;
    chooser_.setEndpoints(spec.endpoints, spec.affinityTimeout);
    chooser_.expire(Clock::now());
    // A flow to an endpoint that left ends now: UDP has no connection to drain, and the
    // client's next datagram starts a flow to an endpoint that is there.
    std::vector<std::shared_ptr<UdpFlow>> gone;
    for (const auto& [key, flow] : flows_)
      if (std::find(spec.endpoints.begin(), spec.endpoints.end(), flow->target()) == spec.endpoints.end())
        gone.push_back(flow);
    for (const auto& f : gone) f->close();
  }

  void close() override {
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    auto flows = flows_;
    for (const auto& [key, flow] : flows) flow->close();
  }
  std::uint16_t port() const override { return port_; }
  bool udp() const override { return true; }

  Shared& shared() { return shared_; }
  const std::string& service() const { return spec_.service; }
  void flowEnded(const std::string& key) {
    if (flows_.erase(key) == 0) return;
    shared_.udpFlows.fetch_sub(1);
    if (shared_.observer) shared_.observer->active(spec_.service, true, -1);
  }

  /// Sends a reply to `client` from `local` (the address its datagrams were redirected to), so
  /// that conntrack maps it back to the service address the client sent to.
  void reply(const char* data, std::size_t size, const sockaddr_storage& client, socklen_t clientLen,
             const sockaddr_storage& local) {
    if (closed_) return;
    iovec iov{const_cast<char*>(data), size};
    msghdr msg{};
    msg.msg_name = const_cast<sockaddr_storage*>(&client);
    msg.msg_namelen = clientLen;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(in6_pktinfo))] = {};
    msg.msg_control = control;
    if (local.ss_family == AF_INET) {
      msg.msg_controllen = CMSG_SPACE(sizeof(in_pktinfo));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = IPPROTO_IP;
      c->cmsg_type = IP_PKTINFO;
      c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
      in_pktinfo info{};
      info.ipi_spec_dst = reinterpret_cast<const sockaddr_in&>(local).sin_addr;
      std::memcpy(CMSG_DATA(c), &info, sizeof info);
    } else if (local.ss_family == AF_INET6) {
      msg.msg_controllen = CMSG_SPACE(sizeof(in6_pktinfo));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = IPPROTO_IPV6;
      c->cmsg_type = IPV6_PKTINFO;
      c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
      in6_pktinfo info{};
      info.ipi6_addr = reinterpret_cast<const sockaddr_in6&>(local).sin6_addr;
      std::memcpy(CMSG_DATA(c), &info, sizeof info);
    } else {
      msg.msg_control = nullptr;
    }
    if (::sendmsg(socket_.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL) > 0 && shared_.observer)
      shared_.observer->bytes(spec_.service, true, 0, size);
  }

 private:
  void receive() {
    socket_.async_wait(udp::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed_) return;
      self->drain();
      self->receive();
    });
  }

  void drain() {
    for (int i = 0; i < 64; ++i) {
      sockaddr_storage client{};
      alignas(cmsghdr) char control[256];
      iovec iov{buffer_.data(), buffer_.size()};
      msghdr msg{};
      msg.msg_name = &client;
      msg.msg_namelen = sizeof client;
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(socket_.native_handle(), &msg, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        return;  // EAGAIN, or an error queued by ICMP: wait for the next datagram
      }
      sockaddr_storage local{};
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
          in_pktinfo info;
          std::memcpy(&info, CMSG_DATA(c), sizeof info);
          auto& sin = reinterpret_cast<sockaddr_in&>(local);
          sin.sin_family = AF_INET;
          sin.sin_addr = info.ipi_addr;
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
          in6_pktinfo info;
          std::memcpy(&info, CMSG_DATA(c), sizeof info);
          auto& sin6 = reinterpret_cast<sockaddr_in6&>(local);
          sin6.sin6_family = AF_INET6;
          sin6.sin6_addr = info.ipi6_addr;
        }
      }
      const std::string key = clientKey(client);
      auto it = flows_.find(key);
      if (it == flows_.end()) {
        std::string clientIP = key.substr(0, key.rfind(' '));
        auto targets = chooser_.order(clientIP, Clock::now(), 1);
        if (targets.empty()) {
          if (shared_.observer) shared_.observer->refused(spec_.service, true, RefusedReason::kNoEndpoints);
          continue;
        }
        auto flow = std::make_shared<UdpFlow>(shared_from_this(), key, targets.front(), client, msg.msg_namelen, local);
        if (!flow->open()) continue;
        chooser_.served(clientIP, targets.front(), Clock::now());
        it = flows_.emplace(key, std::move(flow)).first;
        shared_.udpFlows.fetch_add(1);
        if (shared_.observer) {
          shared_.observer->active(spec_.service, true, 1);
          shared_.observer->attempt(spec_.service, false);
        }
      }
      it->second->toEndpoint(buffer_.data(), static_cast<std::size_t>(n));
    }
  }

  static std::string clientKey(const sockaddr_storage& s) {
    char host[INET6_ADDRSTRLEN] = {};
    std::uint16_t port = 0;
    if (s.ss_family == AF_INET) {
      const auto& sin = reinterpret_cast<const sockaddr_in&>(s);
      ::inet_ntop(AF_INET, &sin.sin_addr, host, sizeof host);
      port = ntohs(sin.sin_port);
    } else {
      const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(s);
      ::inet_ntop(AF_INET6, &sin6.sin6_addr, host, sizeof host);
      port = ntohs(sin6.sin6_port);
    }
    return fmt::format("{} {}", host, port);
  }

  Shared& shared_;
  ListenerSpec spec_;
  udp::socket socket_;
  EndpointChooser chooser_;
  std::unordered_map<std::string, std::shared_ptr<UdpFlow>> flows_;
  std::vector<char> buffer_;
  std::uint16_t port_ = 0;
  bool closed_ = false;
};

UdpFlow::UdpFlow(std::shared_ptr<UdpListener> owner, std::string key, Target target, sockaddr_storage client,
                 socklen_t clientLen, sockaddr_storage local)
    : owner_(std::move(owner)),
      shared_(owner_->shared()),
      key_(std::move(key)),
      target_(std::move(target)),
      client_(client),
      clientLen_(clientLen),
      local_(local),
      upstream_(shared_.io),
      idle_(shared_.io) {}

core::Result<void> UdpFlow::open() {
  auto address = parseAddress(target_.ip);
  if (!address) return core::makeError(core::ErrorCategory::kInvalidArgument, "userspace: bad endpoint " + target_.ip);
  boost::system::error_code ec;
  upstream_.connect(udp::endpoint(*address, target_.port), ec);
  if (!ec) upstream_.non_blocking(true, ec);
  if (ec) return core::makeError(core::ErrorCategory::kKernel, "userspace: UDP flow to " + target_.toString(), ec.value());
  last_ = Clock::now();
  armIdle();
  receive();
  return {};
}

void UdpFlow::toEndpoint(const char* data, std::size_t size) {
  if (closed_) return;
  last_ = Clock::now();
  if (::send(upstream_.native_handle(), data, size, MSG_DONTWAIT | MSG_NOSIGNAL) > 0 && shared_.observer)
    shared_.observer->bytes(owner_->service(), true, size, 0);
}

void UdpFlow::receive() {
  upstream_.async_wait(udp::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    char buf[65536];
    for (int i = 0; i < 64; ++i) {
      const ssize_t n = ::recv(self->upstream_.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR || errno == ECONNREFUSED) continue;  // ICMP from the endpoint: keep the flow
        break;
      }
      self->last_ = Clock::now();
      self->owner_->reply(buf, static_cast<std::size_t>(n), self->client_, self->clientLen_, self->local_);
    }
    self->receive();
  });
}

void UdpFlow::armIdle() {
  idle_.expires_at(last_ + shared_.settings.udpIdleTimeout);
  idle_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    if (Clock::now() - self->last_ >= self->shared_.settings.udpIdleTimeout)
      self->close();
    else
      self->armIdle();
  });
}

void UdpFlow::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  idle_.cancel();
  upstream_.close(ec);
  auto owner = std::move(owner_);
  owner->flowEnded(key_);
}

}  // namespace

// ---- the server ------------------------------------------------------------------------

class ProxyServer::Impl {
 public:
  Impl(const ProxySettings& settings, std::shared_ptr<ProxyObserver> observer)
      : observer_(std::move(observer)),
        guard_(asio::make_work_guard(io_)),
        shared_{io_, settings, observer_.get()},
        thread_([this] {
          blockSigpipeOnThisThread();
          io_.run();
        }) {}

  ~Impl() {
    run([this] {
      for (auto& [id, l] : listeners_) l->close();
      listeners_.clear();
    });
    guard_.reset();
    io_.stop();
    thread_.join();
    // Handlers the closes left (aborted waits, deferred releases) run here, on this thread
    // now that the io thread is gone, so that nothing stays alive in a reference cycle.
    io_.restart();
    io_.poll();
  }

  /// Runs `fn` on the io thread and waits for it.
  template <typename Fn>
  auto run(Fn&& fn) -> decltype(fn()) {
    if (thread_.get_id() == std::this_thread::get_id()) return fn();
    std::packaged_task<decltype(fn())()> task(std::forward<Fn>(fn));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    return result.get();
  }

  core::Result<std::map<std::string, std::uint16_t>> update(const std::vector<ListenerSpec>& specs) {
    return run([&]() -> core::Result<std::map<std::string, std::uint16_t>> {
      std::map<std::string, std::uint16_t> ports;
      for (const auto& spec : specs) {
        auto it = listeners_.find(spec.id);
        if (it != listeners_.end() && it->second->udp() != spec.udp) {
          it->second->close();
          listeners_.erase(it);
          it = listeners_.end();
        }
        if (it == listeners_.end()) {
          std::shared_ptr<Listener> listener;
          core::Result<void> opened;
          if (spec.udp) {
            auto l = std::make_shared<UdpListener>(shared_, spec);
            opened = l->open();
            listener = l;
          } else {
            auto l = std::make_shared<TcpListener>(shared_, spec);
            opened = l->open();
            listener = l;
          }
          if (!opened) return std::unexpected(opened.error());
          it = listeners_.emplace(spec.id, std::move(listener)).first;
        } else {
          it->second->setPool(spec);
        }
        ports[spec.id] = it->second->port();
      }
      return ports;
    });
  }

  void retain(const std::set<std::string>& keep) {
    run([&] {
      for (auto it = listeners_.begin(); it != listeners_.end();) {
        if (keep.contains(it->first)) {
          ++it;
          continue;
        }
        it->second->close();
        it = listeners_.erase(it);
      }
    });
  }

  std::shared_ptr<ProxyObserver> observer_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  Shared shared_;
  std::map<std::string, std::shared_ptr<Listener>> listeners_;
  std::thread thread_;
};

ProxyServer::ProxyServer(ProxySettings settings, std::shared_ptr<ProxyObserver> observer)
    : settings_(settings), impl_(std::make_unique<Impl>(settings_, std::move(observer))) {}

ProxyServer::~ProxyServer() = default;

core::Result<std::map<std::string, std::uint16_t>> ProxyServer::update(const std::vector<ListenerSpec>& specs) {
  return impl_->update(specs);
}

void ProxyServer::retain(const std::set<std::string>& keep) { impl_->retain(keep); }

std::size_t ProxyServer::tcpConnections() const { return impl_->shared_.tcpConnections.load(); }
std::size_t ProxyServer::udpFlows() const { return impl_->shared_.udpFlows.load(); }

}  // namespace kproxy::userspace
