// The SDK on hand-made host structs: the sizes of older hosts (and impossible ones), the
// endpoint stride, the error category and the metric functions only where the host has them.
#include "kproxy/plugin/sdk.h"

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace sdk = kproxy::sdk;

namespace {

// One endpoint as a later host might lay it out: the 1.0 fields, then fields this SDK does not
// know. The SDK must step over them.
struct WideEndpoint {
  kproxy_endpoint base;
  std::uint64_t future[3];
};

// A host table followed by room a smaller struct_size does not cover, so that the SDK reading
// or writing past an old host's table would be seen.
struct FakeHost {
  kproxy_host_api api{};
  const kproxy_service_port* port = nullptr;
  const kproxy_node_info* node = nullptr;
  int metricCalls = 0;
  std::vector<std::string> registered;
  std::vector<double> added;
  std::vector<double> observed;
  std::vector<std::uint32_t> registeredTypes;
};

FakeHost* self(void* ctx) { return static_cast<FakeHost*>(ctx); }
// The snapshot handle is the FakeHost itself.
const FakeHost* hostOf(const kproxy_snapshot* s) { return reinterpret_cast<const FakeHost*>(s); }

void makeHost(FakeHost& h, std::uint32_t structSize) {
  h.api.struct_size = structSize;
  h.api.abi_version = KPROXY_PLUGIN_ABI_VERSION;
  h.api.host_ctx = &h;
  h.api.log = [](void*, int, const char*) {};
  h.api.snapshot_size = [](const kproxy_snapshot* s) -> size_t { return hostOf(s)->port ? 1 : 0; };
  h.api.snapshot_node = [](const kproxy_snapshot* s) { return hostOf(s)->node; };
  h.api.snapshot_foreach = [](const kproxy_snapshot* s, kproxy_service_port_visitor visit,
                              void* user) {
    if (hostOf(s)->port != nullptr) visit(user, hostOf(s)->port);
  };
  h.api.snapshot_find = [](const kproxy_snapshot* s, uint8_t, const char*,
                           kproxy_service_port_visitor visit, void* user) -> int {
    if (hostOf(s)->port == nullptr) return 0;
    visit(user, hostOf(s)->port);
    return 1;
  };
  // Filled in every case: with a 1.0/1.1 struct_size the SDK must not look at them.
  h.api.features = KPROXY_HOST_ERROR_CATEGORY;
  h.api.metric_register = [](void* ctx, const kproxy_metric_spec* spec, kproxy_error*) -> uint64_t {
    ++self(ctx)->metricCalls;
    self(ctx)->registered.emplace_back(spec->name);
    self(ctx)->registeredTypes.push_back(spec->type);
    return 7;
  };
  h.api.metric_observe = [](void* ctx, uint64_t, const char* const*, size_t, double value) -> int {
    ++self(ctx)->metricCalls;
    self(ctx)->observed.push_back(value);
    return KPROXY_OK;
  };
  h.api.metric_add = [](void* ctx, uint64_t, const char* const*, size_t, double delta) -> int {
    ++self(ctx)->metricCalls;
    self(ctx)->added.push_back(delta);
    return KPROXY_OK;
  };
  h.api.metric_set = [](void* ctx, uint64_t, const char* const*, size_t, double) -> int {
    ++self(ctx)->metricCalls;
    return KPROXY_OK;
  };
}

const kproxy_snapshot* snapshotOf(const FakeHost& h) {
  return reinterpret_cast<const kproxy_snapshot*>(&h);
}

// A plugin that reads the whole snapshot, registers a counter, and fails on request.
struct Probe {
  static inline std::vector<sdk::ServicePort> seen;
  static inline sdk::NodeInfo node;
  static inline bool metricActive = false;
  static inline sdk::PluginError failWith{};
  static inline bool fail = false;
};

class ProbeBackend final : public sdk::BackendPlugin {
 public:
  explicit ProbeBackend(sdk::Metric syncs) : syncs_(syncs) {}
  sdk::Expected<sdk::SyncOutcome> sync(const sdk::SyncContext& ctx) override {
    if (Probe::fail) return std::unexpected(Probe::failWith);
    Probe::seen = ctx.next.all();
    Probe::node = ctx.next.node();
    syncs_.add(1);
    return sdk::SyncOutcome{1, "ok"};
  }
  sdk::Expected<void> cleanup() override { return {}; }
  sdk::Expected<std::string> explain(const sdk::SnapshotView&, const sdk::ExplainRequest& r) override {
    return r.destinationIP;
  }

