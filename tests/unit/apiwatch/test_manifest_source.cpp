#include "kproxy/apiwatch/manifest_source.h"

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kproxy/core/events.h"
#include "kproxy/core/log.h"
#include "log_capture.h"

namespace fs = std::filesystem;
namespace core = kproxy::core;
namespace klog = kproxy::log;
using kproxy::apiwatch::ManifestSource;
using kproxy::testing::LogCapture;
using namespace std::chrono_literals;

namespace {

/// Records every call, in order, plus the current state of each object.
class RecordingSink : public core::EventSink {
 public:
  void serviceUpserted(core::Service s) override {
    std::lock_guard lock(mu_);
    events_.push_back("upsert Service " + s.ns + "/" + s.name);
    services_[s.ns + "/" + s.name] = std::move(s);
  }
  void serviceDeleted(const std::string& ns, const std::string& name) override {
    std::lock_guard lock(mu_);
    events_.push_back("delete Service " + ns + "/" + name);
    services_.erase(ns + "/" + name);
  }
  void endpointSliceUpserted(core::EndpointSlice s) override {
    std::lock_guard lock(mu_);
    events_.push_back("upsert EndpointSlice " + s.ns + "/" + s.name);
    slices_[s.ns + "/" + s.name] = std::move(s);
  }
  void endpointSliceDeleted(const std::string& ns, const std::string& name) override {
    std::lock_guard lock(mu_);
    events_.push_back("delete EndpointSlice " + ns + "/" + name);
    slices_.erase(ns + "/" + name);
  }
  void nodeUpserted(core::Node n) override {
    std::lock_guard lock(mu_);
    events_.push_back("upsert Node " + n.name);
    nodes_[n.name] = std::move(n);
  }
  void nodeDeleted(const std::string& name) override {
    std::lock_guard lock(mu_);
    events_.push_back("delete Node " + name);
    nodes_.erase(name);
  }
  void serviceCIDRUpserted(core::ServiceCIDR c) override {
    std::lock_guard lock(mu_);
    events_.push_back("upsert ServiceCIDR " + c.name);
    serviceCIDRs_[c.name] = std::move(c);
  }
  void serviceCIDRDeleted(const std::string& name) override {
    std::lock_guard lock(mu_);
    events_.push_back("delete ServiceCIDR " + name);
    serviceCIDRs_.erase(name);
  }
  std::optional<core::ServiceCIDR> serviceCIDR(const std::string& name) const {
    std::lock_guard lock(mu_);
    auto it = serviceCIDRs_.find(name);
    return it == serviceCIDRs_.end() ? std::nullopt : std::optional(it->second);
  }
  void servicesSynced() override {
    std::lock_guard lock(mu_);
    events_.push_back("servicesSynced");
  }
  void endpointSlicesSynced() override {
    std::lock_guard lock(mu_);
    events_.push_back("endpointSlicesSynced");
  }

