// EbpfBackend over FakeKernelMaps: a full sync from empty, a restart that writes nothing,
// partial syncs that write only what changed and never show a half-written service, a map
// element deleted by hand and repaired, a refused write that makes the next sync full,
// cleanup and --dry-run.

#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../nftables/service_ports.h"
#include "kproxy/ebpf/backend.h"
#include "kproxy/nftables/ir.h"

using namespace kproxy;
using namespace kproxy::ebpf;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;
using kproxy::nftables::testing::manyServices;
using kproxy::nftables::testing::setEndpoints;
using plan::VectorSnapshot;

namespace {

constexpr net::Family kV4 = net::Family::kIPv4;

/// A backend over a fake that outlives it (a restart is a second backend over the same maps).
struct Harness {
  FakeKernelMaps* kernel = nullptr;
  nftables::FakeKernelNftables* tables = nullptr;  ///< the nftables part's
  std::unique_ptr<EbpfBackend> backend;
  VectorSnapshot snap;

  explicit Harness(std::unique_ptr<FakeKernelMaps> fake = std::make_unique<FakeKernelMaps>()) {
    kernel = fake.get();
    kernel->watchHalfWritten = true;
    auto nft = std::make_unique<nftables::FakeKernelNftables>();
    tables = nft.get();
    backend = std::make_unique<EbpfBackend>(sdk::Host(nullptr), BackendSettings{}, std::move(fake), std::move(nft));
  }
  std::uint64_t full() {
    auto r = backend->syncFrom(snap, {}, true);
    INFO((r ? r->summary : r.error().message));
    REQUIRE(r.has_value());
    return r->operations;
  }
  std::uint64_t partial(const std::vector<std::string>& keys) {
    std::vector<sdk::ChangedKey> changed;
    for (const auto& k : keys) changed.push_back(sdk::ChangedKey{kV4, k});
    auto r = backend->syncFrom(snap, changed, false);
    INFO((r ? r->summary : r.error().message));
    REQUIRE(r.has_value());
    return r->operations;
  }
  sdk::ServicePort& port(const std::string& key) {
    for (auto& p : snap.ports())
      if (p.key == key) return p;
    FAIL("no port " << key);
    throw;
  }
};

ServiceKey key(const char* ip, std::uint16_t port) { return ServiceKey{*SocketAddress::of(ip, port), kProtoTCP}; }

}  // namespace

TEST_CASE("a full sync writes the plan, and a restart over the same maps writes nothing", "[unit][ebpf][backend]") {
  auto fake = std::make_unique<FakeKernelMaps>();
  FakeKernelMaps* kernel = fake.get();
  VectorSnapshot snap(manyServices(50, 3));
  {
    Harness h(std::move(fake));
    h.snap = snap;
    CHECK(h.full() == 50 * (1 + 3));
    CHECK(kernel->maps == h.backend->mirror());
    CHECK(kernel->halfWritten.empty());
    // Another full pass over the same snapshot: nothing differs.
    CHECK(h.full() == 0);
    // The backend goes away; the maps stay, as pins do. A restart adopts them.
    h.kernel = nullptr;
    fake.reset(new FakeKernelMaps);
    std::swap(fake->maps, kernel->maps);
  }
  Harness restarted(std::move(fake));
  restarted.snap = snap;
  CHECK(restarted.full() == 0);
  CHECK(restarted.kernel->writes == 0);
}

TEST_CASE("a restart takes back the ids a previous run gave, even ones moved by a collision", "[unit][ebpf][backend]") {
  Harness first;
  first.snap = VectorSnapshot({clusterIP("ns", "a", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080)})});
  first.full();
  // Another run had given the port another id (a collision moved it): the element says which.
  MapContents moved;
  for (auto [k, v] : first.kernel->maps.services) moved.services[k] = ServiceValue{v.id + 1, v.count, v.localCount, v.flags, v.affinityTimeout};
  for (auto [k, e] : first.kernel->maps.slots) moved.slots[SlotKey{k.serviceId + 1, k.slot}] = e;
  auto fake = std::make_unique<FakeKernelMaps>();
  fake->maps = moved;
  Harness restarted(std::move(fake));
  restarted.snap = first.snap;
  CHECK(restarted.full() == 0);
  CHECK(restarted.backend->idOf(kV4, "ns/a:p") == first.backend->idOf(kV4, "ns/a:p") + 1);
}

