#include "kproxy/apiwatch/decode.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace net = kproxy::net;

using kproxy::apiwatch::decodeEndpointSlice;
using kproxy::apiwatch::decodeNode;
using kproxy::apiwatch::decodeObject;
using kproxy::apiwatch::decodeService;
using kproxy::apiwatch::decodeServiceCIDR;
using kproxy::apiwatch::decodeStatus;
using kproxy::apiwatch::decodeWatchEvent;
using kproxy::apiwatch::UnknownObject;
using kproxy::apiwatch::WatchEventType;
using kproxy::apiwatch::yamlToJson;
using nlohmann::json;
namespace core = kproxy::core;

namespace {

/// A fixture recorded from the real kube-apiserver (tests/unit/apiwatch/fixtures/record.sh).
json loadFixture(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(KPROXY_FIXTURES_DIR) / name;
  INFO("fixture " << path.string() << " (re-record with fixtures/record.sh)");
  REQUIRE(std::filesystem::exists(path));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

json fromYaml(const std::string& text) {
  auto converted = yamlToJson(YAML::Load(text), text.size());
  INFO((converted ? std::string() : converted.error().message()));
  REQUIRE(converted.has_value());
  return *converted;
}

/// Decodes and returns the error's context; fails the test when decoding succeeds.
template <typename Decoder>
std::string errorOf(Decoder decode, const json& object) {
  auto result = decode(object);
  REQUIRE_FALSE(result.has_value());
  CHECK(result.error().category == core::ErrorCategory::kDecode);
  return result.error().context;
}

auto svcDecoder = [](const json& j) { return decodeService(j); };
auto sliceDecoder = [](const json& j) { return decodeEndpointSlice(j); };
auto nodeDecoder = [](const json& j) { return decodeNode(j); };

}  // namespace

TEST_CASE("a Service as the apiserver sends it: every field kproxy uses is read", "[unit]") {
  const json recorded = loadFixture("core.v1.Service.json");
  auto svc = decodeService(recorded);
  INFO((svc ? std::string() : svc.error().message()));
  REQUIRE(svc.has_value());
  CHECK(svc->ns == "default");
  CHECK(svc->name == "web");
  // Of its labels only the one a proxy reads is kept.
  CHECK(svc->labels == core::Labels{{core::kLabelServiceProxyName, "kproxy-test"}});
  CHECK(svc->resourceVersion == recorded["metadata"]["resourceVersion"].get<std::string>());
  CHECK(svc->type == core::ServiceType::kLoadBalancer);
  // Allocated by the apiserver, IPv6 first as asked.
  REQUIRE(svc->clusterIPs.size() == 2);
  CHECK_THAT(svc->clusterIPs[0], Catch::StartsWith("fd00:10:96::"));
  CHECK_THAT(svc->clusterIPs[1], Catch::StartsWith("10.96."));
  CHECK(svc->ipFamilies == std::vector<net::Family>{net::Family::kIPv6, net::Family::kIPv4});
  REQUIRE(svc->ports.size() == 2);
  const auto& http = svc->ports[0];
  CHECK(http.name == "http");
  CHECK(http.protocol == core::Protocol::kTCP);
  CHECK(http.port == 80);
  CHECK(http.targetPort.name == "web-http");
  CHECK(http.targetPort.number == 0);
  CHECK(http.nodePort == 30080);
  CHECK(http.appProtocol == std::optional<std::string>("kubernetes.io/h2c"));
  const auto& sctp = svc->ports[1];
  CHECK(sctp.protocol == core::Protocol::kSCTP);
  CHECK(sctp.port == 9000);
  CHECK(sctp.targetPort.number == 9000);
  CHECK(sctp.nodePort >= 30000);  // allocated from the default node-port range
  CHECK(sctp.nodePort <= 32767);
  CHECK_FALSE(sctp.appProtocol.has_value());
  CHECK(svc->externalIPs == std::vector<std::string>{"203.0.113.10"});
  REQUIRE(svc->loadBalancerIngress.size() == 2);
  CHECK(svc->loadBalancerIngress[0].ip == "192.0.2.10");
  CHECK(svc->loadBalancerIngress[0].ipMode == core::LoadBalancerIPMode::kProxy);
  CHECK(svc->loadBalancerIngress[1].ip.empty());
  CHECK(svc->loadBalancerIngress[1].hostname == "lb.example.com");
  CHECK(svc->loadBalancerSourceRanges == std::vector<std::string>{"198.51.100.0/24"});
  CHECK(svc->externalTrafficPolicy == core::TrafficPolicy::kLocal);
  CHECK(svc->internalTrafficPolicy == core::TrafficPolicy::kLocal);
  CHECK(svc->healthCheckNodePort == recorded["spec"]["healthCheckNodePort"].get<int>());
  CHECK(svc->healthCheckNodePort >= 30000);
  CHECK(svc->sessionAffinity == core::SessionAffinity::kClientIP);
  CHECK(svc->sessionAffinityTimeoutSeconds == 600);
  CHECK(svc->trafficDistribution == std::optional<std::string>("PreferClose"));
  CHECK(svc->externalName.empty());
}

TEST_CASE("a recorded Service with an enum value Kubernetes does not define is an error naming "
          "the field",
          "[unit]") {
  const std::vector<std::pair<json::json_pointer, std::string>> enums = {
      {json::json_pointer("/spec/type"), "spec.type"},
      {json::json_pointer("/spec/ports/1/protocol"), "spec.ports[1].protocol"},
      {json::json_pointer("/spec/ipFamilies/0"), "spec.ipFamilies[0]"},
      {json::json_pointer("/spec/sessionAffinity"), "spec.sessionAffinity"},
      {json::json_pointer("/spec/externalTrafficPolicy"), "spec.externalTrafficPolicy"},
      {json::json_pointer("/spec/internalTrafficPolicy"), "spec.internalTrafficPolicy"},
      {json::json_pointer("/status/loadBalancer/ingress/0/ipMode"),
       "status.loadBalancer.ingress[0].ipMode"},
  };
  for (const auto& [pointer, path] : enums) {
    json j = loadFixture("core.v1.Service.json");
    REQUIRE(j.contains(pointer));
    j[pointer] = "BogusValue";
    const std::string error = errorOf(svcDecoder, j);
    INFO(error);
    CHECK_THAT(error, Catch::StartsWith("Service default/web: " + path + ": "));
    CHECK_THAT(error, Catch::Contains("BogusValue"));
  }
  // spec.clusterIP is spec.clusterIPs[0]; a recorded object where they differ is refused.
  json j = loadFixture("core.v1.Service.json");
  j["spec"]["clusterIP"] = j["spec"]["clusterIPs"][1];
  CHECK_THAT(errorOf(svcDecoder, j), Catch::StartsWith("Service default/web: spec.clusterIP: "));
}

TEST_CASE("an EndpointSlice as the apiserver sends it: every field kproxy uses is read",
          "[unit]") {
  const json recorded = loadFixture("discovery.k8s.io.v1.EndpointSlice.json");
  auto slice = decodeEndpointSlice(recorded);
  INFO((slice ? std::string() : slice.error().message()));
  REQUIRE(slice.has_value());
  CHECK(slice->ns == "default");
  CHECK(slice->name == "web-abc12");
  CHECK(slice->labels.empty());  // managed-by is not a label a proxy reads
  CHECK(slice->serviceName == "web");
  CHECK(slice->resourceVersion == recorded["metadata"]["resourceVersion"].get<std::string>());
  CHECK(slice->addressType == core::AddressType::kIPv4);
  REQUIRE(slice->ports.size() == 1);
  CHECK(slice->ports[0].name == std::optional<std::string>("http"));
  CHECK(slice->ports[0].protocol == core::Protocol::kTCP);
  CHECK(slice->ports[0].port == 8080);
  CHECK(slice->ports[0].appProtocol == std::optional<std::string>("kubernetes.io/h2c"));
  REQUIRE(slice->endpoints.size() == 2);
  const auto& ready = slice->endpoints[0];
  CHECK(ready.addresses == std::vector<std::string>{"10.244.1.5"});
  CHECK(ready.conditions.ready == true);
  CHECK(ready.conditions.serving == true);
  CHECK(ready.conditions.terminating == false);
  CHECK(ready.nodeName == std::optional<std::string>("node-a"));
  CHECK(ready.zone == std::optional<std::string>("zone-a"));
  REQUIRE(ready.hints.has_value());
  CHECK(ready.hints->forZones == std::vector<std::string>{"zone-a"});
  CHECK(ready.hints->forNodes == std::vector<std::string>{"node-a"});
  const auto& terminating = slice->endpoints[1];
  CHECK(terminating.addresses == std::vector<std::string>{"10.244.2.7"});
  CHECK(terminating.conditions.ready == false);
  CHECK(terminating.conditions.serving == true);
  CHECK(terminating.conditions.terminating == true);
  CHECK(terminating.nodeName == std::optional<std::string>("node-b"));
  CHECK_FALSE(terminating.hints.has_value());
}

TEST_CASE("a recorded EndpointSlice with an enum value Kubernetes does not define is an error",
          "[unit]") {
  json j = loadFixture("discovery.k8s.io.v1.EndpointSlice.json");
  j["addressType"] = "BogusType";
  CHECK_THAT(errorOf(sliceDecoder, j),
             Catch::StartsWith("EndpointSlice default/web-abc12: addressType: "));
  j["addressType"] = "IPv4";
  j["ports"][0]["protocol"] = "BogusProtocol";
  const std::string error = errorOf(sliceDecoder, j);
  CHECK_THAT(error, Catch::StartsWith("EndpointSlice default/web-abc12: ports[0].protocol: "));
  CHECK_THAT(error, Catch::Contains("\"BogusProtocol\""));
}

TEST_CASE("a Node as the apiserver sends it", "[unit]") {
  const json recorded = loadFixture("core.v1.Node.json");
  auto node = decodeNode(recorded);
  INFO((node ? std::string() : node.error().message()));
  REQUIRE(node.has_value());
  CHECK(node->name == "node-a");
  CHECK(node->resourceVersion == recorded["metadata"]["resourceVersion"].get<std::string>());
  CHECK(node->labels.at(core::kLabelTopologyZone) == "zone-a");
  CHECK(node->podCIDRs == std::vector<std::string>{"10.244.1.0/24", "fd00:10:244:1::/64"});
  CHECK(node->addresses == std::vector<core::NodeAddress>{{"InternalIP", "10.0.0.1"},
                                                          {"InternalIP", "fd00::1"},
                                                          {"Hostname", "node-a"}});
  CHECK_FALSE(node->deleting);
}

TEST_CASE("watch events and Status objects as the apiserver sends them", "[unit]") {
  // The Service's status change, as a watcher from the version before it receives it.
  json event = loadFixture("core.v1.WatchEvent.json");
  auto decoded = decodeWatchEvent(event);
  INFO((decoded ? std::string() : decoded.error().message()));
  REQUIRE(decoded.has_value());
  CHECK(decoded->type == WatchEventType::kModified);
  CHECK(decoded->object == event["object"]);
  CHECK(decoded->resourceVersion == event["object"]["metadata"]["resourceVersion"].get<std::string>());
  CHECK_FALSE(decoded->status.has_value());
  auto object = decodeObject(decoded->object);
  REQUIRE(object.has_value());
  REQUIRE(std::holds_alternative<core::Service>(*object));
  CHECK(std::get<core::Service>(*object).loadBalancerIngress.size() == 2);

  // An event type the API does not define is an error naming it.
  event["type"] = "BogusEvent";
  const std::string error = errorOf([](const json& j) { return decodeWatchEvent(j); }, event);
  CHECK_THAT(error, Catch::Contains("type"));
  CHECK_THAT(error, Catch::Contains("BogusEvent"));

  // A kind kproxy does not decode is reported as unknown rather than failing.
  json custom = loadFixture("core.v1.WatchEvent.json")["object"];
  custom["apiVersion"] = "example.com/v1";
  custom["kind"] = "CustomType";
  auto unknown = decodeObject(custom);
  REQUIRE(unknown.has_value());
  REQUIRE(std::holds_alternative<UnknownObject>(*unknown));
  CHECK(std::get<UnknownObject>(*unknown).kind == "CustomType");
  CHECK(std::get<UnknownObject>(*unknown).apiVersion == "example.com/v1");
  CHECK(std::get<UnknownObject>(*unknown).name == "web");

  // The answer to a GET of a Service that does not exist.
  auto notFound = decodeStatus(loadFixture("core.v1.Status.json"));
  REQUIRE(notFound.has_value());
  CHECK(notFound->status == "Failure");
  CHECK(notFound->code == 404);
  CHECK(notFound->reason == "NotFound");
  CHECK_THAT(notFound->message, Catch::Contains("\"absent\""));
  CHECK_FALSE(notFound->retryAfterSeconds.has_value());

  // A watch from a version the apiserver no longer has: an ERROR event carrying 410 Expired.
  const json expiredEvent = loadFixture("core.v1.WatchEvent.expired.json");
  auto expired = decodeWatchEvent(expiredEvent);
  REQUIRE(expired.has_value());
  CHECK(expired->type == WatchEventType::kError);
  REQUIRE(expired->status.has_value());
  CHECK(expired->status->status == "Failure");
  CHECK(expired->status->code == 410);
  CHECK(expired->status->reason == "Expired");
  CHECK(*expired->status == *decodeStatus(expiredEvent["object"]));

  // What the apiserver's in-flight limit answers (no fixture: a test apiserver is not easily
  // overloaded); details.retryAfterSeconds is read.
  auto tooMany = decodeStatus(json::parse(R"({"kind":"Status","apiVersion":"v1","metadata":{},
      "status":"Failure","message":"Too many requests, please try again later.",
      "reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429})"));
  REQUIRE(tooMany.has_value());
  CHECK(tooMany->code == 429);
  CHECK(tooMany->retryAfterSeconds == std::optional<std::int32_t>(1));
}

TEST_CASE("watch events: types, bookmarks and malformed events", "[unit]") {
  auto bookmark = decodeWatchEvent(json::parse(R"({"type":"BOOKMARK","object":{"kind":"Service",
      "apiVersion":"v1","metadata":{"resourceVersion":"12345"}}})"));
  REQUIRE(bookmark.has_value());
  CHECK(bookmark->type == WatchEventType::kBookmark);
  CHECK(bookmark->resourceVersion == "12345");

