#include "kproxy/plugins/loader.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace net = kproxy::net;

namespace fs = std::filesystem;
using kproxy::plugins::PluginRegistry;

namespace {

const fs::path kPluginDir = TEST_PLUGIN_DIR;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kproxy-loader-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const kproxy::core::ServicePortKey kWebKey{kproxy::net::Family::kIPv4, "default/web:http"};

kproxy::core::ServicePortState webPort(std::vector<std::string> endpointIPs) {
  kproxy::core::ServicePortState s;
  s.key = kWebKey;
  s.ns = "default";
  s.serviceName = "web";
  s.portName = "http";
  s.clusterIP = "10.96.0.10";
  s.port = 80;
  s.nodePort = 30080;
  s.type = kproxy::core::ServiceType::kNodePort;
  for (const auto& ip : endpointIPs) {
    kproxy::core::Endpoint e;
    e.ip = ip;
    e.port = 8080;
    e.ready = e.serving = true;
    s.clusterEndpoints.push_back(e);
  }
  s.allReachableEndpoints = s.clusterEndpoints;
  s.allEndpoints = s.clusterEndpoints;
  s.hasAnyEndpoints = !s.clusterEndpoints.empty();
  return s;
}

kproxy::core::NodeInfo nodeA() {
  kproxy::core::NodeInfo node;
  node.name = "node-a";
  node.known = true;
  return node;
}

// The first snapshot a plugin sees: node-a and the web service port with these endpoints.
kproxy::core::Snapshot webSnapshot(std::vector<std::string> endpointIPs) {
  using kproxy::core::ServicePortState;
  auto state = std::make_shared<const ServicePortState>(webPort(std::move(endpointIPs)));
  return kproxy::core::Snapshot().withNode(nodeA()).with(state->key, state).withGeneration(1);
}

}  // namespace

TEST_CASE("loader refuses a missing file, naming it", "[unit]") {
  PluginRegistry registry;
  auto r = registry.load(kPluginDir / "does-not-exist.so");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("does-not-exist.so") && Catch::Contains("no such file"));
}

TEST_CASE("loader refuses a file that is not a shared object", "[unit]") {
  TempDir dir;
  auto junk = dir.path / "junk.so";
  std::ofstream(junk) << "this is not an ELF file\n";
  PluginRegistry registry;
  auto r = registry.load(junk);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("junk.so") &&
                                      Catch::Contains("not a loadable shared object"));
}

TEST_CASE("loader refuses a shared object without the entry point", "[unit]") {
  PluginRegistry registry;
  auto r = registry.load(kPluginDir / "broken" / "broken-no_entry.so");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("broken-no_entry.so") &&
                                      Catch::Contains("does not export kproxy_plugin_entry"));
}

TEST_CASE("loader refuses an entry point returning null", "[unit]") {
  PluginRegistry registry;
  auto r = registry.load(kPluginDir / "broken" / "broken-null_entry.so");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("broken-null_entry.so") &&
                                      Catch::Contains("returned no descriptor"));
}

TEST_CASE("loader refuses another ABI version and names both versions", "[unit]") {
  PluginRegistry registry;
  auto r = registry.load(kPluginDir / "broken" / "broken-wrong_abi.so");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(),
             Catch::Contains("broken-wrong_abi.so") && Catch::Contains("plugin ABI version 2") &&
                 Catch::Contains("supports ABI version 1"));
  CHECK_FALSE(registry.has("future"));
}

TEST_CASE("loader refuses two plugins with one name", "[unit]") {
  PluginRegistry registry;
  auto first = registry.load(kPluginDir / "recorder.so");
  REQUIRE(first);
  CHECK(first->abiMinor == KPROXY_PLUGIN_ABI_MINOR);
  auto r = registry.load(kPluginDir / "duplicate" / "recorder-copy.so");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("recorder-copy.so") &&
                                      Catch::Contains("\"recorder\" is already loaded from") &&
                                      Catch::Contains("recorder.so"));
  CHECK(registry.plugins().size() == 1);
}