 private:
  sdk::Metric syncs_;
};

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeProbe(const sdk::Host& host,
                                                             const sdk::Options&) {
  auto syncs = host.counter("probe_syncs_total", "Syncs");
  if (!syncs) return std::unexpected(syncs.error());
  Probe::metricActive = syncs->active();
  return std::make_unique<ProbeBackend>(*syncs);
}

struct Plugin {
  kproxy_backend* backend = nullptr;
  ~Plugin() {
    if (backend != nullptr) sdk::detail::destroy(backend);
  }
};

// kproxy_error with a tail after it: a sentinel where a 1.2 `category` would be on an old host.
struct GuardedError {
  kproxy_error err;
  unsigned char tail[16];
};

kproxy_error* freshError(GuardedError& g) {
  std::memset(&g, 0xAB, sizeof g);
  g.err.errnum = 0;
  g.err.message[0] = '\0';
  return &g.err;
}

bool untouchedFrom(const GuardedError& g, std::size_t offset) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&g);
  for (std::size_t i = offset; i < sizeof g; ++i)
    if (bytes[i] != 0xAB) return false;
  return true;
}

// A service port as the given ABI's host fills it; endpoints are `stride` bytes apart.
struct PortFixture {
  std::vector<WideEndpoint> wide;
  std::vector<kproxy_endpoint> narrow;
  kproxy_service_port port{};
  PortFixture(std::uint32_t structSize, bool wideStride) {
    const char* ips[] = {"10.244.1.2", "10.244.1.3"};
    for (int i = 0; i < 2; ++i) {
      kproxy_endpoint e{ips[i], 8080 + i, 0, 1, 1, 0, "node-a", "zone-1"};
      wide.push_back(WideEndpoint{e, {~0ull, ~0ull, ~0ull}});
      narrow.push_back(e);
    }
    port.struct_size = structSize;
    port.family = KPROXY_FAMILY_IPV4;
    port.key = "default/web:http";
    port.ns = "default";
    port.service_name = "web";
    port.port_name = "http";
    port.cluster_ip = "10.96.0.10";
    port.port = 80;
    const kproxy_endpoint* eps = wideStride ? &wide[0].base : narrow.data();
    port.cluster_endpoints = eps;
    port.cluster_endpoints_count = 2;
    port.all_endpoints = eps;
    port.all_endpoints_count = 2;
    port.endpoint_size = wideStride ? sizeof(WideEndpoint) : sizeof(kproxy_endpoint);
  }
};

int runSync(Plugin& p, FakeHost& h, kproxy_sync_result* result, kproxy_error* err) {
  return sdk::detail::sync(p.backend, nullptr, snapshotOf(h), nullptr, 0, KPROXY_SYNC_FULL, result, err);
}

// Creates the probe on `h`, runs a full sync that must succeed and see one service port, and
// returns that port as the plugin saw it.
sdk::ServicePort syncTheOnePort(FakeHost& h) {
  Plugin p;
  kproxy_error err{};
  p.backend = sdk::detail::create<makeProbe>(&h.api, nullptr, 0, &err);
  REQUIRE(p.backend != nullptr);
  kproxy_sync_result result{};
  result.struct_size = sizeof result;
  REQUIRE(runSync(p, h, &result, &err) == KPROXY_OK);
  REQUIRE(Probe::seen.size() == 1);
  return Probe::seen[0];
}

}  // namespace

TEST_CASE("SDK: a 1.2 host's endpoints are walked with its stride", "[unit]") {
  FakeHost h;
  makeHost(h, sizeof(kproxy_host_api));
  PortFixture f(sizeof(kproxy_service_port), /*wideStride=*/true);
  h.port = &f.port;
  const sdk::ServicePort seen = syncTheOnePort(h);
  const auto& eps = seen.clusterEndpoints;
  REQUIRE(eps.size() == 2);
  CHECK(eps[1].ip == "10.244.1.3");
  CHECK(eps[1].port == 8081);
  CHECK(eps[1].nodeName == "node-a");
  CHECK(eps[1].zone == "zone-1");
  CHECK(seen.allEndpoints == eps);
}