  for (const char* type : {"ADDED", "MODIFIED", "DELETED"}) {
    auto e = decodeWatchEvent(json{{"type", type}, {"object", json::object()}});
    REQUIRE(e.has_value());
    CHECK(std::string(kproxy::apiwatch::toString(e->type)) == type);
  }

  auto expired = decodeWatchEvent(json::parse(R"js({"type":"ERROR","object":{"kind":"Status",
      "apiVersion":"v1","status":"Failure","message":"too old resource version: 1 (2)",
      "reason":"Expired","code":410}})js"));
  REQUIRE(expired.has_value());
  REQUIRE(expired->status.has_value());
  CHECK(expired->status->code == 410);
  CHECK(expired->status->reason == "Expired");
  CHECK_FALSE(expired->status->retryAfterSeconds.has_value());

  auto decodeEvent = [](const json& j) { return decodeWatchEvent(j); };
  CHECK_THAT(errorOf(decodeEvent, json{{"object", json::object()}}), Catch::Contains("type"));
  CHECK_THAT(errorOf(decodeEvent, json{{"type", "ADDED"}}), Catch::Contains("object"));
  CHECK_THAT(errorOf(decodeEvent, json{{"type", "ADDED"}, {"object", "x"}}),
             Catch::Contains("object: expected an object"));
  CHECK_THAT(errorOf(decodeEvent, json{{"type", "ERROR"}, {"object", {{"code", "410"}}}}),
             Catch::Contains("code"));
  CHECK_THAT(errorOf(decodeEvent, json::array()), Catch::Contains("expected an object"));
}

