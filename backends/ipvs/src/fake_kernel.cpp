// The IPVS backend's fakes: in-memory IPVS, dummy links and ipsets with the kernel's and the
// tools' refusals, and the sysctls a fresh kernel holds, for unit tests and --dry-run.
#include <algorithm>
#include <cerrno>
#include <optional>

#include <fmt/format.h>

#include "ipset_lines.h"
#include "ipvs_wire.h"
#include "kproxy/ipvs/kernel.h"

namespace kproxy::ipvs {
namespace {

/// What the kernel reports back for `vs`: the identity a firewall-mark service does not use
/// cleared, a host netmask as nullopt.
VirtualServer normalised(const VirtualServer& vs) {
  VirtualServer out = vs;
  if (out.fwmark != 0) {
    out.protocol = Protocol::kTcp;
    out.address = net::Prefix{};
    out.port = 0;
  }
  const std::uint8_t host = vs.family == net::Family::kIPv4 ? 32 : 128;
  if (out.netmask == host) out.netmask.reset();
  return out;
}

RealServer settingsOf(const RealServer& rs) {
  RealServer out = rs;
  out.activeConnections = out.inactiveConnections = out.persistentConnections = 0;
  return out;
}

}  // namespace

std::optional<core::Error> FakeIpvs::injected(IpvsOperation op, const VirtualServer* vs, const RealServer* rs) {
  ++calls;
  if (op != IpvsOperation::kListVirtualServers && op != IpvsOperation::kListRealServers &&
      op != IpvsOperation::kGetTimeouts)
    ++writes;
  if (!failure_ || failure_->first != op) return std::nullopt;
  const int errnum = failure_->second;
  failure_.reset();
  return ipvsError(op, errnum, vs, rs);
}

FakeIpvs::Entry* FakeIpvs::find(const VirtualServer& vs) {
  auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.vs.sameIdentity(normalised(vs)); });
  return it == entries.end() ? nullptr : &*it;
}

core::Result<std::vector<VirtualServer>> FakeIpvs::listVirtualServers() {
  if (auto e = injected(IpvsOperation::kListVirtualServers, nullptr, nullptr)) return std::unexpected(*e);
  std::vector<VirtualServer> out;
  for (const auto& e : entries) out.push_back(e.vs);
  return out;
}

core::Result<std::vector<RealServer>> FakeIpvs::listRealServers(const VirtualServer& vs) {
  const auto op = IpvsOperation::kListRealServers;
  if (auto e = injected(op, &vs, nullptr)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, false); !r) return std::unexpected(r.error());
  Entry* entry = find(vs);
  if (entry == nullptr) return std::unexpected(ipvsError(op, ESRCH, &vs));
  return entry->realServers;
}

core::Result<void> FakeIpvs::addVirtualServer(const VirtualServer& vs) {
  const auto op = IpvsOperation::kAddVirtualServer;
  if (auto e = injected(op, &vs, nullptr)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, true); !r) return r;
  if (find(vs) != nullptr) return std::unexpected(ipvsError(op, EEXIST, &vs));
  if (std::find(schedulers.begin(), schedulers.end(), vs.scheduler) == schedulers.end())
    return std::unexpected(ipvsError(op, ENOENT, &vs));
  entries.push_back({normalised(vs), {}});
  return {};
}

core::Result<void> FakeIpvs::updateVirtualServer(const VirtualServer& vs) {
  const auto op = IpvsOperation::kUpdateVirtualServer;
  if (auto e = injected(op, &vs, nullptr)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, true); !r) return r;
  Entry* entry = find(vs);
  if (entry == nullptr) return std::unexpected(ipvsError(op, ESRCH, &vs));
  if (std::find(schedulers.begin(), schedulers.end(), vs.scheduler) == schedulers.end())
    return std::unexpected(ipvsError(op, ENOENT, &vs));
  entry->vs = normalised(vs);
  return {};
}

core::Result<void> FakeIpvs::deleteVirtualServer(const VirtualServer& vs) {
  const auto op = IpvsOperation::kDeleteVirtualServer;
  if (auto e = injected(op, &vs, nullptr)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, false); !r) return r;
  Entry* entry = find(vs);
  if (entry == nullptr) return std::unexpected(ipvsError(op, ESRCH, &vs));
  entries.erase(entries.begin() + (entry - entries.data()));
  return {};
}

