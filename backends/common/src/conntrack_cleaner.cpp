#include "kproxy/backends/common/conntrack_cleaner.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace kproxy::backends {
namespace {

net::Family toCore(net::Family f) {
  return f == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6;
}

core::Protocol toCore(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kTCP: return core::Protocol::kTCP;
    case sdk::Protocol::kUDP: return core::Protocol::kUDP;
    case sdk::Protocol::kSCTP: return core::Protocol::kSCTP;
  }
  return core::Protocol::kUDP;
}

/// The kernel reports addresses in inet_ntop form; API objects may spell IPv6 differently
/// ("2001:db8:0::1"), so both sides are compared in that form.
std::string canonicalIP(const std::string& ip) {
  in6_addr addr{};
  char buf[INET6_ADDRSTRLEN] = {};
  int af = ip.find(':') == std::string::npos ? AF_INET : AF_INET6;
  if (inet_pton(af, ip.c_str(), &addr) != 1) return ip;
  if (inet_ntop(af, &addr, buf, sizeof buf) == nullptr) return ip;
  return buf;
}

using EndpointIPs = std::set<std::string>;

/// Upstream's serviceIPEndpointIPs and serviceNodePortEndpointIPs, for one family, keyed by
/// protocol as well so that one pass serves every cleaned protocol.
struct ServingIndex {
  std::map<std::tuple<core::Protocol, std::string, std::uint16_t>, EndpointIPs> byServiceIP;
  std::map<std::pair<core::Protocol, std::uint16_t>, EndpointIPs> byNodePort;
  std::set<core::Protocol> protocols;  ///< protocols with at least one entry
  bool empty() const { return protocols.empty(); }
};

/// `family`: only its ports (nullopt: every port, all of one family). `deleted`: the ports a
/// sync removed (upstream's DeletedServices); their addresses and NodePorts count as serving
/// nothing, unless a port that remains uses them too.
ServingIndex indexServing(std::span<const sdk::ServicePort> ports, std::span<const sdk::ServicePort> deleted,
                          const ConntrackCleaner& cleaner, std::optional<net::Family> family = std::nullopt) {
  ServingIndex index;
  auto addPort = [&](const sdk::ServicePort& port, bool remains) {
    if (!cleaner.cleans(port.protocol) || (family && port.family != *family)) return;
    EndpointIPs serving;
    // Every serving endpoint, whatever the traffic policy, topology or termination: existing
    // flows keep going to an endpoint that still serves, as for TCP. A port with none (scaled to
    // zero) is indexed with the empty set: each of its flows goes to a gone or non-serving pod,
    // and a one-way sender that keeps one alive would otherwise be blackholed until the service
    // has an endpoint again (upstream's fix of that regression, kubernetes#139629).
    if (remains)
      for (const auto& ep : port.allEndpoints)
        if (ep.serving) serving.insert(canonicalIP(ep.ip));
    auto proto = toCore(port.protocol);
    auto servicePort = static_cast<std::uint16_t>(port.port);
    auto add = [&](auto& map, auto key) {
      // Two service ports behind one address and port (a shared VIP) both count; a removed
      // port's frontend never narrows one that a remaining port still serves.
      if (remains)
        map[key].insert(serving.begin(), serving.end());
      else
        map.try_emplace(key);
    };
    auto addIP = [&](const std::string& ip) {
      if (!ip.empty()) add(index.byServiceIP, std::tuple{proto, canonicalIP(ip), servicePort});
    };
    addIP(port.clusterIP);
    for (const auto& ip : port.loadBalancerIPs) addIP(ip);
    for (const auto& ip : port.externalIPs) addIP(ip);
    if (port.nodePort != 0) add(index.byNodePort, std::pair{proto, static_cast<std::uint16_t>(port.nodePort)});
    index.protocols.insert(proto);
  };
  for (const auto& port : ports) addPort(port, true);
  for (const auto& port : deleted) addPort(port, false);
  return index;
}

