#pragma once
/// EndpointChooser: which endpoints a new connection to one service listener tries, in order.
/// Round robin over the pool the plan gives the listener; with ClientIP affinity, a client's
/// last endpoint first while its entry is younger than the timeout. A connection tries at most
/// `maxAttempts` endpoints, each once: the first that accepts serves it (the retry property of
/// the userspace mode, see README).
///
/// Time is passed in (no clock inside), so tests run without sleeping.
/// Thread-safety: none; the proxy's io thread owns each chooser.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kproxy::userspace {

/// An endpoint: address (numeric, one family) and port.
struct Target {
  std::string ip;
  std::uint16_t port = 0;
  bool operator==(const Target&) const = default;
  /// "10.0.0.1:80", "[fd00::1]:80".
  std::string toString() const;
};

class EndpointChooser {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  /// Replaces the pool. The round-robin position is kept (modulo the new size), so an endpoint
  /// change does not send the next connections back to the first endpoint; affinity entries
  /// whose endpoint left the pool are dropped. `affinityTimeout` zero: no affinity.
  void setEndpoints(std::vector<Target> endpoints, std::chrono::seconds affinityTimeout);

  /// The endpoints a new connection from `client` tries, in order: the client's affinity
  /// endpoint if it has a live entry, then the pool in round-robin order from the next
  /// position (each endpoint once), at most `maxAttempts` of them. Advances the round robin by
  /// one. Empty when the pool is empty.
  std::vector<Target> order(const std::string& client, TimePoint now, std::size_t maxAttempts);

  /// Records that `client` was served by `target` (its affinity entry, when affinity is on).
  void served(const std::string& client, const Target& target, TimePoint now);

  const std::vector<Target>& endpoints() const { return endpoints_; }
  bool affinity() const { return affinityTimeout_.count() > 0; }
  /// Affinity entries kept (expired ones are dropped as they are met and by expire()).
  std::size_t affinityEntries() const { return affinity_.size(); }
  /// Drops affinity entries older than the timeout.
  void expire(TimePoint now);

 private:
  struct Sticky {
    Target target;
    TimePoint last;
  };
  std::vector<Target> endpoints_;
  std::size_t next_ = 0;
  std::chrono::seconds affinityTimeout_{0};
  std::unordered_map<std::string, Sticky> affinity_;
};

}  // namespace kproxy::userspace