TEST_CASE("Services and EndpointSlices keep the labels a proxy reads, and only those", "[unit]") {
  auto svc = decodeService(json::parse(R"({"metadata":{"name":"a","labels":{
      "app":"a","service.kubernetes.io/service-proxy-name":"other","service.kubernetes.io/headless":""}}})"));
  REQUIRE(svc.has_value());
  CHECK(svc->labels == core::Labels{{core::kLabelServiceProxyName, "other"}, {core::kLabelHeadless, ""}});

  auto slice = decodeEndpointSlice(json::parse(R"({"metadata":{"name":"a-1","labels":{
      "kubernetes.io/service-name":"a","endpointslice.kubernetes.io/managed-by":"x",
      "service.kubernetes.io/headless":""}},"addressType":"IPv4"})"));
  REQUIRE(slice.has_value());
  CHECK(slice->serviceName == "a");
  CHECK(slice->labels == core::Labels{{core::kLabelHeadless, ""}});

  auto node = decodeNode(json::parse(R"({"metadata":{"name":"n","labels":{"a":"1","b":"2"}}})"));
  REQUIRE(node.has_value());
  CHECK(node->labels.size() == 2);
}

TEST_CASE("a realistic NodePort Service from YAML, with API defaulting", "[unit]") {
  auto svc = decodeService(fromYaml(R"(
apiVersion: v1
kind: Service
metadata:
  name: web
  labels: {app: web, tier: "1"}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    targetPort: http-alt
    nodePort: 30080
  - name: dns
    protocol: UDP
    port: 53
  - name: metrics
    port: 9090
    targetPort: 9100
)"));
  REQUIRE(svc.has_value());
  CHECK(svc->ns == "default");
  CHECK(svc->labels.empty());  // app and tier mean nothing to a proxy
  CHECK(svc->type == core::ServiceType::kNodePort);
  CHECK(svc->clusterIPs == std::vector<std::string>{"10.96.0.10"});
  CHECK(svc->ipFamilies == std::vector<net::Family>{net::Family::kIPv4});
  REQUIRE(svc->ports.size() == 3);
  CHECK(svc->ports[0].protocol == core::Protocol::kTCP);
  CHECK(svc->ports[0].targetPort == core::TargetPort{0, "http-alt"});
  CHECK(svc->ports[0].nodePort == 30080);
  CHECK_FALSE(svc->ports[0].appProtocol.has_value());
  CHECK(svc->ports[1].protocol == core::Protocol::kUDP);
  CHECK(svc->ports[1].targetPort == core::TargetPort{53, ""});  // defaults to port
  CHECK(svc->ports[2].targetPort == core::TargetPort{9100, ""});
  CHECK(svc->externalTrafficPolicy == core::TrafficPolicy::kCluster);
  CHECK(svc->internalTrafficPolicy == core::TrafficPolicy::kCluster);
  CHECK(svc->sessionAffinity == core::SessionAffinity::kNone);
  CHECK(svc->sessionAffinityTimeoutSeconds == core::kDefaultStickyMaxAgeSeconds);
  CHECK_FALSE(svc->trafficDistribution.has_value());
  CHECK(svc->loadBalancerIngress.empty());
}

TEST_CASE("dual-stack, headless and ExternalName Services", "[unit]") {
  auto dual = decodeService(json::parse(R"({"metadata":{"name":"d","namespace":"n"},
      "spec":{"clusterIPs":["fd00::10","10.0.0.10"],"ports":[{"port":443}]}})"));
  REQUIRE(dual.has_value());
  CHECK(dual->clusterIPs == std::vector<std::string>{"fd00::10", "10.0.0.10"});
  // ipFamilies omitted: derived from the addresses as the API server would.
  CHECK(dual->ipFamilies ==
        std::vector<net::Family>{net::Family::kIPv6, net::Family::kIPv4});

  auto headless = decodeService(json::parse(R"({"metadata":{"name":"h"},
      "spec":{"clusterIP":"None","ipFamilies":["IPv4"]}})"));
  REQUIRE(headless.has_value());
  CHECK(headless->clusterIPs == std::vector<std::string>{"None"});
  CHECK(headless->ipFamilies == std::vector<net::Family>{net::Family::kIPv4});

  auto external = decodeService(json::parse(R"({"metadata":{"name":"e"},
      "spec":{"type":"ExternalName","externalName":"db.example.com","clusterIP":""}})"));
  REQUIRE(external.has_value());
  CHECK(external->type == core::ServiceType::kExternalName);
  CHECK(external->externalName == "db.example.com");
  CHECK(external->clusterIPs.empty());
  CHECK(external->ipFamilies.empty());
}

TEST_CASE("a realistic EndpointSlice", "[unit]") {
  auto slice = decodeEndpointSlice(fromYaml(R"(
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc12
  namespace: shop
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
- {}
endpoints:
- addresses: ["10.244.1.5"]
  conditions: {ready: true}
  nodeName: node-a
  zone: zone-1
  hints:
    forZones: [{name: zone-1}]
- addresses: ["10.244.2.7"]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: ["10.244.3.9"]
)"));
  INFO((slice ? std::string() : slice.error().message()));
  REQUIRE(slice.has_value());
  CHECK(slice->ns == "shop");
  CHECK(slice->serviceName == "web");
  CHECK(slice->addressType == core::AddressType::kIPv4);
  REQUIRE(slice->ports.size() == 2);
  CHECK(slice->ports[0] == core::EndpointPort{"http", core::Protocol::kTCP, 8080, std::nullopt});
  // An empty port means "all ports"; defaulting still fills name and protocol.
  CHECK(slice->ports[1] ==
        core::EndpointPort{"", core::Protocol::kTCP, std::nullopt, std::nullopt});
  REQUIRE(slice->endpoints.size() == 3);
  CHECK(slice->endpoints[0].hints.value().forZones == std::vector<std::string>{"zone-1"});
  CHECK(slice->endpoints[0].hints.value().forNodes.empty());
  CHECK(slice->endpoints[0].conditions.serving == std::nullopt);
  CHECK(slice->endpoints[1].conditions == core::EndpointConditions{false, true, true});
  CHECK_FALSE(slice->endpoints[1].nodeName.has_value());
  CHECK_FALSE(slice->endpoints[1].hints.has_value());
  CHECK(slice->endpoints[2].conditions == core::EndpointConditions{});
}

TEST_CASE("Nodes: the cluster autoscaler's taint marks the node as being deleted", "[unit]") {
  auto node = decodeNode(json::parse(R"({"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a"},
      "spec":{"taints":[{"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"},
                        {"key":"ToBeDeletedByClusterAutoscaler","value":"1718000000","effect":"NoSchedule"}]}})"));
  REQUIRE(node.has_value());
  CHECK_FALSE(node->deleting);
  CHECK(node->taints == std::vector<core::Taint>{{"node.kubernetes.io/unschedulable", "", "NoSchedule"},
                                                 {"ToBeDeletedByClusterAutoscaler", "1718000000", "NoSchedule"}});
  CHECK(node->beingDeleted());

  auto cordoned = decodeNode(json::parse(R"({"metadata":{"name":"n"},
      "spec":{"taints":[{"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"}]}})"));
  REQUIRE(cordoned.has_value());
  CHECK_FALSE(cordoned->beingDeleted());  // cordoned or drained is not being deleted

  auto bad = decodeNode(json::parse(R"({"metadata":{"name":"n"},"spec":{"taints":[{"key":7}]}})"));
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message(), Catch::Contains("spec.taints[0].key"));
}

TEST_CASE("Nodes: addresses, pod CIDRs and deletion", "[unit]") {
  auto node = decodeNode(json::parse(R"({"kind":"Node","apiVersion":"v1",
      "metadata":{"name":"node-a","resourceVersion":"7","labels":{"topology.kubernetes.io/zone":"z1"},
                  "deletionTimestamp":"2024-01-01T00:00:00Z"},
      "spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","fd00:1::/64"]},
      "status":{"addresses":[{"type":"InternalIP","address":"192.168.1.10"},
                             {"type":"Hostname","address":"node-a"}]}})"));
  REQUIRE(node.has_value());
  CHECK(node->name == "node-a");
  CHECK(node->resourceVersion == "7");
  CHECK(node->labels.at(core::kLabelTopologyZone) == "z1");
  CHECK(node->deleting);
  CHECK(node->podCIDRs == std::vector<std::string>{"10.244.1.0/24", "fd00:1::/64"});
  CHECK(node->addresses ==
        std::vector<core::NodeAddress>{{"InternalIP", "192.168.1.10"}, {"Hostname", "node-a"}});

  auto old = decodeNode(json::parse(R"({"metadata":{"name":"n","namespace":"ignored"},
      "spec":{"podCIDR":"10.244.9.0/24"}})"));
  REQUIRE(old.has_value());
  CHECK(old->podCIDRs == std::vector<std::string>{"10.244.9.0/24"});
  CHECK_FALSE(old->deleting);

  CHECK_THAT(errorOf(nodeDecoder, json::parse(R"({"metadata":{"name":"n"},
      "status":{"addresses":[{"type":1}]}})")),
             Catch::Equals("Node n: status.addresses[0].type: expected a string, got number"));
}

