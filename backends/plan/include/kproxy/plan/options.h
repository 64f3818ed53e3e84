#pragma once
/// The plugin options every kernel backend reads the same way (plugins/README.md lists them):
/// the local-traffic detector, masquerade settings, NodePort addresses and node IPs. Parsed once
/// here so that a value means, and is refused, the same in every mode.
/// Thread-safety: pure functions.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/plan/service_plan.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::plan {

/// The value of option `key`, "" when it is not given.
std::string optionValue(const sdk::Options& options, std::string_view key);

/// "a, b,,c" → {"a", "b", "c"}: comma-separated, blanks trimmed, empty items dropped.
std::vector<std::string> splitOptionList(std::string_view list);

struct CommonOptions {
  std::vector<std::string> clusterCIDRs;              ///< cluster-cidr, validated
  std::string detectLocalMode = "ClusterCIDR";        ///< detect-local-mode
  std::string bridgeInterface;                        ///< pod-bridge-interface
  std::string interfaceNamePrefix;                    ///< pod-interface-name-prefix
  bool masqueradeAll = false;                         ///< masquerade-all
  std::uint32_t masqueradeBit = 14;                   ///< masquerade-bit, 0..31
  std::vector<std::string> nodePortAddresses;         ///< nodeport-addresses: CIDRs, or "primary"
  std::vector<std::string> nodeIPs;                   ///< node-ips, validated
};

/// Reads the common options; an error (category kInvalidInput, prefixed "BACKEND: ") names the
/// bad option and value.
sdk::Expected<CommonOptions> parseCommonOptions(const sdk::Options& options, std::string_view backend);

/// The plan's node-wide settings from the options: masquerade-all, the local-traffic detector
/// (NodeCIDR mode gets its CIDRs from the node, see applyNode) and the fallback node IPs.
PlanConfig planConfigOf(bool masqueradeAll, std::string_view detectLocalMode,
                        const std::vector<std::string>& clusterCIDRs, const std::string& bridgeInterface,
                        const std::string& interfaceNamePrefix, const std::vector<std::string>& nodeIPs);

/// Where NodePorts answer on `node`: the host's decision, which every host of plugin ABI 1.2 or
/// newer sends; under an older host, the same decision (core::decideNodePortAddresses) from the
/// Node object's addresses, `nodePortAddresses` (the option as given) and the option's node
/// IPs. Backends render from this and nothing else.
sdk::NodePortAddresses nodePortAddressesOf(const sdk::NodeInfo& node,
                                           const std::vector<std::string>& nodePortAddresses,
                                           const std::vector<std::string>& nodeIPs);

/// Whether a packet to `destination` (numeric) reaches the node's NodePorts in `kproxy explain`:
/// one of the addresses NodePorts answer on, or, where they answer on every local address of
/// the family, one of the node's (`localAddresses`) or loopback. A backend whose mode never
/// serves NodePorts on loopback passes `loopback` false.
bool nodePortAnswersOn(const sdk::NodePortAddresses& nodePorts, std::span<const std::string> localAddresses,
                       std::string_view destination, bool loopback);

/// planConfigOf for the parsed common options.
PlanConfig planConfigOf(const CommonOptions& options);

/// What the node brings to the plan: its pod CIDRs (NodeCIDR mode) and its addresses (the
/// options' node IPs when it has none).
void applyNode(PlanConfig& config, std::string_view detectLocalMode, const sdk::NodeInfo& node,
               const std::vector<std::string>& fallbackNodeIPs);

}  // namespace kproxy::plan
