// ApiSource against an in-process fake API server on 127.0.0.1 (plain HTTP, port 0): paging,
// selectors, initial sync order, watch events, malformed objects, 410 → relist and reconcile,
// reconnect after the stream ends. The real kube-apiserver is exercised by tests/e2e.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kproxy/apiwatch/api_source.h"
#include "kproxy/core/log.h"
#include "log_capture.h"
#include "loopback_server.h"

using nlohmann::json;
using namespace kproxy;
using namespace std::chrono_literals;

namespace {

/// How long a test waits for an event before it takes it for a hang: a ceiling, never a measure
/// (the machine may be slow, loaded, or running sanitizers).
constexpr std::chrono::milliseconds kHang = 60s;

std::string queryParam(const std::string& target, const std::string& key) {
  auto q = target.find('?');
  if (q == std::string::npos) return {};
  std::string rest = target.substr(q + 1);
  std::size_t start = 0;
  while (start <= rest.size()) {
    auto amp = rest.find('&', start);
    std::string part = rest.substr(start, amp == std::string::npos ? std::string::npos : amp - start);
    if (part.starts_with(key + "=")) return part.substr(key.size() + 1);
    if (amp == std::string::npos) break;
    start = amp + 1;
  }
  return {};
}

/// Serves LISTs from `items` (paged by limit/continue) and WATCHes from per-path event queues.
class FakeApiServer {
 public:
  FakeApiServer() { port = server_.port(); }
  ~FakeApiServer() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
  }

  int port = 0;

  void setItems(const std::string& path, std::vector<json> items, std::string rv) {
    std::lock_guard lock(mutex_);
    items_[path] = std::move(items);
    listRv_[path] = std::move(rv);
  }
  void push(const std::string& path, json event) {
    {
      std::lock_guard lock(mutex_);
      events_[path].push_back(event.dump() + "\n");
    }
    changed_.notify_all();
  }
  /// Ends every open watch stream (as a server timeout or restart would).
  void endWatches() {
    {
      std::lock_guard lock(mutex_);
      ++watchGeneration_;
    }
    changed_.notify_all();
  }
  /// The next `n` LIST requests that carry a continue token are answered 410 (token expired).
  void expireContinueTokens(int n) {
    std::lock_guard lock(mutex_);
    expireContinue_ = n;
  }
  std::vector<std::string> requests() {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  /// Every request for `path` is answered with `code` and a Status (a resource the server does
  /// not have, or RBAC refusing it); 0 serves it again.
  void refuse(const std::string& path, int code) {
    std::lock_guard lock(mutex_);
    refused_[path] = code;
  }
  int openWatches() {
    std::lock_guard lock(mutex_);
    return openWatches_;
  }

 private:
  void serve(int fd, const std::string& target) {
    std::string path = target.substr(0, target.find('?'));
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(target);
    }
    int refusal = 0;
    {
      std::lock_guard lock(mutex_);
      refusal = refused_[path];
    }
    if (refusal != 0) {
      std::string status = json{{"kind", "Status"}, {"status", "Failure"}, {"code", refusal},
                                {"reason", refusal == 404 ? "NotFound" : "Forbidden"},
                                {"message", "refused by the test"}}.dump();
      const char* reason = refusal == 404 ? "Not Found" : "Forbidden";
      testing::sendAll(fd, testing::jsonResponse(fmt::format("{} {}", refusal, reason), status));
    } else if (queryParam(target, "watch") == "1") {
      serveWatch(fd, path);
    } else {
      serveList(fd, path, target);
    }
  }