TEST_CASE("SDK: a 1.0 host's service port (no endpoint_size) uses the 1.0 stride", "[unit]") {
  FakeHost h;
  makeHost(h, KPROXY_HOST_API_V1_0_SIZE);
  // The field exists in memory (set to a wrong stride) but struct_size does not cover it.
  PortFixture f(KPROXY_SERVICE_PORT_V1_0_SIZE, /*wideStride=*/false);
  f.port.endpoint_size = sizeof(WideEndpoint);
  h.port = &f.port;
  const sdk::ServicePort seen = syncTheOnePort(h);
  REQUIRE(seen.clusterEndpoints.size() == 2);
  CHECK(seen.clusterEndpoints[1].ip == "10.244.1.3");
  CHECK(seen.clusterIP == "10.96.0.10");
}

TEST_CASE("SDK: host structs smaller than ABI 1.0's are clear errors, not reads past the end",
          "[unit]") {
  FakeHost h;
  makeHost(h, sizeof(kproxy_host_api));
  GuardedError g;

  SECTION("kproxy_host_api") {
    h.api.struct_size = KPROXY_HOST_API_V1_0_SIZE - 8;
    CHECK(sdk::detail::create<makeProbe>(&h.api, nullptr, 0, freshError(g)) == nullptr);
    CHECK_THAT(g.err.message, Catch::Contains("kproxy_host_api of " +
                                              std::to_string(KPROXY_HOST_API_V1_0_SIZE - 8) +
                                              " bytes; ABI 1.0 needs at least"));
    // Too small to say what the host supports: no category written.
    CHECK(untouchedFrom(g, KPROXY_ERROR_V1_0_SIZE));
    CHECK(h.metricCalls == 0);
  }
  SECTION("no kproxy_host_api at all") {
    CHECK(sdk::detail::create<makeProbe>(nullptr, nullptr, 0, freshError(g)) == nullptr);
    CHECK_THAT(g.err.message, Catch::Contains("no kproxy_host_api"));
  }
}

TEST_CASE("SDK: host structs of a call smaller than ABI 1.0's are clear errors", "[unit]") {
  FakeHost h;
  makeHost(h, sizeof(kproxy_host_api));
  Plugin p;
  GuardedError g;
  Probe::fail = false;
  p.backend = sdk::detail::create<makeProbe>(&h.api, nullptr, 0, freshError(g));
  REQUIRE(p.backend != nullptr);
  kproxy_sync_result result{};
  result.struct_size = sizeof result;

  SECTION("kproxy_service_port") {
    PortFixture f(KPROXY_SERVICE_PORT_V1_0_SIZE - 16, false);
    h.port = &f.port;
    REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_ERR);
    CHECK_THAT(g.err.message,
               Catch::Equals("sync: the host passed a kproxy_service_port of " +
                             std::to_string(KPROXY_SERVICE_PORT_V1_0_SIZE - 16) +
                             " bytes; ABI 1.0 needs at least " +
                             std::to_string(KPROXY_SERVICE_PORT_V1_0_SIZE)));
    CHECK(g.err.category == KPROXY_ERROR_INVALID_INPUT);
  }
  SECTION("an endpoint stride smaller than a 1.0 endpoint") {
    PortFixture f(sizeof(kproxy_service_port), false);
    f.port.endpoint_size = 8;
    h.port = &f.port;
    REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_ERR);
    CHECK_THAT(g.err.message, Catch::Contains("endpoints of 8 bytes; ABI 1.0 needs at least"));
  }
  SECTION("kproxy_node_info") {
    kproxy_node_info node{};
    node.struct_size = 8;
    node.name = "node-a";
    h.node = &node;
    REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_ERR);
    CHECK_THAT(g.err.message, Catch::Contains("kproxy_node_info of 8 bytes"));
  }
  SECTION("kproxy_node_info of ABI 1.0 is read") {
    kproxy_node_info node{};
    node.struct_size = KPROXY_NODE_INFO_V1_0_SIZE;
    node.name = "node-a";
    h.node = &node;
    REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_OK);
    CHECK(Probe::node.name == "node-a");
  }
  SECTION("kproxy_sync_result") {
    result.struct_size = 4;
    REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_ERR);
    CHECK_THAT(g.err.message, Catch::Contains("kproxy_sync_result of 4 bytes"));
  }
  SECTION("kproxy_explain_request") {
    kproxy_explain_request r{};
    r.struct_size = 8;
    std::string text;
    auto write = [](void* user, const char* t, size_t n) { static_cast<std::string*>(user)->append(t, n); };
    REQUIRE(sdk::detail::explain(p.backend, snapshotOf(h), &r, write, &text, freshError(g)) == KPROXY_ERR);
    CHECK_THAT(g.err.message, Catch::Contains("kproxy_explain_request of 8 bytes; ABI 1.1 needs at least"));
    // The 1.1 size is enough.
    r.struct_size = KPROXY_EXPLAIN_REQUEST_V1_1_SIZE;
    r.destination_ip = "10.96.0.10";
    REQUIRE(sdk::detail::explain(p.backend, snapshotOf(h), &r, write, &text, freshError(g)) == KPROXY_OK);
    CHECK(text == "10.96.0.10");
  }
}