TEST_CASE("an endpoint change writes only its slots and count, never a half-written service", "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot(manyServices(20, 2));
  h.full();
  const std::size_t before = h.kernel->writes;
  const std::string k = "ns/svc-3:p";
  const std::uint32_t id = h.backend->idOf(kV4, k);

  // Scale up: two slots, then the count.
  setEndpoints(h.port(k), {endpoint("10.9.0.1", 8080), endpoint("10.9.0.2", 8080), endpoint("10.9.0.3", 8080)});
  CHECK(h.partial({k}) == 4);
  CHECK(h.kernel->maps.slots.at(SlotKey{id, 2}) == *SocketAddress::of("10.9.0.3", 8080));
  // Scale down to one: the count, then two slots.
  setEndpoints(h.port(k), {endpoint("10.9.0.2", 8080)});
  CHECK(h.partial({k}) == 4);
  CHECK(h.kernel->maps.services.at(key("172.30.0.3", 80)).count == 1);
  CHECK(h.kernel->maps.slots.at(SlotKey{id, 0}) == *SocketAddress::of("10.9.0.2", 8080));
  CHECK_FALSE(h.kernel->maps.slots.contains(SlotKey{id, 1}));
  CHECK(h.kernel->writes - before == 8);
  CHECK(h.kernel->readBacks == 1);  // partial syncs never read the kernel
  CHECK(h.kernel->halfWritten.empty());
  CHECK(h.kernel->maps == h.backend->mirror());
}

TEST_CASE("a service that goes loses its element before its slots; one that comes gets a free id", "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot(manyServices(5, 2));
  h.full();
  h.snap.ports().erase(h.snap.ports().begin() + 2);
  h.snap.ports().push_back(clusterIP("ns", "new", "10.96.1.1", 443, {endpoint("10.244.7.7", 8443)}));
  CHECK(h.partial({"ns/svc-2:p", "ns/new:p"}) == 3 + 2);
  CHECK_FALSE(h.kernel->maps.services.contains(key("172.30.0.2", 80)));
  CHECK(h.kernel->maps.services.contains(key("10.96.1.1", 443)));
  CHECK(h.backend->idOf(kV4, "ns/svc-2:p") == 0);
  CHECK(h.kernel->halfWritten.empty());
  CHECK(h.kernel->maps == h.backend->mirror());
  CHECK(h.full() == 0);
}

TEST_CASE("a full sync repairs elements deleted or changed by hand", "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot(manyServices(5, 2));
  h.full();
  const MapContents good = h.kernel->maps;
  h.kernel->maps.slots.erase(h.kernel->maps.slots.begin());
  h.kernel->maps.services.begin()->second.count = 9;
  h.kernel->maps.services[key("10.1.2.3", 9)] = ServiceValue{99, 0, 0, 0, 0};  // not the plan's
  CHECK(h.full() == 3);
  CHECK(h.kernel->maps == good);
}

TEST_CASE("a refused write fails the sync and makes the next one full", "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot(manyServices(3, 2));
  h.full();
  setEndpoints(h.port("ns/svc-1:p"), {endpoint("10.9.0.1", 8080)});
  h.kernel->failNextApplyAt(0, E2BIG);
  auto r = h.backend->syncFrom(h.snap, {sdk::ChangedKey{kV4, "ns/svc-1:p"}}, false);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("update slots") != std::string::npos);
  CHECK(h.backend->needsFullSync());
  const std::size_t readBacks = h.kernel->readBacks;
  CHECK(h.partial({}) > 0);  // turned full: reads the maps back and writes the change
  CHECK(h.kernel->readBacks == readBacks + 1);
  CHECK(h.kernel->maps == h.backend->mirror());
}

