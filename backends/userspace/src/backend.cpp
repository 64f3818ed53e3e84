#include "kproxy/userspace/backend.h"

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kproxy/nftables/renderer.h"
#include "kproxy/userspace/kernel.h"
#include "kproxy/nftables/tracer.h"
#include "kproxy/plan/trace.h"
#include "kproxy/plan/options.h"

namespace kproxy::userspace {


namespace {

constexpr std::string_view kName = "userspace";

sdk::Expected<std::chrono::milliseconds> secondsOption(const sdk::Options& options, std::string_view key,
                                                       std::chrono::milliseconds fallback, bool allowZero) {
  auto it = options.find(key);
  if (it == options.end() || it->second.empty()) return fallback;
  const std::string& text = it->second;
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(value) || value < 0 ||
      (!allowZero && value == 0))
    return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                     fmt::format("userspace: invalid {} \"{}\" (seconds{})", key, text, allowZero ? ", >= 0" : ", > 0"));
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(value * 1000)));
}

sdk::Expected<std::size_t> countOption(const sdk::Options& options, std::string_view key, std::size_t fallback) {
  auto it = options.find(key);
  if (it == options.end() || it->second.empty()) return fallback;
  const std::string& text = it->second;
  std::size_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value == 0)
    return sdk::fail(sdk::ErrorCategory::kInvalidInput, fmt::format("userspace: invalid {} \"{}\" (> 0)", key, text));
  return value;
}

std::vector<Target> targetsOf(std::span<const sdk::Endpoint> endpoints) {
  std::vector<Target> out;
  for (const auto& e : endpoints)
    if (e.port > 0 && e.port < 65536) out.push_back(Target{e.ip, static_cast<std::uint16_t>(e.port)});
  return out;
}

/// A redirect entry waiting for its listener's port.
struct PendingEntry {
  net::Family family;
  RedirectEntry entry;
  std::string listener;  ///< empty unless the action is kListener
};

/// What the plans of the service ports ask of the proxy: its listeners (one per service port
/// and endpoint pool) and the table's redirect entries, whose listener ports are assigned once
/// the listeners are open. `forEach(fn)` calls fn for every service port.
struct Redirects {
  std::vector<ListenerSpec> specs;
  std::vector<PendingEntry> entries;
  std::set<net::Family> families{net::Family::kIPv4};
  std::size_t sctp = 0;  ///< SCTP service ports, which the proxy does not carry
};

template <typename ForEach>
Redirects planRedirects(ForEach&& forEach, const plan::PlanConfig& config) {
  Redirects out;
  std::vector<ListenerSpec>& specs = out.specs;
  std::vector<PendingEntry>& entries = out.entries;
  std::map<std::string, std::size_t> specIndex;
  forEach([&](const sdk::ServicePort& p) {
    if (p.protocol == sdk::Protocol::kSCTP) {
      ++out.sctp;
      return;
    }
    const net::Family family = p.family;
    out.families.insert(family);
    const bool udp = p.protocol == sdk::Protocol::kUDP;
    const std::uint8_t proto = udp ? 17 : 6;
    const plan::ServicePortPlan plan = plan::planServicePort(p, config);
    auto listener = [&](plan::Pool pool) {
      std::string id = fmt::format("{} {}/{} {}", family == net::Family::kIPv4 ? "ipv4" : "ipv6", sdk::protocolName(p.protocol),
                                   p.key, pool == plan::Pool::kCluster ? "cluster" : "local");
      if (!specIndex.contains(id)) {
        specIndex.emplace(id, specs.size());
        specs.push_back(ListenerSpec{id, family == net::Family::kIPv6, udp, p.key, targetsOf(plan.endpointsOf(pool)),
                                     std::chrono::seconds(plan.affinity ? plan.affinityTimeoutSeconds : 0)});
      }
      return id;
    };
    std::vector<net::Prefix> firewall;  // loadBalancerSourceRanges, for the LoadBalancer IPs
    if (plan.usesFirewall)
      for (const auto& source : plan.firewallAllowedSources)
        if (auto a = net::Prefix::parse(source)) firewall.push_back(*a);
    auto add = [&](std::optional<net::Prefix> address, std::int32_t port, bool shortCircuit, RedirectAction::Kind kind,
                   std::string id = {}, bool clusterIP = false, bool loadBalancerIP = false) {
      if (port <= 0 || port > 65535) return;
      entries.push_back(PendingEntry{family,
                                     RedirectEntry{proto, address, static_cast<std::uint16_t>(port), shortCircuit,
                                                   clusterIP, RedirectAction{kind, 0},
                                                   loadBalancerIP ? firewall : std::vector<net::Prefix>{}},
                                     std::move(id)});
    };
    auto noEndpoints = [](plan::NoEndpoints n) {
      return n == plan::NoEndpoints::kDrop ? RedirectAction::Kind::kDrop : RedirectAction::Kind::kReject;
    };

    if (auto cip = net::Prefix::parse(plan.clusterIP); cip && !plan.clusterIP.empty()) {
      if (plan.hasInternalEndpoints)
        add(cip, p.port, false, RedirectAction::Kind::kListener, listener(plan.internalPool), true);
      else
        add(cip, p.port, false, noEndpoints(plan.internalNoEndpoints), {}, true);
    }
    if (plan.externallyAccessible) {
      struct External {
        std::optional<net::Prefix> address;
        std::int32_t port;
        bool loadBalancerIP;
      };
      std::vector<External> external;
      for (const auto& ip : plan.externalIPs)
        if (auto a = net::Prefix::parse(ip)) external.push_back({a, p.port, false});
      for (const auto& ip : plan.loadBalancerIPs)
        if (auto a = net::Prefix::parse(ip)) external.push_back({a, p.port, true});
      if (plan.nodePort != 0) external.push_back({std::nullopt, plan.nodePort, false});
      for (const auto& [address, port, lb] : external) {
        if (plan.hasExternalEndpoints)
          add(address, port, false, RedirectAction::Kind::kListener, listener(plan.externalPool), false, lb);
        else
          add(address, port, false, noEndpoints(plan.externalNoEndpoints));
        // The short-circuit: the node and its pods reach an eTP=Local service's external
        // addresses through the cluster-wide pool.
        if (plan.shortCircuitNode && plan.usesClusterPool)
          add(address, port, true, RedirectAction::Kind::kListener, listener(plan::Pool::kCluster), false, lb);
      }
    }
  });
  return out;
}

