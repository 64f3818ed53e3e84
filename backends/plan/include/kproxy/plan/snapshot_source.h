#pragma once
/// SnapshotSource: what a backend's sync reads — the next snapshot's service ports, node and
/// ServiceCIDRs — whether it comes from the host (HostSnapshot, over the plugin ABI) or from a
/// vector (VectorSnapshot: tests and benchmarks). Shared by every backend.
///
/// Thread-safety: a source is read by one sync at a time; VectorSnapshot builds its index on
/// the first find, so concurrent finds on one instance race.

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kproxy/plugin/sdk.h"

namespace kproxy::plan {

class SnapshotSource {
 public:
  virtual ~SnapshotSource() = default;
  /// Calls `fn` for every service port, in any order. A full sync renders while iterating, so
  /// the snapshot is never copied as a whole.
  virtual void forEach(const std::function<void(const sdk::ServicePort&)>& fn) const = 0;
  virtual std::optional<sdk::ServicePort> find(net::Family family, const std::string& key) const = 0;
  virtual sdk::NodeInfo node() const = 0;
  /// The cluster's service CIDRs, both families.
  virtual std::vector<sdk::ServiceCIDR> serviceCIDRs() const { return {}; }
};

/// A snapshot held in a vector (tests, benchmarks).
class VectorSnapshot final : public SnapshotSource {
 public:
  VectorSnapshot() = default;
  explicit VectorSnapshot(std::vector<sdk::ServicePort> ports, sdk::NodeInfo node = {})
      : ports_(std::move(ports)), node_(std::move(node)) {}
  void forEach(const std::function<void(const sdk::ServicePort&)>& fn) const override {
    for (const auto& p : ports_) fn(p);
  }
  std::optional<sdk::ServicePort> find(net::Family family, const std::string& key) const override;
  sdk::NodeInfo node() const override { return node_; }
  std::vector<sdk::ServiceCIDR> serviceCIDRs() const override { return serviceCIDRs_; }
  /// The ports, for changing them in place (keys must stay as they are).
  std::vector<sdk::ServicePort>& ports() { return ports_; }
  void setNode(sdk::NodeInfo node) { node_ = std::move(node); }
  void setServiceCIDRs(std::vector<sdk::ServiceCIDR> cidrs) { serviceCIDRs_ = std::move(cidrs); }

 private:
  std::vector<sdk::ServicePort> ports_;
  /// family + key → index, built on the first find (a linear scan would make a benchmark's
  /// partial syncs cost O(services)).
  mutable std::unordered_map<std::string, std::size_t> index_;
  sdk::NodeInfo node_;
  std::vector<sdk::ServiceCIDR> serviceCIDRs_;
};

/// The host's snapshot seen through SnapshotSource.
class HostSnapshot final : public SnapshotSource {
 public:
  explicit HostSnapshot(const sdk::SnapshotView& view) : view_(view) {}
  void forEach(const std::function<void(const sdk::ServicePort&)>& fn) const override {
    view_.forEach([&fn](const sdk::ServicePort& p) { fn(p); });
  }
  std::optional<sdk::ServicePort> find(net::Family family, const std::string& key) const override {
    return view_.find(family, key);
  }
  sdk::NodeInfo node() const override { return view_.node(); }
  std::vector<sdk::ServiceCIDR> serviceCIDRs() const override { return view_.serviceCIDRs(); }

 private:
  sdk::SnapshotView view_;
};

}  // namespace kproxy::plan
