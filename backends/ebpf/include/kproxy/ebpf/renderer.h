#pragma once
/// EbpfRenderer: the service plan (backends/plan) → the elements of ebpf mode's services and
/// slots maps for one service port.
///
/// What a socket hook sees is always this node's own traffic (its pods and processes), so each
/// address of a service port is rendered with the pool the plan gives that traffic:
///   - the ClusterIP: the internal pool (cluster, or local with internalTrafficPolicy Local);
///   - externalIPs, LoadBalancer IPs and NodePorts on the node's NodePort addresses: the
///     cluster pool, as the plan's short-circuit does for pods and the node under
///     externalTrafficPolicy Local, and as Cluster policy always does;
///   - a pool without endpoints renders count 0: the data path refuses the connect (the
///     plan's reject, and, where a socket cannot be dropped, its drop too).
/// LoadBalancer IPs behind loadBalancerSourceRanges are left to a later slice (not rendered:
/// their traffic goes unsteered to the nftables part), and so is SCTP (kSteeredProtocols). The
/// slots of the cluster pool are 0..n-1 and those of the local pool kLocalSlotBase.., so that
/// one pool's change never renumbers the other's.
///
/// Thread-safety: render() is const; setNode() must not run concurrently with it.

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/ebpf/maps.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ebpf {

/// The protocols the socket hooks steer (bpf/kproxy_sock.bpf.c, translatable()): TCP and UDP.
/// A port of another protocol (SCTP) has no map element; the nftables part dispatches its
/// ClusterIP as nftables mode does.
inline constexpr std::array<sdk::Protocol, 2> kSteeredProtocols{sdk::Protocol::kTCP, sdk::Protocol::kUDP};
inline bool steered(sdk::Protocol protocol) {
  return std::find(kSteeredProtocols.begin(), kSteeredProtocols.end(), protocol) != kSteeredProtocols.end();
}

struct RenderConfig {
  plan::CommonOptions common;
};

/// Reads the common options (masquerade and detect-local settings, NodePort addresses, node
/// IPs); an error names the bad option.
sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options);

/// One service port's elements. The id is the backend's to give (setId); render() leaves 0.
struct PortMaps {
  std::vector<std::pair<ServiceKey, ServiceValue>> services;
  std::vector<std::pair<SlotKey, SocketAddress>> slots;
  /// Gives the service port its id: in every service value and slot key.
  void setId(std::uint32_t id);
  std::uint32_t id() const { return services.empty() ? 0 : services.front().second.id; }
  bool operator==(const PortMaps&) const = default;
};

class EbpfRenderer {
 public:
  explicit EbpfRenderer(RenderConfig config);
  /// The node: its addresses and pod CIDRs for the plan, and where NodePorts answer.
  void setNode(const sdk::NodeInfo& node);
  PortMaps render(const sdk::ServicePort& port) const;

 private:
  /// The addresses NodePorts answer on in `family`.
  std::vector<std::string> nodePortAddresses(net::Family family) const;

  RenderConfig config_;
  plan::PlanConfig planConfig_;
  sdk::NodeInfo node_;
  sdk::NodePortAddresses nodePorts_;
};

}  // namespace kproxy::ebpf
