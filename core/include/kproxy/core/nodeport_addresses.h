#pragma once
/// Where NodePorts answer on this node: `--nodeport-addresses` decided with upstream kube-proxy's
/// meaning (pkg/proxy/util/nodeport_addresses.go, and "primary" / the node IPs of
/// cmd/kube-proxy/app/server.go). This is the one place that decides it: the tracker calls it
/// for the daemon and for `kproxy explain`, and a backend under a host too old to send the
/// decision calls it through the plan. The host reads the interface addresses; these functions
/// only decide.
/// Thread-safety: pure functions on value types.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/model.h"

namespace kproxy::core {

/// The node's IP per family, as upstream's detectNodeIPs: the Node object's first InternalIP
/// (else ExternalIP) of each family, then a --bind-address other than 0.0.0.0 / :: replaces
/// the IP of its family. "" when a family has none.
struct NodeIPs {
  std::string ipv4;
  std::string ipv6;
  const std::string& of(net::Family family) const { return family == net::Family::kIPv4 ? ipv4 : ipv6; }
  bool operator==(const NodeIPs&) const = default;
};

NodeIPs detectNodeIPs(std::span<const NodeAddress> nodeAddresses, std::string_view bindAddress);

/// Where NodePorts answer on this node.
struct NodePortAddresses {
  /// true once decided (decideNodePortAddresses). A current host always decides; false only
  /// comes from a host older than plugin ABI 1.2, and a backend then decides through the plan.
  bool resolved = false;
  /// The node's interface addresses NodePorts answer on, both families, canonical text,
  /// sorted and unique. Loopback addresses are listed when a CIDR holds them; whether a
  /// backend serves NodePorts on them is its own business (nftables does not, as upstream).
  std::vector<std::string> addresses;
  /// Upstream's MatchAll: every local address of the family, including ones added later
  /// (`addresses` then lists those known now, but for IPv6 link-local ones: nftables and
  /// iptables match any local destination, and IPVS leaves them out as upstream does, so that
  /// a pod's veth appearing on the node changes nothing).
  bool allLocalIPv4 = false;
  bool allLocalIPv6 = false;

  bool allLocal(net::Family family) const {
    return family == net::Family::kIPv4 ? allLocalIPv4 : allLocalIPv6;
  }
  bool operator==(const NodePortAddresses&) const = default;
};

/// The --nodeport-addresses of a mode that was given none: upstream's nftables mode defaults
/// to "primary"; iptables and IPVS (and kproxy's userspace mode) to none, every local address.
std::vector<std::string> defaultNodePortAddresses(std::string_view mode);

/// Decides `spec` (the validated --nodeport-addresses: CIDRs of either family, or the one
/// keyword "primary") against `localAddresses` (numeric, either family; malformed entries are
/// ignored). Per family, as upstream:
///  - "primary" becomes the node IP of each family (/32, /128), skipping a loopback or
///    unknown one;
///  - a family without any CIDR, or with 0.0.0.0/0 (::/0), answers on every local address;
///  - otherwise on the local addresses inside one of the family's CIDRs.
/// `localAddresses` are the node's interface addresses where the host can read them; where it
/// cannot (`kproxy explain`, which does not run on the node, or a host whose address watcher
/// failed) they are the Node object's addresses, which every node holds. The result has
/// `resolved` set.
NodePortAddresses decideNodePortAddresses(std::span<const std::string> spec,
                                          std::span<const std::string> localAddresses,
                                          const NodeIPs& nodeIPs);

/// Where NodePorts answer before the Node object is known with "primary": on `nodeIPs` alone
/// (a --bind-address, the only node IP known then), else nowhere (upstream waits for the Node
/// object at start-up; answering on every local address meanwhile would open NodePorts the
/// operator closed). Decided (`resolved` set).
NodePortAddresses nodePortAddressesBeforeNode(const NodeIPs& nodeIPs);

}  // namespace kproxy::core
