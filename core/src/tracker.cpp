#include "kproxy/core/tracker.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "kproxy/core/log.h"
#include "resolve.h"

namespace kproxy::core {
namespace {

std::string joinName(const std::string& ns, const std::string& name) { return ns + "/" + name; }

// Equality that ignores resourceVersion: a resync or an update that only bumps the version is
// a no-op for the proxy. Both objects may be shared with the source, so neither is modified;
// only an update of a known object with a new version pays for a short-lived copy.
template <typename T>
bool sameIgnoringVersion(const T& incoming, const T& existing) {
  if (incoming.resourceVersion == existing.resourceVersion) return incoming == existing;
  T probe = incoming;
  probe.resourceVersion = existing.resourceVersion;
  return probe == existing;
}

// Slices the proxy never uses: not owned by a service, FQDN addresses, or the endpoint
// controller's headless marker (upstream's informer filters those out).
std::optional<std::string> ignoredSliceReason(const EndpointSlice& slice) {
  if (slice.serviceName.empty()) return "no " + std::string(kLabelServiceName) + " label";
  if (slice.addressType == AddressType::kFQDN) return "FQDN address type";
  if (slice.labels.contains(kLabelHeadless)) return "headless service";
  return std::nullopt;
}

}  // namespace

struct ChangeTracker::Impl {
  explicit Impl(TrackerConfig c) : config(std::move(c)) {
    node.name = config.nodeName;
    resolveNodePorts(node);
    current = std::make_shared<const Snapshot>(Snapshot().withNode(node));
  }

  TrackerConfig config;

  // Objects are immutable and may be shared with the source that delivered them.
  std::unordered_map<std::string, std::shared_ptr<const Service>> services;  // by "ns/name"
  // Slices grouped by their service ("ns/serviceName"), sorted by slice name for a stable
  // order. A vector: nearly every service has one or two slices, and a map per service would
  // cost more than the slices' pointers.
  std::unordered_map<std::string, std::vector<std::shared_ptr<const EndpointSlice>>> slicesByService;
  // "ns/sliceName" -> the slice held; its owner ("ns/serviceName") is read from it, to find a
  // slice on delete and when it moves.
  std::unordered_map<std::string, std::shared_ptr<const EndpointSlice>> slicesByKey;
  // Keys each service currently has in the snapshot, so removed ports can be dropped.
  // The states each service has in the current snapshot (the snapshot's own, shared), so
  // that removed ports can be dropped; their keys are read from them.
  std::unordered_map<std::string, std::vector<std::shared_ptr<const ServicePortState>>> statesByService;

  std::unordered_set<std::string> dirty;
  std::size_t serviceChanges = 0;
  std::size_t endpointChanges = 0;
  std::vector<TriggerTime> triggerTimes;

  NodeInfo node;
  std::vector<NodeAddress> nodeAddresses;  // of the Node object, typed, for detectNodeIPs
  std::optional<std::vector<std::string>> interfaceAddresses;  // once the host has read them
  bool nodeDirty = false;
  std::map<std::string, ServiceCIDR> serviceCIDRs;  // by name
  bool serviceCIDRsDirty = false;
  bool resolveAll = false;  // the zone changed: topology of every service may differ

  std::shared_ptr<const Snapshot> current;

  static std::string ownerOf(const EndpointSlice& slice) { return joinName(slice.ns, slice.serviceName); }

  // The position of the slice named `name` in its service's list, or where it would go.
  static auto slicePosition(std::vector<std::shared_ptr<const EndpointSlice>>& list,
                            const std::string& name) {
    return std::lower_bound(list.begin(), list.end(), name,
                            [](const auto& slice, const std::string& n) { return slice->name < n; });
  }

  // Sets (adds or replaces) a slice in its service's list.
  void placeSlice(const std::string& owner, std::shared_ptr<const EndpointSlice> slice) {
    auto& list = slicesByService[owner];
    auto at = slicePosition(list, slice->name);
    if (at != list.end() && (*at)->name == slice->name) {
      *at = std::move(slice);
    } else {
      list.insert(at, std::move(slice));
    }
  }