  std::vector<std::string> takeEvents() {
    std::lock_guard lock(mu_);
    return std::exchange(events_, {});
  }
  std::vector<std::string> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  std::optional<core::Service> service(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = services_.find(key);
    return it == services_.end() ? std::nullopt : std::optional(it->second);
  }
  std::size_t serviceCount() const {
    std::lock_guard lock(mu_);
    return services_.size();
  }
  std::optional<core::EndpointSlice> slice(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = slices_.find(key);
    return it == slices_.end() ? std::nullopt : std::optional(it->second);
  }
  std::optional<core::Node> node(const std::string& name) const {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(name);
    return it == nodes_.end() ? std::nullopt : std::optional(it->second);
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> events_;
  std::map<std::string, core::Service> services_;
  std::map<std::string, core::EndpointSlice> slices_;
  std::map<std::string, core::Node> nodes_;
  std::map<std::string, core::ServiceCIDR> serviceCIDRs_;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kproxy-apiwatch-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

  /// Writes in place, like an editor that truncates and rewrites.
  void write(const std::string& name, const std::string& content) const {
    std::ofstream out(path_ / name, std::ios::trunc);
    out << content;
    out.close();
    REQUIRE(out.good());
  }
  /// Writes a hidden temp file and renames it into place, like kubectl-style atomic writers.
  void writeAtomic(const std::string& name, const std::string& content) const {
    write("." + name + ".tmp", content);
    fs::rename(path_ / ("." + name + ".tmp"), path_ / name);
  }
  void remove(const std::string& name) const { fs::remove(path_ / name); }

 private:
  fs::path path_;
};

/// How long a test waits for the watcher before it takes it for a hang: a ceiling, never a
/// measure (the machine may be slow, loaded, or running sanitizers).
constexpr std::chrono::milliseconds kHang = 60s;

/// Polls until `done` holds or the deadline passes; returns whether it holds.
bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = kHang) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

/// Waits for the watcher to finish the next directory read after a change.
bool waitForRescan(const ManifestSource& source, std::uint64_t before) {
  return waitUntil([&] { return source.stats().rescans > before; });
}

std::string service(const std::string& name, int port, const std::string& ns = "default") {
  return "apiVersion: v1\nkind: Service\nmetadata:\n  name: " + name + "\n  namespace: " + ns +
         "\nspec:\n  clusterIP: 10.96.0.1\n  ports:\n  - port: " + std::to_string(port) + "\n";
}

/// Writes the Service `late` into `dir` and returns once a running watcher of the same
/// directory (a witness with a sink of its own) has delivered it: by then a watcher that still
/// ran would have acted too. For "nothing was delivered" checks, instead of a fixed sleep.
bool writeLateServiceSeenByWitness(const TempDir& dir) {
  RecordingSink witnessSink;
  ManifestSource witness(dir.path(), witnessSink);
  if (!witness.start().has_value()) return false;
  dir.write("late.yaml", service("late", 80));
  return waitUntil([&] { return witnessSink.service("default/late").has_value(); });
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

TEST_CASE("manifest source: initial read of YAML, multi-document, Lists and JSON", "[unit]") {
  TempDir dir;
  dir.write("a.yaml", service("web", 80) + R"(---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.244.0.5]
---
# a document holding only a comment is no document
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {replicas: 2}
)");
  dir.write("b.json", R"({"kind":"List","apiVersion":"v1","items":[
    {"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a"},"spec":{"podCIDR":"10.244.0.0/24"}},
    {"kind":"Service","apiVersion":"v1","metadata":{"name":"db","namespace":"data"},
     "spec":{"clusterIP":"10.96.0.9","ports":[{"port":5432}]}}]})");
  dir.write("c.yml", R"(apiVersion: v1
kind: ServiceList
items:
- metadata: {name: typed, namespace: x}
  spec: {ports: [{port: 53, protocol: UDP}]}
)");
  // None of these may be read.
  dir.write(".hidden.yaml", service("hidden", 1));
  dir.write("notes.txt", service("txt", 1));
  dir.write("web.yaml~", service("backup", 1));
  dir.write("#web.yaml#", service("autosave", 1));
  fs::create_directory(dir.path() / "sub");
  dir.write("sub/nested.yaml", service("nested", 1));

  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  auto started = source.start();
  INFO((started ? std::string() : started.error().message()));
  REQUIRE(started.has_value());

  // Everything is delivered before start() returns, and the synced calls come last.
  auto events = sink.events();
  REQUIRE(events.size() == 7);
  CHECK(events[5] == "servicesSynced");
  CHECK(events[6] == "endpointSlicesSynced");
  const std::vector<std::string> upserts(events.begin(), events.begin() + 5);
  CHECK(contains(upserts, "upsert Service default/web"));
  CHECK(contains(upserts, "upsert EndpointSlice default/web-1"));
  CHECK(contains(upserts, "upsert Node node-a"));
  CHECK(contains(upserts, "upsert Service data/db"));
  CHECK(contains(upserts, "upsert Service x/typed"));

  CHECK(sink.service("default/web").value().ports.at(0).port == 80);
  CHECK(sink.slice("default/web-1").value().serviceName == "web");
  CHECK(sink.node("node-a").value().podCIDRs == std::vector<std::string>{"10.244.0.0/24"});
  CHECK(sink.service("x/typed").value().ports.at(0).protocol == core::Protocol::kUDP);
  CHECK(source.stats().documentFailures == 0);
  CHECK(source.stats().rescans == 1);
}