  void serveList(int fd, const std::string& path, const std::string& target) {
    json body;
    {
      std::lock_guard lock(mutex_);
      if (!queryParam(target, "continue").empty() && expireContinue_ > 0) {
        --expireContinue_;
        std::string status = json{{"kind", "Status"}, {"status", "Failure"}, {"code", 410}, {"reason", "Expired"},
                                  {"message", "The provided continue parameter is too old"}}.dump();
        testing::sendAll(fd, testing::jsonResponse("410 Gone", status));
        return;
      }
      const auto& items = items_[path];
      std::size_t limit = std::stoul(queryParam(target, "limit").empty() ? "1000" : queryParam(target, "limit"));
      std::string cont = queryParam(target, "continue");
      std::size_t start = cont.empty() ? 0 : std::stoul(cont);
      std::size_t end = std::min(items.size(), start + limit);
      body = {{"kind", "List"}, {"apiVersion", "v1"},
              {"metadata", {{"resourceVersion", listRv_[path]}}}, {"items", json::array()}};
      for (std::size_t i = start; i < end; ++i) body["items"].push_back(items[i]);
      if (end < items.size()) body["metadata"]["continue"] = std::to_string(end);
    }
    testing::sendAll(fd, testing::jsonResponse("200 OK", body.dump()));
  }

  void serveWatch(int fd, const std::string& path) {
    if (!testing::sendAll(fd, testing::kChunkedJsonHead)) return;
    std::unique_lock lock(mutex_);
    ++openWatches_;
    int generation = watchGeneration_;
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || generation != watchGeneration_ || !events_[path].empty(); });
      if (stopping_ || generation != watchGeneration_) break;
      std::string line = std::move(events_[path].front());
      events_[path].pop_front();
      lock.unlock();
      bool ok = testing::sendAll(fd, fmt::format("{:x}\r\n{}\r\n", line.size(), line));
      lock.lock();
      if (!ok) break;
    }
    --openWatches_;
    lock.unlock();
    testing::sendAll(fd, "0\r\n\r\n");
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  int watchGeneration_ = 0;
  int openWatches_ = 0;
  int expireContinue_ = 0;
  std::map<std::string, std::vector<json>> items_;
  std::map<std::string, int> refused_;
  std::map<std::string, std::string> listRv_;
  std::map<std::string, std::deque<std::string>> events_;
  std::vector<std::string> requests_;
  // Last, so that it stops (joining the connections) while the members above are still there.
  testing::LoopbackServer server_{[this](int fd, const std::string& target) { serve(fd, target); }};
};

/// Records sink calls as text lines, in order.
class RecordingSink final : public core::EventSink {
 public:
  void serviceUpserted(core::Service s) override {
    add(fmt::format("upsert Service {}/{} port={}", s.ns, s.name, s.ports.empty() ? 0 : s.ports[0].port));
  }
  void serviceDeleted(const std::string& ns, const std::string& name) override {
    add(fmt::format("delete Service {}/{}", ns, name));
  }
  void endpointSliceUpserted(core::EndpointSlice s) override {
    add(fmt::format("upsert EndpointSlice {}/{}", s.ns, s.name));
  }
  void endpointSliceDeleted(const std::string& ns, const std::string& name) override {
    add(fmt::format("delete EndpointSlice {}/{}", ns, name));
  }
  void nodeUpserted(core::Node n) override { add("upsert Node " + n.name); }
  void nodeDeleted(const std::string& name) override { add("delete Node " + name); }
  void serviceCIDRUpserted(core::ServiceCIDR c) override {
    add(fmt::format("upsert ServiceCIDR {} {}", c.name, fmt::join(c.cidrs, ",")));
  }
  void serviceCIDRDeleted(const std::string& name) override { add("delete ServiceCIDR " + name); }
  void servicesSynced() override { add("servicesSynced"); }
  void endpointSlicesSynced() override { add("endpointSlicesSynced"); }

  std::vector<std::string> events() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  bool waitFor(const std::string& line, std::chrono::milliseconds timeout = kHang) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return std::find(events_.begin(), events_.end(), line) != events_.end(); });
  }
  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
  }

 private:
  void add(std::string line) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(line));
    }
    cv_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

json service(const std::string& name, int port, const std::string& rv) {
  return {{"metadata", {{"namespace", "default"}, {"name", name}, {"resourceVersion", rv}}},
          {"spec", {{"clusterIP", "10.96.0.10"}, {"ports", {{{"port", port}, {"protocol", "TCP"}}}}}}};
}

json slice(const std::string& name, const std::string& rv) {
  return {{"metadata", {{"namespace", "default"}, {"name", name}, {"resourceVersion", rv},
                        {"labels", {{"kubernetes.io/service-name", "a"}}}}},
          {"addressType", "IPv4"},
          {"endpoints", {{{"addresses", {"10.244.1.10"}}, {"conditions", {{"ready", true}}}}}},
          {"ports", {{{"port", 8080}, {"protocol", "TCP"}}}}};
}

