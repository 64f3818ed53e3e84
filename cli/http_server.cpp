#include "http_server.h"

#include <algorithm>
#include <list>
#include <optional>
#include <thread>
#include <vector>

#include "kproxy/apiwatch/asio.h"
#include "kproxy/core/log.h"
#include "kproxy/net/host_port.h"

namespace kproxy::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// After an error answer the client may still be sending (a body we refused): read and drop what
// comes, up to these bounds, so that closing does not reset the connection before the client
// has read the answer.
constexpr auto kDrainTimeout = std::chrono::seconds(1);
constexpr std::size_t kDrainBytes = 4 * 1024 * 1024;
// After a failed accept (out of file descriptors), wait before the next one instead of spinning.
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);

class Session;

// Every open connection of one EventLoop, ordered by when each started its current wait (for a
// request, or for a slow client to take an answer): the front has waited longest. Loop thread
// only.
struct ConnectionTable {
  std::size_t max = 0;
  std::list<Session*> sessions;
};

// One connection: read a request, answer it, repeat while the client keeps the connection.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<const HttpHandler> handler,
          std::shared_ptr<const std::vector<std::string>> putPaths, const HttpLimits& limits,
          ConnectionTable& table)
      : stream_(std::move(socket)),
        handler_(std::move(handler)),
        putPaths_(std::move(putPaths)),
        limits_(limits),
        table_(table),
        entry_(table.sessions.insert(table.sessions.end(), this)) {}
  ~Session() { leaveTable(); }

  void start() { read(); }

  /// Closes the connection at once to make room for a new one; its pending operation then
  /// completes with an error and the session ends.
  void evict() {
    leaveTable();
    evicted_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  void leaveTable() {
    if (!entry_) return;
    table_.sessions.erase(*entry_);
    entry_.reset();
  }

  // Moves the session to the back of the table: its wait starts now.
  void startWait() {
    if (entry_) table_.sessions.splice(table_.sessions.end(), table_.sessions, *entry_);
  }

  void read() {
    parser_.emplace();
    parser_->header_limit(limits_.maxHeaderBytes);
    parser_->body_limit(limits_.maxBodyBytes);
    startWait();
    stream_.expires_after(limits_.readTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->onRead(ec);
                     });
  }

  void onRead(beast::error_code ec) {
    if (evicted_) return;
    if (ec == http::error::header_limit) return refuse(431, "request header fields too large\n");
    if (ec == http::error::body_limit) return refuse(413, "request body too large\n");
    if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message)
      return refuse(400, "bad request\n");
    if (ec) {
      // End of stream, read timeout, or a reset: nothing useful to answer.
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      return;
    }
    const auto& request = parser_->get();
    HttpRequest req;
    req.method = std::string(request.method_string());
    req.target = std::string(request.target());
    const bool put = request.method() == http::verb::put &&
                     std::find(putPaths_->begin(), putPaths_->end(), req.path()) != putPaths_->end();
    if (request.method() != http::verb::get && request.method() != http::verb::head && !put) {
      return refuse(405, "method not allowed\n", {{"Allow", "GET, HEAD"}});
    }
    if (put) req.body = request.body();
    HttpResponse answer;
    try {
      answer = (*handler_)(req);
    } catch (const std::exception& e) {
      log::error("HTTP handler failed", {{"path", req.target}, {"error", e.what()}});
      answer = HttpResponse{500, "text/plain; charset=utf-8", {}, "internal error\n"};
    }
    send(std::move(answer), request.keep_alive(), request.method() == http::verb::head);
  }

  // An error answer; the connection closes after it.
  void refuse(int status, std::string body, std::vector<std::pair<std::string, std::string>> headers = {}) {
    send(HttpResponse{status, "text/plain; charset=utf-8", std::move(headers), std::move(body)}, false, false);
  }

  void send(HttpResponse answer, bool keepAlive, bool head) {
    response_ = {};
    response_.version(parser_ && parser_->is_header_done() ? parser_->get().version() : 11);
    response_.result(static_cast<unsigned>(answer.status));
    response_.set(http::field::content_type, answer.contentType);
    for (const auto& [name, value] : answer.headers) response_.set(name, value);
    response_.keep_alive(keepAlive);
    const std::size_t length = answer.body.size();
    if (!head) response_.body() = std::move(answer.body);
    response_.content_length(length);
    startWait();
    stream_.expires_after(limits_.writeTimeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code writeEc, std::size_t) {
                        self->onWrite(writeEc);
                      });
  }

  void onWrite(beast::error_code ec) {
    if (ec || evicted_) return;
    if (!response_.keep_alive()) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      drain();
      return;
    }
    read();
  }

  void drain() {
    startWait();
    stream_.expires_after(kDrainTimeout);
    drainBuffer_.resize(16 * 1024);
    drainSome();
  }
  void drainSome() {
    stream_.async_read_some(asio::buffer(drainBuffer_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->drained_ += n;
                              if (!ec && !self->evicted_ && self->drained_ < kDrainBytes) self->drainSome();
                            });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  std::shared_ptr<const HttpHandler> handler_;
  std::shared_ptr<const std::vector<std::string>> putPaths_;
  const HttpLimits& limits_;
  ConnectionTable& table_;
  std::optional<std::list<Session*>::iterator> entry_;
  bool evicted_ = false;
  std::vector<char> drainBuffer_;
  std::size_t drained_ = 0;
};

// Makes room for one more connection: evicts the one that has waited longest.
void makeRoom(ConnectionTable& table) {
  while (table.sessions.size() >= table.max && !table.sessions.empty()) table.sessions.front()->evict();
}

