#pragma once
/// NftablesRenderer: sdk service ports → the nftables objects kproxy wants in the kernel.
/// Rendering is per service port, so a partial sync renders only the changed ones.
///
/// Shape (names follow upstream kube-proxy's nftables mode): base chains filter-* / nat-*,
/// dispatch chains, the fixed maps service-ips, service-nodeports, no-endpoint-services,
/// no-endpoint-nodeports, firewall-ips, the sets cluster-ips and nodeport-ips, and one shared
/// `affinity` map. Per service port: `service-HASH-ns/name/proto/port` (internal traffic),
/// `external-…` (NodePort / externalIPs / LoadBalancer), `firewall-…` (source ranges), and
/// `endpoint-HASH-…__ip/port` chains.
///
/// Unlike upstream, nothing here creates a set or map per service: the kernel's cost of a
/// batch grows with the number of sets in the table, so a service chain picks its endpoint with
/// a cascade of `numgen random mod K == 0 goto endpoint-…` rules, source ranges are rules, and
/// session affinity uses one map keyed by (client, service address, proto, port).
/// Thread-safety: none needed (pure functions of their inputs).

#include <cstdint>
#include <string>
#include <vector>

#include "kproxy/nftables/ir.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::nftables {

/// Settings that shape the ruleset, parsed from the plugin's options.
struct RenderConfig {
  std::vector<Address> clusterCIDRs;  ///< traffic to ClusterIPs from outside is masqueraded
  bool masqueradeAll = false;
  std::uint32_t masqueradeBit = 14;
  /// nodeport-addresses as CIDRs; empty means "the node's primary IPs".
  std::vector<Address> nodePortCIDRs;
  /// Fallback node IPs (option node-ips) when the snapshot has no node info.
  std::vector<Address> nodeIPs;
  std::uint32_t affinityMapSize = 1u << 20;

  std::uint32_t mark() const { return 1u << masqueradeBit; }
};

/// Objects owned by one service port in one family.
struct Fragment {
  Family family = Family::kIPv4;
  std::string key;  ///< "ns/name:port"
  std::vector<Chain> chains;
  std::vector<Element> elements;
};

/// The table-wide objects of one family: base and dispatch chains, sets and maps, nodeport-ips.
struct GlobalObjects {
  Family family = Family::kIPv4;
  std::vector<SetSpec> sets;
  std::vector<Chain> chains;
  std::vector<Element> elements;
};

/// Chain names, as upstream: "HASH-ns/name/proto/port" with HASH the first 8 characters of
/// base32(sha256(the rest)).
std::string servicePortChainBase(const sdk::ServicePort& port);
std::string serviceChainName(const sdk::ServicePort& port);
std::string externalChainName(const sdk::ServicePort& port);
std::string firewallChainName(const sdk::ServicePort& port);
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
inline constexpr const char* kAffinityMap = "affinity";
}  // namespace names

class NftablesRenderer {
 public:
  explicit NftablesRenderer(RenderConfig config) : config_(std::move(config)) {}

  /// Objects of one service port. Addresses of another family than `port.family` are ignored.
  Fragment renderServicePort(const sdk::ServicePort& port) const;
  /// Table-wide objects of `family`; `node` supplies the node's IPs for nodeport-ips.
  GlobalObjects renderGlobal(Family family, const sdk::NodeInfo& node) const;
  /// The fixed sets/maps of `family` (used to decode read-back elements).
  std::vector<SetSpec> setSpecs(Family family) const;

  const RenderConfig& config() const { return config_; }

 private:
  RenderConfig config_;
};

/// Builds a RenderConfig from plugin options; an error names the bad option.
sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options);

Family toFamily(sdk::Family family);

}  // namespace kproxy::nftables