std::vector<kernel::ConntrackFlow> staleIn(std::span<const kernel::ConntrackFlow> flows, const ServingIndex& index) {
  std::vector<kernel::ConntrackFlow> stale;
  for (const auto& flow : flows) {
    if (!index.protocols.contains(flow.protocol)) continue;
    const std::string& replySource = flow.reply.srcIP;
    bool isStale = false;
    // (1) Sent to a service address and port, answered by something that is not serving it.
    if (auto it = index.byServiceIP.find({flow.protocol, flow.original.dstIP, flow.original.dstPort});
        it != index.byServiceIP.end() && !it->second.contains(replySource))
      isStale = true;
    // (2) Sent to a NodePort (on any address), answered by something that is not serving it.
    if (auto it = index.byNodePort.find({flow.protocol, flow.original.dstPort});
        it != index.byNodePort.end() && !it->second.contains(replySource))
      isStale = true;
    if (isStale) stale.push_back(flow);
  }
  return stale;
}

}  // namespace

ConntrackCleaner::ConntrackCleaner(kernel::ConntrackTable& table, ConntrackCleanupOptions options)
    : table_(table), options_(std::move(options)) {}

bool ConntrackCleaner::cleans(sdk::Protocol protocol) const {
  return std::find(options_.protocols.begin(), options_.protocols.end(), protocol) !=
         options_.protocols.end();
}

std::vector<kernel::ConntrackFlow> ConntrackCleaner::staleFlows(std::span<const kernel::ConntrackFlow> flows,
                                                        std::span<const sdk::ServicePort> ports) const {
  return staleIn(flows, indexServing(ports, {}, *this));
}

core::Result<ConntrackCleanupReport> ConntrackCleaner::reconcile(std::span<const sdk::ServicePort> ports,
                                                                 const FamilySet& families,
                                                                 std::span<const sdk::ServicePort> deleted) {
  ConntrackCleanupReport report;
  report.ran = true;
  for (net::Family family : families) {
    // Each family on its own, as upstream's per-family proxiers: timed from listing to deleting.
    const auto started = std::chrono::steady_clock::now();
    ServingIndex index = indexServing(ports, deleted, *this, family);
    std::vector<kernel::ConntrackFlow> stale;
    for (core::Protocol protocol : index.protocols) {
      auto flows = table_.list(toCore(family), protocol);
      if (!flows) return std::unexpected(flows.error());
      report.listed += flows->size();
      for (auto& f : staleIn(*flows, index)) stale.push_back(std::move(f));
    }
    auto removed = table_.remove(stale);
    if (!removed) return std::unexpected(removed.error());
    report.deleted += *removed;
    report.families.push_back(FamilyReconcile{
        family, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), *removed});
    for (auto& f : stale) report.stale.push_back(std::move(f));
  }
  return report;
}

namespace {

/// Both afterSync versions: which families the sync requires a cleanup of, and the cleanup. A
/// partial sync requires one of a family when a changed key of it is, or was, a port of a
/// cleaned protocol (upstream's ConntrackCleanupRequired, which each family's proxier decides
/// for itself); a full sync also when any port of the family uses one. `changedFamilies()`
/// answers the first, `forEachNext(fn)` walks the next snapshot's ports and
/// `forEachDeleted(fn)` the changed ports that the next snapshot no longer has. None keeps
/// copies of the ports it looks at: a first sync changes every key, and copies of every port
/// with its endpoints were once the largest allocation of a first sync.
template <class ChangedFamilies, class ForEachNext, class ForEachDeleted>
core::Result<ConntrackCleanupReport> cleanAfterSync(ConntrackCleaner& cleaner, bool full,
                                                    ChangedFamilies changedFamilies, ForEachNext forEachNext,
                                                    ForEachDeleted forEachDeleted) {
  std::set<net::Family> families = changedFamilies();
  // Only a required cleanup, or a full sync, pays for a walk over the whole snapshot.
  if (!full && families.empty()) return ConntrackCleanupReport{};
  std::vector<sdk::ServicePort> cleaned;
  forEachNext([&](const sdk::ServicePort& p) {
    if (!cleaner.cleans(p.protocol)) return;
    cleaned.push_back(p);
    if (full) families.insert(p.family);
  });
  std::vector<sdk::ServicePort> deleted;
  forEachDeleted([&](const sdk::ServicePort& p) {
    if (cleaner.cleans(p.protocol)) deleted.push_back(p);
  });
  if (families.empty()) return ConntrackCleanupReport{};
  return cleaner.reconcile(cleaned, FamilySet(families.begin(), families.end()), deleted);
}

}  // namespace

