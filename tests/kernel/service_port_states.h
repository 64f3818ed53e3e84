#pragma once
// Service ports as the host's snapshot holds them (core::ServicePortState), for kernel tests
// that sync a plugin loaded as kproxy loads it.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/core/snapshot.h"

namespace kproxy::testing {

/// A ready, serving endpoint; one with a node name is local to that node.
inline core::Endpoint servingEndpoint(std::string ip, int port, std::string localNode = {}) {
  core::Endpoint e;
  e.ip = std::move(ip);
  e.port = port;
  e.isLocal = !localNode.empty();
  e.nodeName = std::move(localNode);
  e.ready = true;
  e.serving = true;
  return e;
}

/// The IPv4 UDP ClusterIP service port "NS/NAME:dns" at `clusterIP`:`port` with `endpoints`,
/// each in the lists the plan reads (local ones in the local list too).
inline std::shared_ptr<const core::ServicePortState> udpClusterIPState(std::string ns, std::string name,
                                                                       std::string clusterIP, int port,
                                                                       const std::vector<core::Endpoint>& endpoints) {
  auto s = std::make_shared<core::ServicePortState>();
  s->key = core::ServicePortKey{net::Family::kIPv4, ns + "/" + name + ":dns"};
  s->ns = std::move(ns);
  s->serviceName = std::move(name);
  s->portName = "dns";
  s->type = core::ServiceType::kClusterIP;
  s->protocol = core::Protocol::kUDP;
  s->clusterIP = std::move(clusterIP);
  s->port = port;
  for (const auto& e : endpoints) {
    s->clusterEndpoints.push_back(e);
    if (e.isLocal) s->localEndpoints.push_back(e);
    s->allReachableEndpoints.push_back(e);
    s->allEndpoints.push_back(e);
  }
  s->hasAnyEndpoints = !endpoints.empty();
  return s;
}

}  // namespace kproxy::testing
