#include "health.h"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

using kproxy::cli::HealthInput;
using kproxy::cli::HttpResponse;
using Json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// 2024-05-01T10:00:00Z
constexpr double kT0 = 1714557600.0;

HealthInput input() {
  HealthInput in;
  in.startWall = kT0;
  in.nowWall = kT0 + 5;
  in.healthTimeout = 60s;  // 2 × a 30 s syncPeriod
  in.families = {"IPv4"};
  return in;
}

std::string header(const HttpResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name) return v;
  }
  return "";
}

}  // namespace

TEST_CASE("RFC 3339 times as Go's encoding/json writes them", "[unit][health]") {
  CHECK(kproxy::cli::formatRfc3339Nano(kT0) == "2024-05-01T10:00:00Z");
  CHECK(kproxy::cli::formatRfc3339Nano(kT0 + 0.25) == "2024-05-01T10:00:00.25Z");
  CHECK(kproxy::cli::formatRfc3339Nano(kT0 + 1.000123) == "2024-05-01T10:00:01.000123Z");
  CHECK(kproxy::cli::formatRfc3339Nano(0) == "0001-01-01T00:00:00Z");
}

TEST_CASE("healthy while nothing is queued, even before the first sync", "[unit][health]") {
  HealthInput in = input();
  in.nowWall = kT0 + 3600;  // long after start, but nothing was ever queued
  const HttpResponse r = kproxy::cli::healthzResponse(in);
  CHECK(r.status == 200);
  CHECK(r.contentType == "application/json");
  CHECK(header(r, "X-Content-Type-Options") == "nosniff");
  const Json body = Json::parse(r.body);
  CHECK(body["healthy"] == true);
  CHECK(body["nodeEligible"] == true);
  // While healthy, lastUpdated is reported as now (upstream's compatibility rule) ...
  CHECK(body["lastUpdated"] == "2024-05-01T11:00:00Z");
  CHECK(body["currentTime"] == "2024-05-01T11:00:00Z");
  // ... while the per-family status has the real last update (the loop start here).
  CHECK(body["status"]["IPv4"]["lastUpdated"] == "2024-05-01T10:00:00Z");
  CHECK(body["status"]["IPv4"]["healthy"] == true);
}

TEST_CASE("a queued change becomes unhealthy exactly at the timeout", "[unit][health]") {
  HealthInput in = input();
  in.lastSuccessWall = kT0 + 10;
  in.oldestQueuedWall = kT0 + 20;

  in.nowWall = kT0 + 20 + 59.999;
  CHECK(kproxy::cli::evaluateProxyHealth(in).healthy);
  CHECK(kproxy::cli::livezResponse(in).status == 200);
  CHECK(kproxy::cli::healthzResponse(in).status == 200);

  in.nowWall = kT0 + 20 + 60;
  CHECK_FALSE(kproxy::cli::evaluateProxyHealth(in).healthy);
  const HttpResponse livez = kproxy::cli::livezResponse(in);
  const HttpResponse healthz = kproxy::cli::healthzResponse(in);
  CHECK(livez.status == 503);
  CHECK(healthz.status == 503);
  const Json body = Json::parse(healthz.body);
  CHECK(body["healthy"] == false);
  // Unhealthy: lastUpdated is the last successful sync, not now.
  CHECK(body["lastUpdated"] == "2024-05-01T10:00:10Z");
  CHECK(body["currentTime"] == "2024-05-01T10:01:20Z");
  CHECK(body["status"]["IPv4"]["healthy"] == false);
  CHECK_FALSE(Json::parse(livez.body).contains("nodeEligible"));
}

TEST_CASE("a first sync that never happens makes the proxy unhealthy", "[unit][health]") {
  HealthInput in = input();
  in.oldestQueuedWall = kT0 + 1;  // events arrived, no sync ever succeeded
  in.nowWall = kT0 + 61;
  const auto h = kproxy::cli::evaluateProxyHealth(in);
  CHECK_FALSE(h.healthy);
  CHECK(h.lastUpdated == kT0);  // upstream marks the loop start as the last update
}

TEST_CASE("a Node being deleted fails /healthz but not /livez", "[unit][health]") {
  HealthInput in = input();
  in.nodeDeleting = true;
  const HttpResponse healthz = kproxy::cli::healthzResponse(in);
  CHECK(healthz.status == 503);
  const Json body = Json::parse(healthz.body);
  CHECK(body["nodeEligible"] == false);
  CHECK(body["healthy"] == true);  // the proxier itself is fine
  CHECK(kproxy::cli::livezResponse(in).status == 200);
}

TEST_CASE("a Node not seen yet fails /healthz when the source has Nodes, as upstream", "[unit][health]") {
  HealthInput in = input();
  in.nodeRequired = true;
  in.nodeSeen = false;
  const HttpResponse healthz = kproxy::cli::healthzResponse(in);
  CHECK(healthz.status == 503);
  CHECK(Json::parse(healthz.body)["nodeEligible"] == false);
  CHECK(kproxy::cli::livezResponse(in).status == 200);
  in.nodeSeen = true;
  CHECK(kproxy::cli::healthzResponse(in).status == 200);
  // A manifest directory has no Node to wait for.
  in.nodeRequired = false;
  in.nodeSeen = false;
  CHECK(kproxy::cli::healthzResponse(in).status == 200);
}

TEST_CASE("dual-stack status lists each family", "[unit][health]") {
  HealthInput in = input();
  in.families = {"IPv4", "IPv6"};
  const Json body = Json::parse(kproxy::cli::livezResponse(in).body);
  CHECK(body["status"].size() == 2);
  CHECK(body["status"].contains("IPv6"));
}

TEST_CASE("service health check: 200 with local endpoints, 503 without or when unhealthy", "[unit][health]") {
  const HttpResponse ok = kproxy::cli::serviceHealthResponse("default", "web", 2, true);
  CHECK(ok.status == 200);
  CHECK(ok.contentType == "application/json");
  CHECK(header(ok, "X-Content-Type-Options") == "nosniff");
  CHECK(header(ok, "X-Load-Balancing-Endpoint-Weight") == "2");
  CHECK(ok.body ==
        "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n"
        "\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}");
  const Json parsed = Json::parse(ok.body);
  CHECK(parsed["service"]["name"] == "web");

  const HttpResponse none = kproxy::cli::serviceHealthResponse("default", "web", 0, true);
  CHECK(none.status == 503);
  CHECK(header(none, "X-Load-Balancing-Endpoint-Weight") == "0");
  CHECK(Json::parse(none.body)["localEndpoints"] == 0);

  const HttpResponse sick = kproxy::cli::serviceHealthResponse("default", "web", 1, false);
  CHECK(sick.status == 503);
  CHECK(Json::parse(sick.body)["serviceProxyHealthy"] == false);
}
