#pragma once
// Shared by the iptables backend's unit and kernel tests: a broad fixture of service ports (every
// feature the renderer has, IPv4 and IPv6), a sysctl directory that is not the host's, a kernel
// adapter that several backends share (a restart over the same kernel), and the owned chains
// of an iptables-save or restore text.

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "../nftables/service_ports.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/iptables/kernel.h"
#include "kproxy/iptables/renderer.h"
#include "kproxy/plan/snapshot_source.h"

namespace kproxy::iptables::testing {

using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::nftables::testing::setEndpoints;

/// A temporary /proc/sys look-alike holding net/ipv4/conf/all/route_localnet = 0, so a full
/// sync's sysctl write never reaches the host.
class TempSysctls {
 public:
  TempSysctls() {
    char pattern[] = "/tmp/kproxy-iptables-sysctl-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = made;
    std::filesystem::create_directories(root_ / "net/ipv4/conf/all");
    std::ofstream(root_ / "net/ipv4/conf/all/route_localnet") << "0\n";
  }
  ~TempSysctls() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  TempSysctls(const TempSysctls&) = delete;
  TempSysctls& operator=(const TempSysctls&) = delete;
  std::string root() const { return root_.string(); }
  std::string routeLocalnet() const {
    std::ifstream in(root_ / "net/ipv4/conf/all/route_localnet");
    std::string v;
    in >> v;
    return v;
  }

 private:
  std::filesystem::path root_;
};

/// Forwards to a kernel the test keeps, so that a second backend (a restart) meets the same one.
class SharedKernel final : public KernelIptables {
 public:
  explicit SharedKernel(KernelIptables& inner) : inner_(inner) {}
  core::Result<std::string> save(net::Family family, Table table) override { return inner_.save(family, table); }
  core::Result<void> restore(net::Family family, std::string_view input) override {
    return inner_.restore(family, input);
  }
  core::Result<bool> chainExists(net::Family family, Table table, std::string_view chain) override {
    return inner_.chainExists(family, table, chain);
  }
  std::string describe() const override { return inner_.describe(); }
  std::size_t restoreChunkRules() const override { return inner_.restoreChunkRules(); }
  bool replacesWholeTables() const override { return inner_.replacesWholeTables(); }

