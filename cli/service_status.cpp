#include "service_status.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>

#include "kproxy/plan/options.h"
#include "kproxy/plugins/snapshot_view.h"

namespace kproxy::cli {
namespace {

using nlohmann::json;

const char* protocolUpper(sdk::Protocol p) {
  switch (p) {
    case sdk::Protocol::kTCP: return "TCP";
    case sdk::Protocol::kUDP: return "UDP";
    case sdk::Protocol::kSCTP: return "SCTP";
  }
  return "TCP";
}

net::Family coreFamily(net::Family f) {
  return f == net::Family::kIPv6 ? net::Family::kIPv6 : net::Family::kIPv4;
}

json syncRecord(const core::SyncRecord& r, double now) {
  json j = {{"sync", r.number},
            {"kind", r.kind == core::SyncKind::kFull ? "full" : "partial"},
            {"time", r.wall},
            {"ageSeconds", std::round((now - r.wall) * 10) / 10},
            {"durationSeconds", std::chrono::duration<double>(r.duration).count()},
            {"operations", r.operations},
            {"changedServicePorts", r.changedServicePorts}};
  if (!r.error.empty()) j["error"] = r.error;
  if (r.verification) {
    j["verification"] = true;
    j["summary"] = r.summary;
  }
  return j;
}

bool contains(std::span<const sdk::Endpoint> pool, const sdk::Endpoint& e) {
  return std::any_of(pool.begin(), pool.end(),
                     [&](const sdk::Endpoint& p) { return p.ip == e.ip && p.port == e.port; });
}

std::string endpointAddress(const sdk::Endpoint& e) {
  std::string out;
  if (e.ip.find(':') != std::string::npos) {
    out += '[';
    out += e.ip;
    out += ']';
  } else {
    out += e.ip;
  }
  out += ':';
  out += std::to_string(e.port);
  return out;
}

// Why an endpoint of the port is, or is not, used: the plan's pools are the truth, the reason
// names the rule that put it there or kept it out (upstream's CategorizeEndpoints).
json endpointStatus(const sdk::Endpoint& e, const sdk::ServicePort& port, const plan::ServicePortPlan& plan) {
  json used = json::array();
  if (plan.usesClusterPool && contains(plan.clusterEndpoints, e)) used.push_back("cluster");
  if (plan.usesLocalPool && contains(plan.localEndpoints, e)) used.push_back("local");
  // The words of `kproxy explain` (plan/trace.cpp), for the same situations.
  std::string reason;
  if (!used.empty()) {
    reason = e.ready ? "ready" : "terminating (fallback)";
  } else if (!e.ready && !(e.serving && e.terminating)) {
    reason = "not ready";
  } else if (!e.ready) {
    reason = "terminating (ready endpoints exist)";
  } else if (!e.isLocal && !plan.usesClusterPool) {
    reason = port.internalPolicyLocal && port.externalPolicyLocal && port.externallyAccessible()
                 ? "not local (iTP=Local, eTP=Local)"
             : port.internalPolicyLocal ? "not local (iTP=Local)"
                                        : "not local (eTP=Local)";
  } else if (plan.usesClusterPool && !contains(plan.clusterEndpoints, e)) {
    reason = "not in topology hints";
  } else {
    reason = "not used by any traffic of this port";
  }
  json j = {{"address", endpointAddress(e)}, {"node", e.nodeName}, {"local", e.isLocal},
            {"ready", e.ready}, {"serving", e.serving}, {"terminating", e.terminating},
            {"usedFor", used}, {"reason", reason}};
  if (!e.zone.empty()) j["zone"] = e.zone;
  return j;
}

const char* poolName(plan::Pool p) { return p == plan::Pool::kCluster ? "cluster" : "local"; }

std::string countOf(std::size_t n) { return std::to_string(n) + (n == 1 ? " endpoint" : " endpoints"); }

std::string noEndpointsText(plan::NoEndpoints n, const char* what) {
  if (n == plan::NoEndpoints::kReject) return "rejected: the service has no usable endpoint";
  std::string out = "dropped: no ";
  out += what;
  out += " endpoint";
  return out;
}

json internalTraffic(const plan::ServicePortPlan& p) {
  if (p.clusterIP.empty()) return nullptr;
  json j = {{"pool", poolName(p.internalPool)}};
  if (p.hasInternalEndpoints) {
    j["meets"] = countOf(p.endpointsOf(p.internalPool).size()) + " (" + poolName(p.internalPool) + " pool)";
  } else {
    j["meets"] = noEndpointsText(p.internalNoEndpoints, p.internalPool == plan::Pool::kLocal ? "local" : "usable");
  }
  j["masquerade"] = p.internalMasquerade == plan::InternalMasquerade::kAll        ? "all"
                    : p.internalMasquerade == plan::InternalMasquerade::kNotLocal ? "clients outside the node's pods"
                                                                                   : "none";
  return j;
}

json externalTraffic(const plan::ServicePortPlan& p) {
  if (!p.externallyAccessible) return nullptr;
  json j = {{"pool", poolName(p.externalPool)}, {"captured", p.capturesExternal}};
  if (!p.capturesExternal) {
    j["meets"] = "not captured: the service has no usable endpoint anywhere";
  } else if (p.hasExternalEndpoints) {
    j["meets"] = countOf(p.endpointsOf(p.externalPool).size()) + " (" + poolName(p.externalPool) + " pool)";
  } else {
    j["meets"] = noEndpointsText(p.externalNoEndpoints, p.externalPool == plan::Pool::kLocal ? "local" : "usable");
  }
  j["masquerade"] = p.externalMasqueradeAll ? "all" : "none (source kept)";
  if (p.shortCircuitPods || p.shortCircuitNode) {
    j["shortCircuit"] = p.shortCircuitPods ? "the node and its pods reach the cluster pool"
                                           : "the node reaches the cluster pool";
  }
  if (p.usesFirewall) j["allowedSources"] = p.firewallAllowedSources;
  return j;
}

}  // namespace

json servicesStatus(const ServiceStatusInput& in) {
  json doc = {{"mode", in.mode}, {"now", in.nowWall}};
  if (in.ledger.last) doc["lastSync"] = syncRecord(*in.ledger.last, in.nowWall);
  if (in.ledger.lastFullSuccess) doc["lastFullSync"] = syncRecord(*in.ledger.lastFullSuccess, in.nowWall);
  if (in.ledger.lastFullFailure) doc["lastFailedFullSync"] = syncRecord(*in.ledger.lastFullFailure, in.nowWall);
  json verification = {{"count", in.ledger.verifications}, {"mismatchedObjects", in.ledger.mismatchedObjects}};
  if (in.ledger.lastVerification) verification["last"] = syncRecord(*in.ledger.lastVerification, in.nowWall);
  if (in.ledger.lastMismatch) verification["lastMismatch"] = syncRecord(*in.ledger.lastMismatch, in.nowWall);
  doc["verification"] = std::move(verification);
  json services = json::array();
  if (!in.snapshot) {
    doc["programmed"] = false;
    doc["services"] = services;
    return doc;
  }
  doc["programmed"] = true;
  doc["generation"] = in.snapshot->generation();
  const sdk::SnapshotView view = plugins::sdkView(*in.snapshot);
  const sdk::NodeInfo node = view.node();
  doc["node"] = node.name;
  plan::PlanConfig config = plan::planConfigOf(in.common);
  plan::applyNode(config, in.common.detectLocalMode, node, in.common.nodeIPs);
  // Where NodePorts answer, as every backend decides it.
  const sdk::NodePortAddresses nodePorts =
      plan::nodePortAddressesOf(node, in.common.nodePortAddresses, in.common.nodeIPs);
  doc["nodePortAddresses"] = {{"addresses", nodePorts.addresses},
                              {"allLocalIPv4", nodePorts.allLocalIPv4},
                              {"allLocalIPv6", nodePorts.allLocalIPv6}};

  std::vector<std::pair<std::string, json>> rows;
  view.forEach([&](const sdk::ServicePort& port) {
    const std::string service = port.ns + "/" + port.serviceName;
    if (!in.service.empty() && service != in.service) return;
    const plan::ServicePortPlan p = plan::planServicePort(port, config);
    json j = {{"service", service},
              {"port", port.portName},
              {"key", port.key},
              {"family", port.family == net::Family::kIPv6 ? "IPv6" : "IPv4"},
              {"protocol", protocolUpper(port.protocol)},
              {"type", sdk::serviceTypeName(port.type)}};
    json addresses = {{"port", port.port}};
    if (!port.clusterIP.empty()) addresses["clusterIP"] = port.clusterIP;
    if (port.nodePort != 0) addresses["nodePort"] = port.nodePort;
    if (!port.externalIPs.empty()) addresses["externalIPs"] = port.externalIPs;
    if (!port.loadBalancerIPs.empty()) addresses["loadBalancerIPs"] = port.loadBalancerIPs;
    if (!port.loadBalancerSourceRanges.empty()) addresses["loadBalancerSourceRanges"] = port.loadBalancerSourceRanges;
    if (port.healthCheckNodePort != 0) addresses["healthCheckNodePort"] = port.healthCheckNodePort;
    j["addresses"] = addresses;
    j["trafficPolicy"] = {{"internal", port.internalPolicyLocal ? "Local" : "Cluster"},
                          {"external", port.externalPolicyLocal ? "Local" : "Cluster"}};
    if (p.affinity) j["sessionAffinity"] = {{"clientIP", true}, {"timeoutSeconds", p.affinityTimeoutSeconds}};
    j["internalTraffic"] = internalTraffic(p);
    j["externalTraffic"] = externalTraffic(p);
    json endpoints = json::array();
    std::size_t used = 0;
    for (const auto& e : port.allEndpoints) {
      json ej = endpointStatus(e, port, p);
      if (!ej["usedFor"].empty()) ++used;
      endpoints.push_back(std::move(ej));
    }
    j["endpointCounts"] = {{"total", port.allEndpoints.size()}, {"used", used}};
    j["endpoints"] = std::move(endpoints);
    const core::ServicePortKey key{coreFamily(port.family), port.key};
    const core::SyncRecord* programmed = in.ledger.programmed(key);
    j["lastProgrammed"] = programmed ? syncRecord(*programmed, in.nowWall) : json(nullptr);
    const core::SyncRecord* failed = in.ledger.failure(key);
    j["lastError"] = failed ? syncRecord(*failed, in.nowWall) : json(nullptr);
    rows.emplace_back(service + "\x1f" + port.portName + "\x1f" + j["family"].get<std::string>(), std::move(j));
  });
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [_, j] : rows) services.push_back(std::move(j));
  doc["services"] = std::move(services);
  return doc;
}

