#pragma once
// Builders for the ops tests: services, slices and snapshots resolved by the real tracker.

#include <memory>
#include <string>
#include <vector>

#include "kproxy/core/model.h"
#include "kproxy/core/snapshot.h"

namespace ops_test {

struct LocalEndpoint {
  std::string ip;
  bool local = true;
  bool ready = true;
  bool terminating = false;
};

/// A LoadBalancer service default/<name> with eTP=Local and the given health-check port.
kproxy::core::Service localLoadBalancer(const std::string& name, int healthCheckNodePort,
                                        const std::string& clusterIP);
/// A ClusterIP service default/<name> with internalTrafficPolicy=Local.
kproxy::core::Service internalLocalService(const std::string& name, const std::string& clusterIP);
/// An IPv4 slice for default/<service> on port 8080 ("http"); local endpoints are on node-a.
kproxy::core::EndpointSlice sliceFor(const std::string& service,
                                     const std::vector<LocalEndpoint>& endpoints);
/// Publishes the given objects through a ChangeTracker for node "node-a".
std::shared_ptr<const kproxy::core::Snapshot> snapshotOf(
    const std::vector<kproxy::core::Service>& services,
    const std::vector<kproxy::core::EndpointSlice>& slices);

/// Silences kproxy's log for the lifetime of the object.
struct QuietLog {
  QuietLog();
  ~QuietLog();
};

}  // namespace ops_test