 private:
  KernelIptables& inner_;
};

/// (table, chain) → rules of every chain in an iptables-save (or full restore) text; with
/// `ownedOnly`, kproxy's chains only.
using ChainMap = std::map<std::pair<std::string, std::string>, std::vector<std::string>>;
inline ChainMap chainsOf(std::string_view text, bool ownedOnly) {
  ChainMap out;
  auto parsed = backends::parseIptablesSave(text);
  if (!parsed) throw std::runtime_error("unparsable save text: " + parsed.error().message());
  for (const auto& table : parsed->tables) {
    Table t = Table::kFilter;
    for (Table candidate : kTables)
      if (tableName(candidate) == table.name) t = candidate;
    for (const auto& c : table.chains) {
      if (ownedOnly && (c.builtin() || !isOwnedChain(t, c.name))) continue;
      auto& rules = out[{table.name, c.name}];
      for (const auto& r : c.rules) rules.push_back(r.spec);
    }
  }
  return out;
}

/// The lines of `text` that start with `prefix`.
inline std::size_t countLines(std::string_view text, std::string_view prefix = {}) {
  std::size_t n = 0, start = 0;
  while (start < text.size()) {
    auto nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    if (text.substr(start, nl - start).starts_with(prefix)) ++n;
    start = nl + 1;
  }
  return n;
}

inline bool isDispatchChain(const std::string& table, const std::string& chain) {
  for (const auto& [t, name] : dispatchChainNames())
    if (tableName(t) == table && name == chain) return true;
  return false;
}

/// A dispatch rule's section, told from its text (the fixed tail rules and the per-ClusterIP
/// reject have comments of their own).
inline int sectionOf(const std::string& rule) {
  if (rule.find("kubernetes service nodeports") != std::string::npos ||
      rule.find("unallocated ClusterIPs") != std::string::npos ||
      rule.find("block incoming localnet") != std::string::npos)
    return 2;
  if (rule.find("ClusterIP without a service on this port") != std::string::npos) return 1;
  return 0;
}

/// Dispatch chains in a canonical order (by section, then text): the order among a section's
/// rules does not matter. Fails when a chain's sections are out of order.
inline ChainMap canonical(ChainMap chains) {
  for (auto& [key, rules] : chains) {
    if (!isDispatchChain(key.first, key.second)) continue;
    INFO(key.first << " " << key.second);
    CHECK(std::is_sorted(rules.begin(), rules.end(),
                         [](const std::string& a, const std::string& b) { return sectionOf(a) < sectionOf(b); }));
    std::sort(rules.begin(), rules.end(), [](const std::string& a, const std::string& b) {
      return std::pair(sectionOf(a), a) < std::pair(sectionOf(b), b);
    });
  }
  return chains;
}

/// What differs between two chain maps, chain by chain (empty when equal).
inline std::string chainDiff(const ChainMap& actual, const ChainMap& expected) {
  std::string out;
  auto dump = [&](const char* what, const std::pair<std::string, std::string>& key, const std::vector<std::string>& rules) {
    out += std::string(what) + " " + key.first + " " + key.second + ":\n";
    for (const auto& r : rules) out += "    " + r + "\n";
  };
  for (const auto& [key, rules] : expected) {
    auto it = actual.find(key);
    if (it == actual.end()) {
      dump("missing", key, rules);
    } else if (it->second != rules) {
      dump("wanted", key, rules);
      dump("found", key, it->second);
    }
  }
  for (const auto& [key, rules] : actual)
    if (!expected.contains(key)) dump("unwanted", key, rules);
  return out;
}

inline RenderConfig featureConfig() {
  RenderConfig cfg;
  cfg.common.clusterCIDRs = {"10.0.0.0/8", "fd00:10::/64"};
  cfg.common.nodeIPs = {"192.168.50.10", "fd00:50::10"};
  return cfg;
}

inline sdk::NodeInfo featureNode() {
  sdk::NodeInfo node;
  node.name = "node-a";
  node.addresses = {"192.168.50.10", "fd00:50::10"};
  return node;
}

/// Every feature of the renderer, in family `v6 ? IPv6 : IPv4`: a plain ClusterIP with three
/// endpoints, session affinity, a UDP NodePort with eTP=Local and a health check node port,
/// an SCTP LoadBalancer with source ranges (one holding the node) and external IPs, iTP=Local
/// with and without local endpoints, eTP=Local without local endpoints (drop), a service
/// without endpoints (reject, internal and external), and a multi-port service sharing one
/// ClusterIP.
inline std::vector<sdk::ServicePort> featureServices(bool v6) {
  auto a = [v6](int i) { return v6 ? "fd00:30::" + std::to_string(i) : "172.30.0." + std::to_string(i); };
  auto ep = [v6](int i) { return v6 ? "fd00:10::" + std::to_string(i) : "10.1.0." + std::to_string(i); };
  auto ext = [v6](int i) { return v6 ? "2001:db8::" + std::to_string(i) : "198.51.100." + std::to_string(i); };
  const std::string ns = v6 ? "six" : "four";
  std::vector<sdk::ServicePort> out;

  out.push_back(clusterIP(ns, "web", a(10), 80, {endpoint(ep(1), 8080), endpoint(ep(2), 8080), endpoint(ep(3), 8080)}));

  auto sticky = clusterIP(ns, "sticky", a(11), 80, {endpoint(ep(4), 8080), endpoint(ep(5), 8080)});
  sticky.sessionAffinityClientIP = true;
  sticky.stickyMaxAgeSeconds = 600;
  out.push_back(sticky);

  auto np = clusterIP(ns, "np", a(12), 53, {endpoint(ep(6), 53, true), endpoint(ep(7), 53)}, sdk::Protocol::kUDP);
  np.type = sdk::ServiceType::kNodePort;
  np.nodePort = 30053;
  np.externalPolicyLocal = true;
  np.healthCheckNodePort = 31053;
  np.sessionAffinityClientIP = true;
  np.stickyMaxAgeSeconds = 300;
  out.push_back(np);

  auto lb = clusterIP(ns, "lb", a(13), 443, {endpoint(ep(8), 8443), endpoint(ep(9), 8443)}, sdk::Protocol::kSCTP);
  lb.type = sdk::ServiceType::kLoadBalancer;
  lb.nodePort = 30443;
  lb.loadBalancerIPs = {ext(7)};
  lb.loadBalancerSourceRanges = v6 ? std::vector<std::string>{"2001:db8:1::/48", "fd00:50::/64"}
                                   : std::vector<std::string>{"203.0.113.0/24", "192.168.50.0/24"};
  lb.externalIPs = {ext(8)};
  out.push_back(lb);

  auto itp = clusterIP(ns, "itp", a(14), 80, {endpoint(ep(10), 80, true), endpoint(ep(11), 80)});
  itp.internalPolicyLocal = true;
  out.push_back(itp);

  auto itpNone = clusterIP(ns, "itp-none", a(15), 80, {endpoint(ep(12), 80)});
  itpNone.internalPolicyLocal = true;
  out.push_back(itpNone);

  auto etpNone = clusterIP(ns, "etp-none", a(16), 80, {endpoint(ep(13), 80)});
  etpNone.type = sdk::ServiceType::kLoadBalancer;
  etpNone.nodePort = 30080;
  etpNone.externalPolicyLocal = true;
  etpNone.healthCheckNodePort = 31080;
  etpNone.loadBalancerIPs = {ext(9)};
  etpNone.externalIPs = {ext(10)};
  out.push_back(etpNone);

  auto empty = clusterIP(ns, "empty", a(17), 80, {});
  empty.type = sdk::ServiceType::kNodePort;
  empty.nodePort = 30081;
  empty.externalIPs = {ext(11)};
  out.push_back(empty);

  for (auto [port, name] : {std::pair{80, "http"}, std::pair{443, "https"}})
    out.push_back(clusterIP(ns, "multi", a(18), port, {endpoint(ep(14), port + 8000)}, sdk::Protocol::kTCP, name));

  auto extCluster = clusterIP(ns, "ext", a(19), 8080, {endpoint(ep(15), 8080)});
  extCluster.externalIPs = {ext(12)};
  out.push_back(extCluster);
  return out;
}

/// One random change to `ports` (endpoints, a new or removed port, a policy, affinity, type or
/// address change), with the key it touched added to `changed`. `serial` names new things.
inline void mutate(std::vector<sdk::ServicePort>& ports, std::mt19937& rng, std::vector<sdk::ChangedKey>& changed,
                   int& serial) {
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  auto chance = [&](int percent) { return std::uniform_int_distribution<int>(0, 99)(rng) < percent; };
  ++serial;
  const int what = static_cast<int>(pick(ports.empty() ? 1 : 9));
  if (ports.empty() || what == 0) {  // a new port
    const bool v6 = chance(40);
    const std::string addr = v6 ? "fd00:30::1:" + std::to_string(serial) : "172.30.1." + std::to_string(serial % 250);
    std::vector<sdk::Endpoint> eps;
    for (std::size_t i = 0, n = pick(4); i < n; ++i)
      eps.push_back(endpoint(v6 ? "fd00:10::2:" + std::to_string(serial * 4 + static_cast<int>(i))
                                : "10.2." + std::to_string(serial % 250) + "." + std::to_string(i + 1),
                             8000 + static_cast<int>(i), chance(50)));
    auto p = clusterIP("rand", "svc-" + std::to_string(serial), addr, 80 + static_cast<int>(pick(3)), std::move(eps),
                       chance(70) ? sdk::Protocol::kTCP : sdk::Protocol::kUDP);
    if (chance(50)) {
      p.type = sdk::ServiceType::kNodePort;
      p.nodePort = 30000 + serial;
    }
    changed.push_back({p.family, p.key});
    ports.push_back(std::move(p));
    return;
  }
  const std::size_t i = pick(ports.size());
  auto& p = ports[i];
  changed.push_back({p.family, p.key});
  const bool v6 = p.family == net::Family::kIPv6;
  switch (what) {
    case 1:  // removed
      ports.erase(ports.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    case 2:
    case 3: {  // endpoints: keep some, add some, flip locality
      std::vector<sdk::Endpoint> eps;
      for (auto e : p.allEndpoints)
        if (chance(70)) {
          if (chance(20)) e.isLocal = !e.isLocal;
          eps.push_back(e);
        }
      for (std::size_t n = pick(3); n > 0; --n)
        eps.push_back(endpoint(v6 ? "fd00:10::3:" + std::to_string(serial * 3 + static_cast<int>(n))
                                  : "10.3." + std::to_string(serial % 250) + "." + std::to_string(n),
                               9000, chance(50)));
      setEndpoints(p, std::move(eps));
      return;
    }
    case 4:
      p.externalPolicyLocal = !p.externalPolicyLocal;
      p.healthCheckNodePort = p.externalPolicyLocal && p.nodePort != 0 ? p.nodePort + 1000 : 0;
      return;
    case 5: p.internalPolicyLocal = !p.internalPolicyLocal; return;
    case 6:
      p.sessionAffinityClientIP = !p.sessionAffinityClientIP;
      p.stickyMaxAgeSeconds = p.sessionAffinityClientIP ? 100 + serial : 0;
      return;
    case 7:  // NodePort / LoadBalancer on and off
      if (p.type == sdk::ServiceType::kClusterIP) {
        p.type = sdk::ServiceType::kLoadBalancer;
        p.nodePort = 31000 + serial;
        p.loadBalancerIPs = {v6 ? "2001:db8::9:" + std::to_string(serial) : "198.51.101." + std::to_string(serial % 250)};
        if (chance(50)) p.loadBalancerSourceRanges = {v6 ? "2001:db8:2::/48" : "203.0.114.0/24"};
      } else {
        p.type = sdk::ServiceType::kClusterIP;
        p.nodePort = 0;
        p.healthCheckNodePort = 0;
        p.loadBalancerIPs.clear();
        p.loadBalancerSourceRanges.clear();
      }
      return;
    default:  // the ClusterIP or the port moves
      if (chance(50))
        p.clusterIP = v6 ? "fd00:30::4:" + std::to_string(serial) : "172.30.4." + std::to_string(serial % 250);
      else
        p.port += 1;
      return;
  }
}

/// `snap` with its lookup index rebuilt: VectorSnapshot indexes its ports on the first find and
/// rebuilds only when their number changes, so a step that removes one port and adds another
/// would look the new one up in a stale index.
inline void reindex(plan::VectorSnapshot& snap) {
  plan::VectorSnapshot fresh(snap.ports(), snap.node());
  fresh.setServiceCIDRs(snap.serviceCIDRs());
  snap = std::move(fresh);
}

/// Both families' features.
inline std::vector<sdk::ServicePort> allFeatureServices() {
  auto out = featureServices(false);
  for (auto& p : featureServices(true)) out.push_back(std::move(p));
  return out;
}

}  // namespace kproxy::iptables::testing