TEST_CASE("decodeObject dispatches on kind and apiVersion", "[unit]") {
  auto svc =
      decodeObject(json::parse(R"({"kind":"Service","apiVersion":"v1","metadata":{"name":"a"}})"));
  REQUIRE(svc.has_value());
  CHECK(std::holds_alternative<core::Service>(*svc));
  CHECK(kproxy::apiwatch::describe(*svc) == "Service default/a");

  auto slice =
      decodeObject(json::parse(R"({"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1",
      "metadata":{"name":"a-1","namespace":"x"},"addressType":"IPv6"})"));
  REQUIRE(slice.has_value());
  CHECK(std::get<core::EndpointSlice>(*slice).addressType == core::AddressType::kIPv6);

  auto node = decodeObject(json::parse(R"({"kind":"Node","metadata":{"name":"n1"}})"));
  REQUIRE(node.has_value());
  CHECK(std::holds_alternative<core::Node>(*node));

  auto deployment = decodeObject(json::parse(R"({"kind":"Deployment","apiVersion":"apps/v1",
      "metadata":{"name":"web","namespace":"shop"},"spec":{"replicas":"not checked"}})"));
  REQUIRE(deployment.has_value());
  CHECK(std::get<UnknownObject>(*deployment) ==
        UnknownObject{"apps/v1", "Deployment", "shop", "web"});

  // Another version of a known kind has another schema: not decoded as if it were v1.
  auto beta =
      decodeObject(json::parse(R"({"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1beta1",
      "metadata":{"name":"old"}})"));
  REQUIRE(beta.has_value());
  CHECK(std::holds_alternative<UnknownObject>(*beta));

  auto decode = [](const json& j) { return decodeObject(j); };
  CHECK_THAT(errorOf(decode, json::parse(R"({"metadata":{"name":"a"}})")), Catch::Contains("kind"));
  CHECK_THAT(errorOf(decode, json::parse(R"({"kind":7})")), Catch::Contains("kind"));
  CHECK_THAT(errorOf(decode, json::parse(R"({"kind":"Service","apiVersion":1})")),
             Catch::Contains("apiVersion"));
  CHECK_THAT(errorOf(decode, json::parse(R"([1,2])")), Catch::Contains("expected an object"));
  // A known kind that fails to decode is an error, not an unknown object.
  CHECK_THAT(errorOf(decode, json::parse(R"({"kind":"Service","metadata":{"name":"a"},
      "spec":{"ports":[{"port":0}]}})")),
             Catch::Contains("Service default/a: spec.ports[0].port"));
}

