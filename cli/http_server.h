#pragma once
/// A small HTTP/1.1 server on one shared event loop (Boost.Beast underneath; no Beast type
/// appears here). kproxy runs all its HTTP listeners — metrics, health, and the per-service
/// health-check node ports — on one EventLoop thread.
///
/// Thread-safety: EventLoop::post/runAfter/start/stop may be called from any thread. Every
/// HttpServer member must be called on the loop thread (from a posted task), or before start()
/// / after stop(). Handlers run on the loop thread and must not block.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::cli {

struct HttpRequest {
  std::string method;  ///< "GET", "HEAD", ...
  std::string target;  ///< path and query, e.g. "/metrics"
  std::string body;    ///< a PUT's body (allowPut); empty for GET and HEAD
  /// The path without the query string.
  std::string path() const;
};

struct HttpResponse {
  int status = 200;
  std::string contentType = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;  ///< extra headers
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

/// Go's net/http answer for an unknown path.
HttpResponse notFound();

/// What one client may cost the servers of an EventLoop. Every server answers on nodes reachable
/// by anyone on the network (the health-check node ports by design), so none of this may be
/// unbounded.
struct HttpLimits {
  /// Request line and headers; larger requests get 431 and the connection is closed.
  std::uint32_t maxHeaderBytes = 16 * 1024;
  /// Request bodies (no endpoint reads one); larger ones get 413 and the connection is closed.
  std::uint64_t maxBodyBytes = 4 * 1024;
  /// Open connections over all the loop's servers. At the cap a new connection takes the place
  /// of the one that has waited longest for its request (idle keep-alive, idle or slow clients),
  /// so probes that send their request at once are never starved by held connections.
  std::size_t maxConnections = 256;
  /// A whole request (headers and body) must arrive within this, counted from the connection's
  /// start or the previous response; a slow client (slowloris) is cut off after it.
  std::chrono::steady_clock::duration readTimeout = std::chrono::seconds(10);
  /// Writing one response.
  std::chrono::steady_clock::duration writeTimeout = std::chrono::seconds(10);
};

/// One I/O thread running an Asio io_context until stop().
class EventLoop {
 public:
  explicit EventLoop(HttpLimits limits = {});
  ~EventLoop();  ///< stops and joins the thread
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void start();
  /// Stops the loop and joins its thread; pending tasks are dropped. Idempotent.
  void stop();
  /// Runs `task` on the loop thread.
  void post(std::function<void()> task);
  /// Runs `task` on the loop thread after `delay`.
  void runAfter(std::chrono::steady_clock::duration delay, std::function<void()> task);

 private:
  friend class HttpServer;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One listening socket answering GET and HEAD requests with `handler` (other methods get 405
/// with `Allow: GET, HEAD`, except PUT on a path given to allowPut; malformed requests 400),
/// within the loop's HttpLimits. Connections are kept alive (HTTP/1.1) until the read timeout
/// passes without a request.
class HttpServer {
 public:
  /// `name` appears in log lines ("metrics", "healthz", "service health check default/web").
  HttpServer(EventLoop& loop, std::string name, HttpHandler handler);
  ~HttpServer();  ///< closes the listener
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds `host:port` and starts accepting. `host` is an IP literal (no brackets); "0.0.0.0"
  /// and "" listen on every address, IPv6 too when the kernel has it (as Go does). Port 0
  /// picks a free port (see port()). Errors: the address is in use, not local, malformed.
  core::Result<void> listen(const std::string& host, std::uint16_t port);
  /// PUT requests to exactly `path` reach the handler, with their body. Call before listen().
  void allowPut(std::string path);
  /// Stops accepting; connections in progress finish their current request. Idempotent.
  void close();
  bool listening() const;
  /// The bound port (useful after listen(…, 0)); 0 when not listening.
  std::uint16_t port() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kproxy::cli
