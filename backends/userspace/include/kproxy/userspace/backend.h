#pragma once
/// UserspaceBackend: `--proxy-mode=userspace`. Every sync turns the plan of every service port
/// into the proxy's listeners (ProxyServer: one per service port and endpoint pool) and into the
/// `kproxy-userspace` nftables table that redirects the service's addresses to them
/// (renderer.h), which goes to the kernel through the nftables backend's differ and netlink
/// kernel: element-level diffs against a mirror, one atomic batch, a read-back of the table on
/// full syncs, nothing outside the table touched.
///
/// Order within a sync: new listeners and new pools first, then the table, then listeners no
/// longer wanted are closed, so a redirect never points at a closed port. A refused batch
/// leaves the mirror as it was and makes the next sync full. Every sync renders every service
/// port (the table holds one element per service address, not per endpoint, so this is cheap
/// next to relaying the traffic).
///
/// The client's source address is not preserved: the endpoint sees a connection from the node.
/// Thread-safety: one sync at a time (the plugin ABI guarantees it); the proxy runs on its own
/// thread (proxy.h).

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/backends/common/reconciler.h"
#include "kproxy/nftables/differ.h"
#include "kproxy/plan/options.h"
#include "kproxy/nftables/kernel.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plan/snapshot_source.h"
#include "kproxy/plugin/sdk.h"
#include "kproxy/userspace/proxy.h"
#include "kproxy/userspace/renderer.h"

namespace kproxy::userspace {

struct UserspaceSettings {
  ProxySettings proxy;
  /// The options every backend reads alike, parsed once by the plan (plan/options.h).
  plan::CommonOptions common;
  plan::PlanConfig plan;  ///< plan::planConfigOf(common), before the node's part
  /// No conntrack cleanup, " dry_run=true" in the summary, listeners bound but not listening;
  /// the factory then gives the backend the printing decorators (kernel.h).
  bool dryRun = false;
  /// Where dry-run prints the listeners' and the table's changes (nft syntax).
  std::FILE* dryRunOutput = stdout;
};

/// Reads the plugin options (plugins/README.md: the common ones, `udp-timeout` and the
/// `userspace-*` keys); an error of category invalid input names the bad option.
sdk::Expected<UserspaceSettings> parseUserspaceSettings(const sdk::Options& options);

/// The proxy's metrics on the host's /metrics (inactive on a host without plugin metrics).
class MetricsObserver final : public ProxyObserver {
 public:
  static sdk::Expected<std::shared_ptr<MetricsObserver>> create(const sdk::Host& host);
  void active(const std::string& service, bool udp, int delta) override;
  void attempt(const std::string& service, bool retry) override;
  void refused(const std::string& service, bool udp, RefusedReason reason) override;
  void bytes(const std::string& service, bool udp, std::uint64_t toEndpoint, std::uint64_t toClient) override;
  /// Gauge kproxy_userspace_listeners{protocol}: listeners open after the last sync.
  sdk::Metric listeners;

 private:
  sdk::Metric active_, attempts_, retries_, refused_, bytes_;
};

/// The userspace backend: one pass (listeners, then the redirect table) under the one
/// reconcile skeleton (backends/common/reconciler.h); a full pass reads the table back first.
class UserspaceBackend final : public backends::Reconciler {
 public:
  /// `kernel`: the table's; `listeners`: the proxy's sockets (a ProxyServer, made with
  /// settings.proxy and `metrics`). In --dry-run, their printing decorators (kernel.h).
  UserspaceBackend(sdk::Host host, UserspaceSettings settings, std::unique_ptr<nftables::KernelNftables> kernel,
                   std::unique_ptr<ProxyListeners> listeners, std::shared_ptr<MetricsObserver> metrics);

  /// Deletes the table in both families (the listeners close with the backend).
  sdk::Expected<void> cleanup() override;
  /// `kproxy explain`: renders the table for `snapshot` with this backend's settings, traces the
  /// packet through it (the nftables backend's tracer) and, where it is redirected to a
  /// listener, answers with the endpoints the proxy relays to, always from the node. Reads
  /// neither the kernel nor the running proxy.
  sdk::Expected<std::string> explain(const sdk::SnapshotView& snapshot, const sdk::ExplainRequest& request) override;

  const nftables::Mirror& mirror() const { return mirror_; }
  /// The listeners' ports by listener id after the last sync.
  const std::map<std::string, std::uint16_t>& listenerPorts() const { return ports_; }

 protected:
  sdk::Expected<backends::PassOutcome> fullSync(const plan::SnapshotSource& next) override {
    return pass(next, true);
  }
  sdk::Expected<backends::PassOutcome> partialSync(const plan::SnapshotSource& next,
                                                   const std::vector<sdk::ChangedKey>&) override {
    return pass(next, false);
  }

 private:
  /// Every pass renders every port; an endpoint change touches only the proxy's pools.
  sdk::Expected<backends::PassOutcome> pass(const plan::SnapshotSource& next, bool full);

  sdk::Host host_;
  UserspaceSettings settings_;
  std::unique_ptr<nftables::KernelNftables> kernel_;
  std::unique_ptr<ProxyListeners> listeners_;
  std::shared_ptr<MetricsObserver> metrics_;
  nftables::Mirror mirror_;
  std::map<std::string, std::uint16_t> ports_;
};

/// The factory the plugin entry uses.
sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeUserspaceBackend(const sdk::Host& host,
                                                                         const sdk::Options& options);

}  // namespace kproxy::userspace
