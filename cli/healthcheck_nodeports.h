#pragma once
/// Health-check node ports (upstream pkg/proxy/healthcheck/service_health.go): for every
/// Service with externalTrafficPolicy=Local and a healthCheckNodePort, an HTTP listener on that
/// port tells external load balancers whether this node has ready local endpoints for it.
/// Listeners are opened and closed as the applied snapshot changes; a port that cannot be
/// opened is logged and retried on the next reconcile, never fatal.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "http_server.h"
#include "kproxy/core/snapshot.h"

namespace kproxy::cli {

/// What one service's health check needs.
struct ServiceHealthTarget {
  std::string ns;
  std::string name;
  std::uint16_t port = 0;
  /// Distinct IPs of local, ready endpoints over all the service's ports and families
  /// (upstream LocalReadyEndpoints: terminating endpoints do not count).
  int localEndpoints = 0;
  bool operator==(const ServiceHealthTarget&) const = default;
};

/// The health checks `snapshot` asks for, keyed by "namespace/name". Pure.
std::map<std::string, ServiceHealthTarget> serviceHealthTargets(const core::Snapshot& snapshot);

/// The listeners. Every member runs on the EventLoop's thread.
class ServiceHealthServers {
 public:
  /// `proxyHealthy` is asked on every request (serviceProxyHealthy in the body). `addresses`
  /// are the IPs to listen on (empty: every address).
  ServiceHealthServers(EventLoop& loop, std::function<bool()> proxyHealthy,
                       std::vector<std::string> addresses = {});
  ~ServiceHealthServers();

  /// Opens, closes and updates listeners to match `snapshot`.
  void reconcile(const core::Snapshot& snapshot);
  /// Closes every listener.
  void closeAll();
  /// Ports with an open listener, ascending (for tests and logs).
  std::vector<std::uint16_t> openPorts() const;

 private:
  struct Instance;
  EventLoop& loop_;
  std::function<bool()> proxyHealthy_;
  std::vector<std::string> addresses_;
  std::map<std::string, std::unique_ptr<Instance>> instances_;
};

}  // namespace kproxy::cli
