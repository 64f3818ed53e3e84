#pragma once
/// EbpfBackend: --proxy-mode=ebpf. Socket-level load balancing: BPF programs on the cgroup v2
/// hooks connect4/6, sendmsg4/6, recvmsg4/6 and getpeername4/6 (bpf/kproxy_sock.bpf.c) give a
/// connect or datagram to a service address an endpoint's address before the kernel routes
/// it. The backend keeps their services and slots maps what the plan says (renderer.h), with
/// the ordered writes of differ.h.
///
/// Full syncs (the first, after a failure, the host's periodic ones) read both maps back and
/// write only what differs: over a node whose maps a previous run pinned and left as the
/// snapshot says, a restart writes nothing. Partial syncs never read the kernel: they diff the
/// changed service ports against the mirror of what was applied.
///
/// A service port's id (the key of its slots and affinity) is kept for as long as the port
/// exists; a new port takes the id a previous run gave it (read back from its first address's
/// element) or else a hash of its key, probed past ids in use.
///
/// Traffic no socket hook sees (connections from other hosts to NodePorts on the node's
/// NodePort addresses, externalIPs and LoadBalancer IPs) is the nftables part's: the nftables
/// backend, composed, in tables `ip`/`ip6 kproxy-ebpf`, rendered from the same plan in the same
/// sync without ClusterIP dispatch for TCP and UDP (nftables/renderer.h,
/// RenderConfig::clusterIPSteeredElsewhere; an SCTP ClusterIP is dispatched there): eTP
/// Local, source ranges and masquerading are nftables mode's own. Each sync writes the nftables
/// part first, in one transaction, then the maps in their ordered writes: a refused
/// transaction leaves both as they were, a refused map write leaves the maps whole per service
/// (differ.h) and the nftables part complete; either failure makes the next sync full for both.
/// A partial sync gives the part only the changed ports it renders differently: a port with no
/// external entry point, before and after, with the same ClusterIP, is its cluster-ips element
/// alone, so its endpoint changes touch the maps only.
/// The two never serve the same connection: a steered connect has the endpoint's address
/// before its first packet, so the table sees only what no hook steered.
///
/// Connected UDP sockets keep the endpoint they were steered to. After the syncs that clean
/// stale conntrack flows (a changed UDP service port; a full sync while any UDP port exists),
/// the backend lists the sockets the connect hook steered (in every network namespace of a
/// process in the cgroup) and ends those whose endpoint no longer serves the service port, with
/// the conntrack cleaner's rule and decision (stale_sockets.h): the application's next receive
/// fails with ECONNABORTED (a send, with EDESTADDRREQ) and its next connect is steered anew.
/// Where the kernel cannot end sockets (bpf_sock_destroy, Linux 6.5+) it warns once and counts
/// each cleanup it could not run.
///
/// Processes outside --ebpf-cgroup-path (the default is the root of the node's cgroup v2
/// hierarchy, so that every local process, every pod's included, is covered) are not steered:
/// their connections to externalIPs, LoadBalancer IPs and NodePorts are served by the nftables
/// part as in nftables mode, and those to ClusterIPs are rejected (a ClusterIP is in the table's
/// `cluster-ips`, which rejects what is not dispatched). A narrower cgroup suits tests and
/// nodes whose pods all live under it; a CNI whose pods run elsewhere needs the default.
///
/// Thread-safety: one thread at a time (the plugin ABI guarantees it).

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kproxy/backends/common/reconciler.h"
#include "kproxy/ebpf/differ.h"
#include "kproxy/ebpf/kernel.h"
#include "kproxy/ebpf/leftovers.h"
#include "kproxy/ebpf/renderer.h"
#include "kproxy/nftables/backend.h"
#include "kproxy/plan/snapshot_source.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ebpf {

struct BackendSettings {
  RenderConfig render;
  /// " dry_run=true" in the summary; the factory gives the backend a printer over an empty fake.
  bool dryRun = false;
  std::FILE* dryRunOutput = stdout;
};

class EbpfBackend final : public backends::Reconciler {
 public:
  /// `tables`: the nftables part's kernel, for tables kNftablesTable.
  EbpfBackend(sdk::Host host, BackendSettings settings, std::unique_ptr<KernelMaps> kernel,
              std::unique_ptr<nftables::KernelNftables> tables);

  /// Detaches the programs, removes the pins and deletes the nftables part's tables. Safe to
  /// run twice.
  sdk::Expected<void> cleanup() override;
  /// `kproxy explain`: renders `snapshot` with this backend's settings and traces the packet
  /// with the data path's decision (explain.h, in explain.cpp); reads neither the maps nor the
  /// mirror.
  sdk::Expected<std::string> explain(const sdk::SnapshotView& snapshot, const sdk::ExplainRequest& request) override;

  /// What the maps hold after the last sync, as the backend believes.
  MapContents mirror() const;
  /// Element writes of the last sync.
  std::size_t lastWrites() const { return lastWrites_; }
  /// The id of service port `key` of `family` (0: none).
  std::uint32_t idOf(net::Family family, const std::string& key) const;
  /// The nftables part.
  const nftables::NftablesBackend& externalPart() const { return *external_; }

