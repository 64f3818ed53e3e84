#pragma once
// Builders of sdk::ServicePort values for nftables tests and the benchmark.

#include <string>
#include <vector>

#include "kproxy/plugin/sdk.h"

namespace kproxy::nftables::testing {

inline sdk::Endpoint endpoint(std::string ip, int port, bool local = false) {
  sdk::Endpoint e;
  e.ip = std::move(ip);
  e.port = port;
  e.isLocal = local;
  e.ready = true;
  e.serving = true;
  return e;
}

/// A ClusterIP service port "ns/name:portName" with the given endpoints (all cluster-wide).
inline sdk::ServicePort clusterIP(std::string ns, std::string name, std::string clusterIP, int port,
                                  std::vector<sdk::Endpoint> eps,
                                  sdk::Protocol proto = sdk::Protocol::kTCP,
                                  std::string portName = "p") {
  sdk::ServicePort p;
  p.family = clusterIP.find(':') == std::string::npos ? net::Family::kIPv4 : net::Family::kIPv6;
  p.protocol = proto;
  p.type = sdk::ServiceType::kClusterIP;
  p.ns = std::move(ns);
  p.serviceName = std::move(name);
  p.portName = std::move(portName);
  p.key = p.ns + "/" + p.serviceName + ":" + p.portName;
  p.clusterIP = std::move(clusterIP);
  p.port = port;
  p.hasAnyEndpoints = !eps.empty();
  for (const auto& e : eps)
    if (e.isLocal) p.localEndpoints.push_back(e);
  p.clusterEndpoints = eps;
  p.allReachableEndpoints = eps;
  p.allEndpoints = std::move(eps);
  return p;
}

/// Replaces the endpoints of `p`, keeping the derived lists consistent.
inline void setEndpoints(sdk::ServicePort& p, std::vector<sdk::Endpoint> eps) {
  p.localEndpoints.clear();
  for (const auto& e : eps)
    if (e.isLocal) p.localEndpoints.push_back(e);
  p.hasAnyEndpoints = !eps.empty();
  p.clusterEndpoints = eps;
  p.allReachableEndpoints = eps;
  p.allEndpoints = std::move(eps);
}

/// n services "ns/svc-i:p" with `eps` endpoints each, ClusterIPs 172.30.x.y, endpoints 10.x.y.z;
/// every tenth has session affinity.
/// Service port `i` of manyServices(…, eps, …): ClusterIP 172.30.x.y (172.31.x.y past 65,535),
/// `eps` endpoints 10.a.b.c:8080 numbered on from i · eps, affinity on every tenth.
inline sdk::ServicePort manyServicesPort(int i, int eps, bool affinityEveryTenth = true) {
  std::vector<sdk::Endpoint> list;
  for (int j = 0, epCounter = i * eps; j < eps; ++j, ++epCounter)
    list.push_back(endpoint("10." + std::to_string((epCounter >> 16) & 255) + "." +
                                std::to_string((epCounter >> 8) & 255) + "." + std::to_string(epCounter & 255),
                            8080));
  auto p = clusterIP("ns", "svc-" + std::to_string(i),
                     "172.30." + std::to_string((i >> 8) & 255) + "." + std::to_string(i & 255), 80,
                     std::move(list));
  if (i >= 65536) p.clusterIP = "172.31." + std::to_string((i >> 8) & 255) + "." + std::to_string(i & 255);
  if (affinityEveryTenth && i % 10 == 0) {
    p.sessionAffinityClientIP = true;
    p.stickyMaxAgeSeconds = 10800;
  }
  return p;
}

inline std::vector<sdk::ServicePort> manyServices(int n, int eps, bool affinityEveryTenth = true) {
  std::vector<sdk::ServicePort> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out.push_back(manyServicesPort(i, eps, affinityEveryTenth));
  return out;
}

}  // namespace kproxy::nftables::testing