TEST_CASE("loading a directory keeps good plugins and reports each bad one", "[unit]") {
  PluginRegistry registry;
  auto errors = registry.loadDirectory(kPluginDir / "broken");
  CHECK(errors.size() == 3);
  CHECK(registry.plugins().empty());
  CHECK(registry.loadDirectory(kPluginDir).empty());
  CHECK(registry.has("recorder"));
  auto missing = registry.loadDirectory(kPluginDir / "nope");
  REQUIRE(missing.size() == 1);
  CHECK_THAT(missing[0].message(), Catch::Contains("not a directory"));
}

TEST_CASE("an unknown mode lists the modes the loaded plugins offer", "[unit]") {
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto r = registry.createBackend("ipvs", {});
  REQUIRE_FALSE(r);
  CHECK(r.error().message() == "unknown proxy mode \"ipvs\"; available: recorder");
}

TEST_CASE("a plugin's create error reaches the host", "[unit]") {
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto r = registry.createBackend("recorder", {});
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("option record-file is required"));
}

TEST_CASE("snapshots, changed keys and options cross the ABI end to end", "[unit]") {
  TempDir dir;
  auto record = dir.path / "record.txt";
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto backend = registry.createBackend("recorder", {{"record-file", record.string()}});
  REQUIRE(backend);
  CHECK((*backend)->name() == "recorder");

  using namespace kproxy::core;
  Snapshot first = webSnapshot({"10.244.1.2", "10.244.1.3"});
  std::vector<ServicePortKey> changed{kWebKey};
  auto r1 = (*backend)->sync(SyncRequest{nullptr, &first, changed, SyncKind::kFull});
  REQUIRE(r1);
  CHECK(r1->operations == 1);
  CHECK(r1->summary == "recorded 1");

  // Remove one endpoint and delete nothing else: the plugin sees exactly that.
  auto smaller = std::make_shared<const ServicePortState>(webPort({"10.244.1.3"}));
  Snapshot second = first.with(smaller->key, smaller).withGeneration(2);
  ServicePortKey gone{net::Family::kIPv4, "default/gone:dns"};
  std::vector<ServicePortKey> changed2{smaller->key, gone};
  REQUIRE((*backend)->sync(SyncRequest{&first, &second, changed2, SyncKind::kPartial}));

  std::string text = readFile(record);
  CHECK_THAT(text, Catch::Contains("sync full=1 previous=0 size=1 node=node-a"));
  CHECK_THAT(text, Catch::Contains("changed v4:default/web:http v4:default/web:http tcp "
                                   "10.96.0.10:80 nodePort=30080 endpoints=10.244.1.2:8080,10.244.1.3:8080"));
  CHECK_THAT(text, Catch::Contains("sync full=0 previous=1 size=1 node=node-a"));
  CHECK_THAT(text, Catch::Contains("endpoints=10.244.1.3:8080\n"));
  CHECK_THAT(text, Catch::Contains("changed v4:default/gone:dns deleted"));
  CHECK_THAT(text, !Catch::Contains("nodeports"));  // not resolved: nothing crosses

  // NodePort addresses the host resolved (ABI 1.2) reach the plugin.
  NodeInfo node = nodeA();
  node.nodePortAddresses.resolved = true;
  node.nodePortAddresses.addresses = {"192.168.2.20", "fd00::20"};
  node.nodePortAddresses.allLocalIPv6 = true;
  Snapshot third = second.withNode(node).withGeneration(3);
  REQUIRE((*backend)->sync(SyncRequest{&second, &third, {}, SyncKind::kPartial}));
  CHECK_THAT(readFile(record), Catch::Contains("nodeports all4=0 all6=1 addresses=192.168.2.20,fd00::20\n"));
  REQUIRE((*backend)->cleanup());
  CHECK_THAT(readFile(record), Catch::EndsWith("cleanup\n"));
}

TEST_CASE("a failed plugin sync is an error carrying the plugin's message and errno", "[unit]") {
  TempDir dir;
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto backend = registry.createBackend(
      "recorder", {{"record-file", (dir.path / "r").string()}, {"fail-sync", "true"}});
  REQUIRE(backend);
  kproxy::core::Snapshot empty;
  auto r = (*backend)->sync({nullptr, &empty, {}, kproxy::core::SyncKind::kFull});
  REQUIRE_FALSE(r);
  CHECK(r.error().errnum == 5);
  // Its name and its errno's text once each, though its message already carries both.
  CHECK(r.error().message() == "recorder: refusing sync as asked (option fail-sync): Input/output error");
}

