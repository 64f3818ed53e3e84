#pragma once
/// NftablesRenderer: sdk service ports → the nftables objects kproxy wants in the kernel.
/// Rendering is per service port, so a partial sync renders only the changed ones.
///
/// Shape (names follow upstream kube-proxy's nftables mode): base chains filter-* / nat-*,
/// dispatch chains, the fixed maps service-ips, service-nodeports, no-endpoint-services,
/// no-endpoint-nodeports, firewall-ips, the sets cluster-ips and nodeport-ips. Per service
/// port: `service-HASH-ns/name/proto/port` (internal traffic), `external-…` (NodePort /
/// externalIPs / LoadBalancer), `firewall-…` (source ranges) and, with session affinity,
/// `affinity-…`.
///
/// Choosing an endpoint is data, not rules (why, against upstream's endpoint chains:
/// docs/upstream-differences.md). Each balancing chain owns a range of 65,536 keys in one of
/// the interval maps `service-endpoints-N` (kEndpointMapShards) and ends with
/// `dnat to numgen random mod 65535 offset BASE map @service-endpoints-N`; its K endpoints split
/// the range's 65,535 slots into K intervals (sizes differ by at most one slot). There are no
/// per-endpoint chains. So an endpoint change is a handful of element changes in a data map,
/// which the kernel commits without re-validating the table (a rule or a goto element would
/// make it walk every chain), and the number of chains does not grow with endpoints.
/// Hairpin traffic (a pod reaching itself) is found after DNAT by `hairpin-ips`, a set of
/// (endpoint . endpoint) pairs. Session affinity uses one `session-affinity` map keyed by
/// (client, endpoint pool ID): the chains that balance a pool DNAT a hit from it under the
/// pool's ID, whatever address the client used (ClusterIP, NodePort, externalIP, LoadBalancer
/// IP), and after DNAT the filter hooks record the client's endpoint, or restart the timeout
/// of the entry it hit, through `affinity-services` / `affinity-nodeports`, which send affinity
/// services' connections to their `affinity-…` chain (it knows the service's timeout and the
/// pool IDs; `affinity-external-…` for external addresses whose pools differ from the
/// ClusterIP's, e.g. eTP=Local). The number of sets and maps is fixed.
/// Thread-safety: none needed (pure functions of their inputs).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kproxy/nftables/ir.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::nftables {

/// Settings that shape the ruleset, parsed from the plugin's options.
struct RenderConfig {
  /// The options every backend reads alike (detect-local-mode and its CIDRs or interface,
  /// masquerade-all and the masquerade bit, nodeport-addresses, node-ips), parsed once by the
  /// plan (plan/options.h) and carried whole.
  plan::CommonOptions common;
  std::uint32_t affinityMapSize = 1u << 20;
  /// The protocols whose ClusterIP connections something else steers, so that this table does
  /// not dispatch their ClusterIPs to endpoints. ebpf mode's nftables part renders with TCP and
  /// UDP here (its socket hooks steer those connections before any packet exists, and only the
  /// external entry points are left to this table): such a ClusterIP port then has neither DNAT
  /// nor no-endpoint verdict, nor internalTrafficPolicy Local's chain; its ClusterIP stays in
  /// `cluster-ips`, so what no socket hook steered (another port, an unallocated address) is
  /// still rejected or dropped as in nftables mode. A port of another protocol (SCTP, which the
  /// hooks do not steer) is dispatched here as in nftables mode. Empty (nftables mode): every
  /// ClusterIP is dispatched.
  std::vector<sdk::Protocol> clusterIPSteeredElsewhere;

  /// Whether this table dispatches the ClusterIP of a port of `protocol`.
  bool dispatchesClusterIP(sdk::Protocol protocol) const {
    return std::find(clusterIPSteeredElsewhere.begin(), clusterIPSteeredElsewhere.end(), protocol) ==
           clusterIPSteeredElsewhere.end();
  }

  std::uint32_t mark() const { return 1u << common.masqueradeBit; }
};

/// Objects owned by one service port in one family.
struct Fragment {
  net::Family family = net::Family::kIPv4;
  std::string key;  ///< "ns/name:port"
  std::vector<Chain> chains;
  std::vector<Element> elements;
  /// What could not be rendered as asked (logged by the backend), e.g. no slot range left.
  std::vector<std::string> problems;
};

/// The table-wide objects of one family: base and dispatch chains, sets and maps, nodeport-ips.
struct GlobalObjects {
  net::Family family = net::Family::kIPv4;
  std::span<const SetSpec> sets;  ///< the renderer's setSpecs(family)
  std::vector<Chain> chains;
  std::vector<Element> elements;
};

