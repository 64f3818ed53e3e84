#pragma once
/// IpvsBackend: --proxy-mode=ipvs. Renders upstream kube-proxy's IPVS mode through the shared
/// service plan (IpvsRenderer) and programs virtual and real servers over generic netlink, the
/// service addresses on the kube-ipvs0 dummy link over rtnetlink, the ipsets with
/// `ipset restore -exist` and the small fixed iptables ruleset with `iptables-restore --noflush`.
///
/// IPVS has no transactions: a sync is a sequence of single netlink messages. Every step is
/// idempotent (an add that finds the object updates it, a delete that finds nothing is done),
/// a step that fails stops the sync with an error naming the object, and the next sync is a full
/// one, which reads the kernel back and repairs whatever the failed sync left half done.
///
/// Full syncs (the first, after a failure, and the host's periodic ones) dump the virtual
/// servers and their real servers, kube-ipvs0's addresses, `ipset save` and the two iptables
/// tables, and change only what differs; over an unchanged kernel they write nothing. Partial
/// syncs never read the kernel: they diff the changed service ports' renders against the
/// mirror of what was applied, so a one-endpoint change is one or two netlink messages.
///
/// Ownership: kproxy deletes only virtual servers whose address is bound to kube-ipvs0 (as
/// upstream), is a NodePort address it serves on, whose protocol and port are a NodePort in its
/// KUBE-NODE-PORT-* sets (how a restart or --cleanup finds the NodePorts of services deleted
/// meanwhile), or that it applied itself, and never one inside ipvs-exclude-cidrs; and the
/// firewall-mark virtual servers whose mark carries its tag bit (RenderConfig::fwmarkTag). Other
/// virtual servers, other links, and sets and chains not named by IPVS mode are left alone.
///
/// Graceful termination (upstream's graceful_termination.go): a TCP real server that leaves
/// gets weight 0 and is deleted once it has no active and no inactive connections, or after
/// BackendSettings::gracefulTimeout; UDP and SCTP real servers are deleted at once (the kernel
/// expires their connections on the next packet, expire_nodest_conn=1). Checked on every sync.
///
/// Thread-safety: one thread at a time (the plugin ABI guarantees it).

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <string>
#include <vector>

#include "kproxy/backends/common/reconciler.h"
#include "kproxy/iptables/kernel.h"
#include "kproxy/ipvs/kernel.h"
#include "kproxy/ipvs/renderer.h"
#include "kproxy/plan/snapshot_source.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ipvs {

struct BackendSettings {
  RenderConfig render;
  /// No conntrack cleanup, " dry_run=true" in the summary; the factory then gives the backend
  /// printing adapters over empty fakes, which print to dryRunOutput.
  bool dryRun = false;
  std::FILE* dryRunOutput = stdout;
  /// Program IPv6 too (off when the kernel has no IPv6 or there is no ip6tables).
  bool ipv6 = true;
  /// ipvs-strict-arp: arp_ignore=1 and arp_announce=2 on all interfaces.
  bool strictARP = false;
  /// ipvs-tcp-timeout etc.; a 0 leaves the kernel's value.
  Timeouts timeouts;
  /// ipvs-exclude-cidrs: virtual servers in these are never deleted.
  std::vector<std::string> excludeCIDRs;
  /// The running kernel's release ("6.1.0-56-cloud-amd64"; empty: uname), which decides
  /// conn_reuse_mode as upstream.
  std::string kernelRelease;
  /// How long a TCP real server that left may keep connections before it is deleted anyway.
  std::chrono::seconds gracefulTimeout{std::chrono::minutes(15)};
  /// The clock of graceful termination (tests inject one).
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
};

/// The kernel adapters a backend works through. In --dry-run they are printing decorators
/// (kernel.h, iptables' PrintingIptables) over fakes that start empty.
struct IpvsAdapters {
  std::unique_ptr<KernelIpvs> ipvs;
  std::unique_ptr<KernelDummyLink> link;
  std::unique_ptr<KernelIpsets> ipsets;
  std::unique_ptr<iptables::KernelIptables> iptables;
  std::unique_ptr<kernel::Sysctls> sysctls;
};

/// The IPVS backend: its full and partial passes under the one reconcile skeleton
/// (backends/common/reconciler.h), which owns the sync around them.
class IpvsBackend final : public backends::Reconciler {
 public:
  IpvsBackend(sdk::Host host, BackendSettings settings, IpvsAdapters adapters);

