#include "kproxy/plan/options.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include <fmt/format.h>

#include "kproxy/net/ip.h"
#include "kproxy/core/nodeport_addresses.h"

namespace kproxy::plan {

std::string optionValue(const sdk::Options& options, std::string_view key) {
  auto it = options.find(key);
  return it == options.end() ? std::string() : it->second;
}

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
  auto get = [&](std::string_view key) { return optionValue(options, key); };
  auto bad = [&](std::string message) {
    return sdk::fail(sdk::ErrorCategory::kInvalidInput, fmt::format("{}: {}", backend, message));
  };
  for (auto [option, into] : {std::pair{"cluster-cidr", &out.clusterCIDRs},
                              std::pair{"nodeport-addresses", &out.nodePortAddresses},
                              std::pair{"node-ips", &out.nodeIPs}}) {
    for (auto& item : splitOptionList(get(option))) {
      if (into == &out.nodePortAddresses && item == "primary") {
        into->push_back(std::move(item));
        continue;
      }
      if (!net::Prefix::parse(item)) return bad(fmt::format("invalid {} entry \"{}\"", option, item));
      into->push_back(std::move(item));
    }
  }
  if (out.nodePortAddresses.size() > 1 &&
      std::find(out.nodePortAddresses.begin(), out.nodePortAddresses.end(), "primary") != out.nodePortAddresses.end())
    return bad("nodeport-addresses \"primary\" cannot be combined with CIDRs");
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

PlanConfig planConfigOf(const CommonOptions& options) {
  return planConfigOf(options.masqueradeAll, options.detectLocalMode, options.clusterCIDRs, options.bridgeInterface,
                      options.interfaceNamePrefix, options.nodeIPs);
}

sdk::NodePortAddresses nodePortAddressesOf(const sdk::NodeInfo& node,
                                           const std::vector<std::string>& nodePortAddresses,
                                           const std::vector<std::string>& nodeIPs) {
  if (node.nodePortAddresses.resolved) return node.nodePortAddresses;
  // A host older than ABI 1.2: it sends the Node object's addresses in the node's order, and
  // the option's node IPs stand for a --bind-address.
  std::vector<core::NodeAddress> typed;
  for (const auto& a : node.addresses) typed.push_back(core::NodeAddress{"InternalIP", a});
  std::vector<std::string> local = node.addresses;
  core::NodeIPs ips = core::detectNodeIPs(typed, "");
  for (const auto& ip : nodeIPs) {
    auto p = net::Prefix::parse(ip);
    if (!p || !p->isHost()) continue;
    (p->v6() ? ips.ipv6 : ips.ipv4) = p->toString();
    local.push_back(p->toString());
  }
  const bool primary = nodePortAddresses.size() == 1 && nodePortAddresses.front() == "primary";
  // "primary" waits for the Node object, answering on a --bind-address alone meanwhile, as the
  // host's tracker does.
  const core::NodePortAddresses decided = primary && node.addresses.empty()
                                              ? core::nodePortAddressesBeforeNode(ips)
                                              : core::decideNodePortAddresses(nodePortAddresses, local, ips);
  sdk::NodePortAddresses out;
  out.resolved = decided.resolved;
  out.addresses = decided.addresses;
  out.allLocalIPv4 = decided.allLocalIPv4;
  out.allLocalIPv6 = decided.allLocalIPv6;
  return out;
}

bool nodePortAnswersOn(const sdk::NodePortAddresses& nodePorts, std::span<const std::string> localAddresses,
                       std::string_view destination, bool loopback) {
  auto dst = net::Prefix::parse(destination);
  if (!dst || !dst->isHost()) return false;
  auto same = [&](const std::string& a) {
    auto p = net::Prefix::parse(a);
    return p && *p == *dst;
  };
  if (std::any_of(nodePorts.addresses.begin(), nodePorts.addresses.end(), same)) return true;
  const auto loopbackNet = *net::Prefix::parse(dst->v6() ? "::1/128" : "127.0.0.0/8");
  if (loopbackNet.contains(*dst)) return loopback;
  if (!nodePorts.allLocal(dst->v6() ? net::Family::kIPv6 : net::Family::kIPv4)) return false;
  return std::any_of(localAddresses.begin(), localAddresses.end(), same);
}

void applyNode(PlanConfig& config, std::string_view detectLocalMode, const sdk::NodeInfo& node,
               const std::vector<std::string>& fallbackNodeIPs) {
  if (detectLocalMode == "NodeCIDR") config.localDetector.cidrs = node.podCIDRs;
  config.nodeIPs = node.addresses.empty() ? fallbackNodeIPs : node.addresses;
}

}  // namespace kproxy::plan
