#include "http_server.h"

#include <optional>
#include <thread>

#include "kproxy/apiwatch/asio.h"
#include "kproxy/core/log.h"

namespace kproxy::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kIdleTimeout = std::chrono::seconds(30);

// One connection: read a request, answer it, repeat while the client keeps the connection.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<const HttpHandler> handler)
      : stream_(std::move(socket)), handler_(std::move(handler)) {}

  void start() { read(); }

 private:
  void read() {
    request_ = {};
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->onRead(ec);
                     });
  }

  void onRead(beast::error_code ec) {
    if (ec) {
      // End of stream, timeout, or a malformed request: nothing useful to answer.
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      return;
    }
    HttpRequest req;
    req.method = std::string(request_.method_string());
    req.target = std::string(request_.target());
    HttpResponse answer;
    try {
      answer = (*handler_)(req);
    } catch (const std::exception& e) {
      log::error("HTTP handler failed", {{"path", req.target}, {"error", e.what()}});
      answer = HttpResponse{500, "text/plain; charset=utf-8", {}, "internal error\n"};
    }
    response_ = {};
    response_.version(request_.version());
    response_.result(static_cast<unsigned>(answer.status));
    response_.set(http::field::content_type, answer.contentType);
    for (const auto& [name, value] : answer.headers) response_.set(name, value);
    response_.keep_alive(request_.keep_alive());
    const std::size_t length = answer.body.size();
    if (request_.method() != http::verb::head) response_.body() = std::move(answer.body);
    response_.content_length(length);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code writeEc, std::size_t) {
                        self->onWrite(writeEc);
                      });
  }

  void onWrite(beast::error_code ec) {
    if (ec) return;
    if (!response_.keep_alive()) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      return;
    }
    read();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
  std::shared_ptr<const HttpHandler> handler_;
};

core::Error socketError(const std::string& what, const std::string& host, std::uint16_t port,
                        const beast::error_code& ec) {
  const std::string address =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
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
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
};

EventLoop::EventLoop() : impl_(std::make_unique<Impl>()) {}

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
  Impl(asio::io_context& io, std::string n, HttpHandler h)
      : name(std::move(n)), handler(std::make_shared<const HttpHandler>(std::move(h))), acceptor(io) {}

  void accept() {
    acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) {
        std::make_shared<Session>(std::move(socket), self->handler)->start();
      } else {
        log::warning("HTTP accept failed", {{"server", self->name}, {"error", ec.message()}});
      }
      self->accept();
    });
  }

  std::string name;
  std::shared_ptr<const HttpHandler> handler;
  tcp::acceptor acceptor;
};

HttpServer::HttpServer(EventLoop& loop, std::string name, HttpHandler handler)
    : impl_(std::make_shared<Impl>(loop.impl_->io, std::move(name), std::move(handler))) {}

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

void HttpServer::close() {
  if (!impl_->acceptor.is_open()) return;
  beast::error_code ignored;
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