core::Result<void> FakeIpvs::addRealServer(const VirtualServer& vs, const RealServer& rs) {
  const auto op = IpvsOperation::kAddRealServer;
  if (auto e = injected(op, &vs, &rs)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, false); !r) return r;
  if (auto r = wire::checkDest(rs); !r) return r;
  Entry* entry = find(vs);
  if (entry == nullptr) return std::unexpected(ipvsError(op, ESRCH, &vs, &rs));
  // Masquerading needs a real server of the service's family (the kernel says EINVAL).
  if (rs.forwarding != ForwardingMethod::kTunnel && rs.address.v6() != (vs.family == net::Family::kIPv6))
    return std::unexpected(ipvsError(op, EINVAL, &vs, &rs));
  for (const auto& existing : entry->realServers)
    if (existing.sameIdentity(rs)) return std::unexpected(ipvsError(op, EEXIST, &vs, &rs));
  entry->realServers.push_back(settingsOf(rs));
  return {};
}

core::Result<void> FakeIpvs::updateRealServer(const VirtualServer& vs, const RealServer& rs) {
  const auto op = IpvsOperation::kUpdateRealServer;
  if (auto e = injected(op, &vs, &rs)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, false); !r) return r;
  if (auto r = wire::checkDest(rs); !r) return r;
  Entry* entry = find(vs);
  if (entry == nullptr) return std::unexpected(ipvsError(op, ESRCH, &vs, &rs));
  for (auto& existing : entry->realServers) {
    if (!existing.sameIdentity(rs)) continue;
    // The counters belong to the kernel; an update keeps them.
    RealServer updated = rs;
    updated.activeConnections = existing.activeConnections;
    updated.inactiveConnections = existing.inactiveConnections;
    updated.persistentConnections = existing.persistentConnections;
    existing = updated;
    return {};
  }
  return std::unexpected(ipvsError(op, ENOENT, &vs, &rs));
}

core::Result<void> FakeIpvs::deleteRealServer(const VirtualServer& vs, const RealServer& rs) {
  const auto op = IpvsOperation::kDeleteRealServer;
  if (auto e = injected(op, &vs, &rs)) return std::unexpected(*e);
  if (auto r = wire::checkService(vs, false); !r) return r;
  Entry* entry = find(vs);
  if (entry == nullptr) return std::unexpected(ipvsError(op, ESRCH, &vs, &rs));
  auto& list = entry->realServers;
  auto it = std::find_if(list.begin(), list.end(), [&](const RealServer& r) { return r.sameIdentity(rs); });
  if (it == list.end()) return std::unexpected(ipvsError(op, ENOENT, &vs, &rs));
  list.erase(it);
  return {};
}

core::Result<void> FakeIpvs::flush() {
  if (auto e = injected(IpvsOperation::kFlush, nullptr, nullptr)) return std::unexpected(*e);
  entries.clear();
  return {};
}

core::Result<Timeouts> FakeIpvs::timeouts() {
  if (auto e = injected(IpvsOperation::kGetTimeouts, nullptr, nullptr)) return std::unexpected(*e);
  return currentTimeouts;
}

core::Result<void> FakeIpvs::setTimeouts(const Timeouts& t) {
  const auto op = IpvsOperation::kSetTimeouts;
  if (auto e = injected(op, nullptr, nullptr)) return std::unexpected(*e);
  if (t.tcp < 0 || t.tcpFin < 0 || t.udp < 0) return std::unexpected(ipvsError(op, EINVAL));
  if (t.tcp != 0) currentTimeouts.tcp = t.tcp;
  if (t.tcpFin != 0) currentTimeouts.tcpFin = t.tcpFin;
  if (t.udp != 0) currentTimeouts.udp = t.udp;
  return {};
}

// --- FakeDummyLink -------------------------------------------------------------------------

FakeDummyLink::FakeLink* FakeDummyLink::find(const std::string& name) {
  for (auto& [n, link] : links)
    if (n == name) return &link;
  return nullptr;
}