TEST_CASE("decode errors name the object and the JSON path", "[unit]") {
  auto svc = [](const char* spec) {
    return json::parse(std::string(R"({"metadata":{"name":"web","namespace":"shop"},"spec":)") +
                       spec + "}");
  };
  struct Case {
    const char* spec;
    const char* expected;
  };
  const Case cases[] = {
      {R"({"ports":[{"port":"80"}]})",
       "Service shop/web: spec.ports[0].port: expected an integer, got string"},
      {R"({"ports":[{"port":70000}]})",
       "Service shop/web: spec.ports[0].port: 70000 is out of range [1, 65535]"},
      {R"({"ports":[{"port":-1}]})", "Service shop/web: spec.ports[0].port: -1 is out of range"},
      {R"({"ports":[{"port":1.5}]})",
       "Service shop/web: spec.ports[0].port: expected an integer, got a fraction"},
      {R"({"ports":[{"name":"x"}]})",
       "Service shop/web: spec.ports[0].port: required field is missing"},
      {R"({"ports":[{"port":80,"nodePort":65536}]})",
       "Service shop/web: spec.ports[0].nodePort: 65536 is out of range"},
      {R"({"ports":[{"port":80,"targetPort":70000}]})",
       "Service shop/web: spec.ports[0].targetPort: 70000 is out of range"},
      {R"({"ports":[{"port":80,"targetPort":true}]})",
       "Service shop/web: spec.ports[0].targetPort: expected an integer or a string, got boolean"},
      {R"({"ports":[{"port":80},{"port":81,"protocol":"HTTP"}]})",
       "Service shop/web: spec.ports[1].protocol: unsupported value \"HTTP\" (want TCP, UDP or "
       "SCTP)"},
      {R"({"ports":[{"port":80,"protocol":"tcp"}]})",
       "Service shop/web: spec.ports[0].protocol: unsupported value \"tcp\""},
      {R"({"ports":{"port":80}})", "Service shop/web: spec.ports: expected an array, got object"},
      {R"({"type":"Ingress"})", "Service shop/web: spec.type: unsupported value \"Ingress\""},
      {R"({"externalTrafficPolicy":"Global"})",
       "Service shop/web: spec.externalTrafficPolicy: unsupported value"},
      {R"({"internalTrafficPolicy":"Node"})",
       "Service shop/web: spec.internalTrafficPolicy: unsupported value"},
      {R"({"sessionAffinity":"Cookie"})",
       "Service shop/web: spec.sessionAffinity: unsupported value"},
      {R"({"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":0}}})",
       "Service shop/web: spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is out of range "
       "[1, 86400]"},
      {R"({"healthCheckNodePort":99999})",
       "Service shop/web: spec.healthCheckNodePort: 99999 is out of range"},
      {R"({"externalIPs":"1.2.3.4"})",
       "Service shop/web: spec.externalIPs: expected an array, got string"},
      {R"({"externalIPs":[1]})",
       "Service shop/web: spec.externalIPs[0]: expected a string, got number"},
      {R"({"clusterIP":"10.0.0.1","clusterIPs":["10.0.0.2"]})",
       "Service shop/web: spec.clusterIP: \"10.0.0.1\" does not match"},
      {R"({"ipFamilies":["IPv5"]})",
       "Service shop/web: spec.ipFamilies[0]: unsupported value \"IPv5\""},
      {R"("x")", "Service shop/web: spec: expected an object, got string"},
  };
  for (const auto& c : cases) {
    const std::string error = errorOf(svcDecoder, svc(c.spec));
    INFO("spec " << c.spec << " -> " << error);
    CHECK_THAT(error, Catch::StartsWith(c.expected));
  }

  CHECK(errorOf(svcDecoder, json::parse(R"({"metadata":{"namespace":"shop"}})")) ==
        "Service in namespace shop: metadata.name: required field is missing or empty");
  CHECK(errorOf(svcDecoder, json::parse(R"({"spec":{}})")) ==
        "Service in namespace default: metadata.name: required field is missing or empty");
  CHECK(errorOf(svcDecoder, json::parse(R"({"metadata":{"name":5}})")) ==
        "metadata.name: expected a string, got number");
  CHECK(errorOf(svcDecoder, json::parse(R"({"kind":"Pod","metadata":{"name":"a"}})")) ==
        "kind: expected \"Service\", got \"Pod\"");
  CHECK(errorOf(svcDecoder, json::parse(R"({"metadata":{"name":"a","labels":{"x":1}}})")) ==
        "Service default/a: metadata.labels.x: expected a string, got number");
  CHECK(errorOf(svcDecoder, json::parse(R"({"metadata":{"name":"a"},
      "status":{"loadBalancer":{"ingress":[{"ip":"1.1.1.1","ipMode":"Tunnel"}]}}})")) ==
        "Service default/a: status.loadBalancer.ingress[0].ipMode: unsupported value \"Tunnel\" "
        "(want VIP or Proxy)");

  auto slice = [](const char* body) {
    return json::parse(std::string(R"({"metadata":{"name":"s","namespace":"n"},)") + body + "}");
  };
  CHECK(errorOf(sliceDecoder, slice(R"("endpoints":[])")) ==
        "EndpointSlice n/s: addressType: required field is missing");
  CHECK(errorOf(sliceDecoder, slice(R"("addressType":"IPv4","endpoints":[{"addresses":["a"],
      "conditions":{"ready":"yes"}}])")) ==
        "EndpointSlice n/s: endpoints[0].conditions.ready: expected a boolean, got string");
  CHECK(errorOf(sliceDecoder, slice(R"("addressType":"IPv4","ports":[{"port":0}])")) ==
        "EndpointSlice n/s: ports[0].port: 0 is out of range [1, 65535]");
  CHECK(
      errorOf(sliceDecoder, slice(R"("addressType":"IPv4","endpoints":[{"hints":
      {"forNodes":[{"name":""}]}}])")) ==
      "EndpointSlice n/s: endpoints[0].hints.forNodes[0].name: required field is missing or empty");
}