  void removeSlice(const std::string& sliceKey, const std::string& owner,
                   const std::string& sliceName) {
    auto it = slicesByService.find(owner);
    if (it != slicesByService.end()) {
      auto& list = it->second;
      auto at = slicePosition(list, sliceName);
      if (at != list.end() && (*at)->name == sliceName) list.erase(at);
      if (list.empty()) slicesByService.erase(it);
    }
    slicesByKey.erase(sliceKey);
    dirty.insert(owner);
  }

  // Decides where NodePorts answer (core/nodeport_addresses.h): against the interface
  // addresses once the host has read them, else against the Node object's addresses (and a
  // specific --bind-address), as `kproxy explain` and a host that cannot read them do.
  // "primary" waits for the Node object (upstream waits for it at start-up).
  void resolveNodePorts(NodeInfo& info) const {
    const auto& spec = config.nodePortAddresses;
    const NodeIPs nodeIPs = detectNodeIPs(nodeAddresses, config.bindAddress);
    if (spec.size() == 1 && spec[0] == "primary" && !info.known) {
      // Until the Node arrives, a --bind-address is the only node IP known: NodePorts answer
      // on it alone (nothing opens on every local address meanwhile).
      info.nodePortAddresses = nodePortAddressesBeforeNode(nodeIPs);
      return;
    }
    if (interfaceAddresses) {
      info.nodePortAddresses = decideNodePortAddresses(spec, *interfaceAddresses, nodeIPs);
      return;
    }
    std::vector<std::string> local;
    for (const auto& a : nodeAddresses) local.push_back(a.address);
    for (const auto* ip : {&nodeIPs.ipv4, &nodeIPs.ipv6})
      if (!ip->empty()) local.push_back(*ip);
    info.nodePortAddresses = decideNodePortAddresses(spec, local, nodeIPs);
  }