TEST_CASE("manifest source: malformed documents are skipped and named, the rest loads", "[unit]") {
  LogCapture logs;
  TempDir dir;
  dir.write("mixed.yaml", service("first", 80) + R"(---
apiVersion: v1
kind: Service
metadata: {name: broken
spec: [
---
apiVersion: v1
kind: Service
metadata: {name: badproto}
spec: {ports: [{port: 80, protocol: HTTP}]}
---
)" + service("last", 81));
  dir.write("broken.json", R"({"kind":"Service", "metadata": )");
  dir.write("good.yaml", service("good", 82));

  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());

  CHECK(sink.service("default/first").has_value());
  CHECK(sink.service("default/last").has_value());
  CHECK(sink.service("default/good").has_value());
  CHECK(sink.serviceCount() == 3);
  CHECK(source.stats().documentFailures == 3);

  auto syntax = logs.linesContaining("document=2");
  REQUIRE(syntax.size() == 1);
  CHECK_THAT(syntax[0], Catch::Contains("mixed.yaml"));
  CHECK_THAT(syntax[0], Catch::Contains("YAML syntax error"));
  auto decode = logs.linesContaining("document=3");
  REQUIRE(decode.size() == 1);
  CHECK_THAT(decode[0], Catch::Contains("mixed.yaml"));
  CHECK_THAT(decode[0], Catch::Contains("Service default/badproto: spec.ports[0].protocol"));
  auto json = logs.linesContaining("broken.json");
  REQUIRE(json.size() == 1);
  CHECK_THAT(json[0], Catch::Contains("JSON syntax error"));
}

TEST_CASE("manifest source: edits, atomic renames and removals arrive as differences", "[unit]") {
  TempDir dir;
  dir.write("a.yaml", service("one", 80) + "---\n" + service("two", 80));
  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());
  sink.takeEvents();

  SECTION("in-place edit: changed object upserted, dropped object deleted, unchanged silent") {
    dir.write("a.yaml", service("one", 8080));
    REQUIRE(waitUntil([&] { return sink.events().size() >= 2; }));
    REQUIRE(waitUntil([&] { return !sink.service("default/two"); }));
    auto events = sink.takeEvents();
    CHECK(events ==
          std::vector<std::string>{"delete Service default/two", "upsert Service default/one"});
    CHECK(sink.service("default/one").value().ports.at(0).port == 8080);
  }

  SECTION("atomic rename into place, then removal") {
    dir.writeAtomic("b.yaml", service("three", 443, "web"));
    REQUIRE(waitUntil([&] { return sink.service("web/three").has_value(); }));
    CHECK(sink.takeEvents() == std::vector<std::string>{"upsert Service web/three"});

    dir.remove("b.yaml");
    REQUIRE(waitUntil([&] { return !sink.service("web/three").has_value(); }));
    CHECK(sink.takeEvents() == std::vector<std::string>{"delete Service web/three"});
  }

  SECTION("renamed away (moved out of the name filter)") {
    fs::rename(dir.path() / "a.yaml", dir.path() / "a.yaml.disabled");
    REQUIRE(waitUntil([&] { return sink.serviceCount() == 0; }));
    CHECK(sink.takeEvents() ==
          std::vector<std::string>{"delete Service default/one", "delete Service default/two"});
  }

  SECTION("rewriting identical content delivers nothing") {
    const auto before = source.stats().rescans;
    dir.write("a.yaml", service("one", 80) + "---\n" + service("two", 80));
    REQUIRE(waitForRescan(source, before));
    CHECK(sink.takeEvents().empty());
  }

  SECTION("atomic replacement of a file changes only what differs") {
    dir.writeAtomic("a.yaml", service("one", 80) + "---\n" + service("two", 90));
    REQUIRE(waitUntil([&] { return sink.service("default/two").value().ports.at(0).port == 90; }));
    CHECK(sink.takeEvents() == std::vector<std::string>{"upsert Service default/two"});
  }
  source.stop();
}