json event(const std::string& type, json object) { return {{"type", type}, {"object", std::move(object)}}; }

template <typename F>
bool eventually(F f, std::chrono::milliseconds timeout = kHang) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

constexpr const char* kServices = "/api/v1/services";
constexpr const char* kSlices = "/apis/discovery.k8s.io/v1/endpointslices";
constexpr const char* kNodes = "/api/v1/nodes";
constexpr const char* kServiceCIDRs = "/apis/networking.k8s.io/v1/servicecidrs";

}  // namespace

TEST_CASE("ApiSource lists, syncs, watches, skips malformed objects and relists on 410", "[unit]") {
  testing::LogCapture logs;

  FakeApiServer server;
  json broken = service("broken", 80, "4");
  broken["spec"]["ports"][0]["protocol"] = "CARRIER-PIGEON";
  server.setItems(kServices, {service("a", 80, "1"), broken, service("b", 81, "3")}, "10");
  server.setItems(kSlices, {slice("a-1", "5")}, "10");
  server.setItems(kNodes, {{{"metadata", {{"name", "n1"}, {"resourceVersion", "7"}}}}}, "10");

  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  apiwatch::ApiSourceOptions options;
  options.nodeName = "n1";
  options.pageSize = 2;
  options.initialBackoff = 20ms;
  options.maxBackoff = 100ms;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());

  REQUIRE(sink.waitFor("servicesSynced"));
  REQUIRE(sink.waitFor("endpointSlicesSynced"));
  REQUIRE(sink.waitFor("upsert Node n1"));
  REQUIRE(eventually([&] { return server.openWatches() == 4; }));  // with ServiceCIDRs

  auto events = sink.events();
  auto pos = [&](const std::string& line) {
    return std::find(events.begin(), events.end(), line) - events.begin();
  };
  // Both pages were read; the broken service was skipped; upserts come before the sync signal.
  CHECK(pos("upsert Service default/a port=80") < pos("servicesSynced"));
  CHECK(pos("upsert Service default/b port=81") < pos("servicesSynced"));
  CHECK(pos("upsert EndpointSlice default/a-1") < pos("endpointSlicesSynced"));
  CHECK(std::count_if(events.begin(), events.end(), [](const std::string& e) { return e.find("broken") != std::string::npos; }) == 0);
  CHECK(source.stats().decodeFailures == 1);
  CHECK(eventually([&] { return source.stats().connected; }));
  {
    auto warnings = logs.linesContaining("Service default/broken");
    bool named = std::any_of(warnings.begin(), warnings.end(), [](const std::string& w) {
      return w.find("protocol") != std::string::npos;
    });
    CHECK(named);
  }

  // Requests carried upstream's selectors, paging and the watch parameters.
  auto requests = server.requests();
  auto sent = [&](const std::string& path, const std::string& needle) {
    return std::any_of(requests.begin(), requests.end(), [&](const std::string& r) {
      return r.starts_with(path + "?") && r.find(needle) != std::string::npos;
    });
  };
  CHECK(sent(kServices, "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name"));
  CHECK(sent(kSlices, "labelSelector=%21service.kubernetes.io%2Fheadless"));
  CHECK(sent(kServices, "continue=2"));
  CHECK(sent(kNodes, "fieldSelector=metadata.name%3Dn1"));
  CHECK(sent(kServices, "watch=1&allowWatchBookmarks=true&resourceVersion=10"));

  SECTION("watch events: modify, delete, malformed, bookmark") {
    sink.clear();
    server.push(kServices, event("MODIFIED", service("a", 8080, "11")));
    server.push(kServices, event("ADDED", broken));
    server.push(kServices, event("DELETED", service("b", 81, "12")));
    server.push(kServices, event("BOOKMARK", {{"metadata", {{"resourceVersion", "20"}}}}));
    server.push(kSlices, event("DELETED", slice("a-1", "13")));
    REQUIRE(sink.waitFor("delete Service default/b"));
    REQUIRE(sink.waitFor("delete EndpointSlice default/a-1"));
    auto seen = sink.events();
    auto firstService = std::find_if(seen.begin(), seen.end(), [](const std::string& e) {
      return e.find(" Service ") != std::string::npos;
    });
    REQUIRE(firstService != seen.end());
    CHECK(*firstService == "upsert Service default/a port=8080");
    CHECK(eventually([&] { return source.stats().bookmarks == 1; }));
    CHECK(source.stats().decodeFailures == 2);

    SECTION("a watch that ends is resumed from the bookmark's resourceVersion, no relist") {
      auto listsBefore = source.stats().lists;
      server.endWatches();
      REQUIRE(eventually([&] {
        auto r = server.requests();
        return std::any_of(r.begin(), r.end(), [](const std::string& t) {
          return t.starts_with(std::string(kServices) + "?watch=1") && t.find("resourceVersion=20") != std::string::npos;
        });
      }));
      CHECK(source.stats().lists == listsBefore);
    }

    SECTION("410 Expired relists and reconciles: gone objects deleted, unchanged ones untouched") {
      // While "disconnected", a was left as is, b stays deleted, c appeared.
      server.setItems(kServices, {service("a", 8080, "11"), service("c", 82, "30")}, "31");
      sink.clear();
      server.push(kServices, event("ERROR", {{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
                                             {"code", 410}, {"reason", "Expired"},
                                             {"message", "too old resource version"}}));
      REQUIRE(sink.waitFor("upsert Service default/c port=82"));
      CHECK(eventually([&] { return source.stats().relists == 1 && source.stats().expired == 1; }));
      auto after = sink.events();
      CHECK(after == std::vector<std::string>{"upsert Service default/c port=82"});
      // The new watch resumes from the relist's resourceVersion.
      CHECK(eventually([&] {
        auto r = server.requests();
        return std::any_of(r.begin(), r.end(), [](const std::string& t) {
          return t.starts_with(std::string(kServices) + "?watch=1") && t.find("resourceVersion=31") != std::string::npos;
        });
      }));
    }
  }

  SECTION("a relist deletes objects that vanished while the watch was down") {
    server.setItems(kServices, {service("b", 81, "3")}, "40");
    sink.clear();
    server.push(kServices, event("ERROR", {{"kind", "Status"}, {"code", 410}, {"reason", "Gone"}}));
    REQUIRE(sink.waitFor("delete Service default/a"));
    CHECK(sink.events() == std::vector<std::string>{"delete Service default/a"});
  }

  source.stop();
}