  /// The metrics this backend keeps on the host's /metrics (inactive ones do nothing); status.cpp.
  struct Metrics {
    /// Gauge kproxy_ebpf_map_elements{map}: the elements of services and slots after the last
    /// successful sync, of affinity and reverse (the data path's) as the last full sync counted.
    sdk::Metric elements;
    /// Counter kproxy_ebpf_map_operations_total: element writes and deletes of accepted passes.
    sdk::Metric operations;
    /// Counter kproxy_ebpf_map_operation_failures_total: passes whose write the kernel refused.
    sdk::Metric failures;
    /// Counter kproxy_ebpf_socket_operations_total{operation}: connected UDP sockets steered to
    /// an endpoint that the stale-socket cleanups listed ("listed") and ended ("ended").
    sdk::Metric socketOperations;
    /// Counter kproxy_ebpf_socket_operation_failures_total{reason}: stale-socket cleanups that
    /// did not complete: "kernel" (a pass refused; the next cleanup tries again) or
    /// "unsupported" (the kernel cannot end sockets); and "namespace", one per network
    /// namespace a cleanup could not walk (the others' sockets were cleaned).
    sdk::Metric socketFailures;
  };
  /// Registers Metrics with the host (ABI 1.2; inactive on an older host).
  static sdk::Expected<Metrics> registerMetrics(const sdk::Host& host);
  void useMetrics(Metrics metrics) { metrics_ = std::move(metrics); }
  /// The data path's elements, as the last full sync counted them.
  const DataPathCounts& dataPathCounts() const { return dataPath_; }

  /// The stale-socket cleanup of a sync from `previous` to `next` (every service port of each
  /// snapshot) over `changed`, as cleanAfterSync runs it after the host's syncs; for tests
  /// that sync with syncFrom. Logged and counted as there; the error is returned as well.
  core::Result<backends::ConntrackCleanupReport> endStaleSockets(const std::vector<sdk::ServicePort>& previous,
                                                                 const std::vector<sdk::ServicePort>& next,
                                                                 const std::vector<sdk::ChangedKey>& changed,
                                                                 bool full);

 protected:
  sdk::Expected<backends::PassOutcome> fullSync(const plan::SnapshotSource& next) override;
  sdk::Expected<backends::PassOutcome> partialSync(const plan::SnapshotSource& next,
                                                   const std::vector<sdk::ChangedKey>& changed) override;
  /// Ends the connected UDP sockets the sync left steered to an endpoint that no longer serves.
  void cleanAfterSync(const sdk::SyncContext& context) override;

 private:
  /// The stale-socket cleanup with `decide` (the conntrack cleaner's afterSync over one of its
  /// inputs), logged and counted. status.cpp.
  core::Result<backends::ConntrackCleanupReport> endStaleSockets(
      const std::function<core::Result<backends::ConntrackCleanupReport>(backends::ConntrackCleaner&)>& decide);
  /// Gives `maps` the port's id: the one it has, else `kernelHint` (a previous run's) when
  /// free, else its key's hash probed past ids in use.
  void assignId(const std::string& portKey, PortMaps& maps, std::uint32_t kernelHint);
  void releaseId(const std::string& portKey);
  /// Applies `ops`; the summary names the elements the maps hold after it (`services`, `slots`).
  sdk::Expected<backends::PassOutcome> write(const std::vector<MapOp>& ops, std::size_t services, std::size_t slots);
  /// Counts a pass's writes: `ops` accepted, or one refusal. status.cpp.
  void noteWrite(std::size_t ops, bool refused);
  /// A successful pass, reported: the elements per map on the metrics and, after a full pass,
  /// the data path's elements counted and added to the summary. status.cpp.
  backends::PassOutcome published(backends::PassOutcome out, bool full);

  sdk::Host host_;
  BackendSettings settings_;
  EbpfRenderer renderer_;
  std::unique_ptr<KernelMaps> kernel_;
  std::unique_ptr<nftables::NftablesBackend> external_;
  std::map<std::string, PortMaps> ports_;  ///< "4|ns/svc:port" → its elements as applied
  /// The ports (as applied) with no external entry point → their ClusterIP: the nftables part
  /// holds only their cluster-ips element, so their endpoint changes skip the part.
  std::map<std::string, std::string> internalOnly_;
  std::map<std::string, std::uint32_t> ids_;
  std::set<std::uint32_t> usedIds_;
  std::vector<std::string> nodeAddresses_;  ///< the node the renderer was last given
  std::size_t lastWrites_ = 0;
  Metrics metrics_;
  DataPathCounts dataPath_;
  bool warnedCannotEndSockets_ = false;
};

/// The nftables part's RenderConfig: ebpf mode's common options, without ClusterIP dispatch for
/// the protocols the socket hooks steer.
/// What the backend's syncs render the part with, and what explain traces it with.
nftables::RenderConfig nftablesPartConfig(const RenderConfig& config);

/// The plugin's factory: options → settings; checks that the kernel has what the mode needs
/// and opens the libbpf adapter (in --dry-run, a printer over an empty fake). Options:
/// ebpf-cgroup-path (default: the root of the cgroup v2 hierarchy), ebpf-pin-path (default
/// /sys/fs/bpf/kproxy), and the common ones (plan/options.h).
sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeEbpfBackend(const sdk::Host& host, const sdk::Options& options);

}  // namespace kproxy::ebpf
