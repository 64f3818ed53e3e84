// EbpfBackend (backend.h): the passes over the maps, and the ids of service ports.
#include "kproxy/ebpf/backend.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace kproxy::ebpf {
namespace {

/// Milliseconds of each phase of a pass, for its summary.
class Stopwatch {
 public:
  /// Since the previous lap (or the start).
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

std::string portKeyOf(net::Family family, const std::string& key) {
  return (family == net::Family::kIPv6 ? "6|" : "4|") + key;
}

/// FNV-1a of the port's key: its id when no other port holds that value.
std::uint32_t hashId(const std::string& portKey) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : portKey) h = (h ^ c) * 16777619u;
  return h == 0 ? 1 : h;
}

sdk::PluginError pluginError(const core::Error& e) {
  return sdk::PluginError{e.errnum, e.message(), sdk::kernelErrorCategory(e.errnum)};
}

/// Whether the node's addresses (what NodePorts follow) or pod CIDRs changed.
std::vector<std::string> nodeFingerprint(const sdk::NodeInfo& node) {
  std::vector<std::string> out = node.addresses;
  out.insert(out.end(), node.podCIDRs.begin(), node.podCIDRs.end());
  out.push_back(node.nodePortAddresses.allLocalIPv4 ? "all4" : "-");
  out.push_back(node.nodePortAddresses.allLocalIPv6 ? "all6" : "-");
  out.insert(out.end(), node.nodePortAddresses.addresses.begin(), node.nodePortAddresses.addresses.end());
  return out;
}

/// The nftables part: nftables mode's backend without ClusterIP dispatch for the protocols the
/// hooks steer, in its own tables.
std::unique_ptr<nftables::NftablesBackend> makeExternalPart(const sdk::Host& host, const BackendSettings& settings,
                                                            std::unique_ptr<nftables::KernelNftables> tables) {
  nftables::BackendSettings part;
  part.render = nftablesPartConfig(settings.render);
  part.dryRun = settings.dryRun;
  part.dryRunOutput = settings.dryRunOutput;
  part.mode = "ebpf-nftables";
  part.table = kNftablesTable;
  return std::make_unique<nftables::NftablesBackend>(host, std::move(part), std::move(tables));
}

}  // namespace

nftables::RenderConfig nftablesPartConfig(const RenderConfig& config) {
  nftables::RenderConfig part;
  part.common = config.common;
  part.clusterIPSteeredElsewhere.assign(kSteeredProtocols.begin(), kSteeredProtocols.end());
  return part;
}

EbpfBackend::EbpfBackend(sdk::Host host, BackendSettings settings, std::unique_ptr<KernelMaps> kernel,
                         std::unique_ptr<nftables::KernelNftables> tables)
    // Steered sockets are never NATed; the conntrack cleanup is for the nftables part's flows.
    : Reconciler(host, backends::kernelReconcilerOptions("ebpf", settings.dryRun, settings.dryRunOutput)),
      host_(host),
      settings_(std::move(settings)),
      renderer_(settings_.render),
      kernel_(std::move(kernel)),
      external_(makeExternalPart(host_, settings_, std::move(tables))) {}

std::uint32_t EbpfBackend::idOf(net::Family family, const std::string& key) const {
  auto it = ids_.find(portKeyOf(family, key));
  return it == ids_.end() ? 0 : it->second;
}

void EbpfBackend::assignId(const std::string& portKey, PortMaps& maps, std::uint32_t kernelHint) {
  auto [it, inserted] = ids_.emplace(portKey, 0);
  if (inserted) {
    std::uint32_t id = kernelHint != 0 && !usedIds_.contains(kernelHint) ? kernelHint : hashId(portKey);
    while (usedIds_.contains(id) || id == 0) ++id;
    usedIds_.insert(id);
    it->second = id;
  }
  maps.setId(it->second);
}

void EbpfBackend::releaseId(const std::string& portKey) {
  if (auto it = ids_.find(portKey); it != ids_.end()) {
    usedIds_.erase(it->second);
    ids_.erase(it);
  }
}