  /// Removes what IPVS mode creates: its virtual servers (as in the ownership rule), the
  /// kube-ipvs0 link, its iptables chains and the jumps to them, then its ipsets. Safe to run
  /// twice; foreign objects stay.
  sdk::Expected<void> cleanup() override;
  /// `kproxy explain`: renders `snapshot` and says which virtual server a packet meets and its
  /// pool; reads neither the kernel nor the mirror.
  sdk::Expected<std::string> explain(const sdk::SnapshotView& snapshot,
                                     const sdk::ExplainRequest& request) override;

  /// Real servers waiting to drain ("TCP 10.96.0.10:80/10.244.1.5:8080").
  std::vector<std::string> terminating() const;
  /// Kernel writes (netlink messages, restores) of the last sync.
  std::size_t lastWrites() const { return lastWrites_; }

  struct Metrics {
    sdk::Metric operations;  ///< counter kproxy_ipvs_operations_total{op}
    sdk::Metric failures;    ///< counter kproxy_ipvs_operation_failures_total{op}
    sdk::Metric objects;     ///< gauge kproxy_ipvs_objects{kind}
  };
  static sdk::Expected<Metrics> registerMetrics(const sdk::Host& host);
  void useMetrics(Metrics metrics) { metrics_ = std::move(metrics); }

 protected:
  sdk::Expected<backends::PassOutcome> fullSync(const plan::SnapshotSource& next) override {
    return pass(next, {}, true);
  }
  sdk::Expected<backends::PassOutcome> partialSync(const plan::SnapshotSource& next,
                                                   const std::vector<sdk::ChangedKey>& changed) override {
    return pass(next, changed, false);
  }

 private:
  /// A virtual server's real servers, sorted by identity (address, then port): a flat array,
  /// since a map keyed by their text takes about twice the memory per real server.
  class RealServers {
   public:
    RealServers() = default;
    /// The first of each identity in `all`.
    explicit RealServers(std::vector<RealServer> all);
    const RealServer* find(const RealServer& identity) const;
    bool contains(const RealServer& identity) const { return find(identity) != nullptr; }
    std::size_t size() const { return sorted_.size(); }
    std::vector<RealServer>::const_iterator begin() const { return sorted_.begin(); }
    std::vector<RealServer>::const_iterator end() const { return sorted_.end(); }

   private:
    std::vector<RealServer> sorted_;
  };
  struct AppliedServer {
    VirtualServer vs;
    RealServers real;
    std::string owner;  ///< the port key that rendered it
  };
  /// The kernel's view of a planned virtual server's real servers.
  static RealServers realServersOf(const PlannedVirtualServer& planned);
  struct Terminating {
    VirtualServer vs;
    RealServer rs;
    std::chrono::steady_clock::time_point since;
  };
  /// What a full sync wants, from every service port.
  struct Wanted {
    std::map<std::string, Fragment> ports;
    std::map<std::string, AppliedServer> servers;
    std::map<std::string, std::size_t> addresses, entries;  ///< with their references
  };
  /// The protocols and ports IPVS mode's NodePort sets hold.
  using NodePorts = std::set<std::pair<Protocol, std::uint16_t>>;

  /// One pass: the differ's full or partial walk, then graceful termination's check; its
  /// summary fields are the virtual servers, the draining real servers and, after a full
  /// pass that wrote, the first writes in ipvsadm notation.
  sdk::Expected<backends::PassOutcome> pass(const plan::SnapshotSource& next,
                                            const std::vector<sdk::ChangedKey>& changed, bool full);

  // The differ (differ.cpp): each difference is written as it is found, in the order that
  // makes before it serves: set entries and chains, then virtual servers, then the addresses
  // that make them answer; and what goes in the reverse order.
  /// Reads the kernel back and repairs whatever differs from `next`.
  sdk::Expected<void> repairAll(const plan::SnapshotSource& next);
  /// Diffs the changed service ports' renders against the mirror.
  sdk::Expected<void> applyChanged(const plan::SnapshotSource& next,
                                   const std::vector<sdk::ChangedKey>& changed);
  Wanted renderWanted(const plan::SnapshotSource& next);
  /// The kernel's virtual servers against `servers`: kproxy's unwanted ones deleted, the
  /// wanted ones updated or added.
  sdk::Expected<void> syncVirtualServers(const std::map<std::string, AppliedServer>& servers,
                                         const std::vector<net::Prefix>& bound,
                                         const NodePorts& nodePorts);
  /// The real servers of the kernel's virtual server `kernel` against `want`'s.
  sdk::Expected<void> syncRealServers(const VirtualServer& kernel, const AppliedServer& want);
  sdk::Expected<void> syncDummyAddresses(const std::map<std::string, std::size_t>& addresses,
                                         const std::vector<std::string>& bound);
  /// The kernel's sets (`state`) against `entries`: the missing sets created and the missing
  /// entries added (`adding`), or the entries not wanted deleted (not `adding`). A full sync
  /// adds before it serves and deletes after it stops serving.
  sdk::Expected<void> syncIpsets(const std::map<std::string, std::size_t>& entries, const IpsetState& state,
                                 bool adding);
  sdk::Expected<void> applyServer(const AppliedServer* old, const AppliedServer& want);
  sdk::Expected<void> removeServer(const AppliedServer& old);
  sdk::Expected<void> retireRealServer(const VirtualServer& vs, const RealServer& rs);
  sdk::Expected<void> drainTerminating();
  /// Writes the owned chains where they differ: from what the kernel holds (readKernel), else
  /// from what was last written; `portRulesChanged` false says no service port's rules changed.
  sdk::Expected<void> syncIptables(bool readKernel, bool portRulesChanged = true);
  sdk::Expected<void> ensureLink();
  void setSysctls();
  void setTimeouts();