TEST_CASE("SDK: on a host table of the 1.1 size, no error category and no metric calls",
          "[unit]") {
  FakeHost h;
  // ABI 1.1 did not change the host table: its size is 1.0's. The 1.2 fields are filled in
  // memory but not covered.
  makeHost(h, KPROXY_HOST_API_V1_0_SIZE);
  CHECK_FALSE(sdk::Host(&h.api).readsErrorCategory());
  CHECK_FALSE(sdk::Host(&h.api).hasMetrics());
  Plugin p;
  GuardedError g;
  p.backend = sdk::detail::create<makeProbe>(&h.api, nullptr, 0, freshError(g));
  REQUIRE(p.backend != nullptr);
  CHECK_FALSE(Probe::metricActive);

  kproxy_sync_result result{};
  result.struct_size = sizeof result;
  Probe::fail = false;
  REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_OK);  // the metric update: a no-op

  Probe::fail = true;
  Probe::failWith = sdk::PluginError{105, "kernel said no", sdk::ErrorCategory::kTransient};
  REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_ERR);
  Probe::fail = false;
  CHECK(std::string(g.err.message) == "kernel said no");
  CHECK(g.err.errnum == 105);
  // The old host's kproxy_error ends after `message`: nothing written beyond it.
  CHECK(untouchedFrom(g, KPROXY_ERROR_V1_0_SIZE));
  CHECK(h.metricCalls == 0);
}

TEST_CASE("SDK: on a 1.2 host, the error category is written and metrics reach the host",
          "[unit]") {
  FakeHost h;
  makeHost(h, sizeof(kproxy_host_api));
  Plugin p;
  GuardedError g;
  p.backend = sdk::detail::create<makeProbe>(&h.api, nullptr, 0, freshError(g));
  REQUIRE(p.backend != nullptr);
  CHECK(Probe::metricActive);
  CHECK(h.registered == std::vector<std::string>{"probe_syncs_total"});
  kproxy_sync_result result{};
  result.struct_size = sizeof result;
  Probe::fail = false;
  REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_OK);
  CHECK(h.added == std::vector<double>{1});

  Probe::fail = true;
  Probe::failWith = sdk::PluginError{105, "kernel said no", sdk::ErrorCategory::kTransient};
  REQUIRE(runSync(p, h, &result, freshError(g)) == KPROXY_ERR);
  Probe::fail = false;
  CHECK(g.err.category == KPROXY_ERROR_TRANSIENT);
  CHECK(untouchedFrom(g, sizeof(kproxy_error)));
}