MapContents EbpfBackend::mirror() const {
  MapContents m;
  for (const auto& [key, maps] : ports_) addPortMaps(m, maps);
  return m;
}

sdk::Expected<backends::PassOutcome> EbpfBackend::write(const std::vector<MapOp>& ops, std::size_t services,
                                                        std::size_t slots) {
  lastWrites_ = ops.size();
  if (!ops.empty())
    if (auto applied = kernel_->apply(ops); !applied) {
      noteWrite(ops.size(), /*refused=*/true);
      return std::unexpected(pluginError(applied.error()));
    }
  noteWrite(ops.size(), /*refused=*/false);
  backends::PassOutcome out;
  out.operations = ops.size();
  out.detail = fmt::format("services={} slots={}", services, slots);
  if (!ops.empty()) out.detail += " first=\"" + ops.front().toText() + "\"";
  return out;
}

sdk::Expected<backends::PassOutcome> EbpfBackend::fullSync(const plan::SnapshotSource& next) {
  Stopwatch clock;
  // The nftables part first, in one transaction: refused, it leaves the maps untouched too.
  if (auto synced = external_->syncFrom(next, {}, true); !synced) return std::unexpected(synced.error());
  const double nftMs = clock.lap();
  auto current = kernel_->readBack();
  if (!current) return std::unexpected(pluginError(current.error()));
  const double readMs = clock.lap();
  const sdk::NodeInfo node = next.node();
  renderer_.setNode(node);
  nodeAddresses_ = nodeFingerprint(node);

  std::vector<std::pair<std::string, PortMaps>> rendered;
  std::map<std::string, std::string> internal;
  next.forEach([&](const sdk::ServicePort& port) {
    PortMaps maps = renderer_.render(port);
    if (!port.externallyAccessible()) internal.emplace(portKeyOf(port.family, port.key), port.clusterIP);
    if (!maps.services.empty()) rendered.emplace_back(portKeyOf(port.family, port.key), std::move(maps));
  });
  // Sorted, so that ids given by hash and probing come out the same from the same snapshot.
  std::sort(rendered.begin(), rendered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::set<std::string> present;
  for (const auto& [key, maps] : rendered) present.insert(key);
  for (auto it = ids_.begin(); it != ids_.end();) {
    if (present.contains(it->first)) {
      ++it;
    } else {
      usedIds_.erase(it->second);
      it = ids_.erase(it);
    }
  }
  // Ports the backend knows keep their ids; then ports a previous run gave an id take it back;
  // then the rest.
  auto kernelIdOf = [&](const PortMaps& maps) -> std::uint32_t {
    auto it = current->services.find(maps.services.front().first);
    return it == current->services.end() ? 0 : it->second.id;
  };
  for (auto& [key, maps] : rendered)
    if (ids_.contains(key)) assignId(key, maps, 0);
  for (auto& [key, maps] : rendered)
    if (!ids_.contains(key))
      if (std::uint32_t hint = kernelIdOf(maps); hint != 0 && !usedIds_.contains(hint)) assignId(key, maps, hint);
  for (auto& [key, maps] : rendered)
    if (maps.id() == 0) assignId(key, maps, 0);

  // Maps that hold nothing (a node's first sync) are filled port by port; otherwise the union
  // of the ports is compared with what the kernel holds.
  std::vector<MapOp> ops;
  std::size_t services = 0, slots = 0;
  if (current->services.empty() && current->slots.empty()) {
    std::vector<const PortMaps*> ports;
    ports.reserve(rendered.size());
    for (const auto& [key, maps] : rendered) {
      ports.push_back(&maps);
      services += maps.services.size();
      slots += maps.slots.size();
    }
    ops = fillEmptyMaps(ports);
  } else {
    MapContents desired;
    for (const auto& [key, maps] : rendered) addPortMaps(desired, maps);
    services = desired.services.size();
    slots = desired.slots.size();
    ops = diffMaps(*current, desired);
  }
  const double renderMs = clock.lap();
  auto out = write(ops, services, slots);
  if (!out) return out;
  out->detail += fmt::format(" nft_ms={:.1f} read_ms={:.1f} render_ms={:.1f} write_ms={:.1f}", nftMs, readMs,
                             renderMs, clock.lap());
  ports_.clear();
  for (auto& [key, maps] : rendered) ports_.emplace(key, std::move(maps));
  internalOnly_ = std::move(internal);
  return published(std::move(*out), /*full=*/true);
}

sdk::Expected<backends::PassOutcome> EbpfBackend::partialSync(const plan::SnapshotSource& next,
                                                              const std::vector<sdk::ChangedKey>& changed) {
  // NodePorts follow the node's addresses: a node change re-renders every port.
  if (nodeFingerprint(next.node()) != nodeAddresses_) return fullSync(next);
  Stopwatch clock;
  // The changed ports as the snapshot has them now; the nftables part is given only those it
  // renders differently: a port that had and has no external entry point, with the same
  // ClusterIP, is the same cluster-ips element before and after (a ClusterIP's endpoint change
  // costs the part nothing, not even its generation read).
  std::map<std::string, std::optional<sdk::ServicePort>> nextPorts;
  std::vector<sdk::ChangedKey> forPart;
  for (const auto& c : changed) {
    const std::string key = portKeyOf(c.family, c.key);
    if (nextPorts.contains(key)) continue;
    auto port = next.find(c.family, c.key);
    auto was = internalOnly_.find(key);
    const bool same = was != internalOnly_.end() && port && !port->externallyAccessible() && port->clusterIP == was->second;
    if (!same) forPart.push_back(c);
    nextPorts.emplace(key, std::move(port));
  }
  if (!forPart.empty())
    if (auto synced = external_->syncFrom(next, forPart, false); !synced) return std::unexpected(synced.error());
  const double nftMs = clock.lap();
  MapContents current, desired;
  std::map<std::string, PortMaps> updated;
  std::vector<std::string> removed;
  for (const auto& c : changed) {
    const std::string key = portKeyOf(c.family, c.key);
    if (updated.contains(key)) continue;
    if (auto old = ports_.find(key); old != ports_.end()) addPortMaps(current, old->second);
    PortMaps maps;
    if (const auto& port = nextPorts.at(key)) maps = renderer_.render(*port);
    if (maps.services.empty()) {
      removed.push_back(key);
      updated.emplace(key, PortMaps{});
      continue;
    }
    assignId(key, maps, 0);
    addPortMaps(desired, maps);
    updated.emplace(key, std::move(maps));
  }
  const double renderMs = clock.lap();
  auto out = write(diffMaps(current, desired), desired.services.size(), desired.slots.size());
  if (!out) return out;
  out->detail += fmt::format(" nft_ms={:.2f} render_ms={:.2f} write_ms={:.2f}", nftMs, renderMs, clock.lap());
  for (auto& [key, maps] : updated) {
    if (maps.services.empty())
      ports_.erase(key);
    else
      ports_[key] = std::move(maps);
  }
  for (const auto& [key, port] : nextPorts) {
    if (port && !port->externallyAccessible())
      internalOnly_[key] = port->clusterIP;
    else
      internalOnly_.erase(key);
  }
  // Ids are freed only now, so that no port of this pass took one whose old slots it met.
  for (const auto& key : removed) releaseId(key);
  return published(std::move(*out), /*full=*/false);
}

sdk::Expected<void> EbpfBackend::cleanup() {
  if (auto removed = kernel_->removeAll(); !removed) return std::unexpected(pluginError(removed.error()));
  if (auto removed = external_->cleanup(); !removed) return removed;
  ports_.clear();
  internalOnly_.clear();
  ids_.clear();
  usedIds_.clear();
  requireFullSync();
  return {};
}

}  // namespace kproxy::ebpf
