#include "http_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <array>

#include <fmt/format.h>

namespace kproxy::apiwatch::detail {
namespace {

using core::ErrorCategory;

bool isIpLiteral(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

std::string openSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  std::array<char, 256> text{};
  ERR_error_string_n(e, text.data(), text.size());
  ERR_clear_error();
  return text.data();
}

}  // namespace

core::Result<std::shared_ptr<asio::ssl::context>> makeTlsContext(const ClientConfig& config) {
  auto tls = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  boost::system::error_code ec;
  tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1,
                   ec);
  if (config.insecureSkipTlsVerify) {
    tls->set_verify_mode(asio::ssl::verify_none);
  } else {
    tls->set_verify_mode(asio::ssl::verify_peer);
    if (!config.caPem.empty()) {
      tls->add_certificate_authority(asio::buffer(config.caPem), ec);
      if (ec)
        return core::makeError(ErrorCategory::kInvalidArgument,
                               fmt::format("certificate authority ({}): {}", config.origin, ec.message()));
    } else {
      tls->set_default_verify_paths(ec);
      if (ec)
        return core::makeError(ErrorCategory::kIo, fmt::format("system trust store: {}", ec.message()));
    }
  }
  if (!config.clientCertPem.empty()) {
    tls->use_certificate_chain(asio::buffer(config.clientCertPem), ec);
    if (ec)
      return core::makeError(ErrorCategory::kInvalidArgument,
                             fmt::format("client certificate ({}): {}", config.origin, ec.message()));
    tls->use_private_key(asio::buffer(config.clientKeyPem), asio::ssl::context::pem, ec);
    if (ec)
      return core::makeError(ErrorCategory::kInvalidArgument,
                             fmt::format("client key ({}): {}", config.origin, ec.message()));
    if (SSL_CTX_check_private_key(tls->native_handle()) != 1)
      return core::makeError(ErrorCategory::kInvalidArgument,
                             fmt::format("client key does not match the certificate ({}): {}", config.origin,
                                         openSslError()));
  }
  return tls;
}

std::string queryEscape(std::string_view value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

http::request<http::empty_body> makeGet(const ClientConfig& config, const std::string& target) {
  http::request<http::empty_body> request{http::verb::get, config.server.basePath + target, 11};
  bool v6 = config.server.host.find(':') != std::string::npos;
  request.set(http::field::host, fmt::format("{}{}{}:{}", v6 ? "[" : "", config.server.host, v6 ? "]" : "",
                                             config.server.port));
  request.set(http::field::user_agent, "kproxy");
  request.set(http::field::accept, "application/json");
  if (config.token) {
    request.set(http::field::authorization, "Bearer " + config.token->current());
  } else if (!config.username.empty()) {
    // Basic auth: base64(user:password). Rare, but kubeconfigs still carry it.
    std::string plain = config.username + ":" + config.password;
    std::string encoded(4 * ((plain.size() + 2) / 3), '\0');
    EVP_EncodeBlock(reinterpret_cast<unsigned char*>(encoded.data()),
                    reinterpret_cast<const unsigned char*>(plain.data()), static_cast<int>(plain.size()));
    request.set(http::field::authorization, "Basic " + encoded);
  }
  return request;
}

Task<std::unique_ptr<Connection>> Connection::open(const ClientConfig& config, asio::ssl::context* tls,
                                                   std::chrono::steady_clock::duration timeout) {
  auto executor = co_await asio::this_coro::executor;
  std::unique_ptr<Connection> c(new Connection());
  asio::ip::tcp::resolver resolver(executor);
  auto endpoints = co_await resolver.async_resolve(config.server.host, std::to_string(config.server.port),
                                                   asio::use_awaitable);
  if (config.server.tls) {
    if (tls == nullptr) throw std::logic_error("https without a TLS context");
    c->tls_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(executor, *tls);
    SSL* ssl = c->tls_->native_handle();
    const std::string& name = config.tlsServerName.empty() ? config.server.host : config.tlsServerName;
    if (!isIpLiteral(name)) SSL_set_tlsext_host_name(ssl, name.c_str());
    if (!config.insecureSkipTlsVerify) {
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
      int ok = isIpLiteral(name) ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                                 : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
      if (ok != 1) throw std::runtime_error("cannot set the name to verify: " + openSslError());
    }
  } else {
    c->plain_ = std::make_unique<beast::tcp_stream>(executor);
  }
  c->lowest().expires_after(timeout);
  co_await c->lowest().async_connect(endpoints, asio::use_awaitable);
  auto& socket = c->lowest().socket();
  socket.set_option(asio::ip::tcp::no_delay(true));
  // A watch can be quiet for minutes (no bookmarks on an idle resource), so a dead peer (a
  // node losing its route, a crashed apiserver host) is found by TCP keepalive: ~60 s.
  socket.set_option(asio::socket_base::keep_alive(true));
  int idle = 30, interval = 10, count = 3;
  ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  if (c->tls_) co_await c->tls_->async_handshake(asio::ssl::stream_base::client, asio::use_awaitable);
  co_return c;
}

beast::tcp_stream& Connection::lowest() {
  return tls_ ? beast::get_lowest_layer(*tls_) : *plain_;
}

void Connection::expiresAfter(std::chrono::steady_clock::duration d) { lowest().expires_after(d); }

Task<void> Connection::write(http::request<http::empty_body>& request) {
  if (tls_) {
    co_await http::async_write(*tls_, request, asio::use_awaitable);
  } else {
    co_await http::async_write(*plain_, request, asio::use_awaitable);
  }
}

Task<void> Connection::write(http::request<http::string_body>& request) {
  if (tls_) {
    co_await http::async_write(*tls_, request, asio::use_awaitable);
  } else {
    co_await http::async_write(*plain_, request, asio::use_awaitable);
  }
}

Task<http::response<http::string_body>> Connection::readResponse(std::uint64_t limit) {
  http::response_parser<http::string_body> parser;
  parser.body_limit(limit);
  if (tls_) {
    co_await http::async_read(*tls_, buffer_, parser, asio::use_awaitable);
  } else {
    co_await http::async_read(*plain_, buffer_, parser, asio::use_awaitable);
  }
  co_return parser.release();
}

Task<void> Connection::readHeader(http::response_parser<http::buffer_body>& parser) {
  if (tls_) {
    co_await http::async_read_header(*tls_, buffer_, parser, asio::use_awaitable);
  } else {
    co_await http::async_read_header(*plain_, buffer_, parser, asio::use_awaitable);
  }
}

Task<bool> Connection::readSome(http::response_parser<http::buffer_body>& parser, std::string& out) {
  if (parser.is_done()) co_return false;
  std::array<char, 16384> chunk;
  parser.get().body().data = chunk.data();
  parser.get().body().size = chunk.size();
  boost::system::error_code ec;
  if (tls_) {
    co_await http::async_read_some(*tls_, buffer_, parser, asio::redirect_error(asio::use_awaitable, ec));
  } else {
    co_await http::async_read_some(*plain_, buffer_, parser, asio::redirect_error(asio::use_awaitable, ec));
  }
  // need_buffer only says our chunk is full: not an error.
  if (ec && ec != http::error::need_buffer) throw boost::system::system_error(ec);
  out.append(chunk.data(), chunk.size() - parser.get().body().size);
  co_return true;
}

void Connection::close() {
  boost::system::error_code ec;
  lowest().socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  lowest().close();
}

}  // namespace kproxy::apiwatch::detail