/// The table of `family` for `entries` (their listener ports assigned), as a sync renders it.
RenderedTable renderFamily(net::Family family, const std::vector<RedirectEntry>& entries, const plan::PlanConfig& config,
                           const sdk::NodePortAddresses& nodePorts, const std::vector<sdk::ServiceCIDR>& serviceCIDRs) {
  const auto pods = nftables::podTrafficMatches(config.localDetector,
                                                family == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6, false);
  // Where NodePorts answer (loopback left out, as in nftables mode), or every local address.
  std::optional<std::vector<net::Prefix>> nodePortAddresses;
  if (!nodePorts.allLocal(family == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6)) {
    nodePortAddresses.emplace();
    for (const auto& ip : nodePorts.addresses)
      if (auto a = net::Prefix::parse(ip); a && a->family == family &&
                                       !net::Prefix::parse(family == net::Family::kIPv4 ? "127.0.0.0/8" : "::1/128")->contains(*a))
        nodePortAddresses->push_back(*a);
  }
  std::vector<net::Prefix> cidrs;
  for (const auto& range : plan::serviceCIDRRanges(serviceCIDRs, family == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6))
    if (auto a = net::Prefix::parse(range.cidr)) cidrs.push_back(*a);
  return renderUserspaceTable(family, entries, pods, nodePortAddresses, cidrs);
}

}  // namespace

sdk::Expected<UserspaceSettings> parseUserspaceSettings(const sdk::Options& options) {
  auto common = plan::parseCommonOptions(options, kName);
  if (!common) return std::unexpected(common.error());
  UserspaceSettings s;
  s.common = std::move(*common);
  s.plan = plan::planConfigOf(s.common);
  auto get = [&](std::string_view key) { return plan::optionValue(options, key); };
  s.dryRun = get("dry-run") == "true";
  const ProxySettings defaults;
  auto udp = secondsOption(options, "udp-timeout", defaults.udpIdleTimeout, false);
  auto connect = secondsOption(options, "userspace-connect-timeout", defaults.connectTimeout, false);
  auto idle = secondsOption(options, "userspace-idle-timeout", defaults.idleTimeout, true);
  auto grace = secondsOption(options, "userspace-endpoint-grace", defaults.removedEndpointGrace, true);
  auto attempts = countOption(options, "userspace-connect-attempts", defaults.connectAttempts);
  auto max = countOption(options, "userspace-max-connections", defaults.maxConnections);
  for (const auto* r : {&udp, &connect, &idle, &grace})
    if (!*r) return std::unexpected(r->error());
  for (const auto* r : {&attempts, &max})
    if (!*r) return std::unexpected(r->error());
  s.proxy.udpIdleTimeout = *udp;
  s.proxy.connectTimeout = *connect;
  s.proxy.idleTimeout = *idle;
  s.proxy.removedEndpointGrace = *grace;
  s.proxy.connectAttempts = *attempts;
  s.proxy.maxConnections = *max;
  s.proxy.listen = !s.dryRun;
  return s;
}