TEST_CASE("the pages of one LIST do not wait for the client-side rate limit", "[unit]") {
  FakeApiServer server;
  std::vector<json> items;
  for (int i = 0; i < 12; ++i) items.push_back(service(fmt::format("s{}", i), 80, std::to_string(i + 1)));
  server.setItems(kServices, items, "20");
  server.setItems(kSlices, {}, "20");
  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  // One request every 100 s after the first three (the Service, EndpointSlice and ServiceCIDR
  // LISTs): 11 rate-limited pages would take over 18 min, far past kHang.
  config.qps = 0.01f;
  config.burst = 3;
  apiwatch::ApiSourceOptions options;
  options.pageSize = 1;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());
  const auto started = std::chrono::steady_clock::now();
  REQUIRE(sink.waitFor("servicesSynced"));
  CHECK(std::chrono::steady_clock::now() - started < kHang);
  auto events = sink.events();
  CHECK(std::count_if(events.begin(), events.end(), [](const std::string& e) {
          return e.starts_with("upsert Service default/s");
        }) == 12);
}

TEST_CASE("a LIST page's items are decoded as they are parsed, whatever their shape", "[unit]") {
  // Items are taken from the parser one by one; one that is not an object, or an object that
  // holds objects of its own, is still decoded (or skipped) as one item.
  FakeApiServer server;
  json nested = service("nested", 80, "2");
  nested["metadata"]["annotations"] = {{"a", "b"}};
  server.setItems(kServices, {service("first", 80, "1"), json(7), nested, json::array()}, "20");
  server.setItems(kSlices, {}, "20");
  RecordingSink sink;
  apiwatch::ApiSourceOptions options;
  options.pageSize = 3;
  apiwatch::ApiSource source(testing::loopbackClientConfig(server.port), sink, options);
  REQUIRE(source.start());
  REQUIRE(sink.waitFor("servicesSynced"));
  auto events = sink.events();
  CHECK(std::count(events.begin(), events.end(), "upsert Service default/first port=80") == 1);
  CHECK(std::count(events.begin(), events.end(), "upsert Service default/nested port=80") == 1);
  CHECK(source.stats().decodeFailures == 2);
}

