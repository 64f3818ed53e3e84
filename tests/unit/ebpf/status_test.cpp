// What ebpf mode reports (status.cpp): the elements of each map and the writes and refusals
// on the host's metrics, the data path's elements in a full sync's summary, and the
// operations of a full sync over maps changed by hand, which self-verification counts as
// differences repaired (kproxy status: "verified N times, M differences repaired").

#include <catch2/catch.hpp>

#include <memory>

#include "../nftables/service_ports.h"
#include "kproxy/ebpf/backend.h"
#include "kproxy/plugins/plugin_metrics.h"
#include "snapshot_bridge.h"

using namespace kproxy;
using namespace kproxy::ebpf;
using kproxy::nftables::testing::manyServices;

namespace {

struct Reported {
  plugins::PluginMetrics metrics;
  kproxy_host_api api = plugins::makeHostApi(&metrics);
  FakeKernelMaps* kernel = nullptr;
  std::unique_ptr<EbpfBackend> backend;
  plan::VectorSnapshot snap{manyServices(10, 3)};

  Reported() {
    auto fake = std::make_unique<FakeKernelMaps>();
    kernel = fake.get();
    backend = std::make_unique<EbpfBackend>(sdk::Host(&api), BackendSettings{}, std::move(fake),
                                            std::make_unique<nftables::FakeKernelNftables>());
    auto registered = EbpfBackend::registerMetrics(sdk::Host(&api));
    REQUIRE(registered);
    backend->useMetrics(*registered);
  }
  /// The value of `name`{labels}; -1 when it has none.
  double sample(const std::string& name, const std::vector<std::string>& labels = {}) const {
    for (const auto& family : metrics.collect())
      if (family.name == name)
        if (auto it = family.samples.find(labels); it != family.samples.end()) return it->second;
    return -1;
  }
};

}  // namespace

TEST_CASE("status: the elements of each map, the operations and the refusals reach the metrics",
          "[unit][ebpf][status]") {
  Reported r;
  r.kernel->dataPath = DataPathCounts{3, 17};
  auto first = r.backend->syncFrom(r.snap, {}, true);
  REQUIRE(first);
  INFO(first->summary);
  CHECK(r.sample("kproxy_ebpf_map_elements", {"services"}) == 10);
  CHECK(r.sample("kproxy_ebpf_map_elements", {"slots"}) == 30);
  CHECK(r.sample("kproxy_ebpf_map_elements", {"affinity"}) == 3);
  CHECK(r.sample("kproxy_ebpf_map_elements", {"reverse"}) == 17);
  CHECK(r.sample("kproxy_ebpf_map_operations_total") == static_cast<double>(first->operations));
  CHECK(first->operations == 40);
  CHECK(r.sample("kproxy_ebpf_map_operation_failures_total") == 0);
  // The summary says what each map holds, the data path's maps as this full sync counted them.
  CHECK(first->summary.find(" services=10 slots=30 ") != std::string::npos);
  CHECK(first->summary.find(" affinity=3 reverse=17") != std::string::npos);

  SECTION("a partial sync counts its writes on top and leaves the data path's count alone") {
    r.kernel->dataPath = DataPathCounts{99, 99};
    auto& port = r.snap.ports().front();
    nftables::testing::setEndpoints(port, {nftables::testing::endpoint("10.99.0.1", 8080)});
    auto partial = r.backend->syncFrom(r.snap, {{net::Family::kIPv4, port.key}}, false);
    REQUIRE(partial);
    CHECK(partial->operations > 0);
    CHECK(r.sample("kproxy_ebpf_map_operations_total") == static_cast<double>(first->operations + partial->operations));
    CHECK(r.sample("kproxy_ebpf_map_elements", {"slots"}) == 28);
    CHECK(r.sample("kproxy_ebpf_map_elements", {"affinity"}) == 3);
    CHECK(partial->summary.find("affinity=") == std::string::npos);
  }
  SECTION("a refused write is a failure, and counts no operation") {
    auto& port = r.snap.ports().front();
    nftables::testing::setEndpoints(port, {});
    r.kernel->failNextApplyAt(0);
    CHECK_FALSE(r.backend->syncFrom(r.snap, {{net::Family::kIPv4, port.key}}, false));
    CHECK(r.sample("kproxy_ebpf_map_operation_failures_total") == 1);
    CHECK(r.sample("kproxy_ebpf_map_operations_total") == static_cast<double>(first->operations));
    CHECK(r.sample("kproxy_ebpf_map_elements", {"slots"}) == 30);  // the mirror as it was
  }
  SECTION("self-verification: a full sync over the same snapshot counts what differs, and repairs it") {
    auto clean = r.backend->syncFrom(r.snap, {}, true);
    REQUIRE(clean);
    CHECK(clean->operations == 0);
    // Two elements changed behind kproxy's back: a slot deleted, a count changed.
    r.kernel->maps.slots.erase(r.kernel->maps.slots.begin());
    r.kernel->maps.services.begin()->second.count = 1;
    auto verified = r.backend->syncFrom(r.snap, {}, true);
    REQUIRE(verified);
    CHECK(verified->operations == 2);
    CHECK(r.kernel->maps == r.backend->mirror());
    CHECK(verified->summary.find("first=\"update slots") != std::string::npos);
  }
}