/// Chain names, as upstream: "HASH-ns/name/proto/port" with HASH the first 8 characters of
/// base32(sha256(the rest)).
std::string servicePortChainBase(const sdk::ServicePort& port);
std::string serviceChainName(const sdk::ServicePort& port);
std::string externalChainName(const sdk::ServicePort& port);
/// The chain balancing internal traffic over local endpoints (internalTrafficPolicy Local).
std::string localChainName(const sdk::ServicePort& port);
std::string firewallChainName(const sdk::ServicePort& port);
/// The chain that records session affinity after DNAT for the ClusterIP (and for the external
/// addresses when they record the same way), and the one for the external addresses otherwise.
std::string affinityChainName(const sdk::ServicePort& port);
std::string externalAffinityChainName(const sdk::ServicePort& port);
/// The ID of one endpoint pool of `port` in session-affinity keys: the slot range `base` of the
/// pool's first balancing chain in the high half (unique in the family while that chain
/// exists) and a hash of the port's name and pool in the low half, so that a range handed to
/// another port later does not meet the old port's entries.
std::uint32_t affinityPoolId(std::uint32_t base, const sdk::ServicePort& port, plan::Pool pool);
/// The slot ranges are spread over this many maps `service-endpoints-N` (range i in map
/// i mod kEndpointMapShards). Two kernel costs pull in opposite directions: an added map
/// element is checked against every rule that looks its map up (so one map for all services
/// would make adding an endpoint linear in the number of services), and every rule or
/// message that names a set makes the kernel walk the table's list of sets by name. 64 maps
/// measured best for full syncs at 10k and 30k services (see bench/nftables/KERNEL-COSTS.md).
inline constexpr std::uint32_t kEndpointMapShards = 64;
/// Where interval i of a K-interval layout starts within its range (interval i ends where
/// i + 1 starts; the last ends at kSlotsPerRange). Sizes differ by at most one slot.
inline std::uint32_t slotOffset(std::uint64_t i, std::uint64_t k) {
  return static_cast<std::uint32_t>(i * kSlotsPerRange / k);
}
/// Whether a slot-map element of a K-interval layout belongs at `offset` of its range: a start
/// at the start of interval 0..K-1, an end at the start of interval 1..K (K: the range's end).
bool inSlotLayout(std::uint32_t offset, bool end, std::uint32_t k);
/// The map that holds the slot range starting at `base`.
std::string serviceEndpointsMap(std::uint32_t base);
/// Upstream's per-endpoint chain name (kproxy has no endpoint chains; the benchmark's
/// upstream-shaped ruleset uses it).
std::string endpointChainName(const sdk::ServicePort& port, const sdk::Endpoint& endpoint);

/// Names of the fixed objects.
namespace names {
inline constexpr const char* kServicesChain = "services";
inline constexpr const char* kNodePortsChain = "nodeports";
inline constexpr const char* kMasqueradingChain = "masquerading";
inline constexpr const char* kMarkMasqChain = "mark-for-masquerade";
inline constexpr const char* kClusterIPsCheckChain = "cluster-ips-check";
inline constexpr const char* kNodePortEndpointsCheckChain = "nodeport-endpoints-check";
inline constexpr const char* kServiceEndpointsCheckChain = "service-endpoints-check";
inline constexpr const char* kFirewallCheckChain = "firewall-check";
inline constexpr const char* kRejectChain = "reject-chain";
inline constexpr const char* kServiceIPsMap = "service-ips";
inline constexpr const char* kServiceNodePortsMap = "service-nodeports";
inline constexpr const char* kNoEndpointServicesMap = "no-endpoint-services";
inline constexpr const char* kNoEndpointNodePortsMap = "no-endpoint-nodeports";
inline constexpr const char* kFirewallIPsMap = "firewall-ips";
inline constexpr const char* kClusterIPsSet = "cluster-ips";
inline constexpr const char* kNodePortIPsSet = "nodeport-ips";
inline constexpr const char* kAffinityMap = "session-affinity";
inline constexpr const char* kServiceEndpointsMap = "service-endpoints";
inline constexpr const char* kHairpinSet = "hairpin-ips";
inline constexpr const char* kAffinityServicesMap = "affinity-services";
inline constexpr const char* kAffinityNodePortsMap = "affinity-nodeports";
inline constexpr const char* kAffinityRecordChain = "affinity-record";
}  // namespace names