TEST_CASE("SDK: kernel errnos map to categories", "[unit]") {
  CHECK(sdk::kernelErrorCategory(ENOBUFS) == sdk::ErrorCategory::kTransient);
  CHECK(sdk::kernelErrorCategory(EBUSY) == sdk::ErrorCategory::kTransient);
  CHECK(sdk::kernelErrorCategory(EINTR) == sdk::ErrorCategory::kTransient);
  CHECK(sdk::kernelErrorCategory(EAGAIN) == sdk::ErrorCategory::kTransient);
  CHECK(sdk::kernelErrorCategory(EINVAL) == sdk::ErrorCategory::kKernelRefused);
  CHECK(sdk::kernelErrorCategory(EPERM) == sdk::ErrorCategory::kKernelRefused);
  auto e = sdk::fail(sdk::ErrorCategory::kInvalidInput, "bad", 22);
  CHECK(e.error().category == sdk::ErrorCategory::kInvalidInput);
  CHECK(sdk::fail("no category").error().category == sdk::ErrorCategory::kUnknown);
}

namespace {
struct LoggedLine {
  int level;
  std::string file;
  int line;
  std::string message;
};
std::vector<LoggedLine> gLogged;
kproxy_host_api loggingHost(std::uint32_t structSize) {
  gLogged.clear();
  kproxy_host_api api{};
  api.struct_size = structSize;
  api.abi_version = KPROXY_PLUGIN_ABI_VERSION;
  api.log = [](void*, int level, const char* message) { gLogged.push_back({level, "", 0, message}); };
  api.log_at = [](void*, int level, const char* file, int line, const char* message) {
    gLogged.push_back({level, file, line, message});
  };
  return api;
}
}  // namespace

TEST_CASE("SDK: Host logging passes the caller's file and line through log_at on a 1.3 host, "
          "and falls back to log on an older one", "[unit]") {
  kproxy_host_api current = loggingHost(sizeof(kproxy_host_api));
  const int line = __LINE__ + 1;
  sdk::Host(&current).info(3, "hello");
  sdk::Host(&current).warning("careful");
  sdk::Host(&current).error("bad");
  REQUIRE(gLogged.size() == 3);
  CHECK(std::string(gLogged[0].file).ends_with("test_sdk.cpp"));
  CHECK(gLogged[0].line == line);
  CHECK(gLogged[0].level == 3);
  CHECK(gLogged[0].message == "hello");
  CHECK(gLogged[1].level == KPROXY_LOG_WARNING);
  CHECK(gLogged[1].line == line + 1);
  CHECK(gLogged[2].level == KPROXY_LOG_ERROR);

  // A 1.2 host's table ends before log_at: the SDK must not call it.
  kproxy_host_api older = loggingHost(offsetof(kproxy_host_api, log_at));
  sdk::Host(&older).info(1, "old host");
  REQUIRE(gLogged.size() == 1);
  CHECK(gLogged[0].file.empty());
  CHECK(gLogged[0].message == "old host");
}

TEST_CASE("SDK: histograms reach a 1.4 host and are inactive on a 1.3 one", "[unit]") {
  FakeHost h;
  makeHost(h, offsetof(kproxy_host_api, metric_observe));  // a 1.3 host: log_at is its last
  sdk::Host older(&h.api);
  CHECK(older.hasMetrics());
  CHECK_FALSE(older.hasHistograms());
  auto inactive = older.histogram("probe_seconds", "Seconds", {"ip_family"}, {0.001, 0.002});
  REQUIRE(inactive);
  CHECK_FALSE(inactive->active());
  CHECK_FALSE(inactive->observe({"IPv4"}, 0.5));
  CHECK(h.metricCalls == 0);  // the older host refuses the type: it is never asked

  makeHost(h, sizeof(kproxy_host_api));
  sdk::Host current(&h.api);
  CHECK(current.hasHistograms());
  auto histogram = current.histogram("probe_seconds", "Seconds", {"ip_family"}, {0.001, 0.002});
  REQUIRE(histogram);
  CHECK(histogram->active());
  CHECK(h.registeredTypes == std::vector<std::uint32_t>{KPROXY_METRIC_HISTOGRAM});
  CHECK(histogram->observe({"IPv4"}, 0.5));
  CHECK_FALSE(histogram->observe({}, 0.5));  // one value per label
  CHECK(h.observed == std::vector<double>{0.5});
}
