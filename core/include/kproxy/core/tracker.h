#pragma once
/// The change tracker: folds Service / EndpointSlice / Node events into the current model and
/// publishes immutable snapshots. Not thread-safe (the Proxier serialises access).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/core/model.h"
#include "kproxy/core/snapshot.h"

namespace kproxy::core {

struct TrackerConfig {
  std::string nodeName;
  /// IP families this node can program; service ports of other families are skipped with a log.
  bool ipv4 = true;
  bool ipv6 = true;
  /// Honour service.kubernetes.io/service-proxy-name: services carrying it are skipped unless it
  /// equals this value (empty: skip every labelled service, as upstream does by default).
  std::string serviceProxyName;
  /// --nodeport-addresses as validated and defaulted for the mode (CIDRs, or "primary"), and
  /// --bind-address, which "primary" takes as the node IP of its family. Every snapshot's node
  /// carries where NodePorts answer, decided from them (core/nodeport_addresses.h).
  std::vector<std::string> nodePortAddresses;
  std::string bindAddress;
  /// The feature gate PreferSameTrafficDistribution (on by default upstream since 1.34): when
  /// off, EndpointSlices' node hints (forNodes) are ignored, as upstream's endpoint cache does,
  /// so PreferSameNode falls back to the zone hints.
  bool preferSameTrafficDistribution = true;
};

/// The trigger time (annotation endpoints.kubernetes.io/last-change-trigger-time, wall seconds)
/// of one EndpointSlice change, with the slice's family: network programming latency is
/// reported per IP family, as upstream's per-family proxiers report it.
struct TriggerTime {
  double wall = 0;
  net::Family family = net::Family::kIPv4;
  bool operator==(const TriggerTime&) const = default;
};

struct PublishResult {
  std::shared_ptr<const Snapshot> snapshot;
  std::vector<ServicePortKey> changed;  ///< keys whose state differs from the previous snapshot
  std::size_t serviceChanges = 0;        ///< Service events folded into this snapshot
  std::size_t endpointChanges = 0;       ///< EndpointSlice events folded into this snapshot
  /// Trigger times of the EndpointSlice changes folded into this snapshot.
  std::vector<TriggerTime> triggerTimes;
};

class ChangeTracker {
 public:
  explicit ChangeTracker(TrackerConfig config);
  ~ChangeTracker();
  ChangeTracker(const ChangeTracker&) = delete;
  ChangeTracker& operator=(const ChangeTracker&) = delete;

  /// Each returns true when the event changed something (no-op updates are dropped).
  /// The shared forms keep a reference to the (immutable, non-null) object instead of a copy.
  bool upsertService(Service service);
  bool upsertService(std::shared_ptr<const Service> service);
  bool deleteService(const std::string& ns, const std::string& name);
  bool upsertEndpointSlice(EndpointSlice slice);
  bool upsertEndpointSlice(std::shared_ptr<const EndpointSlice> slice);
  bool deleteEndpointSlice(const std::string& ns, const std::string& name);
  bool upsertNode(Node node);
  /// The node this tracker follows (TrackerConfig::nodeName; empty: any Node).
  const std::string& nodeName() const;
  bool deleteNode(const std::string& name);
  /// The node's interface addresses (numeric, both families), read by the host; from the
  /// first call on, NodePort addresses are decided against them instead of the Node object's
  /// addresses. True when they changed.
  bool setInterfaceAddresses(std::vector<std::string> addresses);
  /// ServiceCIDR objects: the snapshot's serviceCIDRs() are the CIDRs of all of them.
  bool upsertServiceCIDR(ServiceCIDR cidr);
  bool deleteServiceCIDR(const std::string& name);

  bool hasPendingChanges() const;
  std::size_t pendingServiceChanges() const;
  std::size_t pendingEndpointChanges() const;

  /// Builds the next snapshot from the pending changes. O(changed services) unless the node's
  /// topology labels changed (then every service is re-resolved).
  PublishResult publish();
  std::shared_ptr<const Snapshot> current() const;

 private:
  bool upsertEndpointSliceImpl(std::shared_ptr<const EndpointSlice> slice);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::core