  void setNode(NodeInfo next) {
    if (next == node) return;
    if (next.zone != node.zone) resolveAll = true;
    node = std::move(next);
    nodeDirty = true;
  }
};

ChangeTracker::ChangeTracker(TrackerConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
ChangeTracker::~ChangeTracker() = default;

bool ChangeTracker::upsertService(Service service) {
  return upsertService(std::make_shared<const Service>(std::move(service)));
}

bool ChangeTracker::upsertService(std::shared_ptr<const Service> service) {
  const std::string key = joinName(service->ns, service->name);
  auto it = impl_->services.find(key);
  if (it != impl_->services.end()) {
    if (sameIgnoringVersion(*service, *it->second)) return false;
    it->second = std::move(service);
  } else {
    impl_->services.emplace(key, std::move(service));
  }
  impl_->dirty.insert(key);
  ++impl_->serviceChanges;
  return true;
}

bool ChangeTracker::deleteService(const std::string& ns, const std::string& name) {
  const std::string key = joinName(ns, name);
  if (impl_->services.erase(key) == 0) return false;
  impl_->dirty.insert(key);
  ++impl_->serviceChanges;
  return true;
}

bool ChangeTracker::upsertEndpointSlice(EndpointSlice slice) {
  return upsertEndpointSlice(std::make_shared<const EndpointSlice>(std::move(slice)));
}

bool ChangeTracker::upsertEndpointSlice(std::shared_ptr<const EndpointSlice> slice) {
  const std::optional<double> trigger = slice->lastChangeTriggerTime;
  const net::Family family =
      slice->addressType == AddressType::kIPv6 ? net::Family::kIPv6 : net::Family::kIPv4;
  const bool changed = upsertEndpointSliceImpl(std::move(slice));
  if (changed && trigger) impl_->triggerTimes.push_back(TriggerTime{*trigger, family});
  return changed;
}

bool ChangeTracker::upsertEndpointSliceImpl(std::shared_ptr<const EndpointSlice> slice) {
  const std::string sliceKey = joinName(slice->ns, slice->name);
  auto heldIt = impl_->slicesByKey.find(sliceKey);
  if (auto reason = ignoredSliceReason(*slice)) {
    log::info(4, "Ignoring EndpointSlice", {{"endpointSlice", sliceKey}, {"reason", *reason}});
    // It may have been a usable slice before this update.
    if (heldIt == impl_->slicesByKey.end()) return false;
    const std::string owner = Impl::ownerOf(*heldIt->second);
    impl_->removeSlice(sliceKey, owner, slice->name);
    ++impl_->endpointChanges;
    return true;
  }

  const std::string owner = Impl::ownerOf(*slice);
  if (heldIt != impl_->slicesByKey.end()) {
    const std::string previousOwner = Impl::ownerOf(*heldIt->second);
    if (previousOwner == owner) {
      if (sameIgnoringVersion(*slice, *heldIt->second)) return false;
      heldIt->second = slice;
      impl_->placeSlice(owner, std::move(slice));
      impl_->dirty.insert(owner);
      ++impl_->endpointChanges;
      return true;
    }
    // The slice now belongs to another service: both services change.
    impl_->removeSlice(sliceKey, previousOwner, slice->name);
  }
  impl_->slicesByKey.insert_or_assign(sliceKey, slice);
  impl_->placeSlice(owner, std::move(slice));
  impl_->dirty.insert(owner);
  ++impl_->endpointChanges;
  return true;
}

bool ChangeTracker::deleteEndpointSlice(const std::string& ns, const std::string& name) {
  const std::string sliceKey = joinName(ns, name);
  auto it = impl_->slicesByKey.find(sliceKey);
  if (it == impl_->slicesByKey.end()) return false;
  const std::string owner = Impl::ownerOf(*it->second);
  impl_->removeSlice(sliceKey, owner, name);
  ++impl_->endpointChanges;
  return true;
}

bool ChangeTracker::upsertNode(Node node) {
  if (!impl_->config.nodeName.empty() && node.name != impl_->config.nodeName) {
    log::info(4, "Ignoring another node's object", {{"node", node.name}});
    return false;
  }
  NodeInfo info = resolve::nodeInfoFrom(node);
  impl_->nodeAddresses = node.addresses;
  impl_->resolveNodePorts(info);
  if (info == impl_->node) return false;
  impl_->setNode(std::move(info));
  return true;
}

const std::string& ChangeTracker::nodeName() const { return impl_->config.nodeName; }

bool ChangeTracker::deleteNode(const std::string& name) {
  if (!impl_->node.known || name != impl_->node.name) return false;
  NodeInfo info;
  info.name = impl_->config.nodeName;
  impl_->nodeAddresses.clear();
  impl_->resolveNodePorts(info);
  impl_->setNode(std::move(info));
  return true;
}

bool ChangeTracker::setInterfaceAddresses(std::vector<std::string> addresses) {
  if (impl_->interfaceAddresses == addresses) return false;
  impl_->interfaceAddresses = std::move(addresses);
  NodeInfo info = impl_->node;
  impl_->resolveNodePorts(info);
  if (info == impl_->node) return false;
  impl_->setNode(std::move(info));
  return true;
}

bool ChangeTracker::upsertServiceCIDR(ServiceCIDR cidr) {
  auto it = impl_->serviceCIDRs.find(cidr.name);
  if (it != impl_->serviceCIDRs.end()) {
    if (sameIgnoringVersion(cidr, it->second)) return false;
    it->second = std::move(cidr);
  } else {
    std::string name = cidr.name;
    impl_->serviceCIDRs.emplace(std::move(name), std::move(cidr));
  }
  impl_->serviceCIDRsDirty = true;
  return true;
}

bool ChangeTracker::deleteServiceCIDR(const std::string& name) {
  if (impl_->serviceCIDRs.erase(name) == 0) return false;
  impl_->serviceCIDRsDirty = true;
  return true;
}

bool ChangeTracker::hasPendingChanges() const {
  return !impl_->dirty.empty() || impl_->nodeDirty || impl_->serviceCIDRsDirty;
}
std::size_t ChangeTracker::pendingServiceChanges() const { return impl_->serviceChanges; }
std::size_t ChangeTracker::pendingEndpointChanges() const { return impl_->endpointChanges; }

PublishResult ChangeTracker::publish() {
  Impl& d = *impl_;
  PublishResult result;
  result.serviceChanges = std::exchange(d.serviceChanges, 0);
  result.endpointChanges = std::exchange(d.endpointChanges, 0);
  result.triggerTimes = std::exchange(d.triggerTimes, {});

  if (d.resolveAll) {
    for (const auto& [key, svc] : d.services) d.dirty.insert(key);
  }

  Snapshot next = *d.current;
  std::vector<const EndpointSlice*> slices;
  for (const std::string& svcKey : d.dirty) {
    std::vector<std::shared_ptr<const ServicePortState>> states;
    if (auto svc = d.services.find(svcKey); svc != d.services.end()) {
      slices.clear();
      if (auto s = d.slicesByService.find(svcKey); s != d.slicesByService.end()) {
        for (const auto& slice : s->second) slices.push_back(slice.get());
      }
      states = resolve::resolveService(*svc->second, slices, d.config, d.node);
    }

    std::vector<std::shared_ptr<const ServicePortState>> newStates;
    newStates.reserve(states.size());
    for (auto& state : states) {
      auto old = next.find(state->key);
      if (old && *old == *state) {  // unchanged: keep sharing the old entry
        newStates.push_back(std::move(old));
        continue;
      }
      result.changed.push_back(state->key);
      next = next.with(result.changed.back(), state);
      newStates.push_back(std::move(state));
    }
    auto oldStates = d.statesByService.find(svcKey);
    if (oldStates != d.statesByService.end()) {
      for (const auto& old : oldStates->second) {
        const ServicePortKey& key = old->key;
        auto kept = [&key](const auto& state) { return state->key == key; };
        if (std::any_of(newStates.begin(), newStates.end(), kept)) continue;
        result.changed.push_back(key);
        next = next.with(key, nullptr);
      }
    }
    if (newStates.empty()) {
      if (oldStates != d.statesByService.end()) d.statesByService.erase(oldStates);
    } else {
      d.statesByService[svcKey] = std::move(newStates);
    }
  }
  if (d.nodeDirty) next = next.withNode(d.node);
  if (d.serviceCIDRsDirty) {
    std::vector<ServiceCIDRRange> ranges;
    for (const auto& [name, object] : d.serviceCIDRs)
      for (const auto& cidr : object.cidrs) {
        // The API server validates them; a hand-written manifest may not.
        auto parsed = net::parseCIDRSloppy(cidr);
        if (!parsed) {
          log::warning("Ignoring invalid CIDR of a ServiceCIDR", {{"serviceCIDR", name}, {"cidr", cidr}});
          continue;
        }
        ranges.push_back(ServiceCIDRRange{name, parsed->cidrText()});
      }
    std::sort(ranges.begin(), ranges.end());
    ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
    if (ranges != next.serviceCIDRs()) next = next.withServiceCIDRs(std::move(ranges));
  }

  next = next.withGeneration(d.current->generation() + 1);
  std::sort(result.changed.begin(), result.changed.end());
  d.current = std::make_shared<const Snapshot>(std::move(next));
  // clear() would memset every bucket, and the bucket array keeps the size of the largest
  // burst (the initial list): O(cluster) per publish. A fresh set keeps publish O(changes).
  if (d.dirty.bucket_count() > 64) {
    std::unordered_set<std::string>().swap(d.dirty);
  } else {
    d.dirty.clear();
  }
  d.nodeDirty = false;
  d.serviceCIDRsDirty = false;
  d.resolveAll = false;
  result.snapshot = d.current;
  return result;
}

std::shared_ptr<const Snapshot> ChangeTracker::current() const { return impl_->current; }

}  // namespace kproxy::core
