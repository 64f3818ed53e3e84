#pragma once
/// IPVS's scheduling as `kproxy explain` traces it: the iptables tracer's ConnectionScheduler
/// (kproxy/iptables/tracer.h) over the virtual servers a sync would program. The tracer calls
/// it where the kernel calls ip_vs (LOCAL_IN, LOCAL_OUT); this says which virtual server the
/// connection meets and which real servers it may be scheduled to.
///
/// Thread-safety: a const scheduler may be used from several threads.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/iptables/tracer.h"
#include "kproxy/ipvs/renderer.h"
#include "kproxy/net/ip.h"
#include "kproxy/plan/trace.h"

namespace kproxy::ipvs {

/// An IPVS virtual server as the scheduler schedules connections to it.
struct TracedVirtualServer {
  std::uint32_t fwmark = 0;  ///< not 0: matched by the packet mark, not by address
  std::uint8_t protocol = 6;
  net::Prefix address;
  std::uint16_t port = 0;
  std::vector<std::pair<net::Prefix, std::uint16_t>> realServers;
  /// A persistent firewall-mark service: connections keep the packet's destination port (the
  /// kernel uses a real server's port only when the packet's equals the service's, 0 here).
  bool keepsPort = false;
  std::string text;  ///< how the trace names it ("ipvsadm -A -t 10.96.0.10:80 -s rr")
  /// Why it refuses a connection when it has no real server.
  plan::DropReason emptyReason = plan::DropReason::kNone;
};

/// The virtual servers of rendered service ports, as the scheduler takes them.
std::vector<TracedVirtualServer> tracedVirtualServers(std::span<const Fragment> fragments);

/// Schedules as the kernel's ip_vs: the virtual server is looked up by the packet mark first
/// (firewall-mark services), then by protocol, destination and port; each real server is one
/// alternative (a path of the trace), none is a reject (ICMP port unreachable).
class IpvsConnectionScheduler final : public iptables::ConnectionScheduler {
 public:
  explicit IpvsConnectionScheduler(std::vector<TracedVirtualServer> servers) : servers_(std::move(servers)) {}

  Decision schedule(const Connection& connection, plan::ChoiceExplorer& choices,
                    iptables::TracePath& path) const override;

 private:
  std::vector<TracedVirtualServer> servers_;
};

}  // namespace kproxy::ipvs