TEST_CASE("manifest source: a file going bad keeps its last good objects", "[unit]") {
  LogCapture logs;
  TempDir dir;
  dir.write("a.yaml", service("one", 80) + "---\n" + service("two", 80));
  dir.write("other.yaml", service("other", 80));
  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());
  sink.takeEvents();

  // Entirely unparseable: nothing is deleted.
  auto before = source.stats().rescans;
  dir.write("a.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [\n");
  REQUIRE(waitForRescan(source, before));
  CHECK(sink.takeEvents().empty());
  CHECK(sink.serviceCount() == 3);
  CHECK(source.stats().documentFailures == 1);
  CHECK_FALSE(logs.linesContaining("keeping its last good objects").empty());

  // Partly valid: the good document applies, the object of the bad one is kept.
  before = source.stats().rescans;
  dir.write("a.yaml", service("one", 9000) +
                          "---\nkind: Service\nmetadata: {name: two}\n"
                          "spec: {ports: [{port: 99999}]}\n");
  REQUIRE(waitForRescan(source, before));
  CHECK(sink.takeEvents() == std::vector<std::string>{"upsert Service default/one"});
  CHECK(sink.service("default/two").value().ports.at(0).port == 80);
  CHECK(source.stats().documentFailures == 2);

  // Valid again: now the absence of "two" is real and it is deleted.
  dir.write("a.yaml", service("one", 9000));
  REQUIRE(waitUntil([&] { return !sink.service("default/two").has_value(); }));
  CHECK(sink.takeEvents() == std::vector<std::string>{"delete Service default/two"});
  CHECK(sink.service("default/other").has_value());
}

TEST_CASE("manifest source: duplicates, last one wins with a warning", "[unit]") {
  LogCapture logs;
  TempDir dir;
  dir.write("a.yaml", service("dup", 1) + "---\n" + service("dup", 2));
  dir.write("b.yaml", service("dup2", 3));
  dir.write("c.yaml", service("dup2", 4));
  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());
  CHECK(sink.service("default/dup").value().ports.at(0).port == 2);
  CHECK(sink.service("default/dup2").value().ports.at(0).port == 4);  // c.yaml sorts after b.yaml
  auto within = logs.linesContaining("defined twice");
  REQUIRE(within.size() == 1);
  CHECK_THAT(within[0], Catch::Contains("a.yaml document 1"));
  CHECK_THAT(within[0], Catch::Contains("a.yaml document 2"));
  CHECK(logs.linesContaining("defined in several manifest files").size() == 1);

  // Removing the winner makes the other definition current.
  dir.remove("c.yaml");
  REQUIRE(waitUntil([&] { return sink.service("default/dup2").value().ports.at(0).port == 3; }));
}

// The directory is watched (inotify), never polled: each change is delivered soon after it is
// written; one that is not arrives never, which the ceiling catches.
TEST_CASE("manifest source: each change is seen as it is written", "[unit]") {
  TempDir dir;
  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());
  CHECK(sink.takeEvents() == std::vector<std::string>{"servicesSynced", "endpointSlicesSynced"});

  for (int port : {80, 81, 82}) {
    dir.writeAtomic("svc.yaml", service("fast", port));
    REQUIRE(waitUntil([&] {
      auto s = sink.service("default/fast");
      return s.has_value() && s->ports.at(0).port == port;
    }));
  }
}

TEST_CASE("manifest source: start and stop", "[unit]") {
  RecordingSink sink;
  SECTION("a missing directory is an error") {
    ManifestSource source("/nonexistent/kproxy-manifests", sink);
    auto started = source.start();
    REQUIRE_FALSE(started.has_value());
    CHECK(started.error().category == core::ErrorCategory::kNotFound);
    CHECK_THAT(started.error().message(), Catch::Contains("/nonexistent/kproxy-manifests"));
    CHECK(sink.events().empty());
  }
  SECTION("a file is not a directory") {
    TempDir dir;
    dir.write("x.yaml", "");
    ManifestSource source(dir.path() / "x.yaml", sink);
    REQUIRE_FALSE(source.start().has_value());
  }
  SECTION("stop is idempotent, start twice fails, nothing is delivered after stop") {
    TempDir dir;
    ManifestSource source(dir.path(), sink);
    REQUIRE(source.start().has_value());
    CHECK_FALSE(source.start().has_value());
    source.stop();
    source.stop();
    sink.takeEvents();
    REQUIRE(writeLateServiceSeenByWitness(dir));
    CHECK(sink.events().empty());
  }
  SECTION("the destructor stops a running watcher") {
    TempDir dir;
    {
      ManifestSource source(dir.path(), sink);
      REQUIRE(source.start().has_value());
    }
    sink.takeEvents();
    REQUIRE(writeLateServiceSeenByWitness(dir));
    CHECK(sink.events().empty());
  }
}

