#include "ops_fixtures.h"

#include "kproxy/core/log.h"
#include "kproxy/core/tracker.h"

namespace net = kproxy::net;

namespace ops_test {

using namespace kproxy::core;

namespace {
Service baseService(const std::string& name, const std::string& clusterIP) {
  Service s;
  s.ns = "default";
  s.name = name;
  s.clusterIPs = {clusterIP};
  s.ipFamilies = {net::Family::kIPv4};
  ServicePortSpec p;
  p.name = "http";
  p.port = 80;
  p.targetPort.number = 8080;
  s.ports = {p};
  return s;
}
kproxy::log::Sink previousSink;
}  // namespace

Service localLoadBalancer(const std::string& name, int healthCheckNodePort, const std::string& clusterIP) {
  Service s = baseService(name, clusterIP);
  s.type = ServiceType::kLoadBalancer;
  s.ports[0].nodePort = 30080;
  s.externalTrafficPolicy = TrafficPolicy::kLocal;
  s.healthCheckNodePort = healthCheckNodePort;
  return s;
}

Service internalLocalService(const std::string& name, const std::string& clusterIP) {
  Service s = baseService(name, clusterIP);
  s.internalTrafficPolicy = TrafficPolicy::kLocal;
  return s;
}

EndpointSlice sliceFor(const std::string& service, const std::vector<LocalEndpoint>& endpoints) {
  EndpointSlice s;
  s.ns = "default";
  s.name = service + "-1";
  s.serviceName = service;
  s.labels[kLabelServiceName] = service;
  EndpointPort p;
  p.name = "http";
  p.port = 8080;
  p.protocol = Protocol::kTCP;
  s.ports = {p};
  for (const auto& ep : endpoints) {
    SliceEndpoint e;
    e.addresses = {ep.ip};
    e.conditions.ready = ep.ready;
    e.conditions.serving = ep.ready || ep.terminating;
    e.conditions.terminating = ep.terminating;
    e.nodeName = ep.local ? "node-a" : "node-b";
    s.endpoints.push_back(e);
  }
  return s;
}

std::shared_ptr<const Snapshot> snapshotOf(const std::vector<Service>& services,
                                           const std::vector<EndpointSlice>& slices) {
  TrackerConfig config;
  config.nodeName = "node-a";
  ChangeTracker tracker(config);
  for (const auto& s : services) tracker.upsertService(s);
  for (const auto& s : slices) tracker.upsertEndpointSlice(s);
  return tracker.publish().snapshot;
}

QuietLog::QuietLog() { previousSink = kproxy::log::setSink([](kproxy::log::Severity, std::string_view) {}); }
QuietLog::~QuietLog() { kproxy::log::setSink(previousSink); }

}  // namespace ops_test