TEST_CASE("ApiSource restarts a LIST whose continue token expired", "[unit]") {
  FakeApiServer server;
  server.setItems(kServices, {service("a", 80, "1"), service("b", 81, "2"), service("c", 82, "3")}, "10");
  server.setItems(kSlices, {}, "10");
  server.expireContinueTokens(1);
  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  apiwatch::ApiSourceOptions options;
  options.pageSize = 2;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());
  REQUIRE(sink.waitFor("servicesSynced"));
  auto events = sink.events();
  for (const char* name : {"a", "b", "c"}) {
    CHECK(std::count_if(events.begin(), events.end(), [&](const std::string& e) {
            return e.starts_with(fmt::format("upsert Service default/{} ", name));
          }) == 1);
  }
  auto requests = server.requests();
  CHECK(std::count_if(requests.begin(), requests.end(), [](const std::string& r) {
          return r.starts_with(std::string(kServices) + "?limit=2") && r.find("continue=") == std::string::npos;
        }) == 2);
  CHECK(source.stats().requestFailures == 0);
  source.stop();
}

TEST_CASE("ApiSource reopens a watch that outlives its timeoutSeconds", "[unit]") {
  FakeApiServer server;  // never ends a watch on its own
  server.setItems(kServices, {}, "10");
  server.setItems(kSlices, {}, "10");
  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  apiwatch::ApiSourceOptions options;
  options.watchTimeout = 1s;
  options.watchGrace = 1s;
  options.initialBackoff = 10ms;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());
  auto watches = [&] {
    auto r = server.requests();
    return std::count_if(r.begin(), r.end(), [](const std::string& t) {
      return t.starts_with(std::string(kServices) + "?watch=1") && t.find("timeoutSeconds=1&") != std::string::npos;
    });
  };
  CHECK(eventually([&] { return watches() >= 2; }));
  CHECK(source.stats().lists == 3);  // Services, EndpointSlices, ServiceCIDRs: resumed, not relisted
  source.stop();
}

TEST_CASE("ApiSource keeps retrying an unreachable server and reports the failures", "[unit]") {
  std::atomic<int> failures = 0;
  auto previousSink = log::setSink([&](log::Severity, std::string_view line) {
    if (line.find("API request failed; retrying") != std::string_view::npos) ++failures;
  });
  int port = 0;
  {
    FakeApiServer closed;  // take a free port, then close it
    port = closed.port;
  }
  RecordingSink sink;
  apiwatch::ClientConfig config;
  config.serverText = fmt::format("http://127.0.0.1:{}", port);
  config.server = *apiwatch::parseServerUrl(config.serverText);
  apiwatch::ApiSourceOptions options;
  options.initialBackoff = 10ms;
  options.maxBackoff = 40ms;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());
  CHECK(eventually([&] { return failures.load() >= 4; }));
  CHECK(source.stats().requestFailures >= 4);
  CHECK_FALSE(source.stats().connected);
  CHECK(sink.events().empty());
  source.stop();
  log::setSink(previousSink);
}

TEST_CASE("ApiSource refuses a CA that is not PEM", "[unit]") {
  RecordingSink sink;
  apiwatch::ClientConfig config;
  config.serverText = "https://127.0.0.1:1";
  config.server = *apiwatch::parseServerUrl(config.serverText);
  config.caPem = "not a certificate";
  apiwatch::ApiSource source(config, sink);
  auto started = source.start();
  REQUIRE_FALSE(started);
  CHECK(started.error().category == core::ErrorCategory::kInvalidArgument);
}