TEST_CASE("a plugin built against the ABI 1.0 descriptor loads and syncs", "[unit]") {
  PluginRegistry registry;
  auto info = registry.load(kPluginDir / "old" / "old-abi.so");
  REQUIRE(info);
  CHECK(info->name == "old");
  CHECK(info->abiMinor == 0);
  auto backend = registry.createPluginBackend("old", {});
  REQUIRE(backend);
  kproxy::core::Snapshot empty;
  CHECK((*backend)->sync({nullptr, &empty, {}, kproxy::core::SyncKind::kFull}));
  SECTION("and is reported as unable to explain") {
    CHECK_FALSE((*backend)->canExplain());
    auto r = (*backend)->explain(empty, {});
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message(),
               Catch::StartsWith("backend old cannot explain") && Catch::Contains("entry point"));
  }
}

TEST_CASE("loader refuses a descriptor shorter than ABI 1.0's", "[unit]") {
  PluginRegistry registry;
  auto r = registry.load(kPluginDir / "short" / "short-descriptor.so");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("short-descriptor.so") &&
                                      Catch::Contains("ABI version 1 needs at least"));
}

TEST_CASE("explain crosses the ABI: request fields, snapshot, text back", "[unit]") {
  TempDir dir;
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto backend =
      registry.createPluginBackend("recorder", {{"record-file", (dir.path / "r").string()}});
  REQUIRE(backend);
  CHECK((*backend)->canExplain());

  using namespace kproxy::core;
  Snapshot snapshot = webSnapshot({"10.244.1.2"});

  kproxy::plugins::ExplainRequest request;
  request.family = net::Family::kIPv4;
  request.protocol = Protocol::kUDP;
  request.sourceIP = "10.244.0.5";
  request.destinationIP = "10.96.0.10";
  request.destinationPort = 80;
  request.fromNode = true;
  request.inputInterface = "eth0";
  request.json = true;
  auto text = (*backend)->explain(snapshot, request);
  REQUIRE(text);
  CHECK(*text ==
        "json v4 10.244.0.5 -> 10.96.0.10:80/udp fromNode=1 iif=eth0 node=node-a\n"
        "port v4:default/web:http tcp 10.96.0.10:80 nodePort=30080 endpoints=10.244.1.2:8080\n");

  SECTION("a plugin's explain error carries its message and errno") {
    request.destinationPort = 0;
    auto r = (*backend)->explain(snapshot, request);
    REQUIRE_FALSE(r);
    CHECK(r.error().errnum == 22);
    CHECK_THAT(r.error().message(), Catch::StartsWith("backend recorder: recorder: destination port 0"));
  }
}

TEST_CASE("an SDK plugin that does not override explain says it cannot", "[unit]") {
  TempDir dir;
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "plain" / "plain.so"));
  auto backend = registry.createPluginBackend("plain", {{"record-file", (dir.path / "r").string()}});
  REQUIRE(backend);
  kproxy::core::Snapshot empty;
  auto r = (*backend)->explain(empty, {});
  REQUIRE_FALSE(r);
  CHECK(r.error().message() == "backend plain: this backend cannot explain packets");
}