TEST_CASE("manifest source: a ConfigMap-style volume (symlinks swapped atomically)", "[unit]") {
  // The kubelet's atomic writer: files are symlinks through "..data", a symlink to a
  // timestamped directory, and an update swaps "..data" with one rename.
  TempDir dir;
  fs::create_directory(dir.path() / "..v1");
  std::ofstream(dir.path() / "..v1" / "svc.yaml") << service("cm", 80);
  fs::create_directory_symlink("..v1", dir.path() / "..data");
  fs::create_symlink("..data/svc.yaml", dir.path() / "svc.yaml");

  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());
  REQUIRE(sink.service("default/cm").has_value());
  CHECK(sink.service("default/cm").value().ports.at(0).port == 80);
  sink.takeEvents();

  fs::create_directory(dir.path() / "..v2");
  std::ofstream(dir.path() / "..v2" / "svc.yaml") << service("cm", 8443);
  fs::create_directory_symlink("..v2", dir.path() / "..data_tmp");
  fs::rename(dir.path() / "..data_tmp", dir.path() / "..data");
  REQUIRE(waitUntil([&] { return sink.service("default/cm").value().ports.at(0).port == 8443; }));
  CHECK(sink.takeEvents() == std::vector<std::string>{"upsert Service default/cm"});
}

TEST_CASE("manifest source: the directory disappearing deletes nothing; its return is read",
          "[unit]") {
  LogCapture logs;
  TempDir parent;
  const fs::path dir = parent.path() / "manifests";
  fs::create_directory(dir);
  std::ofstream(dir / "a.yaml") << service("kept", 80);
  RecordingSink sink;
  ManifestSource source(dir, sink);
  REQUIRE(source.start().has_value());
  sink.takeEvents();

  fs::remove_all(dir);
  REQUIRE(waitUntil([&] { return source.stats().fileReadFailures > 0; }));
  CHECK(sink.events().empty());
  CHECK(sink.service("default/kept").has_value());
  CHECK_FALSE(logs.linesContaining("keeping the current objects").empty());

  // Put a new directory in place in one rename, as a deployment tool would.
  const fs::path staging = parent.path() / "staging";
  fs::create_directory(staging);
  std::ofstream(staging / "b.yaml") << service("new", 81);
  fs::rename(staging, dir);
  REQUIRE(waitUntil([&] { return sink.service("default/new").has_value(); }));
  REQUIRE(waitUntil([&] { return !sink.service("default/kept").has_value(); }));
  CHECK(sink.takeEvents() ==
        std::vector<std::string>{"delete Service default/kept", "upsert Service default/new"});
}

TEST_CASE("manifest source: ServiceCIDR documents are read; a malformed one is skipped and named",
          "[unit]") {
  LogCapture logs;
  TempDir dir;
  dir.write("cidrs.yaml", R"(apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec:
  cidrs: [10.96.0.0/12, "fd00:10:96::/112"]
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: broken}
spec: {cidrs: 10.100.0.0/16}
)");
  RecordingSink sink;
  ManifestSource source(dir.path(), sink);
  REQUIRE(source.start().has_value());
  CHECK(sink.serviceCIDR("kubernetes").value().cidrs ==
        std::vector<std::string>{"10.96.0.0/12", "fd00:10:96::/112"});
  CHECK_FALSE(sink.serviceCIDR("broken").has_value());
  CHECK(source.stats().documentFailures == 1);
  auto named = logs.linesContaining("ServiceCIDR broken: spec.cidrs");
  CHECK(named.size() == 1);
  sink.takeEvents();

  dir.remove("cidrs.yaml");
  REQUIRE(waitUntil([&] { return !sink.serviceCIDR("kubernetes").has_value(); }));
  CHECK(sink.takeEvents() == std::vector<std::string>{"delete ServiceCIDR kubernetes"});
  source.stop();
}
