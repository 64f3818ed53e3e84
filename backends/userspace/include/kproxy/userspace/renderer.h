#pragma once
/// The userspace proxy's nftables table: what sends a service's addresses to its listeners.
///
/// Table `kproxy-userspace`, in the ip and ip6 families (kproxy owns it whole and touches no
/// other table):
///   - verdict maps `services` (address . protocol . port) and `nodeports` (protocol . port),
///     for any client, and `shortcircuit` / `shortcircuit-nodeports`, for this node's pods and
///     the node itself reaching an externalTrafficPolicy=Local service's external addresses
///     (the plan's short-circuit: they use the cluster-wide pool);
///   - base chains `prerouting` (nat, dstnat: pods and other hosts) and `output` (nat, -100:
///     the node's own connections) that look the packet up in those maps (NodePorts on every
///     local address but loopback, or, when --nodeport-addresses selects addresses, on those in
///     set `nodeport-ips`);
///   - a set `cluster-ips`: the other ports of a ClusterIP are refused (`reject-chain`), as
///     the nftables mode does; then chain `cluster-ips-check` drops what is left inside a
///     ServiceCIDR (an address no Service holds), as upstream;
///   - a chain `firewall-<proto>-<port>` per listener of a LoadBalancer with
///     loadBalancerSourceRanges (the plan's allowed sources go on to the listener, others drop);
///   - a chain `redirect-<proto>-<port>` per listener, `redirect to :<port>`, which the maps'
///     elements go to; and `reject-chain` (a TCP reset, else ICMP port unreachable) for a
///     service without endpoints, as the plan's reject; the plan's drop is a `drop` element.
/// An endpoint change never touches the table (the proxy's pools change); a service's
/// addresses or listener are map elements and at most one chain.
///
/// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kproxy/nftables/ir.h"

namespace kproxy::userspace {

/// The table the userspace mode owns, in both families.
inline constexpr std::string_view kTableName = "kproxy-userspace";

/// What one service address (or NodePort) does with a new connection.
struct RedirectAction {
  enum class Kind : std::uint8_t { kListener, kReject, kDrop };
  Kind kind = Kind::kListener;
  std::uint16_t listenerPort = 0;  ///< kListener
  bool operator==(const RedirectAction&) const = default;
};

struct RedirectEntry {
  std::uint8_t proto = 6;  ///< IPPROTO_TCP / IPPROTO_UDP
  /// The service address; nullopt: a NodePort (every local address but loopback).
  std::optional<net::Prefix> address;
  std::uint16_t port = 0;
  /// For this node's pods and the node itself only (the eTP=Local short-circuit).
  bool shortCircuit = false;
  /// The address is a ClusterIP: connections to its other ports are refused.
  bool clusterIP = false;
  RedirectAction action;
  /// loadBalancerSourceRanges (a LoadBalancer IP with a listener): only these sources reach
  /// the listener, through chain `firewall-<proto>-<port>`; others are dropped. Empty: no filter.
  std::vector<net::Prefix> allowedSources;
};

/// One family's table.
struct RenderedTable {
  std::vector<nftables::SetSpec> sets;
  std::vector<nftables::Chain> chains;
  std::vector<nftables::Element> elements;
};

/// The sets of the table (fixed: the same whatever the services).
std::vector<nftables::SetSpec> userspaceSetSpecs(net::Family family);

/// Renders `family`'s table for `entries`. `podMatches` tell this node's pods' traffic
/// (nftables::podTrafficMatches); empty when the detector cannot, and then only the node itself
/// takes the short-circuit. `nodePortAddresses`: where NodePorts answer (nullopt: every local
/// address but loopback). An address (or NodePort) listed twice keeps its first entry.
/// `serviceCIDRs`: the ServiceCIDR ranges of `family` (plan::serviceCIDRRanges).
RenderedTable renderUserspaceTable(net::Family family, const std::vector<RedirectEntry>& entries,
                                   const std::vector<std::vector<nftables::Statement>>& podMatches,
                                   const std::optional<std::vector<net::Prefix>>& nodePortAddresses = std::nullopt,
                                   const std::vector<net::Prefix>& serviceCIDRs = {});

/// The name of a listener's redirect chain, "redirect-tcp-40123".
std::string redirectChainName(std::uint8_t proto, std::uint16_t listenerPort);

}  // namespace kproxy::userspace
