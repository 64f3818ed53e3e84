#include "kproxy/ipvs/tracer_scheduler.h"

#include <fmt/format.h>

#include "kproxy/ipvs/backend.h"

namespace kproxy::ipvs {
namespace {

std::uint8_t protocolNumber(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kUDP: return 17;
    case sdk::Protocol::kSCTP: return 132;
    case sdk::Protocol::kTCP: break;
  }
  return 6;
}

}  // namespace

std::vector<TracedVirtualServer> tracedVirtualServers(std::span<const Fragment> fragments) {
  std::vector<TracedVirtualServer> out;
  for (const auto& f : fragments)
    for (const auto& vs : f.virtualServers) {
      TracedVirtualServer t;
      t.protocol = protocolNumber(vs.protocol);
      if (auto a = net::Prefix::parse(vs.address)) t.address = *a;
      t.port = vs.port;
      t.fwmark = vs.fwmark;
      t.keepsPort = vs.fwmark != 0 && vs.persistent;
      for (const auto& rs : vs.realServers)
        if (auto a = net::Prefix::parse(rs.address)) t.realServers.emplace_back(*a, rs.port);
      t.text = ipvsadmCommand('A', kernelVirtualServer(vs));
      // The renderer leaves a virtual server without real servers only where the plan rejects
      // for want of endpoints; where it drops (no local endpoint) there are drop rules instead.
      if (vs.realServers.empty()) t.emptyReason = plan::DropReason::kNoEndpoints;
      out.push_back(std::move(t));
    }
  return out;
}

IpvsConnectionScheduler::Decision IpvsConnectionScheduler::schedule(const Connection& c, plan::ChoiceExplorer& choices,
                                                                    iptables::TracePath& path) const {
  const TracedVirtualServer* vs = nullptr;
  for (const auto& v : servers_)
    if (c.mark != 0 && v.fwmark == c.mark) vs = &v;
  if (vs == nullptr)
    for (const auto& v : servers_)
      if (v.fwmark == 0 && v.protocol == c.protocol && v.port == c.destinationPort && v.address == c.destination)
        vs = &v;
  Decision d;
  if (vs == nullptr) return d;
  if (vs->realServers.empty()) {
    path.steps.push_back(plan::TraceStep{"IPVS", vs->text, "no real servers: ICMP port unreachable"});
    d.kind = Decision::Kind::kRejected;
    d.chain = "IPVS";
    d.rule = vs->text + " (no real servers)";
    d.reason = vs->emptyReason;
    return d;
  }
  const std::size_t k = vs->realServers.size() == 1 ? 0 : choices.choose(vs->realServers.size());
  const auto& [address, realPort] = vs->realServers[k];
  // A persistent firewall-mark service keeps the packet's port (the kernel's
  // ip_vs_sched_persist): the real server's port is not used.
  const std::uint16_t port = vs->keepsPort ? c.destinationPort : realPort;
  const std::string to = plan::endpointText(address.toString(), port);
  if (vs->realServers.size() > 1) path.choices.push_back(fmt::format("IPVS {}: real server {}", vs->text, to));
  path.steps.push_back(plan::TraceStep{"IPVS", vs->text, "scheduled to " + to});
  d.kind = Decision::Kind::kScheduled;
  d.destination = address;
  d.destinationPort = port;
  d.service = VirtualService{c.protocol, c.destination, c.destinationPort};
  return d;
}

}  // namespace kproxy::ipvs