core::Result<bool> FakeDummyLink::ensureLink(const std::string& name) {
  if (FakeLink* link = find(name)) {
    if (link->kind != "dummy")
      return std::unexpected(
          linkError(fmt::format("link {} is of type '{}', not dummy; leaving it alone", name, link->kind), EEXIST));
    return true;
  }
  links.emplace_back(name, FakeLink{});
  return false;
}

core::Result<void> FakeDummyLink::deleteLink(const std::string& name) {
  FakeLink* link = find(name);
  if (link == nullptr) return {};
  if (link->kind != "dummy")
    return std::unexpected(
        linkError(fmt::format("link {} is of type '{}', not dummy; leaving it alone", name, link->kind), EINVAL));
  std::erase_if(links, [&](const auto& entry) { return entry.first == name; });
  return {};
}

core::Result<std::vector<net::Prefix>> FakeDummyLink::listAddresses(const std::string& name) {
  FakeLink* link = find(name);
  if (link == nullptr) return std::unexpected(linkError("list addresses of " + name, ENODEV));
  return link->addresses;
}

core::Result<void> FakeDummyLink::addAddress(const std::string& name, const net::Prefix& address) {
  const std::string what = fmt::format("add address {} to {}", address.toString(), name);
  FakeLink* link = find(name);
  if (link == nullptr) return std::unexpected(linkError(what, ENODEV));
  net::Prefix host = address;
  host.length = static_cast<std::uint8_t>(host.size() * 8);
  if (std::find(link->addresses.begin(), link->addresses.end(), host) != link->addresses.end())
    return std::unexpected(linkError(what, EEXIST));
  link->addresses.push_back(host);
  return {};
}

core::Result<void> FakeDummyLink::deleteAddress(const std::string& name, const net::Prefix& address) {
  const std::string what = fmt::format("delete address {} from {}", address.toString(), name);
  FakeLink* link = find(name);
  if (link == nullptr) return std::unexpected(linkError(what, ENODEV));
  net::Prefix host = address;
  host.length = static_cast<std::uint8_t>(host.size() * 8);
  auto it = std::find(link->addresses.begin(), link->addresses.end(), host);
  if (it == link->addresses.end()) return std::unexpected(linkError(what, EADDRNOTAVAIL));
  link->addresses.erase(it);
  return {};
}

// --- FakeIpsets ----------------------------------------------------------------------------

core::Result<IpsetState> FakeIpsets::save() { return state; }

core::Result<void> FakeIpsets::restore(std::string_view input) {
  restores.emplace_back(input);
  if (refuseNext) {
    refuseNext = false;
    return core::makeError(core::ErrorCategory::kKernel, "ipset restore: refused (fake)");
  }
  IpsetState next = state;
  std::optional<core::Error> error;
  std::size_t number = 0;
  forEachLine(input, [&](std::string_view raw) {
    ++number;
    if (error || raw.empty()) return;
    IpsetLine line = splitLine(raw);
    const std::string name(line.name);
    auto refuse = [&](std::string_view why) {
      error = core::Error{core::ErrorCategory::kKernel, 0,
                          fmt::format("ipset restore: line {}: {} (fake)", number, why)};
    };
    if (line.verb == "create") {
      next.sets.try_emplace(name).first->second.createLine = std::string(raw);
      return;
    }
    auto it = next.sets.find(name);
    if (it == next.sets.end()) return refuse("The set with the given name does not exist");
    if (line.verb == "add")
      it->second.entries.emplace(line.rest);
    else if (line.verb == "del")
      it->second.entries.erase(std::string(line.rest));
    else if (line.verb == "flush")
      it->second.entries.clear();
    else if (line.verb == "destroy")
      next.sets.erase(it);
    else
      refuse("unknown command");
  });
  if (error) return std::unexpected(*error);
  state = std::move(next);
  return {};
}

std::map<std::string, std::int64_t> freshSysctls() {
  return {{"net/ipv4/vs/conntrack", 0},          {"net/ipv4/vs/conn_reuse_mode", 1},
          {"net/ipv4/vs/expire_nodest_conn", 0}, {"net/ipv4/vs/expire_quiescent_template", 0},
          {"net/ipv4/conf/all/arp_ignore", 0},   {"net/ipv4/conf/all/arp_announce", 0}};
}

}  // namespace kproxy::ipvs