// ---- metrics ---------------------------------------------------------------------------

sdk::Expected<std::shared_ptr<MetricsObserver>> MetricsObserver::create(const sdk::Host& host) {
  auto m = std::make_shared<MetricsObserver>();
  struct Spec {
    sdk::Metric* into;
    bool counter;
    const char* name;
    const char* help;
    std::vector<std::string> labels;
  };
  const Spec specs[] = {
      {&m->active_, false, "kproxy_userspace_active_connections",
       "TCP connections and UDP flows the userspace proxy relays now", {"service", "protocol"}},
      {&m->attempts_, true, "kproxy_userspace_connection_attempts_total",
       "Connections the userspace proxy opened (or tried to open) to endpoints", {"service"}},
      {&m->retries_, true, "kproxy_userspace_connection_retries_total",
       "Endpoint connection attempts after the first of a client connection (the previous endpoint refused or timed out)",
       {"service"}},
      {&m->refused_, true, "kproxy_userspace_refused_connections_total",
       "Client connections or datagrams the userspace proxy did not relay, by reason", {"service", "protocol", "reason"}},
      {&m->bytes_, true, "kproxy_userspace_bytes_total", "Bytes the userspace proxy relayed",
       {"service", "protocol", "direction"}},
      {&m->listeners, false, "kproxy_userspace_listeners", "Listening sockets of the userspace proxy", {"protocol"}},
  };
  for (const auto& s : specs) {
    auto r = s.counter ? host.counter(s.name, s.help, s.labels) : host.gauge(s.name, s.help, s.labels);
    if (!r) return std::unexpected(r.error());
    *s.into = *r;
  }
  return m;
}

void MetricsObserver::active(const std::string& service, bool udp, int delta) {
  active_.add({service, udp ? "udp" : "tcp"}, delta);
}
void MetricsObserver::attempt(const std::string& service, bool retry) {
  attempts_.add({service}, 1);
  if (retry) retries_.add({service}, 1);
}
void MetricsObserver::refused(const std::string& service, bool udp, RefusedReason reason) {
  refused_.add({service, udp ? "udp" : "tcp", std::string(refusedReasonName(reason))}, 1);
}
void MetricsObserver::bytes(const std::string& service, bool udp, std::uint64_t toEndpoint, std::uint64_t toClient) {
  const std::string proto = udp ? "udp" : "tcp";
  if (toEndpoint > 0) bytes_.add({service, proto, "to_endpoint"}, static_cast<double>(toEndpoint));
  if (toClient > 0) bytes_.add({service, proto, "to_client"}, static_cast<double>(toClient));
}

// ---- the backend -----------------------------------------------------------------------

UserspaceBackend::UserspaceBackend(sdk::Host host, UserspaceSettings settings,
                                   std::unique_ptr<nftables::KernelNftables> kernel,
                                   std::unique_ptr<ProxyListeners> listeners,
                                   std::shared_ptr<MetricsObserver> metrics)
    : Reconciler(host, backends::plainReconcilerOptions("userspace", settings.dryRun ? "dry_run=true" : "")),
      host_(host),
      settings_(std::move(settings)),
      kernel_(std::move(kernel)),
      listeners_(std::move(listeners)),
      metrics_(std::move(metrics)) {}