TEST_CASE("yamlToJson keeps YAML scalar types as Kubernetes users expect", "[unit]") {
  json j = fromYaml(R"(
plainInt: 80
quotedInt: "80"
singleQuoted: '80'
negative: -12
hex: 0x1F
octal: 0o17
float: 1.5
exp: 1e3
yes: true
no: false
capital: True
word: yes
tilde: ~
nullWord: null
empty:
tagged: !!str 80
taggedInt: !!int "42"
version: 1.20
ip: 10.0.0.1
block: |
  line
list: [1, "1", a]
nested: {a: {b: [true]}}
)");
  CHECK(j["plainInt"] == json(80));
  CHECK(j["plainInt"].is_number_integer());
  CHECK(j["quotedInt"] == json("80"));
  CHECK(j["singleQuoted"] == json("80"));
  CHECK(j["negative"] == json(-12));
  CHECK(j["hex"] == json(31));
  CHECK(j["octal"] == json(15));
  CHECK(j["float"] == json(1.5));
  CHECK(j["exp"] == json(1000.0));
  CHECK(j["yes"] == json(true));
  CHECK(j["no"] == json(false));
  CHECK(j["capital"] == json(true));
  CHECK(j["word"] == json("yes"));  // YAML 1.2: only true/false are booleans
  CHECK(j["tilde"].is_null());
  CHECK(j["nullWord"].is_null());
  CHECK(j["empty"].is_null());
  CHECK(j["tagged"] == json("80"));
  CHECK(j["taggedInt"] == json(42));
  CHECK(j["version"] == json(1.2));
  CHECK(j["ip"] == json("10.0.0.1"));
  CHECK(j["block"] == json("line\n"));
  CHECK(j["list"] == json::array({1, "1", "a"}));
  CHECK(j["nested"]["a"]["b"][0] == json(true));

  CHECK(fromYaml("").is_null());
  CHECK(fromYaml("- 1\n- x\n") == json::array({1, "x"}));

  auto badInt = yamlToJson(YAML::Load("spec:\n  port: !!int eighty\n"), 64);
  REQUIRE_FALSE(badInt.has_value());
  CHECK(badInt.error().category == core::ErrorCategory::kDecode);
  CHECK_THAT(badInt.error().context,
             Catch::StartsWith("spec.port (line 2): \"eighty\" is not an integer"));

  auto complexKey = yamlToJson(YAML::Load("? [a, b]\n: 1\n"), 64);
  REQUIRE_FALSE(complexKey.has_value());
  CHECK_THAT(complexKey.error().context, Catch::Contains("mapping keys must be scalars"));
}

