// The IPVS backend around its differ: its passes (full or partial, graceful termination),
// the kernel writes (counted, idempotent), sysctls, cleanup and metrics.
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

#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/plan/options.h"
#include "sync_rules.h"

namespace kproxy::ipvs {
namespace {

using net::Prefix;

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

}  // namespace

VirtualServer kernelVirtualServer(const PlannedVirtualServer& p) {
  VirtualServer vs;
  vs.family = p.family == net::Family::kIPv6 ? net::Family::kIPv6 : net::Family::kIPv4;
  vs.protocol = p.protocol == sdk::Protocol::kUDP    ? Protocol::kUdp
                : p.protocol == sdk::Protocol::kSCTP ? Protocol::kSctp
                                                     : Protocol::kTcp;
  if (p.fwmark != 0) {
    vs.fwmark = p.fwmark;  // no address or port: the kernel keys it by the mark alone
  } else {
    if (auto a = net::Prefix::parse(p.address)) vs.address = *a;
    vs.port = p.port;
  }
  vs.scheduler = p.scheduler;
  vs.flags =
      (p.persistent ? kFlagPersistent : 0u) | (p.sourceHashFallback ? kFlagSourceHashFallback : 0u);
  vs.timeout = p.persistent ? p.timeoutSeconds : 0;
  return vs;
}

RealServer kernelRealServer(const PlannedRealServer& p) {
  RealServer rs;
  if (auto a = net::Prefix::parse(p.address)) rs.address = *a;
  rs.port = p.port;
  rs.weight = static_cast<std::int32_t>(p.weight);
  return rs;
}

std::string ipAddrCommand(std::string_view verb, const std::string& link, const net::Prefix& address) {
  return fmt::format("ip addr {} {}/{} dev {}", verb, address.addressText(), net::bitsOf(address.family), link);
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
          ? fmt::format("ipvsadm -{} -f {}{}", op, vs.fwmark, vs.family == net::Family::kIPv6 ? " -6" : "")
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
  return std::tie(a.address.family, a.address.bytes, a.address.length, a.port) <
         std::tie(b.address.family, b.address.bytes, b.address.length, b.port);
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
    : Reconciler(host, backends::kernelReconcilerOptions("ipvs", settings.dryRun, settings.dryRunOutput)),
      host_(host),
      settings_(std::move(settings)),
      renderer_(settings_.render),
      kernel_(std::move(adapters)) {
  for (const auto& c : settings_.excludeCIDRs)
    if (auto p = net::Prefix::parse(c)) exclude_.push_back(*p);
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

void IpvsBackend::noteWrite(std::string text) {
  if (firstWrites_.size() < 3) firstWrites_.push_back(std::move(text));
}

sdk::Expected<void> IpvsBackend::failed(std::string_view op, const core::Error& error) {
  requireFullSync();  // the next sync reads the kernel back (a failed pass's already is full)
  if (metrics_.failures.active()) metrics_.failures.add({std::string(op)}, 1);
  return sdk::fail(categoryOf(error), "ipvs: " + error.message(), error.errnum);
}

sdk::Expected<void> IpvsBackend::addServer(const VirtualServer& vs) {
  noteWrite(ipvsadmCommand('A', vs));
  count("add_virtual_server");
  auto r = kernel_.ipvs->addVirtualServer(vs);
  if (!r && r.error().errnum == EEXIST) return updateServer(vs);
  if (!r) return failed("add_virtual_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::updateServer(const VirtualServer& vs) {
  noteWrite(ipvsadmCommand('E', vs));
  count("update_virtual_server");
  if (auto r = kernel_.ipvs->updateVirtualServer(vs); !r)
    return failed("update_virtual_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::deleteServer(const VirtualServer& vs) {
  noteWrite(ipvsadmCommand('D', vs));
  count("delete_virtual_server");
  auto r = kernel_.ipvs->deleteVirtualServer(vs);
  if (!r && r.error().errnum != ESRCH) return failed("delete_virtual_server", r.error());
  const std::string prefix = vs.describe() + "/";
  std::erase_if(terminating_, [&](const auto& t) { return t.first.starts_with(prefix); });
  return {};
}

sdk::Expected<void> IpvsBackend::addReal(const VirtualServer& vs, const RealServer& rs) {
  noteWrite(ipvsadmCommand('a', vs, &rs));
  count("add_real_server");
  terminating_.erase(terminatingKey(vs, rs));
  auto r = kernel_.ipvs->addRealServer(vs, rs);
  if (!r && r.error().errnum == EEXIST) return updateReal(vs, rs);
  if (!r) return failed("add_real_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::updateReal(const VirtualServer& vs, const RealServer& rs) {
  noteWrite(ipvsadmCommand('e', vs, &rs));
  count("update_real_server");
  if (auto r = kernel_.ipvs->updateRealServer(vs, rs); !r)
    return failed("update_real_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::deleteReal(const VirtualServer& vs, const RealServer& rs) {
  noteWrite(ipvsadmCommand('d', vs, &rs));
  count("delete_real_server");
  terminating_.erase(terminatingKey(vs, rs));
  auto r = kernel_.ipvs->deleteRealServer(vs, rs);
  if (!r && r.error().errnum != ENOENT && r.error().errnum != ESRCH)
    return failed("delete_real_server", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::bindAddress(const std::string& address) {
  auto a = net::Prefix::parse(address);
  if (!a) return {};
  noteWrite(ipAddrCommand("add", kDummyLinkName, *a));
  count("add_address");
  auto r = kernel_.link->addAddress(kDummyLinkName, *a);
  dummyAddressesStale_ = true;
  if (!r && r.error().errnum != EEXIST) return failed("add_address", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::unbindAddress(const std::string& address) {
  auto a = net::Prefix::parse(address);
  if (!a) return {};
  noteWrite(ipAddrCommand("del", kDummyLinkName, *a));
  count("delete_address");
  auto r = kernel_.link->deleteAddress(kDummyLinkName, *a);
  dummyAddressesStale_ = true;
  if (!r && r.error().errnum != EADDRNOTAVAIL) return failed("delete_address", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::restoreIpsets(const std::string& input) {
  if (input.empty()) return {};
  noteWrite("# ipset restore -exist\n" + input);
  count("ipset_restore");
  if (auto r = kernel_.ipsets->restore(input); !r) return failed("ipset_restore", r.error());
  return {};
}

sdk::Expected<void> IpvsBackend::restoreIptables(net::Family family, const std::string& input) {
  if (input.empty()) return {};
  noteWrite(fmt::format("# {}-restore --noflush\n{}", toolName(family), input));
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
    noteWrite(fmt::format("ip link add {} type dummy", kDummyLinkName));
    count("add_link");
  }
  return {};
}

// ---------------------------------------------------------------------------------------
// Sync

sdk::Expected<backends::PassOutcome> IpvsBackend::pass(const plan::SnapshotSource& next,
                                                       const std::vector<sdk::ChangedKey>& changed, bool full) {
  lastWrites_ = 0;
  firstWrites_.clear();
  renderer_.setNode(next.node());
  renderer_.setServiceCIDRs(next.serviceCIDRs());
  auto r = full ? repairAll(next) : applyChanged(next, changed);
  if (!r) return std::unexpected(r.error());
  if (auto d = drainTerminating(); !d) return std::unexpected(d.error());
  updateMetrics();
  backends::PassOutcome outcome;
  outcome.operations = lastWrites_;
  outcome.detail = fmt::format("virtual_servers={} draining={}", servers_.size(), terminating_.size());
  // A full pass that still wrote: the kernel differed from the plan (a self-verification, or a
  // first sync). Name the first writes, in ipvsadm notation.
  if (full && lastWrites_ > 0 && !firstWrites_.empty())
    outcome.detail += fmt::format(" first writes: {}", fmt::join(firstWrites_, "; "));
  return outcome;
}

sdk::Expected<void> IpvsBackend::retireRealServer(const VirtualServer& vs, const RealServer& rs) {
  if (!drains(vs)) return deleteReal(vs, rs);
  const std::string key = terminatingKey(vs, rs);
  if (terminating_.contains(key)) return {};
  RealServer quiet = rs;
  quiet.weight = 0;
  noteWrite(ipvsadmCommand('e', vs, &quiet));
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

void IpvsBackend::setSysctls() {
  auto ensure = [&](const char* name, int value) {
    if (auto v = kernel_.sysctls->readInt(name); v && *v == value) return;
    if (auto w = kernel_.sysctls->writeInt(name, value); !w)
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
  noteWrite(fmt::format("ipvsadm --set {} {} {}", t.tcp, t.tcpFin, t.udp));
  count("set_timeouts");
  if (auto r = kernel_.ipvs->setTimeouts(t); !r)
    host_.warning(fmt::format("ipvs: setting the IPVS timeouts: {}", r.error().message()));
}

// ---------------------------------------------------------------------------------------
// Cleanup

sdk::Expected<void> IpvsBackend::cleanup() {
  lastWrites_ = 0;
  std::vector<net::Prefix> bound;
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
                                        [&](const net::Prefix& c) { return c.contains(vs.address); });
      if ((onLink || nodePorts.contains({vs.protocol, vs.port}) ||
           servers_.contains(vs.describe())) &&
          !excluded)
        if (auto r = deleteServer(vs); !r) return r;
    }
  }
  noteWrite(fmt::format("ip link del {}", kDummyLinkName));
  if (auto r = kernel_.link->deleteLink(kDummyLinkName); !r)
    return failed("delete_link", r.error());
  if (linkExists) host_.info(0, fmt::format("ipvs: removed interface {}", kDummyLinkName));
  // iptables before ipsets: a set that a rule refers to cannot be destroyed.
  for (net::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    std::string input;
    for (Table t : kIpvsTables) {
      auto out = kernel_.iptables->save(fam, t);
      if (!out) return failed("iptables_save", out.error());
      auto parsed = backends::parseIptablesSave(*out);
      if (!parsed) return failed("iptables_save", parsed.error());
      for (const auto& table : parsed->tables)
        if (table.name == tableName(t))
          input += backends::planChainRemoval(table, [&](std::string_view c) {
                     return ipvs::isOwnedChain(t, c);
                   }).input;
    }
    if (auto r = restoreIptables(fam, input); !r) return r;
  }
  std::string destroy, names;
  std::size_t destroyed = 0;
  for (net::Family fam : kFamilies)
    for (SetId id : allSets()) {
      const std::string name = setName(id, fam);
      if (!state->sets.contains(name)) continue;
      destroy += "destroy " + name + "\n";
      names += (names.empty() ? "" : ",") + name;
      ++destroyed;
    }
  if (auto r = restoreIpsets(destroy); !r) return r;
  if (destroyed > 0)
    host_.info(0, fmt::format("ipvs: removed ipsets count={} names={}", destroyed, names));
  ports_.clear();
  servers_.clear();
  addresses_.clear();
  ipsetEntries_.clear();
  terminating_.clear();
  for (auto& text : iptablesApplied_) text.clear();
  for (auto& chains : globalApplied_) chains.clear();
  requireFullSync();
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
