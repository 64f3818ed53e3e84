#include "kproxy/ipvs/backend.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kproxy/backends/common/conntrack_cleaner.h"
#include "kproxy/backends/common/heap.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/backends/common/sysctl.h"
#include "kproxy/plan/options.h"

namespace kproxy::ipvs {
namespace {

using backends::IPPrefix;
constexpr sdk::Family kFamilies[] = {sdk::Family::kIPv4, sdk::Family::kIPv6};
constexpr Table kIpvsTables[] = {Table::kNat, Table::kFilter};

std::size_t index(sdk::Family f) { return f == sdk::Family::kIPv6 ? 1 : 0; }
std::string tagOf(sdk::Family f, const std::string& key) {
  return (f == sdk::Family::kIPv6 ? "6|" : "4|") + key;
}
std::string_view toolName(sdk::Family f) {
  return f == sdk::Family::kIPv6 ? "ip6tables" : "iptables";
}
iptables::Table iptablesTable(Table t) {
  return t == Table::kNat ? iptables::Table::kNat : iptables::Table::kFilter;
}

/// Whether the settings one adds or updates are the same (identity aside).
bool sameSettings(const VirtualServer& a, const VirtualServer& b) {
  return a.scheduler == b.scheduler && a.flags == b.flags && a.timeout == b.timeout &&
         a.netmask == b.netmask;
}

/// Upstream's IsRsGracefulTerminationNeeded: UDP and SCTP real servers go at once.
bool drains(const VirtualServer& vs) { return vs.protocol == Protocol::kTcp; }

std::string terminatingKey(const VirtualServer& vs, const RealServer& rs) {
  return vs.describe() + "/" + rs.describe();
}

sdk::ErrorCategory categoryOf(const core::Error& e) {
  switch (e.category) {
    case core::ErrorCategory::kTransient:
      return sdk::ErrorCategory::kTransient;
    case core::ErrorCategory::kInvalidArgument:
      return sdk::ErrorCategory::kInvalidInput;
    case core::ErrorCategory::kKernel:
    case core::ErrorCategory::kNotFound:
    case core::ErrorCategory::kProcess:
      return sdk::ErrorCategory::kKernelRefused;
    default:
      return sdk::ErrorCategory::kUnknown;
  }
}

/// "6.1.0-56-cloud-amd64" → {6, 1}; {0, 0} when unreadable.
std::pair<int, int> kernelVersion(const std::string& release) {
  int major = 0, minor = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &major, &minor) != 2) return {0, 0};
  return {major, minor};
}

/// The NodePorts IPVS mode programmed, as its NodePort sets hold them ("30080" in a bitmap:port
/// set, "10.0.0.2,sctp:30080" in the SCTP ones): how a process that applied nothing yet (a
/// restart, --cleanup) knows which virtual servers on the node's addresses are its own.
std::set<std::pair<Protocol, std::uint16_t>> nodePortsOf(const IpsetState& state) {
  std::set<std::pair<Protocol, std::uint16_t>> out;
  const std::pair<SetId, Protocol> sets[] = {
      {SetId::kNodePortTCP, Protocol::kTcp},   {SetId::kNodePortLocalTCP, Protocol::kTcp},
      {SetId::kNodePortUDP, Protocol::kUdp},   {SetId::kNodePortLocalUDP, Protocol::kUdp},
      {SetId::kNodePortSCTP, Protocol::kSctp}, {SetId::kNodePortLocalSCTP, Protocol::kSctp}};
  for (sdk::Family fam : kFamilies)
    for (const auto& [id, protocol] : sets) {
      auto it = state.sets.find(setName(id, fam));
      if (it == state.sets.end()) continue;
      for (const auto& entry : it->second.entries) {
        const auto colon = entry.rfind(':');
        const std::string port = colon == std::string::npos ? entry : entry.substr(colon + 1);
        const int value = std::atoi(port.c_str());
        if (value > 0 && value < 65536) out.emplace(protocol, static_cast<std::uint16_t>(value));
      }
    }
  return out;
}

}  // namespace

VirtualServer kernelVirtualServer(const PlannedVirtualServer& p) {
  VirtualServer vs;
  vs.family = p.family == sdk::Family::kIPv6 ? Family::kIPv6 : Family::kIPv4;
  vs.protocol = p.protocol == sdk::Protocol::kUDP    ? Protocol::kUdp
                : p.protocol == sdk::Protocol::kSCTP ? Protocol::kSctp
                                                     : Protocol::kTcp;
  if (p.fwmark != 0) {
    vs.fwmark = p.fwmark;  // no address or port: the kernel keys it by the mark alone
  } else {
    if (auto a = IPPrefix::parse(p.address)) vs.address = *a;
    vs.port = p.port;
  }
  vs.scheduler = p.scheduler;
  vs.flags =
      (p.persistent ? kFlagPersistent : 0u) | (p.sourceHashFallback ? kFlagSourceHashFallback : 0u);
  vs.timeout = p.persistent ? p.timeoutSeconds : 0;
  return vs;
}

/// A render as the mirror keeps it: its real servers are in the applied virtual servers, and a
/// later partial sync compares everything else.
Fragment withoutRealServers(Fragment f) {
  for (auto& planned : f.virtualServers) std::vector<PlannedRealServer>().swap(planned.realServers);
  return f;
}

