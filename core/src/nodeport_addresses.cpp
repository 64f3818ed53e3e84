#include "kproxy/core/nodeport_addresses.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "resolve.h"

namespace kproxy::core {
namespace {

bool isLinkLocalIPv6(const net::Prefix& host) {
  static const net::Prefix linkLocal = *net::Prefix::parse("fe80::/10");
  return linkLocal.contains(host);
}

bool isLoopback(const net::Prefix& ip) {
  if (ip.v6()) return ip.addressText() == "::1";
  return ip.bytes[0] == 127;
}

}  // namespace

NodeIPs detectNodeIPs(std::span<const NodeAddress> nodeAddresses, std::string_view bindAddress) {
  NodeIPs ips;
  // Upstream's GetNodeHostIPs: InternalIPs before ExternalIPs; the first address is the
  // primary one, then the first of the other family.
  std::optional<net::Family> primary;
  for (const char* type : {"InternalIP", "ExternalIP"}) {
    for (const auto& a : nodeAddresses) {
      if (a.type != type) continue;
      auto ip = net::parseIPSloppy(a.address);
      if (!ip) continue;
      if (!primary) {
        primary = ip->family;
        (ip->family == net::Family::kIPv4 ? ips.ipv4 : ips.ipv6) = ip->addressText();
      } else if (ip->family != *primary && ips.of(ip->family).empty()) {
        (ip->family == net::Family::kIPv4 ? ips.ipv4 : ips.ipv6) = ip->addressText();
      }
    }
  }
  if (auto bind = net::parseIPSloppy(bindAddress);
      bind && bind->addressText() != "0.0.0.0" && bind->addressText() != "::") {
    (bind->family == net::Family::kIPv4 ? ips.ipv4 : ips.ipv6) = bind->addressText();
  }
  return ips;
}

std::vector<std::string> defaultNodePortAddresses(std::string_view mode) {
  if (mode == "nftables") return {"primary"};
  return {};
}

NodePortAddresses nodePortAddressesBeforeNode(const NodeIPs& nodeIPs) {
  NodePortAddresses out;
  out.resolved = true;
  for (const auto* ip : {&nodeIPs.ipv4, &nodeIPs.ipv6})
    if (!ip->empty()) out.addresses.push_back(*ip);
  return out;
}

NodePortAddresses decideNodePortAddresses(std::span<const std::string> spec,
                                          std::span<const std::string> localAddresses,
                                          const NodeIPs& nodeIPs) {
  std::vector<std::string> cidrs;
  if (spec.size() == 1 && spec.front() == "primary") {
    for (net::Family family : {net::Family::kIPv4, net::Family::kIPv6}) {
      auto ip = net::parseIPSloppy(nodeIPs.of(family));
      if (!ip || ip->family != family || isLoopback(*ip)) continue;
      cidrs.push_back(ip->addressText() + (family == net::Family::kIPv4 ? "/32" : "/128"));
    }
  } else {
    cidrs.assign(spec.begin(), spec.end());
  }

  NodePortAddresses out;
  out.resolved = true;
  for (net::Family family : {net::Family::kIPv4, net::Family::kIPv6}) {
    std::vector<net::Prefix> prefixes;
    bool all = false;
    for (const auto& text : cidrs) {
      auto p = net::parseSloppy(text);
      if (!p || p->family != family) continue;
      if (p->length == 0) all = true;
      prefixes.push_back(*p);
    }
    // No CIDR of this family: upstream adds 0.0.0.0/0 (::/0) for it.
    if (prefixes.empty()) all = true;
    (family == net::Family::kIPv4 ? out.allLocalIPv4 : out.allLocalIPv6) = all;
    for (const auto& text : localAddresses) {
      auto ip = net::parseIPSloppy(text);
      if (!ip || ip->family != family) continue;
      // Every local address: no backend programs an IPv6 link-local one then, and every pod's
      // host-side veth brings one (the node would change, and sync in full, at each pod start).
      if (all && isLinkLocalIPv6(*ip)) continue;
      if (all || std::any_of(prefixes.begin(), prefixes.end(),
                             [&](const net::Prefix& p) { return p.contains(*ip); }))
        out.addresses.push_back(ip->addressText());
    }
  }
  std::sort(out.addresses.begin(), out.addresses.end());
  out.addresses.erase(std::unique(out.addresses.begin(), out.addresses.end()), out.addresses.end());
  return out;
}

}  // namespace kproxy::core
