#pragma once
// Private: one HTTP/1.1 connection to the API server (plain or TLS) driven by C++20 coroutines
// on an Asio io_context. Errors inside coroutines are boost::system::system_error exceptions;
// api_source.cpp turns them into log lines and retries, they never leave the module.

#include <chrono>
#include <memory>
#include <string>

#include "kproxy/apiwatch/asio.h"
#include "kproxy/apiwatch/kubeconfig.h"
#include "kproxy/core/error.h"

namespace kproxy::apiwatch::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;

template <typename T>
using Task = asio::awaitable<T>;

/// Builds the TLS client context: verification on (with the configured CA, else the system
/// store) unless insecure-skip-tls-verify, and the client certificate/key when configured.
core::Result<std::shared_ptr<asio::ssl::context>> makeTlsContext(const ClientConfig& config);

/// The request line and headers common to every API request (Host, auth, Accept, agent).
http::request<http::empty_body> makeGet(const ClientConfig& config, const std::string& target);

/// Percent-encodes a query parameter value.
std::string queryEscape(std::string_view value);

class Connection {
 public:
  /// Resolves, connects and (for https) handshakes with verification of the server's name or IP.
  static Task<std::unique_ptr<Connection>> open(const ClientConfig& config, asio::ssl::context* tls,
                                                std::chrono::steady_clock::duration timeout);

  /// Deadline for the next operations (reset before each read of a stream).
  void expiresAfter(std::chrono::steady_clock::duration d);
  Task<void> write(http::request<http::empty_body>& request);
  Task<void> write(http::request<http::string_body>& request);
  /// Reads a whole response with a string body (body size capped at `limit` bytes).
  Task<http::response<http::string_body>> readResponse(std::uint64_t limit);
  /// For streamed bodies: reads the header into `parser`.
  Task<void> readHeader(http::response_parser<http::buffer_body>& parser);
  /// Reads the next piece of a streamed body into `out` (appending). Returns false at the end
  /// of the body.
  Task<bool> readSome(http::response_parser<http::buffer_body>& parser, std::string& out);
  /// Best-effort close (TLS close_notify is skipped: the stream is abandoned, not reused).
  void close();

 private:
  Connection() = default;
  std::unique_ptr<beast::tcp_stream> plain_;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buffer_;
  beast::tcp_stream& lowest();
};

}  // namespace kproxy::apiwatch::detail