namespace {

std::string str(const json& j, const char* key, const std::string& fallback = "") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

std::string ago(const json& record) {
  if (record.is_null()) return "never";
  char buf[64];
  std::snprintf(buf, sizeof buf, "#%s %s, %gs ago", str(record, "sync").c_str(), str(record, "kind").c_str(),
                record.value("ageSeconds", 0.0));
  return buf;
}

void table(std::string& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
}

}  // namespace

std::string servicesStatusTable(const json& status, bool wide) {
  std::string out;
  out += "mode " + str(status, "mode") + ", node " + str(status, "node", "?");
  if (status.contains("lastSync")) {
    const json& s = status["lastSync"];
    out += ", last sync " + ago(s) + (s.contains("error") ? " FAILED: " + str(s, "error") : " ok");
  } else {
    out += ", no sync yet";
  }
  out += "\n";
  if (status.contains("verification")) {
    const json& v = status["verification"];
    out += "verified " + str(v, "count", "0") + " times, " + str(v, "mismatchedObjects", "0") +
           " differences repaired";
    if (v.contains("lastMismatch")) out += " (last: " + ago(v["lastMismatch"]) + ": " + str(v["lastMismatch"], "summary") + ")";
    out += "\n";
  }
  if (status.contains("lastFailedFullSync"))
    out += "last full sync FAILED (" + ago(status["lastFailedFullSync"]) +
           "): " + str(status["lastFailedFullSync"], "error") + "\n";
  out += "\n";
  std::vector<std::vector<std::string>> rows{
      {"SERVICE", "PORT", "TYPE", "ADDRESSES", "ENDPOINTS", "INTERNAL", "EXTERNAL", "PROGRAMMED", "ERROR"}};
  std::vector<const json*> detail;
  const json services = status.value("services", json::array());
  for (const json& s : services) {
    const json& a = s["addresses"];
    std::string addr = str(a, "clusterIP", "None") + ":" + str(a, "port");
    if (a.contains("nodePort")) addr += ",node:" + str(a, "nodePort");
    for (const char* k : {"externalIPs", "loadBalancerIPs"})
      if (a.contains(k))
        for (const auto& ip : a[k]) addr += "," + ip.get<std::string>();
    const json& counts = s["endpointCounts"];
    std::string eps = str(counts, "used") + "/" + str(counts, "total");
    const std::string internal = s["internalTraffic"].is_null() ? "-" : str(s["internalTraffic"], "meets");
    const std::string external = s["externalTraffic"].is_null() ? "-" : str(s["externalTraffic"], "meets");
    const std::string error = s["lastError"].is_null() ? "-" : str(s["lastError"], "error");
    std::string port = str(s, "port");
    if (!port.empty()) port += '/';
    port += str(s, "protocol");
    if (str(s, "family") == "IPv6") port += "/v6";
    rows.push_back({str(s, "service"), port, str(s, "type"), addr, eps, internal, external,
                    ago(s["lastProgrammed"]), error});
    if (wide || counts.value("used", 0) != counts.value("total", 0)) detail.push_back(&s);
  }
  table(out, rows);
  if (!detail.empty()) {
    out += "\n";
    std::vector<std::vector<std::string>> erows{{"SERVICE", "PORT", "ENDPOINT", "NODE", "USED FOR", "REASON"}};
    for (const json* s : detail) {
      for (const json& e : (*s)["endpoints"]) {
        std::string used;
        for (const auto& u : e["usedFor"]) {
          if (!used.empty()) used += ',';
          used += u.get<std::string>();
        }
        erows.push_back({str(*s, "service"), str(*s, "port", ""), str(e, "address"), str(e, "node", "-"),
                         used.empty() ? "-" : used, str(e, "reason")});
      }
    }
    table(out, erows);
  }
  return out;
}

}  // namespace kproxy::cli