  // Kernel writes: counted, the first ones noted for the summary, idempotent.
  sdk::Expected<void> addServer(const VirtualServer& vs);
  sdk::Expected<void> updateServer(const VirtualServer& vs);
  sdk::Expected<void> deleteServer(const VirtualServer& vs);
  sdk::Expected<void> addReal(const VirtualServer& vs, const RealServer& rs);
  sdk::Expected<void> updateReal(const VirtualServer& vs, const RealServer& rs);
  sdk::Expected<void> deleteReal(const VirtualServer& vs, const RealServer& rs);
  sdk::Expected<void> bindAddress(const std::string& address);
  sdk::Expected<void> unbindAddress(const std::string& address);
  sdk::Expected<void> restoreIpsets(const std::string& input);
  sdk::Expected<void> restoreIptables(net::Family family, const std::string& input);
  sdk::Expected<void> failed(std::string_view op, const core::Error& error);
  void count(std::string_view op);
  /// Keeps the first writes of a pass (in ipvsadm notation) for its summary.
  void noteWrite(std::string text);

  bool familyEnabled(net::Family family) const {
    return family == net::Family::kIPv4 || settings_.ipv6;
  }
  bool ownsAddress(const net::Prefix& address) const;
  /// A firewall mark of kproxy's (its tag bit; ClientIP affinity).
  bool ownsFwmark(std::uint32_t fwmark) const { return (fwmark & settings_.render.fwmarkTag()) != 0; }
  void updateMetrics() const;

  sdk::Host host_;
  BackendSettings settings_;
  IpvsRenderer renderer_;
  IpvsAdapters kernel_;
  std::vector<net::Prefix> exclude_;

  // The mirror of what was applied.
  std::map<std::string, Fragment> ports_;            ///< "4|key" / "6|key" → its last render
  std::map<std::string, AppliedServer> servers_;     ///< VirtualServer::describe() → applied
  std::map<std::string, std::size_t> addresses_;     ///< bound address → references
  std::map<std::string, std::size_t> ipsetEntries_;  ///< "SET ENTRY" → references
  std::string iptablesApplied_[2];                   ///< the owned chains as last written
  std::map<std::string, Terminating> terminating_;   ///< "VS/RS" → since when
  /// The fixed chains as last written, per family: a partial sync that changed no service
  /// port's rules skips the iptables step unless these changed (the node did).
  std::vector<GlobalChain> globalApplied_[2];
  /// kube-ipvs0's addresses changed since the renderer was last told.
  bool dummyAddressesStale_ = true;
  std::size_t lastWrites_ = 0;
  std::vector<std::string> firstWrites_;  ///< the current sync's first writes (ipvsadm notation)
  Metrics metrics_;
};

/// The kernel adapter's form of a planned virtual server (its real servers not included) and of
/// a planned real server (masqueraded).
VirtualServer kernelVirtualServer(const PlannedVirtualServer& planned);
RealServer kernelRealServer(const PlannedRealServer& planned);

/// What `ipvsadm` would be run with to make one change (`-A -t 10.96.0.10:80 -s rr`,
/// `-a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1`, ...): the notation of --dry-run
/// (PrintingIpvs) and of a sync's summary.
std::string ipvsadmCommand(char op, const VirtualServer& vs, const RealServer* rs = nullptr);
/// "ip addr add 10.96.0.10/32 dev kube-ipvs0" (`verb` add or del): the address as the link is
/// given it, a host prefix.
std::string ipAddrCommand(std::string_view verb, const std::string& link, const net::Prefix& address);

/// The plugin's factory: parses the options, opens the adapters (in --dry-run, printing
/// decorators over empty fakes).
sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeIpvsBackend(const sdk::Host& host,
                                                                   const sdk::Options& options);

}  // namespace kproxy::ipvs