RealServer kernelRealServer(const PlannedRealServer& p) {
  RealServer rs;
  if (auto a = IPPrefix::parse(p.address)) rs.address = *a;
  rs.port = p.port;
  rs.weight = static_cast<std::int32_t>(p.weight);
  return rs;
}

std::string ipvsadmCommand(char op, const VirtualServer& vs, const RealServer* rs) {
  const std::string_view kind = vs.protocol == Protocol::kUdp    ? "-u"
                                : vs.protocol == Protocol::kSctp ? "--sctp-service"
                                                                 : "-t";
  // describe() is "TCP 10.96.0.10:80": the address part is what ipvsadm takes; a
  // firewall-mark service is "-f MARK", with "-6" for IPv6.
  const std::string full = vs.describe();
  const std::string vip = full.substr(full.find(' ') + 1);
  std::string out =
      vs.fwmark != 0
          ? fmt::format("ipvsadm -{} -f {}{}", op, vs.fwmark, vs.family == Family::kIPv6 ? " -6" : "")
          : fmt::format("ipvsadm -{} {} {}", op, kind, vip);
  if (rs == nullptr) {
    if (op == 'A' || op == 'E') {
      out += " -s " + vs.scheduler;
      if ((vs.flags & kFlagSourceHashFallback) != 0)
        out += " -b " + (vs.scheduler == "mh" ? vs.scheduler : std::string("sh")) + "-fallback";
      if ((vs.flags & kFlagPersistent) != 0) out += fmt::format(" -p {}", vs.timeout);
    }
    return out;
  }
  out += " -r " + rs->describe();
  if (op == 'a' || op == 'e') out += fmt::format(" -m -w {}", rs->weight);
  return out;
}

namespace {
bool identityBefore(const RealServer& a, const RealServer& b) {
  return std::tie(a.address.v6, a.address.bytes, a.address.length, a.port) <
         std::tie(b.address.v6, b.address.bytes, b.address.length, b.port);
}
}  // namespace

IpvsBackend::RealServers::RealServers(std::vector<RealServer> all) : sorted_(std::move(all)) {
  std::stable_sort(sorted_.begin(), sorted_.end(), identityBefore);
  sorted_.erase(std::unique(sorted_.begin(), sorted_.end(),
                            [](const RealServer& a, const RealServer& b) { return a.sameIdentity(b); }),
                sorted_.end());
  sorted_.shrink_to_fit();
}

IpvsBackend::RealServers IpvsBackend::realServersOf(const PlannedVirtualServer& planned) {
  std::vector<RealServer> all;
  all.reserve(planned.realServers.size());
  for (const auto& rs : planned.realServers) all.push_back(kernelRealServer(rs));
  return RealServers(std::move(all));
}

const RealServer* IpvsBackend::RealServers::find(const RealServer& identity) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), identity, identityBefore);
  return it != sorted_.end() && it->sameIdentity(identity) ? &*it : nullptr;
}

IpvsBackend::IpvsBackend(sdk::Host host, BackendSettings settings, IpvsAdapters adapters)
    : host_(host),
      settings_(std::move(settings)),
      renderer_(settings_.render),
      kernel_(std::move(adapters)) {
  for (const auto& c : settings_.excludeCIDRs)
    if (auto p = IPPrefix::parse(c)) exclude_.push_back(*p);
}

std::vector<std::string> IpvsBackend::terminating() const {
  std::vector<std::string> out;
  for (const auto& [key, t] : terminating_) out.push_back(key);
  return out;
}

// ---------------------------------------------------------------------------------------
// Kernel writes

void IpvsBackend::count(std::string_view op) {
  ++lastWrites_;
  if (metrics_.operations.active()) metrics_.operations.add({std::string(op)}, 1);
}

void IpvsBackend::print(const std::string& text) {
  if (firstWrites_.size() < 3) firstWrites_.push_back(text);
  if (!settings_.dryRun) return;
  std::fprintf(settings_.dryRunOutput, "%s\n", text.c_str());
  std::fflush(settings_.dryRunOutput);
}

sdk::Expected<void> IpvsBackend::failed(std::string_view op, const core::Error& error) {
  needFull_ = true;
  if (metrics_.failures.active()) metrics_.failures.add({std::string(op)}, 1);
  return sdk::fail(categoryOf(error), "ipvs: " + error.message(), error.errnum);
}