TEST_CASE("ApiSource refuses to send a bearer token over plain http without the opt-in", "[unit]") {
  RecordingSink sink;
  apiwatch::ClientConfig config;
  config.serverText = "http://127.0.0.1:1";
  config.server = *apiwatch::parseServerUrl(config.serverText);
  config.token = apiwatch::TokenSource::fixed("secret");
  {
    apiwatch::ApiSource source(config, sink);
    auto started = source.start();
    REQUIRE_FALSE(started);
    CHECK(started.error().category == core::ErrorCategory::kInvalidArgument);
    CHECK(started.error().message().find("http://127.0.0.1:1") != std::string::npos);
  }
  config.allowHttpCredentials = true;
  apiwatch::ApiSource source(config, sink);
  CHECK(source.start());
  source.stop();
}

TEST_CASE("ApiSource lists and watches ServiceCIDRs before it says Services are synced", "[unit]") {
  FakeApiServer server;
  server.setItems(kServices, {service("a", 80, "1")}, "10");
  server.setItems(kServiceCIDRs,
                  {{{"metadata", {{"name", "kubernetes"}, {"resourceVersion", "2"}}},
                    {"spec", {{"cidrs", {"10.96.0.0/12", "fd00:10:96::/112"}}}}}},
                  "10");
  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  apiwatch::ApiSource source(config, sink, {});
  REQUIRE(source.start());
  REQUIRE(sink.waitFor("servicesSynced"));
  auto events = sink.events();
  auto at = [&](const std::string& line) { return std::find(events.begin(), events.end(), line) - events.begin(); };
  CHECK(at("upsert ServiceCIDR kubernetes 10.96.0.0/12,fd00:10:96::/112") < at("servicesSynced"));
  REQUIRE(eventually([&] { return source.stats().connected; }));
  server.push(kServiceCIDRs, event("ADDED", {{"metadata", {{"name", "extra"}, {"resourceVersion", "11"}}},
                                             {"spec", {{"cidrs", {"10.100.0.0/16"}}}}}));
  CHECK(sink.waitFor("upsert ServiceCIDR extra 10.100.0.0/16"));
  server.push(kServiceCIDRs, event("DELETED", {{"metadata", {{"name", "extra"}, {"resourceVersion", "12"}}}}));
  CHECK(sink.waitFor("delete ServiceCIDR extra"));
  source.stop();
}

TEST_CASE("ApiSource treats ServiceCIDRs it may not read (403) or the server lacks (404) as none",
          "[unit]") {
  for (int code : {403, 404}) {
    DYNAMIC_SECTION("HTTP " << code) {
      testing::LogCapture logs;
      FakeApiServer server;
      server.setItems(kServices, {service("a", 80, "1")}, "10");
      server.refuse(kServiceCIDRs, code);
      RecordingSink sink;
      apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
      apiwatch::ApiSourceOptions options;
      options.initialBackoff = 10ms;
      options.maxBackoff = 40ms;
      apiwatch::ApiSource source(config, sink, options);
      REQUIRE(source.start());
      // Nothing waits for them: Services sync, and the source counts as connected.
      CHECK(sink.waitFor("servicesSynced"));
      CHECK(sink.waitFor("endpointSlicesSynced"));
      CHECK(eventually([&] { return source.stats().connected; }));
      std::this_thread::sleep_for(200ms);  // several backoffs' worth: still one warning
      // Granted (or the server upgraded): picked up by the next attempt.
      server.setItems(kServiceCIDRs, {{{"metadata", {{"name", "kubernetes"}}}, {"spec", {{"cidrs", {"10.96.0.0/12"}}}}}},
                      "11");
      server.refuse(kServiceCIDRs, 0);
      CHECK(sink.waitFor("upsert ServiceCIDR kubernetes 10.96.0.0/12"));
      source.stop();
      auto lines = logs.linesContaining("optional resource cannot be read");
      auto warned = std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
        return l.find("ServiceCIDR") != std::string::npos;
      });
      CHECK(warned == 1);
      CHECK(source.stats().requestFailures == 0);
    }
  }
}

