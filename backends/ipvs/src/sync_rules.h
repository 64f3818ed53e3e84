#pragma once
// What the IPVS backend's sync (backend.cpp) and its differ (differ.cpp) both go by: the
// families and tables, the mirror's keys, which virtual server settings count as a change and
// which real servers drain.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "kproxy/ipvs/kernel.h"
#include "kproxy/ipvs/renderer.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ipvs {

inline constexpr net::Family kFamilies[] = {net::Family::kIPv4, net::Family::kIPv6};
/// IPVS mode's tables, in the order upstream writes them.
inline constexpr Table kIpvsTables[] = {Table::kNat, Table::kFilter};

inline std::size_t index(net::Family f) { return f == net::Family::kIPv6 ? 1 : 0; }
/// The mirror's key of a service port: "4|key" / "6|key".
inline std::string tagOf(net::Family f, const std::string& key) {
  return (f == net::Family::kIPv6 ? "6|" : "4|") + key;
}
inline std::string_view toolName(net::Family f) {
  return f == net::Family::kIPv6 ? "ip6tables" : "iptables";
}

/// Whether the settings one adds or updates are the same (identity aside).
inline bool sameSettings(const VirtualServer& a, const VirtualServer& b) {
  return a.scheduler == b.scheduler && a.flags == b.flags && a.timeout == b.timeout &&
         a.netmask == b.netmask;
}

/// Upstream's IsRsGracefulTerminationNeeded: UDP and SCTP real servers go at once.
inline bool drains(const VirtualServer& vs) { return vs.protocol == Protocol::kTcp; }

inline std::string terminatingKey(const VirtualServer& vs, const RealServer& rs) {
  return vs.describe() + "/" + rs.describe();
}

/// The NodePorts IPVS mode programmed, as its NodePort sets hold them: how a process that
/// applied nothing yet (a restart, --cleanup) knows which virtual servers on the node's
/// addresses are its own.
std::set<std::pair<Protocol, std::uint16_t>> nodePortsOf(const IpsetState& state);

}  // namespace kproxy::ipvs