TEST_CASE("cleanup empties the maps and leaves the next sync full", "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot(manyServices(3, 1));
  h.full();
  REQUIRE(h.backend->cleanup().has_value());
  CHECK(h.kernel->maps == MapContents{});
  CHECK(h.backend->needsFullSync());
  CHECK(h.full() == 3 * 2);
}

TEST_CASE("--dry-run prints every write in the order the kernel would get it", "[unit][ebpf][backend]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  BackendSettings settings;
  settings.dryRun = true;
  EbpfBackend backend(sdk::Host(nullptr), settings,
                      std::make_unique<PrintingKernelMaps>(std::make_unique<FakeKernelMaps>(), out),
                      std::make_unique<nftables::FakeKernelNftables>());
  VectorSnapshot snap({clusterIP("ns", "web", "10.96.0.10", 80, {endpoint("10.244.1.5", 8080)})});
  auto r = backend.syncFrom(snap, {}, true);
  REQUIRE(r.has_value());
  CHECK(r->summary.find("dry_run=true") != std::string::npos);
  std::rewind(out);
  char buf[4096] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, out);
  std::fclose(out);
  const std::uint32_t id = backend.idOf(kV4, "ns/web:p");
  CHECK(std::string(buf, n) == fmt::format("update slots {}/0 10.244.1.5:8080\n"
                                           "update services tcp 10.96.0.10:80 id={} count=1 local=0\n",
                                           id, id));
}

namespace {

/// A NodePort service with an externalIP: ClusterIP 10.96.0.20, NodePort 30080, externalIP
/// 203.0.113.7, one endpoint.
sdk::ServicePort nodePortService() {
  auto p = clusterIP("ns", "np", "10.96.0.20", 80, {endpoint("10.244.1.5", 8080)});
  p.type = sdk::ServiceType::kNodePort;
  p.nodePort = 30080;
  p.externalIPs = {"203.0.113.7"};
  return p;
}

std::string addressKey(const char* ip, std::uint16_t port) {
  nftables::KeyBuilder k;
  k.address(*net::Prefix::parse(ip)).proto(6).port(port);
  return k.bytes;
}

}  // namespace

TEST_CASE("the nftables part programs the external entry points from the same sync, and not the ClusterIP",
          "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot({nodePortService()});
  h.full();
  auto& elements = h.tables->tables[kV4].elements;
  // Other hosts reach the NodePort and the externalIP through the table...
  CHECK(elements["service-nodeports"].size() == 1);
  CHECK(elements["service-ips"].contains(addressKey("203.0.113.7", 80)));
  // ...while the ClusterIP is the socket hooks': no dispatch in the table, only its listing in
  // cluster-ips (what no hook steered to it, another port, is rejected as in nftables mode).
  CHECK_FALSE(elements["service-ips"].contains(addressKey("10.96.0.20", 80)));
  CHECK(elements["no-endpoint-services"].empty());
  nftables::KeyBuilder clusterKey;
  clusterKey.address(*net::Prefix::parse("10.96.0.20"));
  CHECK(elements["cluster-ips"].contains(clusterKey.bytes));
  // The maps have every address the node's own sockets may ask for, the ClusterIP included.
  CHECK(h.kernel->maps.services.contains(key("10.96.0.20", 80)));
  CHECK(h.kernel->maps.services.contains(key("203.0.113.7", 80)));

  // An endpoint change reaches both parts in one partial sync.
  setEndpoints(h.port("ns/np:p"), {endpoint("10.244.1.5", 8080), endpoint("10.244.1.6", 8080)});
  CHECK(h.partial({"ns/np:p"}) > 0);
  CHECK(h.kernel->maps.slots.size() == 2);
  CHECK(h.tables->batches == 2);
}

