#include "kproxy/core/nodeport_addresses.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "resolve.h"

namespace kproxy::core {
namespace {

struct Prefix {
  IPFamily family = IPFamily::kIPv4;
  std::array<std::uint8_t, 16> bytes{};
  int length = 0;

  bool contains(const Prefix& host) const {
    if (host.family != family) return false;
    for (int i = 0; i < length / 8; ++i)
      if (bytes[i] != host.bytes[i]) return false;
    if (const int rest = length % 8; rest != 0) {
      const auto mask = static_cast<std::uint8_t>(0xff00u >> rest);
      if ((bytes[length / 8] & mask) != (host.bytes[length / 8] & mask)) return false;
    }
    return true;
  }
};

// "10.0.0.1" (a host prefix) or "10.0.0.0/8", as Go's sloppy parsers read them.
std::optional<Prefix> parsePrefix(std::string_view text) {
  std::optional<resolve::ParsedIP> parsed =
      text.find('/') == std::string_view::npos ? resolve::parseIP(text) : resolve::parseCIDR(text);
  if (!parsed) return std::nullopt;
  Prefix p;
  p.family = parsed->family;
  const std::string& canonical = parsed->text;
  const auto slash = canonical.find('/');
  const std::string ip = canonical.substr(0, slash);
  const int af = p.family == IPFamily::kIPv4 ? AF_INET : AF_INET6;
  if (inet_pton(af, ip.c_str(), p.bytes.data()) != 1) return std::nullopt;
  const int bits = p.family == IPFamily::kIPv4 ? 32 : 128;
  p.length = slash == std::string::npos ? bits : std::stoi(canonical.substr(slash + 1));
  return p;
}

bool isLinkLocalIPv6(const Prefix& host) {
  static const Prefix linkLocal = *parsePrefix("fe80::/10");
  return linkLocal.contains(host);
}

bool isLoopback(const resolve::ParsedIP& ip) {
  if (ip.family == IPFamily::kIPv6) return ip.text == "::1";
  return ip.text.starts_with("127.");
}

}  // namespace

NodeIPs detectNodeIPs(std::span<const NodeAddress> nodeAddresses, std::string_view bindAddress) {
  NodeIPs ips;
  // Upstream's GetNodeHostIPs: InternalIPs before ExternalIPs; the first address is the
  // primary one, then the first of the other family.
  std::optional<IPFamily> primary;
  for (const char* type : {"InternalIP", "ExternalIP"}) {
    for (const auto& a : nodeAddresses) {
      if (a.type != type) continue;
      auto ip = resolve::parseIP(a.address);
      if (!ip) continue;
      if (!primary) {
        primary = ip->family;
        (ip->family == IPFamily::kIPv4 ? ips.ipv4 : ips.ipv6) = ip->text;
      } else if (ip->family != *primary && ips.of(ip->family).empty()) {
        (ip->family == IPFamily::kIPv4 ? ips.ipv4 : ips.ipv6) = ip->text;
      }
    }
  }
  if (auto bind = resolve::parseIP(bindAddress);
      bind && bind->text != "0.0.0.0" && bind->text != "::") {
    (bind->family == IPFamily::kIPv4 ? ips.ipv4 : ips.ipv6) = bind->text;
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
    for (IPFamily family : {IPFamily::kIPv4, IPFamily::kIPv6}) {
      auto ip = resolve::parseIP(nodeIPs.of(family));
      if (!ip || ip->family != family || isLoopback(*ip)) continue;
      cidrs.push_back(ip->text + (family == IPFamily::kIPv4 ? "/32" : "/128"));
    }
  } else {
    cidrs.assign(spec.begin(), spec.end());
  }

  NodePortAddresses out;
  out.resolved = true;
  for (IPFamily family : {IPFamily::kIPv4, IPFamily::kIPv6}) {
    std::vector<Prefix> prefixes;
    bool all = false;
    for (const auto& text : cidrs) {
      auto p = parsePrefix(text);
      if (!p || p->family != family) continue;
      if (p->length == 0) all = true;
      prefixes.push_back(*p);
    }
    // No CIDR of this family: upstream adds 0.0.0.0/0 (::/0) for it.
    if (prefixes.empty()) all = true;
    (family == IPFamily::kIPv4 ? out.allLocalIPv4 : out.allLocalIPv6) = all;
    for (const auto& text : localAddresses) {
      auto ip = resolve::parseIP(text);
      if (!ip || ip->family != family) continue;
      auto host = parsePrefix(ip->text);
      if (!host) continue;
      // Every local address: no backend programs an IPv6 link-local one then, and every pod's
      // host-side veth brings one (the node would change, and sync in full, at each pod start).
      if (all && isLinkLocalIPv6(*host)) continue;
      if (all || std::any_of(prefixes.begin(), prefixes.end(),
                             [&](const Prefix& p) { return p.contains(*host); }))
        out.addresses.push_back(ip->text);
    }
  }
  std::sort(out.addresses.begin(), out.addresses.end());
  out.addresses.erase(std::unique(out.addresses.begin(), out.addresses.end()), out.addresses.end());
  return out;
}

}  // namespace kproxy::core
