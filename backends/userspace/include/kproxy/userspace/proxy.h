#pragma once
/// ProxyServer: the userspace proxy's sockets. One listener per (service port, endpoint pool)
/// that the plan says this node answers, bound to an ephemeral port on the wildcard address of
/// its family (the nftables redirect sends the service's addresses there). TCP connections are
/// accepted, given endpoints to try (EndpointChooser: round robin, ClientIP affinity), connected
/// with a short timeout, moved on to the next endpoint on refusal or timeout, and relayed
/// (TcpRelay). UDP datagrams are relayed per client flow, with an idle timeout, replies going
/// back from the listener's socket with the address the client's datagram was redirected to as
/// source (so conntrack turns it back into the service address).
///
/// Threading: the server runs one io_context thread of its own, started by the constructor and
/// joined by the destructor (which closes every socket first). update() and retain() may be
/// called from any one other thread (the plugin's sync); they hand their work to the io thread
/// and wait for it, so a listener's pool is only ever touched there.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/userspace/endpoint_chooser.h"

namespace kproxy::userspace {

struct ProxySettings {
  /// How long one endpoint may take to accept a TCP connection before the next is tried.
  std::chrono::milliseconds connectTimeout{250};
  /// Endpoints a TCP connection tries at most (each once).
  std::size_t connectAttempts = 4;
  /// TCP connections relayed at once, over all listeners; a connection over the cap is reset.
  std::size_t maxConnections = 10000;
  /// A TCP connection with no byte either way for this long is closed; zero: never.
  std::chrono::milliseconds idleTimeout{0};
  /// A UDP flow (one client address and port) with no datagram either way for this long ends.
  std::chrono::milliseconds udpIdleTimeout{250};
  /// Connections to an endpoint that left the pool are closed this long after it left.
  std::chrono::milliseconds removedEndpointGrace{30000};
  /// false: bind the listeners but never listen or receive (dry-run shows real port numbers
  /// and relays nothing).
  bool listen = true;
  bool splice = true;
};

/// One listener as the backend wants it.
struct ListenerSpec {
  /// Stable identity across syncs: "ipv4 ns/svc:port cluster". A spec with a known id keeps its
  /// socket (and port) and gets the new pool.
  std::string id;
  bool ipv6 = false;
  bool udp = false;
  /// The service port ("ns/svc:port"), the label of its metrics.
  std::string service;
  std::vector<Target> endpoints;
  /// ClientIP affinity timeout; zero: no affinity.
  std::chrono::seconds affinityTimeout{0};
  bool operator==(const ListenerSpec&) const = default;
};

/// Why a connection or datagram was not relayed (the `reason` of the refused counter).
enum class RefusedReason { kNoEndpoints, kConnectionLimit, kEndpointsFailed };
std::string_view refusedReasonName(RefusedReason reason);

/// What the proxy reports (the backend turns it into metrics; tests count). Called on the io
/// thread.
class ProxyObserver {
 public:
  virtual ~ProxyObserver() = default;
  /// A TCP connection or UDP flow started (+1) or ended (-1).
  virtual void active(const std::string& service, bool udp, int delta) = 0;
  /// A connection attempt to an endpoint; `retry`: not the connection's first.
  virtual void attempt(const std::string& service, bool retry) = 0;
  virtual void refused(const std::string& service, bool udp, RefusedReason reason) = 0;
  virtual void bytes(const std::string& service, bool udp, std::uint64_t toEndpoint, std::uint64_t toClient) = 0;
};

/// The proxy's listening sockets as a sync drives them: ProxyServer, or in --dry-run
/// PrintingListeners (kernel.h) over one.
class ProxyListeners {
 public:
  virtual ~ProxyListeners() = default;
  /// Opens a listener for every spec with a new id and gives known ones their new pool
  /// (connections to endpoints that left it are closed after the grace period). Returns the
  /// port of every spec's listener. On an error (a socket that cannot be bound), the listeners
  /// opened before it stay and the error names the spec.
  virtual core::Result<std::map<std::string, std::uint16_t>> update(const std::vector<ListenerSpec>& specs) = 0;
  /// Closes the listeners whose id is not in `keep`, with their connections and flows.
  virtual void retain(const std::set<std::string>& keep) = 0;
};

class ProxyServer final : public ProxyListeners {
 public:
  /// Starts the io thread. `observer` may be null.
  ProxyServer(ProxySettings settings, std::shared_ptr<ProxyObserver> observer);
  /// Closes every listener and connection and joins the io thread.
  ~ProxyServer() override;
  ProxyServer(const ProxyServer&) = delete;
  ProxyServer& operator=(const ProxyServer&) = delete;

  core::Result<std::map<std::string, std::uint16_t>> update(const std::vector<ListenerSpec>& specs) override;
  void retain(const std::set<std::string>& keep) override;

  /// TCP connections being relayed or connected now, UDP flows now (for tests).
  std::size_t tcpConnections() const;
  std::size_t udpFlows() const;
  const ProxySettings& settings() const { return settings_; }

 private:
  class Impl;
  ProxySettings settings_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::userspace
