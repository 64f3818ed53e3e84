#pragma once
/// What kproxy's API client reports about its own requests, for client-go's `rest_client_*`
/// metrics (k8s.io/client-go/tools/metrics, registered by component-base's restclient
/// package). The client calls it; the program renders it (cli/metrics.h, RestClientMetrics).
///
/// Labels as client-go gives them: `host` is the API server's host:port, `method` / `verb`
/// the HTTP method ("GET", "POST"), `code` the answer's status ("200") or "<error>" when no
/// answer came (connection, TLS, timeout).
///
/// Thread-safety: implementations are called from the API source's and the Event recorder's
/// threads at once and must be thread-safe.

#include <string_view>

namespace kproxy::apiwatch {

class RequestMetrics {
 public:
  virtual ~RequestMetrics() = default;

  /// One request ended: answered with `code`, or "<error>" (rest_client_requests_total).
  virtual void requestDone(std::string_view method, std::string_view host, std::string_view code) = 0;
  /// The time of one request that is not a watch, from its start (the rate-limiter wait
  /// included, as client-go times it) to its whole answer or its failure
  /// (rest_client_request_duration_seconds).
  virtual void requestLatency(std::string_view verb, std::string_view host, double seconds) = 0;
  /// The time one request waited for the client-side rate limiter (QPS / burst), zero
  /// included (rest_client_rate_limiter_duration_seconds).
  virtual void rateLimiterWait(std::string_view verb, std::string_view host, double seconds) = 0;
};

/// The `code` label of a request that got no answer.
inline constexpr std::string_view kRequestErrorCode = "<error>";

}  // namespace kproxy::apiwatch
