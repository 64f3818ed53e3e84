#include "healthcheck_nodeports.h"

#include <set>

#include "health.h"
#include "kproxy/core/log.h"

namespace kproxy::cli {

std::map<std::string, ServiceHealthTarget> serviceHealthTargets(const core::Snapshot& snapshot) {
  std::map<std::string, ServiceHealthTarget> targets;
  std::map<std::string, std::set<std::string>> localIPs;
  snapshot.forEach([&](const core::ServicePortState& sp) {
    if (sp.healthCheckNodePort <= 0 || sp.healthCheckNodePort > 65535) return true;
    if (sp.externalPolicy != core::TrafficPolicy::kLocal || !sp.externallyAccessible()) return true;
    const std::string key = sp.ns + "/" + sp.serviceName;
    auto& target = targets[key];
    target.ns = sp.ns;
    target.name = sp.serviceName;
    target.port = static_cast<std::uint16_t>(sp.healthCheckNodePort);
    auto& ips = localIPs[key];
    for (const auto& ep : sp.allEndpoints) {
      // Terminating endpoints may still serve, but the check must fail when only they remain.
      if (ep.isLocal && ep.ready) ips.insert(ep.ip);
    }
    return true;
  });
  for (auto& [key, target] : targets) target.localEndpoints = static_cast<int>(localIPs[key].size());
  return targets;
}

struct ServiceHealthServers::Instance {
  ServiceHealthTarget target;
  // Shared with the handlers so a reconcile updates what the next request sees.
  std::shared_ptr<int> localEndpoints = std::make_shared<int>(0);
  std::vector<std::unique_ptr<HttpServer>> servers;
};

ServiceHealthServers::ServiceHealthServers(EventLoop& loop, std::function<bool()> proxyHealthy,
                                           std::vector<std::string> addresses)
    : loop_(loop), proxyHealthy_(std::move(proxyHealthy)), addresses_(std::move(addresses)) {}

ServiceHealthServers::~ServiceHealthServers() { closeAll(); }

void ServiceHealthServers::closeAll() {
  for (auto& [key, instance] : instances_) {
    log::info(2, "Closing healthcheck", {{"service", key}, {"port", std::to_string(instance->target.port)}});
  }
  instances_.clear();
}

void ServiceHealthServers::reconcile(const core::Snapshot& snapshot) {
  auto targets = serviceHealthTargets(snapshot);

  for (auto it = instances_.begin(); it != instances_.end();) {
    auto found = targets.find(it->first);
    if (found == targets.end() || found->second.port != it->second->target.port) {
      log::info(2, "Closing healthcheck",
                {{"service", it->first}, {"port", std::to_string(it->second->target.port)}});
      it = instances_.erase(it);
    } else {
      ++it;
    }
  }

  for (auto& [key, target] : targets) {
    if (auto existing = instances_.find(key); existing != instances_.end()) {
      if (*existing->second->localEndpoints != target.localEndpoints) {
        log::info(3, "Reporting endpoints for healthcheck",
                  {{"service", key}, {"endpointCount", std::to_string(target.localEndpoints)}});
      }
      *existing->second->localEndpoints = target.localEndpoints;
      existing->second->target = target;
      continue;
    }
    auto instance = std::make_unique<Instance>();
    instance->target = target;
    *instance->localEndpoints = target.localEndpoints;
    HttpHandler handler = [ns = target.ns, name = target.name, count = instance->localEndpoints,
                           healthy = proxyHealthy_](const HttpRequest&) {
      return serviceHealthResponse(ns, name, *count, healthy ? healthy() : true);
    };
    const std::vector<std::string> hosts =
        addresses_.empty() ? std::vector<std::string>{"0.0.0.0"} : addresses_;
    bool ok = true;
    for (const auto& host : hosts) {
      auto server = std::make_unique<HttpServer>(loop_, "healthcheck " + key, handler);
      if (auto listening = server->listen(host, target.port); !listening) {
        // Upstream logs (and records an event) and retries on the next sync.
        log::error("Failed to start healthcheck",
                   {{"service", key}, {"port", std::to_string(target.port)},
                    {"error", listening.error().message()}});
        ok = false;
        break;
      }
      instance->servers.push_back(std::move(server));
    }
    if (!ok) continue;  // whatever opened closes with `instance`, so a retry can take the port
    log::info(2, "Opening healthcheck", {{"service", key}, {"port", std::to_string(target.port)},
                                        {"localEndpoints", std::to_string(target.localEndpoints)}});
    instances_.emplace(key, std::move(instance));
  }
}

std::vector<std::uint16_t> ServiceHealthServers::openPorts() const {
  std::vector<std::uint16_t> ports;
  for (const auto& [key, instance] : instances_) ports.push_back(instance->target.port);
  std::sort(ports.begin(), ports.end());
  return ports;
}

}  // namespace kproxy::cli