namespace {

/// Records what the client reports for the rest_client_* metrics.
class RecordingRequestMetrics : public apiwatch::RequestMetrics {
 public:
  void requestDone(std::string_view method, std::string_view host, std::string_view code) override {
    std::lock_guard lock(mutex_);
    done_.push_back(fmt::format("{} {} {}", method, host, code));
  }
  void requestLatency(std::string_view verb, std::string_view host, double seconds) override {
    std::lock_guard lock(mutex_);
    if (seconds >= 0) latencies_.push_back(fmt::format("{} {}", verb, host));
  }
  void rateLimiterWait(std::string_view verb, std::string_view host, double seconds) override {
    std::lock_guard lock(mutex_);
    if (seconds >= 0) waits_.push_back(fmt::format("{} {}", verb, host));
  }
  std::size_t count(const std::string& line) const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count(done_.begin(), done_.end(), line));
  }
  std::size_t latencies() const {
    std::lock_guard lock(mutex_);
    return latencies_.size();
  }
  std::size_t waits() const {
    std::lock_guard lock(mutex_);
    return waits_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> done_, latencies_, waits_;
};

}  // namespace

TEST_CASE("ApiSource reports each request for the rest_client metrics: code, method, host", "[unit]") {
  FakeApiServer server;
  server.setItems(kServices, {service("web", 80, "1")}, "10");
  server.setItems(kSlices, {}, "10");
  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  config.qps = 1000;  // limited, so the rate limiter's wait is reported too
  auto metrics = std::make_shared<RecordingRequestMetrics>();
  config.requestMetrics = metrics;
  apiwatch::ApiSource source(config, sink, {});
  REQUIRE(source.start());
  REQUIRE(sink.waitFor("servicesSynced"));
  REQUIRE(sink.waitFor("endpointSlicesSynced"));
  const std::string host = fmt::format("127.0.0.1:{}", server.port);
  // The Service and EndpointSlice LISTs, then their watches, each answered 200.
  CHECK(eventually([&] { return metrics->count("GET " + host + " 200") >= 4; }));
  CHECK(metrics->latencies() >= 2);  // the LISTs (watches are not timed, as in client-go)
  CHECK(metrics->waits() >= 4);
  source.stop();
}

TEST_CASE("ApiSource reports a request without an answer as <error>", "[unit]") {
  int port = 0;
  {
    FakeApiServer closed;  // take a free port, then close it
    port = closed.port;
  }
  testing::LogCapture quiet;  // the retries are expected
  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(port);
  auto metrics = std::make_shared<RecordingRequestMetrics>();
  config.requestMetrics = metrics;
  apiwatch::ApiSourceOptions options;
  options.initialBackoff = 10ms;
  options.maxBackoff = 40ms;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());
  CHECK(eventually([&] { return metrics->count(fmt::format("GET 127.0.0.1:{} <error>", port)) >= 2; }));
  source.stop();
}

TEST_CASE("ApiSource destroyed with requests in flight reports each as <error> and reads nothing freed",
          "[unit]") {
  // A server that completes the TCP handshake (the kernel does, from the backlog) and never
  // answers: every LIST stays suspended until the source is destroyed, and the destruction of
  // those coroutines reports them. (Under the sanitizers this also catches a member of the
  // source that is destroyed before the coroutines that use it.)
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener, 16) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int port = ntohs(address.sin_port);

  RecordingSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(port);
  auto metrics = std::make_shared<RecordingRequestMetrics>();
  config.requestMetrics = metrics;
  apiwatch::ApiSourceOptions options;
  options.requestTimeout = std::chrono::hours(1);  // nothing ends on its own during the test
  std::uint64_t requests = 0;
  {
    apiwatch::ApiSource source(config, sink, options);
    REQUIRE(source.start());
    // The Service and EndpointSlice LISTs (and the ServiceCIDR one) are sent and wait.
    REQUIRE(eventually([&] { return source.stats().requests >= 2; }));
    source.stop();
    requests = source.stats().requests;
    CHECK(metrics->count(fmt::format("GET 127.0.0.1:{} <error>", port)) == 0);
  }
  CHECK(metrics->count(fmt::format("GET 127.0.0.1:{} <error>", port)) == requests);
  ::close(listener);
}