sdk::Expected<backends::PassOutcome> UserspaceBackend::pass(const plan::SnapshotSource& next, bool full) {
  const sdk::NodeInfo node = next.node();
  const std::vector<sdk::ServiceCIDR> serviceCIDRs = next.serviceCIDRs();
  plan::PlanConfig config = settings_.plan;
  plan::applyNode(config, settings_.common.detectLocalMode, node, settings_.common.nodeIPs);
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node, settings_.common.nodePortAddresses, settings_.common.nodeIPs);

  Redirects planned = planRedirects([&](const auto& fn) { next.forEach(fn); }, config);
  std::vector<ListenerSpec>& specs = planned.specs;
  std::vector<PendingEntry>& entries = planned.entries;
  std::set<net::Family>& families = planned.families;
  const std::size_t sctp = planned.sctp;
  for (const auto& f : {net::Family::kIPv4, net::Family::kIPv6})
    if (mirror_.of(f).tableExists) families.insert(f);

  // Listeners first: the table must never send a connection to a port nobody listens on.
  auto ports = listeners_->update(specs);
  if (!ports) {
    return sdk::fail(sdk::ErrorCategory::kTransient, ports.error().message(), ports.error().errnum);
  }

  std::map<net::Family, std::vector<RedirectEntry>> byFamily;
  for (auto& e : entries) {
    if (!e.listener.empty()) e.entry.action.listenerPort = ports->at(e.listener);
    byFamily[e.family].push_back(e.entry);
  }

  if (full) {
    auto read = kernel_->readBack(userspaceSetSpecs(net::Family::kIPv4), userspaceSetSpecs(net::Family::kIPv6));
    if (!read) {
      return sdk::fail(sdk::kernelErrorCategory(read.error().errnum), read.error().message(), read.error().errnum);
    }
    mirror_ = std::move(*read);
  }

  std::vector<nftables::Op> ops;
  for (net::Family family : families) {
    RenderedTable table = renderFamily(family, byFamily[family], config, nodePorts, serviceCIDRs);
    nftables::DesiredFamily desired;
    desired.sets = table.sets;
    for (auto& c : table.chains) desired.chains.push_back(&c);
    for (auto& e : table.elements) desired.elements.push_back(&e);
    nftables::StaleCandidates stale;
    stale.everythingNotDesired = true;
    auto diff = nftables::NftablesDiffer::diff(family, desired, mirror_.of(family), stale, table.sets);
    for (auto& op : diff.ops) ops.push_back(std::move(op));
  }

  if (!ops.empty()) {
    if (auto applied = kernel_->apply(ops); !applied) {
      return sdk::fail(sdk::kernelErrorCategory(applied.error().errnum), applied.error().message(),
                       applied.error().errnum);
    }
  }
  nftables::applyToMirror(mirror_, ops);

  std::set<std::string> keep;
  for (const auto& spec : specs) keep.insert(spec.id);
  listeners_->retain(keep);
  ports_ = std::move(*ports);
  std::size_t tcp = 0, udp = 0;
  for (const auto& spec : specs) ++(spec.udp ? udp : tcp);
  if (metrics_) {
    metrics_->listeners.set({"tcp"}, static_cast<double>(tcp));
    metrics_->listeners.set({"udp"}, static_cast<double>(udp));
  }
  backends::PassOutcome outcome;
  outcome.operations = ops.size();
  outcome.detail = fmt::format("listeners={} tcp={} udp={}", specs.size(), tcp, udp);
  if (sctp > 0) outcome.detail += fmt::format(" sctp_not_proxied={}", sctp);
  return outcome;
}