TEST_CASE("YAML with quoted numbers decodes as Kubernetes would", "[unit]") {
  // A quoted port is a string: the API server rejects it, so do we (naming the field).
  const std::string error = errorOf(svcDecoder, fromYaml(R"(
metadata: {name: q}
spec:
  ports:
  - port: "80"
)"));
  CHECK(error == "Service default/q: spec.ports[0].port: expected an integer, got string");
  // A quoted targetPort is a port name.
  auto svc = decodeService(
      fromYaml("metadata: {name: q}\nspec: {ports: [{port: 80, targetPort: \"8080\"}]}"));
  REQUIRE(svc.has_value());
  CHECK(svc->ports[0].targetPort == core::TargetPort{0, "8080"});
}

TEST_CASE("the last-change-trigger-time annotation is read; a bad one is ignored", "[unit]") {
  auto slice = decodeEndpointSlice(fromYaml(R"(
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2026-11-22T00:40:00.25Z"}
addressType: IPv4
)"));
  REQUIRE(slice);
  REQUIRE(slice->lastChangeTriggerTime);
  CHECK(*slice->lastChangeTriggerTime == Approx(1795308000.25));
  auto offset = decodeEndpointSlice(fromYaml(R"(
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2026-11-22T01:40:00+01:00"}
addressType: IPv4
)"));
  REQUIRE(offset);
  REQUIRE(offset->lastChangeTriggerTime);
  CHECK(*offset->lastChangeTriggerTime == Approx(1795308000.0));
  auto bad = decodeEndpointSlice(fromYaml(R"(
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "yesterday"}
addressType: IPv4
)"));
  REQUIRE(bad);
  CHECK_FALSE(bad->lastChangeTriggerTime);
}

TEST_CASE("ServiceCIDR: spec.cidrs read as given; wrong types are errors naming the field", "[unit]") {
  auto cidr = decodeServiceCIDR(json::parse(R"({"kind":"ServiceCIDR","apiVersion":"networking.k8s.io/v1",
      "metadata":{"name":"kubernetes","resourceVersion":"7"},
      "spec":{"cidrs":["10.96.0.0/12","fd00:10:96::/112"]},
      "status":{"conditions":[{"type":"Ready","status":"True"}]}})"));
  REQUIRE(cidr.has_value());
  CHECK(*cidr == core::ServiceCIDR{"kubernetes", "7", {"10.96.0.0/12", "fd00:10:96::/112"}});
  // No spec: no CIDRs (the object still exists).
  auto bare = decodeServiceCIDR(json::parse(R"({"metadata":{"name":"empty"}})"));
  REQUIRE(bare.has_value());
  CHECK(bare->cidrs.empty());

  auto decoder = [](const json& j) { return decodeServiceCIDR(j); };
  CHECK_THAT(errorOf(decoder, json::parse(R"({"metadata":{"name":"x"},"spec":{"cidrs":"10.0.0.0/8"}})")),
             Catch::Contains("ServiceCIDR x: spec.cidrs"));
  CHECK_THAT(errorOf(decoder, json::parse(R"({"metadata":{"name":"x"},"spec":{"cidrs":[7]}})")),
             Catch::Contains("ServiceCIDR x: spec.cidrs[0]"));
  CHECK_THAT(errorOf(decoder, json::parse(R"({"metadata":{},"spec":{}})")), Catch::Contains("metadata.name"));

  auto dispatched = decodeObject(json::parse(R"({"kind":"ServiceCIDR","apiVersion":"networking.k8s.io/v1",
      "metadata":{"name":"kubernetes"},"spec":{"cidrs":["10.96.0.0/12"]}})"));
  REQUIRE(dispatched.has_value());
  CHECK(std::holds_alternative<core::ServiceCIDR>(*dispatched));
  CHECK(kproxy::apiwatch::describe(*dispatched) == "ServiceCIDR kubernetes");
  // The beta version has the same schema, but kproxy reads v1 only (GA since 1.33).
  auto beta = decodeObject(json::parse(R"({"kind":"ServiceCIDR","apiVersion":"networking.k8s.io/v1beta1",
      "metadata":{"name":"old"}})"));
  REQUIRE(beta.has_value());
  CHECK(std::holds_alternative<UnknownObject>(*beta));
}
