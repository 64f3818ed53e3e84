#include "kproxy/plan/options.h"

#include <charconv>
#include <utility>

#include <fmt/format.h>

#include "kproxy/backends/common/address.h"

namespace kproxy::plan {

std::vector<std::string> splitOptionList(std::string_view list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    auto comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view item = list.substr(start, comma - start);
    const auto first = item.find_first_not_of(" \t");
    if (first != std::string_view::npos) {
      item = item.substr(first, item.find_last_not_of(" \t") - first + 1);
      out.emplace_back(item);
    }
    start = comma + 1;
  }
  return out;
}

sdk::Expected<CommonOptions> parseCommonOptions(const sdk::Options& options, std::string_view backend) {
  CommonOptions out;
  auto get = [&](std::string_view key) -> std::string {
    auto it = options.find(key);
    return it == options.end() ? std::string() : it->second;
  };
  auto bad = [&](std::string message) {
    return sdk::fail(sdk::ErrorCategory::kInvalidInput, fmt::format("{}: {}", backend, message));
  };
  for (auto [option, into] : {std::pair{"cluster-cidr", &out.clusterCIDRs},
                              std::pair{"nodeport-addresses", &out.nodePortCIDRs},
                              std::pair{"node-ips", &out.nodeIPs}}) {
    for (auto& item : splitOptionList(get(option))) {
      if (into == &out.nodePortCIDRs && item == "primary") {
        out.nodePortPrimary = true;
        continue;
      }
      if (!backends::IPPrefix::parse(item)) return bad(fmt::format("invalid {} entry \"{}\"", option, item));
      into->push_back(std::move(item));
    }
  }
  out.masqueradeAll = get("masquerade-all") == "true";
  if (auto mode = get("detect-local-mode"); !mode.empty()) {
    if (mode != "ClusterCIDR" && mode != "NodeCIDR" && mode != "BridgeInterface" && mode != "InterfaceNamePrefix")
      return bad("invalid detect-local-mode \"" + mode + "\" (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix)");
    out.detectLocalMode = mode;
  }
  out.bridgeInterface = get("pod-bridge-interface");
  out.interfaceNamePrefix = get("pod-interface-name-prefix");
  for (const auto& [mode, name] : {std::pair{"BridgeInterface", &out.bridgeInterface},
                                   std::pair{"InterfaceNamePrefix", &out.interfaceNamePrefix}}) {
    if (out.detectLocalMode != mode) continue;
    // Quotes, spaces, '*', '+' and '!' would change the meaning of a rule (nft wildcards,
    // iptables prefixes and negation).
    if (name->empty() || name->size() >= 16 || name->find_first_of("\"*+! ") != std::string::npos)
      return bad(fmt::format("detect-local-mode {} needs a valid interface name, got \"{}\"", mode, *name));
  }
  if (auto bit = get("masquerade-bit"); !bit.empty()) {
    std::uint32_t v = 0;
    auto [ptr, ec] = std::from_chars(bit.data(), bit.data() + bit.size(), v);
    if (ec != std::errc() || ptr != bit.data() + bit.size() || v > 31)
      return bad("invalid masquerade-bit \"" + bit + "\" (0..31)");
    out.masqueradeBit = v;
  }
  return out;
}

PlanConfig planConfigOf(bool masqueradeAll, std::string_view detectLocalMode,
                        const std::vector<std::string>& clusterCIDRs, const std::string& bridgeInterface,
                        const std::string& interfaceNamePrefix, const std::vector<std::string>& nodeIPs) {
  using Mode = LocalTrafficDetector::Mode;
  PlanConfig out;
  out.masqueradeAll = masqueradeAll;
  auto& detector = out.localDetector;
  if (detectLocalMode == "NodeCIDR") {
    detector.mode = Mode::kCIDRs;  // the CIDRs come with the node (applyNode)
  } else if (detectLocalMode == "BridgeInterface") {
    detector.mode = Mode::kBridgeInterface;
    detector.interface = bridgeInterface;
  } else if (detectLocalMode == "InterfaceNamePrefix") {
    detector.mode = Mode::kInterfaceNamePrefix;
    detector.interface = interfaceNamePrefix;
  } else if (!clusterCIDRs.empty()) {
    detector.mode = Mode::kCIDRs;
    detector.cidrs = clusterCIDRs;
  }
  out.nodeIPs = nodeIPs;
  return out;
}

void applyNode(PlanConfig& config, std::string_view detectLocalMode, const sdk::NodeInfo& node,
               const std::vector<std::string>& fallbackNodeIPs) {
  if (detectLocalMode == "NodeCIDR") config.localDetector.cidrs = node.podCIDRs;
  config.nodeIPs = node.addresses.empty() ? fallbackNodeIPs : node.addresses;
}

}  // namespace kproxy::plan