core::Result<ConntrackCleanupReport> ConntrackCleaner::afterSync(
    const std::vector<sdk::ServicePort>& previous, const std::vector<sdk::ServicePort>& next,
    const std::vector<sdk::ChangedKey>& changed, bool full) {
  auto in = [](const std::vector<sdk::ServicePort>& ports, const sdk::ChangedKey& key) -> const sdk::ServicePort* {
    auto it = std::find_if(ports.begin(), ports.end(),
                           [&](const sdk::ServicePort& p) { return p.family == key.family && p.key == key.key; });
    return it == ports.end() ? nullptr : &*it;
  };
  return cleanAfterSync(
      *this, full,
      [&] {
        std::set<net::Family> families;
        for (const auto& key : changed) {
          const auto* before = in(previous, key);
          const auto* after = in(next, key);
          if ((before && cleans(before->protocol)) || (after && cleans(after->protocol)))
            families.insert(key.family);
        }
        return families;
      },
      [&](const auto& fn) {
        for (const auto& p : next) fn(p);
      },
      [&](const auto& fn) {
        for (const auto& key : changed)
          if (const auto* before = in(previous, key); before && !in(next, key)) fn(*before);
      });
}

core::Result<ConntrackCleanupReport> ConntrackCleaner::afterSync(const sdk::SyncContext& context) {
  return cleanAfterSync(
      *this, context.full,
      [&] {
        std::set<net::Family> families;
        for (const auto& key : context.changed) {
          if (families.contains(key.family)) continue;
          auto previous = context.previous.find(key.family, key.key);
          auto next = context.next.find(key.family, key.key);
          if ((previous && cleans(previous->protocol)) || (next && cleans(next->protocol)))
            families.insert(key.family);
        }
        return families;
      },
      [&](const auto& fn) { context.next.forEach(fn); },
      [&](const auto& fn) {
        for (const auto& key : context.changed) {
          auto previous = context.previous.find(key.family, key.key);
          if (previous && !context.next.find(key.family, key.key)) fn(*previous);
        }
      });
}

sdk::Expected<ConntrackReconcilerMetrics> ConntrackReconcilerMetrics::registerWith(const sdk::Host& host) {
  ConntrackReconcilerMetrics m;
  // Upstream's help texts and buckets (1 ms doubling 15 times).
  std::vector<double> buckets;
  for (double b = 0.001; buckets.size() < 15; b *= 2) buckets.push_back(b);
  auto duration = host.histogram(kDurationName, "ReconcileConntrackFlowsLatency latency in seconds",
                                 {"ip_family"}, buckets);
  if (!duration) return std::unexpected(duration.error());
  m.duration_ = *duration;
  auto deleted = host.counter(kDeletedName, "Cumulative conntrack flows deleted by conntrack reconciler",
                              {"ip_family"});
  if (!deleted) return std::unexpected(deleted.error());
  m.deleted_ = *deleted;
  return m;
}

void ConntrackReconcilerMetrics::observe(const ConntrackCleanupReport& report) const {
  for (const FamilyReconcile& f : report.families) {
    const std::vector<std::string> family{f.family == net::Family::kIPv6 ? "IPv6" : "IPv4"};
    duration_.observe(family, f.seconds);
    deleted_.add(family, static_cast<double>(f.deleted));
  }
}

void cleanStaleConntrackEntries(const sdk::Host& host, const sdk::SyncContext& context,
                                const std::function<std::unique_ptr<kernel::ConntrackTable>()>& open,
                                const ConntrackReconcilerMetrics& metrics, ConntrackCleanupOptions options) {
  try {
    auto started = std::chrono::steady_clock::now();
    auto table = open();
    ConntrackCleaner cleaner(*table, std::move(options));
    auto report = cleaner.afterSync(context);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    if (!report) {
      host.error(fmt::format("conntrack cleanup failed error=\"{}\" ms={:.1f}", report.error().message(), ms));
      return;
    }
    if (!report->ran) return;
    metrics.observe(*report);
    for (const auto& flow : report->stale)
      host.info(4, fmt::format("conntrack deleting stale flow flow=\"{}\"", flow.str()));
    host.info(report->stale.empty() ? 4 : 2,
              fmt::format("conntrack cleanup listed={} stale={} deleted={} ms={:.1f}", report->listed,
                          report->stale.size(), report->deleted, ms));
  } catch (const std::exception& e) {
    // The rules are already in place; a failed cleanup must not turn into a failed sync.
    host.error(fmt::format("conntrack cleanup failed error=\"{}\"", e.what()));
  }
}

}  // namespace kproxy::backends