/// The slot ranges of one family's balancing chains: each chain that picks an endpoint gets
/// range index i (keys i·65536 … i·65536+65535 of service-endpoints) for as long as it exists.
/// A full sync re-seeds the ranges from the kernel (the numgen offset of each chain's rule),
/// so a restart keeps every range and changes nothing.
class SlotRanges {
 public:
  static constexpr std::uint32_t kRanges = 65536;
  /// The chain's range base, allocating the lowest free range; nullopt when all are taken.
  std::optional<std::uint32_t> baseOf(const std::string& chain);
  /// Records a range found in the kernel; ignored if that range is taken already.
  void reserve(const std::string& chain, std::uint32_t base);
  /// Frees the chain's range for reuse after the next settle(): the kernel still holds the
  /// range's elements until the batch that deletes them is committed, and a range taken over
  /// in that same batch made the kernel refuse it (EEXIST on the new layout's elements).
  void release(const std::string& chain);
  /// The batch is committed: ranges released since the last settle() may be reused.
  void settle();
  void clear();
  bool has(const std::string& chain) const { return byChain_.contains(chain); }
  std::size_t size() const { return byChain_.size(); }
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (const auto& [chain, index] : byChain_) fn(chain);
  }

 private:
  std::unordered_map<std::string, std::uint32_t> byChain_;
  std::vector<bool> used_ = std::vector<bool>(kRanges, false);
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> released_;  ///< still marked used until settle()
  std::uint32_t next_ = 0;
};

/// The statements that tell pod traffic of `family` to `detector` (negate: traffic not from
/// pods), one rule's worth each (pod traffic matches any, other traffic the one negated
/// rule); none when the detector cannot tell. Shared with the userspace proxy's table.
std::vector<std::vector<Statement>> podTrafficMatches(const plan::LocalTrafficDetector& detector,
                                                      net::Family family, bool negate);

class NftablesRenderer {
 public:
  explicit NftablesRenderer(RenderConfig config)
      : config_(std::move(config)),
        planConfig_(planConfigOf(config_)),
        setSpecs_{buildSetSpecs(net::Family::kIPv4), buildSetSpecs(net::Family::kIPv6)} {}

  /// The node the next renders are for: its addresses decide which loadBalancerSourceRanges
  /// admit the node itself (a node change makes the host request a full sync).
  void setNode(const sdk::NodeInfo& node);
  /// The cluster's service CIDRs (both families) the next renderGlobal calls drop unallocated
  /// ClusterIPs in.
  void setServiceCIDRs(std::vector<sdk::ServiceCIDR> cidrs) { serviceCIDRs_ = std::move(cidrs); }
  const std::vector<sdk::ServiceCIDR>& serviceCIDRs() const { return serviceCIDRs_; }

  /// Objects of one service port. Addresses of another family than `port.family` are ignored.
  /// Allocates slot ranges for new balancing chains (the only state the renderer keeps).
  Fragment renderServicePort(const sdk::ServicePort& port) const;
  /// Table-wide objects of `family`; `node` supplies the node's IPs for nodeport-ips. After the
  /// reject of known ClusterIPs' unused ports, `cluster-ips-check` drops what is left inside a
  /// service CIDR of the family (setServiceCIDRs): one `ip daddr CIDR drop` rule per range, so a
  /// ServiceCIDR change rewrites that one small chain and nothing else.
  GlobalObjects renderGlobal(net::Family family, const sdk::NodeInfo& node) const;
  /// Where NodePorts answer on `node` (plan::nodePortAddressesOf with this mode's options).
  sdk::NodePortAddresses nodePortAddresses(const sdk::NodeInfo& node) const;
  /// The fixed sets/maps of `family` (used to decode read-back elements).
  const std::vector<SetSpec>& setSpecs(net::Family family) const {
    return setSpecs_[family == net::Family::kIPv4 ? 0 : 1];
  }

  const RenderConfig& config() const { return config_; }
  /// What the plan is told (the node's pod CIDRs and addresses included, after setNode).
  const plan::PlanConfig& planConfig() const { return planConfig_; }
  SlotRanges& slots(net::Family family) const { return slots_[family == net::Family::kIPv4 ? 0 : 1]; }

 private:
  std::vector<SetSpec> buildSetSpecs(net::Family family) const;
  static plan::PlanConfig planConfigOf(const RenderConfig& config);

  RenderConfig config_;
  plan::PlanConfig planConfig_;
  std::vector<sdk::ServiceCIDR> serviceCIDRs_;
  std::vector<SetSpec> setSpecs_[2];
  mutable SlotRanges slots_[2];
};

/// Builds a RenderConfig from plugin options; an error names the bad option.
sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options);


}  // namespace kproxy::nftables
