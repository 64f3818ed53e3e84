#include "health.h"

#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

namespace kproxy::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kJson = "application/json";

// Both health servers answer with these headers (upstream sets them on every response).
HttpResponse jsonResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.contentType = kJson;
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.body = std::move(body);
  return r;
}

Json healthBody(const HealthInput& input, const ProxyHealth& health, bool reportedHealthy,
                std::optional<bool> nodeEligible) {
  Json body;
  // Upstream reports "now" as lastUpdated while healthy, for compatibility with old clients.
  body["lastUpdated"] =
      formatRfc3339Nano(reportedHealthy ? health.currentTime : health.lastUpdated);
  body["currentTime"] = formatRfc3339Nano(health.currentTime);
  if (nodeEligible) body["nodeEligible"] = *nodeEligible;
  body["healthy"] = health.healthy;
  Json status = Json::object();
  for (const auto& family : input.families) {
    status[family] = {{"lastUpdated", formatRfc3339Nano(health.lastUpdated)},
                      {"healthy", health.healthy}};
  }
  if (!status.empty()) body["status"] = std::move(status);
  return body;
}

}  // namespace

std::string formatRfc3339Nano(double wallSeconds) {
  if (wallSeconds <= 0) return "0001-01-01T00:00:00Z";
  double whole = std::floor(wallSeconds);
  // Microseconds: a double of epoch seconds carries no more than that.
  long long micros = std::llround((wallSeconds - whole) * 1e6);
  if (micros >= 1'000'000) {
    whole += 1;
    micros -= 1'000'000;
  }
  const std::time_t t = static_cast<std::time_t>(whole);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::string out = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", tm.tm_year + 1900,
                                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  if (micros > 0) {
    std::string fraction = fmt::format("{:06}", micros);
    while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
    out += "." + fraction;
  }
  return out + "Z";
}

ProxyHealth evaluateProxyHealth(const HealthInput& input) {
  ProxyHealth h;
  h.currentTime = input.nowWall;
  h.lastUpdated = input.lastSuccessWall.value_or(input.startWall);
  const double timeout = std::chrono::duration<double>(input.healthTimeout).count();
  // A queued change that is not late yet is fine; a late one makes the proxy unhealthy.
  if (input.oldestQueuedWall && input.nowWall - *input.oldestQueuedWall >= timeout) {
    h.healthy = false;
  }
  return h;
}

HttpResponse healthzResponse(const HealthInput& input) {
  const ProxyHealth health = evaluateProxyHealth(input);
  const bool nodeEligible = !input.nodeDeleting && (input.nodeSeen || !input.nodeRequired);
  const bool healthy = health.healthy && nodeEligible;
  return jsonResponse(healthy ? 200 : 503, healthBody(input, health, healthy, nodeEligible).dump());
}

HttpResponse livezResponse(const HealthInput& input) {
  const ProxyHealth health = evaluateProxyHealth(input);
  return jsonResponse(health.healthy ? 200 : 503,
                      healthBody(input, health, health.healthy, std::nullopt).dump());
}

HttpResponse serviceHealthResponse(const std::string& ns, const std::string& name,
                                   int localEndpoints, bool proxyHealthy) {
  // Upstream writes this exact indented layout (a dedented Go template), not compact JSON.
  const std::string body = fmt::format(
      "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n"
      "\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
      Json(ns).dump(), Json(name).dump(), localEndpoints, proxyHealthy ? "true" : "false");
  HttpResponse r = jsonResponse(localEndpoints != 0 && proxyHealthy ? 200 : 503, body);
  r.headers.emplace_back("X-Load-Balancing-Endpoint-Weight", std::to_string(localEndpoints));
  return r;
}

}  // namespace kproxy::cli