TEST_CASE("a ClusterIP-only service leaves the nftables part nothing but its cluster-ips element, so its "
          "endpoint changes send the part no transaction",
          "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot({clusterIP("ns", "web", "10.96.0.30", 80, {endpoint("10.244.2.9", 8080)}),
                           nodePortService()});
  h.full();
  auto& elements = h.tables->tables[kV4].elements;
  // Hairpin pairs only for endpoints the table may DNAT to: the NodePort service's, not the
  // steered ClusterIP-only service's (a pod that reaches itself keeps its own address).
  nftables::KeyBuilder webPair;
  webPair.address(*net::Prefix::parse("10.244.2.9")).address(*net::Prefix::parse("10.244.2.9"));
  CHECK_FALSE(elements["hairpin-ips"].contains(webPair.bytes));
  CHECK_FALSE(elements["hairpin-ips"].empty());
  const auto batches = h.tables->batches;
  const auto passes = h.tables->generationReads;
  setEndpoints(h.port("ns/web:p"), {endpoint("10.244.2.9", 8080), endpoint("10.244.2.10", 8080)});
  CHECK(h.partial({"ns/web:p"}) > 0);
  CHECK(h.tables->batches == batches);
  // Not even a pass of the part: the port is its cluster-ips element before and after.
  CHECK(h.tables->generationReads == passes);

  // Made a NodePort, the same port is the part's again, and so is its way back.
  h.port("ns/web:p").type = sdk::ServiceType::kNodePort;
  h.port("ns/web:p").nodePort = 30090;
  h.partial({"ns/web:p"});
  CHECK(h.tables->generationReads == passes + 1);
  // (The fake's tables are rebuilt by each batch: look them up again.)
  CHECK(h.tables->tables[kV4].elements["service-nodeports"].size() == 2);
  h.port("ns/web:p").type = sdk::ServiceType::kClusterIP;
  h.port("ns/web:p").nodePort = 0;
  h.partial({"ns/web:p"});
  CHECK(h.tables->generationReads == passes + 2);
  CHECK(h.tables->tables[kV4].elements["service-nodeports"].size() == 1);
}

TEST_CASE("a refused nftables transaction leaves the maps untouched, and the next sync of both is full",
          "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot({nodePortService()});
  h.tables->failNextBatchAt(0);
  auto failed = h.backend->syncFrom(h.snap, {}, true);
  REQUIRE_FALSE(failed.has_value());
  CHECK(h.kernel->writes == 0);
  CHECK(h.tables->tables[kV4].elements["service-nodeports"].empty());
  // The host asks for a partial sync; the backend makes it full and writes both parts.
  auto r = h.backend->syncFrom(h.snap, {sdk::ChangedKey{kV4, "ns/np:p"}}, false);
  REQUIRE(r.has_value());
  CHECK(r->summary.starts_with("ebpf sync full=true"));
  CHECK(h.kernel->maps.services.size() == 2);  // the ClusterIP and the externalIP (the node has no address)
  CHECK(h.tables->tables[kV4].elements["service-nodeports"].size() == 1);
}

TEST_CASE("a refused map write after the nftables part makes the next sync full, which repairs the maps only",
          "[unit][ebpf][backend]") {
  Harness h;
  h.snap = VectorSnapshot({nodePortService()});
  h.kernel->failNextApplyAt(1);
  REQUIRE_FALSE(h.backend->syncFrom(h.snap, {}, true).has_value());
  const std::size_t batches = h.tables->batches;
  CHECK(batches == 1);  // the table went in whole
  auto r = h.backend->syncFrom(h.snap, {sdk::ChangedKey{kV4, "ns/np:p"}}, false);
  REQUIRE(r.has_value());
  CHECK(r->summary.starts_with("ebpf sync full=true"));
  CHECK(h.kernel->maps == h.backend->mirror());
  CHECK(h.kernel->halfWritten.empty());
  CHECK(h.tables->batches == batches);  // nothing differed in the table
}