sdk::Expected<std::string> UserspaceBackend::explain(const sdk::SnapshotView& snapshot,
                                                     const sdk::ExplainRequest& request) {
  auto packet = plan::packetOf(request);
  if (!packet) return std::unexpected(packet.error());
  const net::Family family = packet->destination.family;
  const net::Family sdkFamily = family == net::Family::kIPv4 ? net::Family::kIPv4 : net::Family::kIPv6;
  const sdk::NodeInfo node = snapshot.node();
  const std::vector<sdk::ServicePort> ports = snapshot.all();
  const std::vector<sdk::ServiceCIDR> serviceCIDRs = snapshot.serviceCIDRs();
  plan::PlanConfig config = settings_.plan;
  plan::applyNode(config, settings_.common.detectLocalMode, node, settings_.common.nodeIPs);

  // The table as a sync renders it, with the listeners numbered in place of the ports the
  // kernel would give them: the trace only needs to tell them apart.
  Redirects planned = planRedirects(
      [&](const auto& fn) {
        for (const auto& p : ports) fn(p);
      },
      config);
  if (planned.specs.size() > 65535) return sdk::fail("explain: more listeners than ports");
  std::map<std::string, std::uint16_t> portOf;
  std::map<std::uint16_t, const ListenerSpec*> specAt;
  for (std::size_t i = 0; i < planned.specs.size(); ++i) {
    const auto port = static_cast<std::uint16_t>(i + 1);
    portOf.emplace(planned.specs[i].id, port);
    specAt.emplace(port, &planned.specs[i]);
  }
  std::vector<RedirectEntry> entries;
  for (auto& e : planned.entries) {
    if (e.family != family) continue;
    if (!e.listener.empty()) e.entry.action.listenerPort = portOf.at(e.listener);
    entries.push_back(e.entry);
  }
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node, settings_.common.nodePortAddresses, settings_.common.nodeIPs);
  RenderedTable table = renderFamily(family, entries, config, nodePorts, serviceCIDRs);
  nftables::GlobalObjects global;
  global.family = family;
  global.sets = table.sets;
  global.chains = std::move(table.chains);
  global.elements = std::move(table.elements);
  const std::vector<net::Prefix> local =
      plan::nodeLocalAddresses(node, settings_.common.nodeIPs, node.nodePortAddresses.addresses);
  const nftables::NftablesTracer tracer(global, {}, local);
  plan::Trace trace = tracer.trace(*packet);

  // The proxy's part: a connection redirected to a listener is relayed to one of its pool's
  // endpoints (round robin, or the client's endpoint under ClientIP affinity), from the node.
  for (auto& path : trace.paths) {
    auto it = specAt.find(path.outcome.redirectPort);
    if (path.outcome.redirectPort == 0 || it == specAt.end()) continue;
    const ListenerSpec& spec = *it->second;
    std::string pool;
    path.outcome.endpoints.clear();
    for (const auto& t : spec.endpoints) {
      path.outcome.endpoints.push_back(t.toString());
      pool += (pool.empty() ? "" : ", ") + t.toString();
    }
    path.outcome.verdict = spec.endpoints.empty() ? plan::TraceVerdict::kRejected : plan::TraceVerdict::kDnat;
    path.outcome.reason = spec.endpoints.empty() ? plan::DropReason::kNoEndpoints : plan::DropReason::kNone;
    path.outcome.masqueraded = true;
    path.steps.push_back(plan::TraceStep{
        "userspace proxy", "",
        fmt::format("listener {} ({}; its port numbered for this trace, the running proxy's comes from the kernel) "
                    "relays to one of {}{}, from the node: the client's source is not preserved",
                    spec.id, spec.udp ? "udp" : "tcp", pool.empty() ? "(none)" : pool,
                    spec.affinityTimeout.count() > 0
                        ? fmt::format(" (ClientIP affinity {}s)", spec.affinityTimeout.count())
                        : "")});
  }
  trace.outcome = plan::mergePaths(trace.paths);

  plan::Explanation x = plan::explanationOf(*packet, request.protocol, ports, sdkFamily, trace);
  std::vector<std::string> localText;
  for (const auto& a : local) localText.push_back(a.toString());
  x.destinationLocal = plan::nodePortAnswersOn(nodePorts, localText, x.destination, /*loopback=*/true);
  x.reason = plan::dropReasonText(trace.outcome, serviceCIDRs, sdkFamily, x.destination);
  if (packet->protocol == 132)
    x.reason = "the userspace proxy does not carry SCTP service ports";
  return plan::explanationText(x, request.json);
}

sdk::Expected<void> UserspaceBackend::cleanup() {
  auto r = kernel_->deleteTables();
  mirror_ = nftables::Mirror{};
  requireFullSync();
  if (!r) return sdk::fail(sdk::kernelErrorCategory(r.error().errnum), r.error().message(), r.error().errnum);
  return {};
}

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeUserspaceBackend(const sdk::Host& host,
                                                                         const sdk::Options& options) {
  auto settings = parseUserspaceSettings(options);
  if (!settings) return std::unexpected(settings.error());
  auto metrics = MetricsObserver::create(host);
  if (!metrics) return std::unexpected(metrics.error());
  if (!settings->dryRun) {
    // Each relayed TCP connection holds two sockets and two pipes: let the process have as many
    // descriptors as its hard limit allows.
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
  }
  host.info(0, fmt::format("userspace: table {} (ip, ip6); connect timeout {} ms, {} attempts, at most {} connections, "
                           "UDP idle timeout {} ms",
                           kTableName, settings->proxy.connectTimeout.count(), settings->proxy.connectAttempts,
                           settings->proxy.maxConnections, settings->proxy.udpIdleTimeout.count()));
  std::unique_ptr<nftables::KernelNftables> kernel;
  std::unique_ptr<ProxyListeners> listeners = std::make_unique<ProxyServer>(settings->proxy, *metrics);
  if (settings->dryRun) {
    // Nothing reaches the table: its changes are printed and kept in memory, over an empty one.
    kernel = std::make_unique<nftables::PrintingNftables>(std::make_unique<nftables::FakeKernelNftables>(),
                                                          settings->dryRunOutput, std::string(kTableName));
    listeners = std::make_unique<PrintingListeners>(std::move(listeners), settings->dryRunOutput);
  } else {
    kernel = nftables::makeNetlinkKernel(kTableName);
  }
  return std::make_unique<UserspaceBackend>(host, std::move(*settings), std::move(kernel), std::move(listeners),
                                            std::move(*metrics));
}

}  // namespace kproxy::userspace