TEST_CASE("a plugin built against the ABI 1.1 headers loads, syncs and explains", "[unit]") {
  TempDir dir;
  auto record = dir.path / "record.txt";
  PluginRegistry registry;
  auto info = registry.load(kPluginDir / "abi-1.1" / "old-recorder.so");
  REQUIRE(info);
  CHECK(info->version == "1.1");
  CHECK(info->abiMinor == 1);  // its descriptor ends after explain
  auto backend = registry.createPluginBackend("old-recorder", {{"record-file", record.string()}});
  REQUIRE(backend);

  using namespace kproxy::core;
  Snapshot snapshot = webSnapshot({"10.244.1.2", "10.244.1.3"});
  std::vector<ServicePortKey> changed{kWebKey};
  auto synced = (*backend)->sync(SyncRequest{nullptr, &snapshot, changed, SyncKind::kFull});
  REQUIRE(synced);
  CHECK(synced->summary == "recorded 1");
  // The 1.1 SDK walks the 1.2 host's endpoints with its own sizeof, which is the host's stride
  // (no endpoint field was appended): every endpoint arrives intact.
  CHECK_THAT(readFile(record), Catch::Contains("state v4:default/web:http tcp 10.96.0.10:80 nodePort=30080 "
                                               "endpoints=10.244.1.2:8080,10.244.1.3:8080"));
  REQUIRE((*backend)->canExplain());
  kproxy::plugins::ExplainRequest request;
  request.sourceIP = "10.244.0.5";
  request.destinationIP = "10.96.0.10";
  request.destinationPort = 80;
  auto text = (*backend)->explain(snapshot, request);
  REQUIRE(text);
  CHECK_THAT(*text, Catch::StartsWith("text v4 10.244.0.5 -> 10.96.0.10:80/tcp fromNode=0"));
  // It registered no metric (the 1.1 SDK has none) and its errors say no category.
  CHECK(registry.metrics().collect().empty());
  auto failing = registry.createPluginBackend(
      "old-recorder", {{"record-file", record.string()}, {"fail-sync", "true"}});
  REQUIRE(failing);
  auto r = (*failing)->sync(SyncRequest{nullptr, &snapshot, {}, SyncKind::kFull});
  REQUIRE_FALSE(r);
  CHECK(r.error().category == ErrorCategory::kPlugin);
  CHECK(r.error().errnum == 5);
}

TEST_CASE("a plugin's error category becomes the host error's category", "[unit]") {
  using kproxy::core::ErrorCategory;
  TempDir dir;
  PluginRegistry registry;
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto [option, category] = GENERATE(table<std::string, ErrorCategory>({
      {"kernel", ErrorCategory::kKernel},
      {"invalid", ErrorCategory::kInvalidArgument},
      {"transient", ErrorCategory::kTransient},
      {"true", ErrorCategory::kPlugin},
  }));
  auto backend = registry.createBackend(
      "recorder", {{"record-file", (dir.path / "r").string()}, {"fail-sync", option}});
  REQUIRE(backend);
  kproxy::core::Snapshot empty;
  auto r = (*backend)->sync({nullptr, &empty, {}, kproxy::core::SyncKind::kFull});
  REQUIRE_FALSE(r);
  INFO(option);
  CHECK(r.error().category == category);
}

TEST_CASE("plugin metrics: registered in create, updated in sync, kept by the host", "[unit]") {
  TempDir dir;
  PluginRegistry registry;
  registry.metrics().reservePrefixes({"kubeproxy_"});
  REQUIRE(registry.load(kPluginDir / "recorder.so"));
  auto backend = registry.createBackend("recorder", {{"record-file", (dir.path / "r").string()}});
  REQUIRE(backend);
  // A second backend of the same plugin registers the same metric again: the same one.
  auto second = registry.createBackend("recorder", {{"record-file", (dir.path / "r").string()}});
  REQUIRE(second);
  kproxy::core::Snapshot empty;
  REQUIRE((*backend)->sync({nullptr, &empty, {}, kproxy::core::SyncKind::kFull}));
  REQUIRE((*backend)->sync({&empty, &empty, {}, kproxy::core::SyncKind::kPartial}));
  REQUIRE((*second)->sync({nullptr, &empty, {}, kproxy::core::SyncKind::kFull}));
  auto families = registry.metrics().collect();
  REQUIRE(families.size() == 1);
  CHECK(families[0].name == "recorder_syncs_total");
  CHECK(families[0].type == kproxy::plugins::MetricType::kCounter);
  CHECK(families[0].labelNames == std::vector<std::string>{"kind"});
  CHECK(families[0].samples.at({"full"}) == 2);
  CHECK(families[0].samples.at({"partial"}) == 1);

  SECTION("a refused name fails create with the host's reason") {
    for (const char* name : {"recorder syncs", "kubeproxy_sync_proxy_rules_duration_seconds"}) {
      auto bad = registry.createBackend(
          "recorder", {{"record-file", (dir.path / "r").string()}, {"metric-name", name}});
      REQUIRE_FALSE(bad);
      INFO(bad.error().message());
      CHECK_THAT(bad.error().message(),
                 Catch::StartsWith(std::string("recorder: plugin metric \"") + name + "\""));
      CHECK(bad.error().errnum == EINVAL);
    }
  }
}