core::Error socketError(const std::string& what, const std::string& host, std::uint16_t port,
                        const beast::error_code& ec) {
  const std::string address = net::joinHostPort(host, port);
  return core::Error{core::ErrorCategory::kIo, ec.category() == boost::system::system_category()
                                                   ? ec.value()
                                                   : 0,
                     what + " " + address + (ec.category() == boost::system::system_category()
                                                 ? ""
                                                 : ": " + ec.message())};
}

}  // namespace

std::string HttpRequest::path() const {
  const auto q = target.find('?');
  return q == std::string::npos ? target : target.substr(0, q);
}

HttpResponse notFound() { return HttpResponse{404, "text/plain; charset=utf-8", {}, "404 page not found\n"}; }

// --- EventLoop -------------------------------------------------------------------------------

struct EventLoop::Impl {
  explicit Impl(HttpLimits l) : limits(l) { connections.max = std::max<std::size_t>(1, limits.maxConnections); }
  HttpLimits limits;
  // Before io: sessions destroyed with the io_context unregister from it.
  ConnectionTable connections;
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
};

EventLoop::EventLoop(HttpLimits limits) : impl_(std::make_unique<Impl>(limits)) {}

EventLoop::~EventLoop() { stop(); }

void EventLoop::start() {
  if (impl_->thread.joinable()) return;
  impl_->work.emplace(impl_->io.get_executor());
  impl_->thread = std::thread([this] {
    for (;;) {
      try {
        impl_->io.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw past its own guard; keep serving the other listeners.
        log::error("HTTP event loop task failed", {{"error", e.what()}});
      }
    }
  });
}

void EventLoop::stop() {
  impl_->work.reset();
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void EventLoop::post(std::function<void()> task) { asio::post(impl_->io, std::move(task)); }

void EventLoop::runAfter(std::chrono::steady_clock::duration delay, std::function<void()> task) {
  auto timer = std::make_shared<asio::steady_timer>(impl_->io, delay);
  timer->async_wait([timer, task = std::move(task)](beast::error_code ec) {
    if (!ec) task();
  });
}

// --- HttpServer ------------------------------------------------------------------------------

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(EventLoop::Impl& l, std::string n, HttpHandler h)
      : loop(l),
        name(std::move(n)),
        handler(std::make_shared<const HttpHandler>(std::move(h))),
        putPaths(std::make_shared<std::vector<std::string>>()),
        acceptor(l.io),
        retry(l.io) {}

  void accept() {
    acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (ec) {
        // Typically out of file descriptors: try again shortly rather than spin on the error.
        log::warning("HTTP accept failed", {{"server", self->name}, {"error", ec.message()}});
        self->retry.expires_after(kAcceptRetryDelay);
        self->retry.async_wait([self](beast::error_code waitEc) {
          if (!waitEc && self->acceptor.is_open()) self->accept();
        });
        return;
      }
      if (self->loop.connections.sessions.size() >= self->loop.connections.max)
        log::info(4, "HTTP connection cap reached; closing the longest waiting connection",
                  {{"server", self->name}});
      makeRoom(self->loop.connections);
      std::make_shared<Session>(std::move(socket), self->handler, self->putPaths, self->loop.limits,
                                self->loop.connections)
          ->start();
      self->accept();
    });
  }

  EventLoop::Impl& loop;
  std::string name;
  std::shared_ptr<const HttpHandler> handler;
  // Written by allowPut before listen, read by the sessions after.
  std::shared_ptr<std::vector<std::string>> putPaths;
  tcp::acceptor acceptor;
  asio::steady_timer retry;
};

HttpServer::HttpServer(EventLoop& loop, std::string name, HttpHandler handler)
    : impl_(std::make_shared<Impl>(*loop.impl_, std::move(name), std::move(handler))) {}

HttpServer::~HttpServer() { close(); }

core::Result<void> HttpServer::listen(const std::string& host, std::uint16_t port) {
  close();
  beast::error_code ec;
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "::";
  tcp::endpoint endpoint;
  if (wildcard) {
    endpoint = tcp::endpoint(tcp::v6(), port);
  } else {
    auto address = asio::ip::make_address(host, ec);
    if (ec) return std::unexpected(socketError("invalid listen address", host, port, ec));
    endpoint = tcp::endpoint(address, port);
  }
  auto& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (ec && wildcard && host != "::") {
    // No IPv6 in this kernel or namespace: listen on IPv4 only.
    endpoint = tcp::endpoint(tcp::v4(), port);
    ec = {};
    acceptor.open(endpoint.protocol(), ec);
  }
  if (ec) return std::unexpected(socketError("cannot open socket for", host, port, ec));
  if (endpoint.protocol() == tcp::v6() && wildcard) {
    // "0.0.0.0" means every address of both families, as Go's listener does.
    acceptor.set_option(asio::ip::v6_only(host == "::"), ec);
  }
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    acceptor.close(ignored);
    return std::unexpected(socketError("cannot listen on", host.empty() ? "0.0.0.0" : host, port, ec));
  }
  impl_->accept();
  return {};
}

void HttpServer::allowPut(std::string path) { impl_->putPaths->push_back(std::move(path)); }

void HttpServer::close() {
  if (!impl_->acceptor.is_open()) return;
  beast::error_code ignored;
  impl_->retry.cancel();
  impl_->acceptor.close(ignored);
}

bool HttpServer::listening() const { return impl_->acceptor.is_open(); }

std::uint16_t HttpServer::port() const {
  if (!impl_->acceptor.is_open()) return 0;
  beast::error_code ec;
  auto endpoint = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : endpoint.port();
}

}  // namespace kproxy::cli
