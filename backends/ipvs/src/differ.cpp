// The IPVS backend's differ: the rendered virtual and real servers, kube-ipvs0 addresses, ipset
// entries and iptables chains against the kernel read back (full syncs) or against the mirror
// of what was applied (partial syncs). IPVS has no transactions: each difference is written as
// it is found, through the backend's idempotent kernel writes.
#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kproxy/iptables/differ.h"
#include "kproxy/ipvs/backend.h"
#include "sync_rules.h"

namespace kproxy::ipvs {
namespace {

using net::Prefix;

/// The owned chains' rules of one family, by table and chain: fixed head, the service ports'
/// rules (in key order), fixed tail.
using OwnedChains = std::map<std::pair<Table, std::string>, std::vector<std::string>>;

OwnedChains ownedChainRules(const GlobalObjects& g, const std::map<std::string, Fragment>& ports,
                            net::Family family) {
  std::map<std::pair<Table, std::string>, std::vector<std::string>> portRules;
  for (const auto& [tag, f] : ports)
    if (f.family == family)
      for (const auto& r : f.rules) portRules[{r.table, r.chain}].push_back(r.spec);
  OwnedChains wanted;
  for (const auto& c : g.chains) {
    auto& rules = wanted[{c.table, c.name}];
    rules = c.head;
    if (auto it = portRules.find({c.table, c.name}); it != portRules.end())
      rules.insert(rules.end(), it->second.begin(), it->second.end());
    rules.insert(rules.end(), c.tail.begin(), c.tail.end());
  }
  return wanted;
}

/// The owned chains as the mirror keeps them: "TABLE CHAIN" lines, each followed by its rules.
std::string mirrorText(const OwnedChains& wanted) {
  std::string text;
  for (const auto& [chain, rules] : wanted) {
    text += fmt::format("{} {}\n", tableName(chain.first), chain.second);
    for (const auto& r : rules) text += r + "\n";
  }
  return text;
}

/// The lines of mirrorText() that belong to table `t`.
std::string tableSection(const std::string& all, Table t) {
  const std::string prefix = std::string(tableName(t)) + " ";
  std::string out;
  bool in = false;
  for (std::size_t pos = 0; pos < all.size();) {
    auto end = all.find('\n', pos);
    std::string_view line(all.data() + pos, end - pos);
    if (line.starts_with("nat ") || line.starts_with("filter ")) in = line.starts_with(prefix);
    if (in) out.append(line).push_back('\n');
    pos = end + 1;
  }
  return out;
}

/// Rewrites every owned chain of table `t` (declared, then their rules).
void rewriteTable(Table t, const OwnedChains& wanted, iptables::RestoreEdit& edit) {
  for (const auto& [chain, rules] : wanted)
    if (chain.first == t) edit.rewrite(t, chain.second, rules);
}

/// A full sync's iptables edit of one family: a table whose owned chains differ from the
/// kernel's is rewritten whole, and missing jumps from the built-in chains are inserted.
core::Result<void> diffWithKernel(iptables::KernelIptables& kernel, net::Family family, const OwnedChains& wanted,
                                  const std::vector<JumpRule>& jumps, iptables::RestoreEdit& edit) {
  for (Table t : kIpvsTables) {
    iptables::KernelChains saved;
    if (auto read = saved.read(kernel, family, t); !read) return read;
    const bool rewrite = std::any_of(wanted.begin(), wanted.end(), [&](const auto& chain) {
      return chain.first.first == t && saved.differs(t, chain.first.second, iptables::hashRules(chain.second));
    });
    if (rewrite) rewriteTable(t, wanted, edit);
    for (const auto& j : jumps)
      if (j.table == t && !saved.holds(j)) edit.insertJump(j);
  }
  return {};
}


/// A render as the mirror keeps it: its real servers are in the applied virtual servers, and a
/// later partial sync compares everything else.
Fragment withoutRealServers(Fragment f) {
  for (auto& planned : f.virtualServers) std::vector<PlannedRealServer>().swap(planned.realServers);
  return f;
}

}  // namespace

/// The NodePorts IPVS mode programmed, as its NodePort sets hold them ("30080" in a bitmap:port
/// set, "10.0.0.2,sctp:30080" in the SCTP ones): how a process that applied nothing yet (a
/// restart, --cleanup) knows which virtual servers on the node's addresses are its own.
std::set<std::pair<Protocol, std::uint16_t>> nodePortsOf(const IpsetState& state) {
  std::set<std::pair<Protocol, std::uint16_t>> out;
  const std::pair<SetId, Protocol> sets[] = {
      {SetId::kNodePortTCP, Protocol::kTcp},   {SetId::kNodePortLocalTCP, Protocol::kTcp},
      {SetId::kNodePortUDP, Protocol::kUdp},   {SetId::kNodePortLocalUDP, Protocol::kUdp},
      {SetId::kNodePortSCTP, Protocol::kSctp}, {SetId::kNodePortLocalSCTP, Protocol::kSctp}};
  for (net::Family fam : kFamilies)
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

bool IpvsBackend::ownsAddress(const net::Prefix& address) const {
  if (std::any_of(exclude_.begin(), exclude_.end(),
                  [&](const net::Prefix& c) { return c.contains(address); }))
    return false;
  const std::string text = address.toString();
  if (addresses_.contains(text)) return true;
  for (net::Family fam : kFamilies) {
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

// ---------------------------------------------------------------------------------------
// Full syncs

IpvsBackend::Wanted IpvsBackend::renderWanted(const plan::SnapshotSource& next) {
  Wanted wanted;
  next.forEach([&](const sdk::ServicePort& p) {
    if (!familyEnabled(p.family)) return;
    Fragment f = renderer_.renderServicePort(p);
    const std::string tag = tagOf(p.family, p.key);
    for (const auto& problem : f.problems)
      host_.warning(fmt::format("ipvs: {}: {}", p.key, problem));
    for (const auto& planned : f.virtualServers) {
      AppliedServer a{kernelVirtualServer(planned), realServersOf(planned), tag};
      const std::string key = a.vs.describe();
      if (!wanted.servers.emplace(key, std::move(a)).second)
        host_.warning(fmt::format(
            "ipvs: {}: virtual server {} is another service port's too; kept once", p.key, key));
    }
    for (const auto& a : f.boundAddresses) ++wanted.addresses[a];
    for (const auto& e : f.ipsetEntries) ++wanted.entries[e.text()];
    wanted.ports[tag] = withoutRealServers(std::move(f));
  });
  return wanted;
}

sdk::Expected<void> IpvsBackend::repairAll(const plan::SnapshotSource& next) {
  setSysctls();
  setTimeouts();
  if (auto r = ensureLink(); !r) return r;
  auto bound = kernel_.link->listAddresses(kDummyLinkName);
  if (!bound) return failed("list_addresses", bound.error());
  std::vector<std::string> boundText;
  for (const auto& a : *bound) boundText.push_back(a.toString());
  renderer_.setDummyInterfaceAddresses(boundText);
  dummyAddressesStale_ = false;

  Wanted wanted = renderWanted(next);
  // The sets as they were: their NodePorts say which virtual servers on node addresses are
  // kproxy's.
  auto state = kernel_.ipsets->save();
  if (!state) return failed("ipset_save", state.error());
  const NodePorts nodePorts = nodePortsOf(*state);
  // Make before serve: the set entries and the chains (masquerading, hairpin, the filter, and
  // the nat rules that switch conntrack on in the namespace) are in before a virtual server
  // answers through them, also on a first sync; the entries that go, after what served them.
  if (auto r = syncIpsets(wanted.entries, *state, true); !r) return r;
  ports_ = std::move(wanted.ports);
  if (auto r = syncIptables(true); !r) return r;
  if (auto r = syncVirtualServers(wanted.servers, *bound, nodePorts); !r) return r;
  if (auto r = syncDummyAddresses(wanted.addresses, boundText); !r) return r;
  if (auto r = syncIpsets(wanted.entries, *state, false); !r) return r;

  servers_ = std::move(wanted.servers);
  addresses_ = std::move(wanted.addresses);
  ipsetEntries_ = std::move(wanted.entries);
  // The renderer learns kube-ipvs0's addresses as they are now, here rather than in the next
  // partial sync (an endpoint change should not cost a pass over every address).
  std::vector<std::string> nowBound;
  nowBound.reserve(addresses_.size());
  for (const auto& [a, refs] : addresses_) nowBound.push_back(a);
  renderer_.setDummyInterfaceAddresses(std::move(nowBound));
  dummyAddressesStale_ = false;
  return {};
}

sdk::Expected<void> IpvsBackend::syncVirtualServers(const std::map<std::string, AppliedServer>& servers,
                                                    const std::vector<net::Prefix>& bound,
                                                    const NodePorts& nodePorts) {
  // Virtual and real servers: the kernel's against the wanted ones.
  auto listed = kernel_.ipvs->listVirtualServers();
  if (!listed) return failed("list_virtual_servers", listed.error());
  const auto wasBound = [&](const net::Prefix& a) {
    return std::find(bound.begin(), bound.end(), a) != bound.end();
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
                                         [&](const net::Prefix& c) { return c.contains(kvs.address); });
      if (owned && !excluded)
        if (auto r = deleteServer(kvs); !r) return r;
      continue;
    }
    seen.insert(key);
    if (auto r = syncRealServers(kvs, want->second); !r) return r;
  }
  for (const auto& [key, w] : servers)
    if (!seen.contains(key))
      if (auto r = applyServer(nullptr, w); !r) return r;
  // Draining real servers of virtual servers that are gone.
  std::erase_if(terminating_,
                [&](const auto& t) { return !servers.contains(t.second.vs.describe()); });
  return {};
}

sdk::Expected<void> IpvsBackend::syncRealServers(const VirtualServer& kvs, const AppliedServer& w) {
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
  return {};
}

sdk::Expected<void> IpvsBackend::syncDummyAddresses(const std::map<std::string, std::size_t>& addresses,
                                                    const std::vector<std::string>& bound) {
  // kube-ipvs0: every address on it is IPVS mode's (as upstream, which unbinds what no
  // service holds).
  for (const auto& [a, refs] : addresses) {
    const auto parsed = net::Prefix::parse(a);
    if (parsed && std::find(bound.begin(), bound.end(), parsed->toString()) == bound.end())
      if (auto r = bindAddress(a); !r) return r;
  }
  for (const auto& a : bound)
    if (!addresses.contains(a))
      if (auto r = unbindAddress(a); !r) return r;
  return {};
}

sdk::Expected<void> IpvsBackend::syncIpsets(const std::map<std::string, std::size_t>& entries,
                                            const IpsetState& state, bool adding) {
  std::string lines;
  for (net::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    for (const auto& def : renderer_.renderGlobal(fam).sets) {
      auto it = state.sets.find(def.name);
      if (it == state.sets.end()) {
        if (adding) lines += def.createText() + "\n";
        continue;
      }
      if (adding) continue;
      for (const auto& e : it->second.entries)
        if (!entries.contains("add " + def.name + " " + e)) lines += "del " + def.name + " " + e + "\n";
    }
  }
  if (!adding) return restoreIpsets(lines);
  for (const auto& [text, refs] : entries) {
    // "add SET ENTRY"
    const auto space = text.find(' ', 4);
    const std::string set = text.substr(4, space - 4);
    auto it = state.sets.find(set);
    if (it == state.sets.end() || !it->second.entries.contains(text.substr(space + 1))) lines += text + "\n";
  }
  return restoreIpsets(lines);
}

// ---------------------------------------------------------------------------------------
// Partial syncs

sdk::Expected<void> IpvsBackend::applyChanged(const plan::SnapshotSource& next,
                                              const std::vector<sdk::ChangedKey>& changed) {
  if (dummyAddressesStale_) {
    std::vector<std::string> bound;
    for (const auto& [a, refs] : addresses_) bound.push_back(a);
    renderer_.setDummyInterfaceAddresses(std::move(bound));
    dummyAddressesStale_ = false;
  }
  // Make before serve, stop serving before unmaking: the new set entries and chains (the
  // masquerading, hairpin and filter they carry) are in before a virtual server or an address
  // that needs them serves; the addresses and virtual servers that go are gone before their
  // set entries. In between, what serves is always complete.
  struct Change {
    std::string tag, key;
    Fragment now, before;
  };
  std::vector<Change> changes;
  // The virtual servers each changed port renders now, by tag (every changed port has one, if
  // empty): one that a changed port leaves may be taken over by the port that renders it now.
  std::map<std::string, std::set<std::string>> kept;
  std::string ipsetAdds, ipsetDels;
  bool rulesChanged = false;
  for (const auto& c : changed) {
    if (!familyEnabled(c.family) || c.key.empty()) continue;
    Change ch{tagOf(c.family, c.key), c.key, {}, {}};
    if (auto port = next.find(c.family, c.key)) {
      ch.now = renderer_.renderServicePort(*port);
      for (const auto& problem : ch.now.problems) host_.warning(fmt::format("ipvs: {}: {}", c.key, problem));
    }
    if (auto it = ports_.find(ch.tag); it != ports_.end()) ch.before = it->second;
    for (const auto& e : ch.now.ipsetEntries)
      if (ipsetEntries_[e.text()]++ == 0) ipsetAdds += e.text() + "\n";
    if (ch.now.rules != ch.before.rules) rulesChanged = true;
    std::set<std::string>& keeps = kept[ch.tag];
    for (const auto& planned : ch.now.virtualServers) keeps.insert(kernelVirtualServer(planned).describe());
    if (ch.now.key.empty())
      ports_.erase(ch.tag);
    else
      ports_[ch.tag] = withoutRealServers(ch.now);
    changes.push_back(std::move(ch));
  }
  if (auto r = restoreIpsets(ipsetAdds); !r) return r;
  if (auto r = syncIptables(false, rulesChanged); !r) return r;

  // Serve: virtual servers and their real servers, then the addresses that make them answer.
  for (const auto& ch : changes) {
    for (const auto& planned : ch.now.virtualServers) {
      AppliedServer want{kernelVirtualServer(planned), realServersOf(planned), ch.tag};
      const std::string key = want.vs.describe();
      auto it = servers_.find(key);
      if (it != servers_.end() && it->second.owner != ch.tag) {
        const auto owner = kept.find(it->second.owner);
        if (owner == kept.end() || owner->second.contains(key)) {
          host_.warning(fmt::format("ipvs: {}: virtual server {} is {}'s too; kept once", ch.key, key,
                                    it->second.owner));
          continue;
        }
        // Its owner leaves it in this very sync: this port takes it over as it is.
      }
      if (auto r = applyServer(it == servers_.end() ? nullptr : &it->second, want); !r) return r;
      servers_[key] = std::move(want);
    }
    for (const auto& a : ch.now.boundAddresses)
      if (addresses_[a]++ == 0)
        if (auto r = bindAddress(a); !r) return r;
  }

  // Stop serving: the addresses first, then the virtual servers, then their set entries.
  for (const auto& ch : changes) {
    for (const auto& a : ch.before.boundAddresses) {
      auto it = addresses_.find(a);
      if (it == addresses_.end() || --it->second > 0) continue;
      addresses_.erase(it);
      if (auto r = unbindAddress(a); !r) return r;
    }
  }
  for (const auto& ch : changes) {
    for (const auto& planned : ch.before.virtualServers) {
      const std::string key = kernelVirtualServer(planned).describe();
      if (kept.at(ch.tag).contains(key)) continue;
      auto it = servers_.find(key);
      if (it == servers_.end() || it->second.owner != ch.tag) continue;
      if (auto r = removeServer(it->second); !r) return r;
      servers_.erase(it);
    }
    for (const auto& e : ch.before.ipsetEntries) {
      auto it = ipsetEntries_.find(e.text());
      if (it == ipsetEntries_.end() || --it->second > 0) continue;
      ipsetEntries_.erase(it);
      ipsetDels += "del " + e.set + " " + e.entry + "\n";
    }
  }
  return restoreIpsets(ipsetDels);
}

// ---------------------------------------------------------------------------------------
// iptables

sdk::Expected<void> IpvsBackend::syncIptables(bool readKernel, bool portRulesChanged) {
  for (net::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    const GlobalObjects g = renderer_.renderGlobal(fam);
    if (!readKernel && !portRulesChanged && g.chains == globalApplied_[index(fam)]) continue;
    const OwnedChains wanted = ownedChainRules(g, ports_, fam);
    std::string text = mirrorText(wanted);
    if (!readKernel && text == iptablesApplied_[index(fam)]) continue;

    iptables::RestoreEdit edit;
    if (readKernel) {
      if (auto r = diffWithKernel(*kernel_.iptables, fam, wanted, g.jumps, edit); !r)
        return failed("iptables_save", r.error());
    } else {
      // A partial sync rewrites a table only when its chains changed.
      for (Table t : kIpvsTables)
        if (tableSection(text, t) != tableSection(iptablesApplied_[index(fam)], t)) rewriteTable(t, wanted, edit);
    }
    if (auto r = restoreIptables(fam, edit.text(kIpvsTables)); !r) return r;
    iptablesApplied_[index(fam)] = std::move(text);
    globalApplied_[index(fam)] = g.chains;
  }
  return {};
}

}  // namespace kproxy::ipvs