namespace {

/// A copy of the recorder plugin in a directory of its own, both writable by their owner only.
struct PluginCopy {
  TempDir dir;
  fs::path plugin = dir.path / "recorder.so";
  PluginCopy() {
    fs::copy_file(kPluginDir / "recorder.so", plugin);
    fs::permissions(plugin, fs::perms(0755));
    fs::permissions(dir.path, fs::perms(0755));
  }
  /// Loading the plugin, alone or from its directory, is refused for `why`, naming `named`.
  void requireRefused(const fs::path& named, const std::string& why) const {
    PluginRegistry registry;
    auto r = registry.load(plugin);
    REQUIRE_FALSE(r);
    INFO(r.error().message());
    CHECK(r.error().message().find('\n') == std::string::npos);
    CHECK_THAT(r.error().message(), Catch::Contains(plugin.string()) && Catch::Contains(why));
    CHECK_THAT(r.error().message(), Catch::Contains(named.string()));
    CHECK_FALSE(registry.has("recorder"));
    auto errors = registry.loadDirectory(dir.path);
    REQUIRE(errors.size() == 1);
    CHECK_THAT(errors[0].message(), Catch::Contains(why));
  }
};

/// Ends this run as skipped (exit status 77: the test's SKIP_RETURN_CODE in CMakeLists.txt),
/// saying why. Only for a test case that runs alone in its ctest entry (its tag is a MAY_SKIP
/// tag of kproxy_add_test), so that no other case's result is lost.
[[noreturn]] void skipRun(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  std::_Exit(77);
}

}  // namespace

// What the kernel's module loader and sudo insist on: code that will run as root must not be
// replaceable by anyone but root (or the user kproxy runs as).
TEST_CASE("loader refuses plugin files and directories others could write", "[unit]") {
  PluginCopy copy;
  const auto& plugin = copy.plugin;
  const auto& dir = copy.dir;

  SECTION("a trusted copy loads") {
    PluginRegistry registry;
    REQUIRE(registry.load(plugin));
    CHECK(registry.has("recorder"));
  }
  SECTION("group-writable file") {
    fs::permissions(plugin, fs::perms(0775));
    copy.requireRefused(plugin, "writable by group or others (mode 0775)");
  }
  SECTION("world-writable file") {
    fs::permissions(plugin, fs::perms(0757));
    copy.requireRefused(plugin, "writable by group or others (mode 0757)");
  }
  SECTION("world-writable directory") {
    fs::permissions(dir.path, fs::perms(0777));
    copy.requireRefused(dir.path, "writable by group or others (mode 0777)");
  }
  SECTION("a sticky world-writable directory (like /tmp) is fine: others cannot replace our file") {
    fs::permissions(dir.path, fs::perms(01777));
    PluginRegistry registry;
    CHECK(registry.load(plugin));
  }
}

// Giving a file to another user takes root (CAP_CHOWN): elsewhere this ctest entry is skipped.
TEST_CASE("loader refuses plugin files and directories owned by another user", "[unit][owned-by-another-user]") {
  if (::geteuid() != 0) skipRun("not root: cannot give a file or a directory to another user");
  PluginCopy copy;
  SECTION("a file owned by another user") {
    REQUIRE(::chown(copy.plugin.c_str(), 12345, 12345) == 0);
    copy.requireRefused(copy.plugin, "owned by uid 12345");
  }
  SECTION("a directory owned by another user") {
    REQUIRE(::chown(copy.dir.path.c_str(), 12345, 12345) == 0);
    copy.requireRefused(copy.dir.path, "owned by uid 12345");
  }
}