sdk::Expected<void> IpvsBackend::addServer(const VirtualServer& vs) {
  print(ipvsadmCommand('A', vs));
  count("add_virtual_server");
  auto r = kernel_.ipvs->addVirtualServer(vs);
  if (!r && r.error().errnum == EEXIST) return updateServer(vs);
  if (!r) return failed("add_virtual_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::updateServer(const VirtualServer& vs) {
  print(ipvsadmCommand('E', vs));
  count("update_virtual_server");
  if (auto r = kernel_.ipvs->updateVirtualServer(vs); !r)
    return failed("update_virtual_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::deleteServer(const VirtualServer& vs) {
  print(ipvsadmCommand('D', vs));
  count("delete_virtual_server");
  auto r = kernel_.ipvs->deleteVirtualServer(vs);
  if (!r && r.error().errnum != ESRCH) return failed("delete_virtual_server", r.error());
  const std::string prefix = vs.describe() + "/";
  std::erase_if(terminating_, [&](const auto& t) { return t.first.starts_with(prefix); });
  return {};
}

sdk::Expected<void> IpvsBackend::addReal(const VirtualServer& vs, const RealServer& rs) {
  print(ipvsadmCommand('a', vs, &rs));
  count("add_real_server");
  terminating_.erase(terminatingKey(vs, rs));
  auto r = kernel_.ipvs->addRealServer(vs, rs);
  if (!r && r.error().errnum == EEXIST) return updateReal(vs, rs);
  if (!r) return failed("add_real_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::updateReal(const VirtualServer& vs, const RealServer& rs) {
  print(ipvsadmCommand('e', vs, &rs));
  count("update_real_server");
  if (auto r = kernel_.ipvs->updateRealServer(vs, rs); !r)
    return failed("update_real_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::deleteReal(const VirtualServer& vs, const RealServer& rs) {
  print(ipvsadmCommand('d', vs, &rs));
  count("delete_real_server");
  terminating_.erase(terminatingKey(vs, rs));
  auto r = kernel_.ipvs->deleteRealServer(vs, rs);
  if (!r && r.error().errnum != ENOENT && r.error().errnum != ESRCH)
    return failed("delete_real_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::bindAddress(const std::string& address) {
  auto a = IPPrefix::parse(address);
  if (!a) return {};
  print(fmt::format("ip addr add {}/{} dev {}", a->toString(), a->v6 ? 128 : 32, kDummyLinkName));
  count("add_address");
  auto r = kernel_.link->addAddress(kDummyLinkName, *a);
  dummyAddressesStale_ = true;
  if (!r && r.error().errnum != EEXIST) return failed("add_address", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::unbindAddress(const std::string& address) {
  auto a = IPPrefix::parse(address);
  if (!a) return {};
  print(fmt::format("ip addr del {}/{} dev {}", a->toString(), a->v6 ? 128 : 32, kDummyLinkName));
  count("delete_address");
  auto r = kernel_.link->deleteAddress(kDummyLinkName, *a);
  dummyAddressesStale_ = true;
  if (!r && r.error().errnum != EADDRNOTAVAIL) return failed("delete_address", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::restoreIpsets(const std::string& input) {
  if (input.empty()) return {};
  print("# ipset restore -exist\n" + input);
  count("ipset_restore");
  if (auto r = kernel_.ipsets->restore(input); !r) return failed("ipset_restore", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::restoreIptables(sdk::Family family, const std::string& input) {
  if (input.empty()) return {};
  print(fmt::format("# {}-restore --noflush\n{}", toolName(family), input));
  count("iptables_restore");
  if (auto r = kernel_.iptables->restore(family, input); !r)
    return failed("iptables_restore",
                  core::Error{r.error().category, r.error().errnum,
                              fmt::format("{}-restore: {}", toolName(family), r.error().context)});
  return {};
}

sdk::Expected<void> IpvsBackend::ensureLink() {
  auto r = kernel_.link->ensureLink(kDummyLinkName);
  if (!r) return failed("add_link", r.error());
  if (!*r) {
    print(fmt::format("ip link add {} type dummy", kDummyLinkName));
    count("add_link");
  }
  return {};
}

// ---------------------------------------------------------------------------------------
// Sync

sdk::Expected<sdk::SyncOutcome> IpvsBackend::sync(const sdk::SyncContext& context) {
  plan::HostSnapshot next(context.next);
  auto synced = syncFrom(next, context.changed, context.full);
  if (synced && !settings_.dryRun) backends::cleanStaleConntrackEntries(host_, context);
  // As the other backends: a full sync's freed heap goes back to the system. Not after
  // partial syncs, where it would cost every endpoint change a walk of the heap (2 ms under
  // the test VM's emulation at 1,000 Services).
  if (context.full) backends::releaseFreeHeap();
  return synced;
}

sdk::Expected<sdk::SyncOutcome> IpvsBackend::syncFrom(const plan::SnapshotSource& next,
                                                      const std::vector<sdk::ChangedKey>& changed,
                                                      bool full) {
  const auto started = std::chrono::steady_clock::now();
  full = full || needFull_;
  lastWrites_ = 0;
  firstWrites_.clear();
  renderer_.setNode(next.node());
  renderer_.setServiceCIDRs(next.serviceCIDRs());
  // Any failure below leaves needFull_ set: the next sync reads the kernel back.
  needFull_ = true;
  auto r = full ? fullSync(next) : partialSync(next, changed);
  if (!r) return std::unexpected(r.error());
  if (auto d = drainTerminating(); !d) return std::unexpected(d.error());
  needFull_ = false;
  updateMetrics();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  sdk::SyncOutcome outcome;
  outcome.operations = lastWrites_;
  outcome.summary =
      fmt::format("{} sync: {} kernel writes in {:.1f} ms ({} virtual servers, {} draining)",
                  full ? "full" : "partial", lastWrites_, ms, servers_.size(), terminating_.size());
  // A full sync asked to change nothing that still wrote: the kernel differed from the plan (a
  // self-verification, or a first sync). Name the first writes, in ipvsadm notation.
  if (full && changed.empty() && lastWrites_ > 0 && !firstWrites_.empty())
    outcome.summary += fmt::format(" first writes: {}", fmt::join(firstWrites_, "; "));
  return outcome;
}

bool IpvsBackend::ownsAddress(const IPPrefix& address) const {
  if (std::any_of(exclude_.begin(), exclude_.end(),
                  [&](const IPPrefix& c) { return c.contains(address); }))
    return false;
  const std::string text = address.toString();
  if (addresses_.contains(text)) return true;
  for (sdk::Family fam : kFamilies) {
    const auto& np = renderer_.nodePortAddresses(fam);
    if (std::find(np.begin(), np.end(), text) != np.end()) return true;
  }
  return false;
}

sdk::Expected<void> IpvsBackend::applyServer(const AppliedServer* old, const AppliedServer& want) {
  if (old == nullptr) {
    if (auto r = addServer(want.vs); !r) return r;
    for (const auto& rs : want.real)
      if (auto r = addReal(want.vs, rs); !r) return r;
    return {};
  }
  if (!sameSettings(old->vs, want.vs))
    if (auto r = updateServer(want.vs); !r) return r;
  for (const auto& rs : want.real) {
    const RealServer* had = old->real.find(rs);
    if (had == nullptr) {
      if (auto r = addReal(want.vs, rs); !r) return r;
    } else if (!had->sameSettings(rs)) {
      if (auto r = updateReal(want.vs, rs); !r) return r;
    }
  }
  for (const auto& rs : old->real)
    if (!want.real.contains(rs))
      if (auto r = retireRealServer(want.vs, rs); !r) return r;
  return {};
}

sdk::Expected<void> IpvsBackend::removeServer(const AppliedServer& old) {
  return deleteServer(old.vs);
}

sdk::Expected<void> IpvsBackend::retireRealServer(const VirtualServer& vs, const RealServer& rs) {
  if (!drains(vs)) return deleteReal(vs, rs);
  const std::string key = terminatingKey(vs, rs);
  if (terminating_.contains(key)) return {};
  RealServer quiet = rs;
  quiet.weight = 0;
  print(ipvsadmCommand('e', vs, &quiet));
  count("update_real_server");
  auto r = kernel_.ipvs->updateRealServer(vs, quiet);
  if (!r && (r.error().errnum == ENOENT || r.error().errnum == ESRCH)) return {};  // gone already
  if (!r) return failed("update_real_server", r.error());
  terminating_[key] = Terminating{vs, quiet, settings_.now()};
  return {};
}

sdk::Expected<void> IpvsBackend::drainTerminating() {
  if (terminating_.empty()) return {};
  // One dump per virtual server with draining real servers, for their connection counters.
  std::map<std::string, std::vector<std::string>> byServer;
  for (const auto& [key, t] : terminating_) byServer[t.vs.describe()].push_back(key);
  const auto now = settings_.now();
  for (const auto& [server, keys] : byServer) {
    const VirtualServer vs = terminating_.at(keys.front()).vs;
    auto listed = kernel_.ipvs->listRealServers(vs);
    if (!listed && listed.error().errnum == ESRCH) {
      for (const auto& k : keys) terminating_.erase(k);
      continue;
    }
    if (!listed) return failed("list_real_servers", listed.error());
    for (const auto& key : keys) {
      const Terminating t = terminating_.at(key);
      auto it = std::find_if(listed->begin(), listed->end(),
                             [&](const RealServer& rs) { return rs.sameIdentity(t.rs); });
      if (it == listed->end()) {
        terminating_.erase(key);
        continue;
      }
      const bool idle = it->activeConnections + it->inactiveConnections == 0;
      if (!idle && now - t.since < settings_.gracefulTimeout) continue;
      if (!idle)
        host_.info(1,
                   fmt::format(
                       "ipvs: real server {} of {} still has {} active and {} inactive connections "
                       "after {} s; deleting it",
                       t.rs.describe(), server, it->activeConnections, it->inactiveConnections,
                       settings_.gracefulTimeout.count()));
      if (auto r = deleteReal(t.vs, t.rs); !r) return r;
    }
  }
  return {};
}

sdk::Expected<void> IpvsBackend::fullSync(const plan::SnapshotSource& next) {
  if (!settings_.dryRun) {
    setSysctls();
    setTimeouts();
  }
  if (auto r = ensureLink(); !r) return r;
  auto bound = kernel_.link->listAddresses(kDummyLinkName);
  if (!bound) return failed("list_addresses", bound.error());
  std::vector<std::string> boundText;
  for (const auto& a : *bound) boundText.push_back(a.toString());
  renderer_.setDummyInterfaceAddresses(boundText);
  dummyAddressesStale_ = false;

  // What is wanted, from every service port.
  std::map<std::string, Fragment> ports;
  std::map<std::string, AppliedServer> servers;
  std::map<std::string, std::size_t> addresses, entries;
  next.forEach([&](const sdk::ServicePort& p) {
    if (!familyEnabled(p.family)) return;
    Fragment f = renderer_.renderServicePort(p);
    const std::string tag = tagOf(p.family, p.key);
    for (const auto& problem : f.problems)
      host_.warning(fmt::format("ipvs: {}: {}", p.key, problem));
    for (const auto& planned : f.virtualServers) {
      AppliedServer a{kernelVirtualServer(planned), realServersOf(planned), tag};
      const std::string key = a.vs.describe();
      if (!servers.emplace(key, std::move(a)).second)
        host_.warning(fmt::format(
            "ipvs: {}: virtual server {} is another service port's too; kept once", p.key, key));
    }
    for (const auto& a : f.boundAddresses) ++addresses[a];
    for (const auto& e : f.ipsetEntries) ++entries[e.text()];
    ports[tag] = withoutRealServers(std::move(f));
  });

  // The sets first: their NodePorts say which virtual servers on node addresses are kproxy's.
  auto state = kernel_.ipsets->save();
  if (!state) return failed("ipset_save", state.error());
  const auto nodePorts = nodePortsOf(*state);

  // Virtual and real servers: the kernel's against the wanted ones.
  auto listed = kernel_.ipvs->listVirtualServers();
  if (!listed) return failed("list_virtual_servers", listed.error());
  const auto wasBound = [&](const IPPrefix& a) {
    return std::find(bound->begin(), bound->end(), a) != bound->end();
  };
  std::set<std::string> seen;
  for (const auto& kvs : *listed) {
    // Firewall-mark services: kproxy's carry its tag bit (ClientIP affinity); others' are left.
    if (kvs.fwmark != 0 && !ownsFwmark(kvs.fwmark)) continue;
    const std::string key = kvs.describe();
    auto want = servers.find(key);
    if (want == servers.end()) {
      const bool owned = kvs.fwmark != 0 || servers_.contains(key) || wasBound(kvs.address) ||
                         ownsAddress(kvs.address) || nodePorts.contains({kvs.protocol, kvs.port});
      const bool excluded =
          kvs.fwmark == 0 && std::any_of(exclude_.begin(), exclude_.end(),
                                         [&](const IPPrefix& c) { return c.contains(kvs.address); });
      if (owned && !excluded)
        if (auto r = deleteServer(kvs); !r) return r;
      continue;
    }
    seen.insert(key);
    const AppliedServer& w = want->second;
    if (!sameSettings(kvs, w.vs))
      if (auto r = updateServer(w.vs); !r) return r;
    auto real = kernel_.ipvs->listRealServers(kvs);
    if (!real) return failed("list_real_servers", real.error());
    for (const auto& krs : *real) {
      if (const RealServer* wanted = w.real.find(krs)) {
        terminating_.erase(terminatingKey(w.vs, krs));
        if (!krs.sameSettings(*wanted))
          if (auto r = updateReal(w.vs, *wanted); !r) return r;
        continue;
      }
      const std::string tkey = terminatingKey(w.vs, krs);
      if (terminating_.contains(tkey) && krs.weight == 0) continue;
      terminating_.erase(tkey);
      if (drains(w.vs) && krs.activeConnections + krs.inactiveConnections == 0) {
        if (auto r = deleteReal(w.vs, krs); !r) return r;
        continue;
      }
      if (drains(w.vs) && krs.weight == 0) {
        // Draining already (a restart): the clock starts again, nothing is written.
        terminating_[tkey] = Terminating{w.vs, krs, settings_.now()};
        continue;
      }
      if (auto r = retireRealServer(w.vs, krs); !r) return r;
    }
    const RealServers present(std::move(*real));
    for (const auto& rs : w.real)
      if (!present.contains(rs))
        if (auto r = addReal(w.vs, rs); !r) return r;
  }
  for (const auto& [key, w] : servers)
    if (!seen.contains(key))
      if (auto r = applyServer(nullptr, w); !r) return r;
  // Draining real servers of virtual servers that are gone.
  std::erase_if(terminating_,
                [&](const auto& t) { return !servers.contains(t.second.vs.describe()); });

  // kube-ipvs0: every address on it is IPVS mode's (as upstream, which unbinds what no
  // service holds).
  for (const auto& [a, refs] : addresses) {
    const auto parsed = IPPrefix::parse(a);
    if (parsed &&
        std::find(boundText.begin(), boundText.end(), parsed->toString()) == boundText.end())
      if (auto r = bindAddress(a); !r) return r;
  }
  for (const auto& a : boundText)
    if (!addresses.contains(a))
      if (auto r = unbindAddress(a); !r) return r;

  // ipsets: create the missing sets, then add and delete the entries that differ.
  std::string creates, changes;
  for (sdk::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    for (const auto& def : renderer_.renderGlobal(fam).sets) {
      auto it = state->sets.find(def.name);
      if (it == state->sets.end()) {
        creates += def.createText() + "\n";
        continue;
      }
      for (const auto& e : it->second.entries) {
        const std::string text = "add " + def.name + " " + e;
        if (!entries.contains(text)) changes += "del " + def.name + " " + e + "\n";
      }
    }
  }
  for (const auto& [text, refs] : entries) {
    // "add SET ENTRY"
    const auto space = text.find(' ', 4);
    const std::string set = text.substr(4, space - 4);
    auto it = state->sets.find(set);
    if (it == state->sets.end() || !it->second.entries.contains(text.substr(space + 1)))
      changes += text + "\n";
  }
  if (auto r = restoreIpsets(creates + changes); !r) return r;

  ports_ = std::move(ports);
  servers_ = std::move(servers);
  addresses_ = std::move(addresses);
  ipsetEntries_ = std::move(entries);
  // The renderer learns kube-ipvs0's addresses as they are now, here rather than in the next
  // partial sync (an endpoint change should not cost a pass over every address).
  std::vector<std::string> nowBound;
  nowBound.reserve(addresses_.size());
  for (const auto& [a, refs] : addresses_) nowBound.push_back(a);
  renderer_.setDummyInterfaceAddresses(std::move(nowBound));
  dummyAddressesStale_ = false;
  return syncIptables(true);
}

sdk::Expected<void> IpvsBackend::partialSync(const plan::SnapshotSource& next,
                                             const std::vector<sdk::ChangedKey>& changed) {
  if (dummyAddressesStale_) {
    std::vector<std::string> bound;
    for (const auto& [a, refs] : addresses_) bound.push_back(a);
    renderer_.setDummyInterfaceAddresses(std::move(bound));
    dummyAddressesStale_ = false;
  }
  std::string ipsetLines;
  bool rulesChanged = false;
  for (const auto& c : changed) {
    if (!familyEnabled(c.family) || c.key.empty()) continue;
    const std::string tag = tagOf(c.family, c.key);
    Fragment now;
    if (auto port = next.find(c.family, c.key)) {
      now = renderer_.renderServicePort(*port);
      for (const auto& problem : now.problems)
        host_.warning(fmt::format("ipvs: {}: {}", c.key, problem));
    }
    Fragment before;
    if (auto it = ports_.find(tag); it != ports_.end()) before = it->second;

    // Addresses first: a virtual server's address is bound before it answers.
    for (const auto& a : now.boundAddresses)
      if (addresses_[a]++ == 0)
        if (auto r = bindAddress(a); !r) return r;

    std::set<std::string> keep;
    for (const auto& planned : now.virtualServers) {
      AppliedServer want{kernelVirtualServer(planned), realServersOf(planned), tag};
      const std::string key = want.vs.describe();
      keep.insert(key);
      auto it = servers_.find(key);
      if (it != servers_.end() && it->second.owner != tag) {
        host_.warning(fmt::format("ipvs: {}: virtual server {} is {}'s too; kept once", c.key, key,
                                  it->second.owner));
        continue;
      }
      if (auto r = applyServer(it == servers_.end() ? nullptr : &it->second, want); !r) return r;
      servers_[key] = std::move(want);
    }
    for (const auto& planned : before.virtualServers) {
      const std::string key = kernelVirtualServer(planned).describe();
      if (keep.contains(key)) continue;
      auto it = servers_.find(key);
      if (it == servers_.end() || it->second.owner != tag) continue;
      if (auto r = removeServer(it->second); !r) return r;
      servers_.erase(it);
    }

    for (const auto& a : before.boundAddresses) {
      auto it = addresses_.find(a);
      if (it == addresses_.end() || --it->second > 0) continue;
      addresses_.erase(it);
      if (auto r = unbindAddress(a); !r) return r;
    }

    for (const auto& e : now.ipsetEntries)
      if (ipsetEntries_[e.text()]++ == 0) ipsetLines += e.text() + "\n";
    for (const auto& e : before.ipsetEntries) {
      auto it = ipsetEntries_.find(e.text());
      if (it == ipsetEntries_.end() || --it->second > 0) continue;
      ipsetEntries_.erase(it);
      ipsetLines += "del " + e.set + " " + e.entry + "\n";
    }

    if (now.rules != before.rules) rulesChanged = true;
    if (now.key.empty())
      ports_.erase(tag);
    else
      ports_[tag] = withoutRealServers(std::move(now));
  }
  if (auto r = restoreIpsets(ipsetLines); !r) return r;
  return syncIptables(false, rulesChanged);
}

sdk::Expected<void> IpvsBackend::syncIptables(bool readKernel, bool portRulesChanged) {
  for (sdk::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    const GlobalObjects g = renderer_.renderGlobal(fam);
    if (!readKernel && !portRulesChanged && g.chains == globalApplied_[index(fam)]) continue;
    // The owned chains' rules: fixed head, the service ports' rules (in key order), fixed tail.
    std::map<std::pair<Table, std::string>, std::vector<std::string>> portRules;
    for (const auto& [tag, f] : ports_)
      if (f.family == fam)
        for (const auto& r : f.rules) portRules[{r.table, r.chain}].push_back(r.spec);
    std::map<std::pair<Table, std::string>, std::vector<std::string>> wanted;
    for (const auto& c : g.chains) {
      auto& rules = wanted[{c.table, c.name}];
      rules = c.head;
      if (auto it = portRules.find({c.table, c.name}); it != portRules.end())
        rules.insert(rules.end(), it->second.begin(), it->second.end());
      rules.insert(rules.end(), c.tail.begin(), c.tail.end());
    }
    std::string text;
    for (const auto& [chain, rules] : wanted) {
      text += fmt::format("{} {}\n", tableName(chain.first), chain.second);
      for (const auto& r : rules) text += r + "\n";
    }
    if (!readKernel && text == iptablesApplied_[index(fam)]) continue;

    std::string input;
    for (Table t : kIpvsTables) {
      bool rewrite = !readKernel;
      std::vector<std::string> jumps;
      if (readKernel) {
        backends::IptablesSave saved;
        {
          auto out = kernel_.iptables->save(fam, iptablesTable(t));
          if (!out)
            return failed("iptables_save",
                          core::Error{out.error().category, out.error().errnum,
                                      fmt::format("{}-save -t {}: {}", toolName(fam), tableName(t),
                                                  out.error().context)});
          auto parsed = backends::parseIptablesSave(*out);
          if (!parsed) return failed("iptables_save", parsed.error());
          saved = std::move(*parsed);
        }
        const backends::IptablesTable* table = saved.findTable(tableName(t));
        for (const auto& [chain, rules] : wanted) {
          if (chain.first != t) continue;
          const auto* k = table == nullptr ? nullptr : table->findChain(chain.second);
          if (k == nullptr || k->rules.size() != rules.size() ||
              !std::equal(rules.begin(), rules.end(), k->rules.begin(),
                          [](const std::string& a, const backends::IptablesRule& b) {
                            return a == b.spec;
                          }))
            rewrite = true;
        }
        for (const auto& j : g.jumps) {
          if (j.table != t) continue;
          const auto* k = table == nullptr ? nullptr : table->findChain(j.chain);
          const bool present =
              k != nullptr && std::any_of(k->rules.begin(), k->rules.end(),
                                          [&](const auto& r) { return r.spec == j.spec; });
          if (!present) jumps.push_back(fmt::format("-I {} 1 {}\n", j.chain, j.spec));
        }
      } else {
        // A partial sync rewrites a table only when its chains changed.
        std::string before, after;
        const std::string prefix = std::string(tableName(t)) + " ";
        auto section = [&](const std::string& all) {
          std::string out;
          bool in = false;
          for (std::size_t pos = 0; pos < all.size();) {
            auto end = all.find('\n', pos);
            std::string_view line(all.data() + pos, end - pos);
            if (line.starts_with("nat ") || line.starts_with("filter "))
              in = line.starts_with(prefix);
            if (in) out.append(line).push_back('\n');
            pos = end + 1;
          }
          return out;
        };
        rewrite = section(text) != section(iptablesApplied_[index(fam)]);
      }
      if (!rewrite && jumps.empty()) continue;
      input += fmt::format("*{}\n", tableName(t));
      if (rewrite) {
        for (const auto& [chain, rules] : wanted)
          if (chain.first == t) input += fmt::format(":{} - [0:0]\n", chain.second);
        for (const auto& [chain, rules] : wanted)
          if (chain.first == t)
            for (const auto& r : rules) input += fmt::format("-A {} {}\n", chain.second, r);
      }
      for (const auto& j : jumps) input += j;
      input += "COMMIT\n";
    }
    if (auto r = restoreIptables(fam, input); !r) return r;
    iptablesApplied_[index(fam)] = std::move(text);
    globalApplied_[index(fam)] = g.chains;
  }
  return {};
}

void IpvsBackend::setSysctls() {
  backends::SysctlFiles sysctls(settings_.sysctlRoot);
  auto ensure = [&](const char* name, int value) {
    if (auto v = sysctls.readInt(name); v && *v == value) return;
    if (auto w = sysctls.writeInt(name, value); !w)
      host_.warning(fmt::format("ipvs: setting {}={}: {}", name, value, w.error().message()));
    else
      host_.info(1, fmt::format("ipvs: set {}={}", name, value));
  };
  ensure("net/ipv4/vs/conntrack", 1);
  // conn_reuse_mode=0 keeps reused source ports on their real server; kernels from 5.9 fixed
  // the delay that made upstream set it, and before 4.1 it does not exist.
  std::string release = settings_.kernelRelease;
  if (release.empty()) {
    struct utsname u {};
    if (uname(&u) == 0) release = u.release;
  }
  const auto [major, minor] = kernelVersion(release);
  if (std::pair{major, minor} < std::pair{4, 1})
    host_.warning(fmt::format(
        "ipvs: kernel {} is older than 4.1: net/ipv4/vs/conn_reuse_mode not set", release));
  else if (std::pair{major, minor} < std::pair{5, 9})
    ensure("net/ipv4/vs/conn_reuse_mode", 0);
  ensure("net/ipv4/vs/expire_nodest_conn", 1);
  ensure("net/ipv4/vs/expire_quiescent_template", 1);
  if (settings_.strictARP) {
    ensure("net/ipv4/conf/all/arp_ignore", 1);
    ensure("net/ipv4/conf/all/arp_announce", 2);
  }
}

void IpvsBackend::setTimeouts() {
  const Timeouts& t = settings_.timeouts;
  if (t.tcp == 0 && t.tcpFin == 0 && t.udp == 0) return;
  auto current = kernel_.ipvs->timeouts();
  if (current && (t.tcp == 0 || t.tcp == current->tcp) &&
      (t.tcpFin == 0 || t.tcpFin == current->tcpFin) && (t.udp == 0 || t.udp == current->udp))
    return;
  print(fmt::format("ipvsadm --set {} {} {}", t.tcp, t.tcpFin, t.udp));
  count("set_timeouts");
  if (auto r = kernel_.ipvs->setTimeouts(t); !r)
    host_.warning(fmt::format("ipvs: setting the IPVS timeouts: {}", r.error().message()));
}

// ---------------------------------------------------------------------------------------
// Cleanup

sdk::Expected<void> IpvsBackend::cleanup() {
  lastWrites_ = 0;
  std::vector<IPPrefix> bound;
  bool linkExists = false;
  if (auto listed = kernel_.link->listAddresses(kDummyLinkName); listed)
    bound = std::move(*listed), linkExists = true;
  else if (listed.error().errnum != ENODEV)
    return failed("list_addresses", listed.error());
  auto state = kernel_.ipsets->save();
  if (!state) return failed("ipset_save", state.error());
  const auto nodePorts = nodePortsOf(*state);
  // Virtual servers on kube-ipvs0's addresses, on the NodePorts its sets name, and the ones
  // this process applied.
  auto servers = kernel_.ipvs->listVirtualServers();
  if (!servers) {
    // No IPVS in this kernel: no virtual servers to remove.
    if (servers.error().category != core::ErrorCategory::kNotFound)
      return failed("list_virtual_servers", servers.error());
  } else {
    for (const auto& vs : *servers) {
      if (vs.fwmark != 0) {
        if (ownsFwmark(vs.fwmark))
          if (auto r = deleteServer(vs); !r) return r;
        continue;
      }
      const bool onLink = std::find(bound.begin(), bound.end(), vs.address) != bound.end();
      const bool excluded = std::any_of(exclude_.begin(), exclude_.end(),
                                        [&](const IPPrefix& c) { return c.contains(vs.address); });
      if ((onLink || nodePorts.contains({vs.protocol, vs.port}) ||
           servers_.contains(vs.describe())) &&
          !excluded)
        if (auto r = deleteServer(vs); !r) return r;
    }
  }
  print(fmt::format("ip link del {}", kDummyLinkName));
  if (auto r = kernel_.link->deleteLink(kDummyLinkName); !r)
    return failed("delete_link", r.error());
  if (linkExists && !settings_.dryRun) host_.info(0, fmt::format("ipvs: removed interface {}", kDummyLinkName));
  // iptables before ipsets: a set that a rule refers to cannot be destroyed.
  for (sdk::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    std::string input;
    for (Table t : kIpvsTables) {
      auto out = kernel_.iptables->save(fam, iptablesTable(t));
      if (!out) return failed("iptables_save", out.error());
      auto parsed = backends::parseIptablesSave(*out);
      if (!parsed) return failed("iptables_save", parsed.error());
      for (const auto& table : parsed->tables)
        if (table.name == tableName(t))
          input += backends::planChainRemoval(table, [&](std::string_view c) {
                     return isOwnedChain(t, c);
                   }).input;
    }
    if (auto r = restoreIptables(fam, input); !r) return r;
  }
  std::string destroy, names;
  std::size_t destroyed = 0;
  for (sdk::Family fam : kFamilies)
    for (SetId id : allSets()) {
      const std::string name = setName(id, fam);
      if (!state->sets.contains(name)) continue;
      destroy += "destroy " + name + "\n";
      names += (names.empty() ? "" : ",") + name;
      ++destroyed;
    }
  if (auto r = restoreIpsets(destroy); !r) return r;
  if (destroyed > 0 && !settings_.dryRun)
    host_.info(0, fmt::format("ipvs: removed ipsets count={} names={}", destroyed, names));
  ports_.clear();
  servers_.clear();
  addresses_.clear();
  ipsetEntries_.clear();
  terminating_.clear();
  for (auto& text : iptablesApplied_) text.clear();
  for (auto& chains : globalApplied_) chains.clear();
  needFull_ = true;
  if (lastWrites_ > 0) host_.info(1, fmt::format("ipvs cleanup: {} kernel changes", lastWrites_));
  return {};
}

// ---------------------------------------------------------------------------------------
// Metrics

sdk::Expected<IpvsBackend::Metrics> IpvsBackend::registerMetrics(const sdk::Host& host) {
  Metrics m;
  auto ops = host.counter(
      "kproxy_ipvs_operations_total",
      "Kernel changes made by the IPVS backend (netlink messages, ipset and iptables restores)",
      {"op"});
  if (!ops) return std::unexpected(ops.error());
  m.operations = *ops;
  auto failures = host.counter("kproxy_ipvs_operation_failures_total",
                               "Kernel changes the kernel or the tool refused", {"op"});
  if (!failures) return std::unexpected(failures.error());
  m.failures = *failures;
  auto objects =
      host.gauge("kproxy_ipvs_objects", "IPVS mode's kernel objects after the last sync", {"kind"});
  if (!objects) return std::unexpected(objects.error());
  m.objects = *objects;
  return m;
}

void IpvsBackend::updateMetrics() const {
  if (!metrics_.objects.active()) return;
  std::size_t real = 0;
  for (const auto& [key, s] : servers_) real += s.real.size();
  metrics_.objects.set({"virtual_server"}, static_cast<double>(servers_.size()));
  metrics_.objects.set({"real_server"}, static_cast<double>(real));
  metrics_.objects.set({"terminating_real_server"}, static_cast<double>(terminating_.size()));
  metrics_.objects.set({"address"}, static_cast<double>(addresses_.size()));
  metrics_.objects.set({"ipset_entry"}, static_cast<double>(ipsetEntries_.size()));
}

}  // namespace kproxy::ipvs
