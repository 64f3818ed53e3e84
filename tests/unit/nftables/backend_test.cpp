// NftablesBackend against the in-memory fake kernel: partial vs. full syncs, failures, repair.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>

#include "kproxy/nftables/backend.h"
#include "kproxy/plugins/plugin_metrics.h"
#include "service_ports.h"
#include "snapshot_bridge.h"

using namespace kproxy;
using namespace kproxy::nftables;
using kproxy::nftables::testing::clusterIP;
using kproxy::nftables::testing::endpoint;

namespace {

struct Fixture {
  Fixture() {
    auto k = std::make_unique<FakeKernelNftables>();
    kernel = k.get();
    backend = std::make_unique<NftablesBackend>(sdk::Host(nullptr), BackendSettings{}, std::move(k));
    for (int i = 0; i < 20; ++i)
      snap.ports().push_back(clusterIP("ns", "svc-" + std::to_string(i), "172.30.0." + std::to_string(i), 80,
                                       {endpoint("10.0.0." + std::to_string(i), 80),
                                        endpoint("10.0.1." + std::to_string(i), 80)}));
  }
  FakeKernelNftables* kernel;
  std::unique_ptr<NftablesBackend> backend;
  VectorSnapshot snap;
};

/// A session-affinity entry as the data path stores it in `session-affinity`: key client .
/// pool ID, data endpoint . port.
std::pair<std::string, std::string> affinityEntry(const char* client, std::uint32_t poolId, const char* ep,
                                                  std::uint16_t port) {
  KeyBuilder key;
  key.address(*net::Prefix::parse(client)).poolId(poolId);
  KeyBuilder data;
  data.address(*net::Prefix::parse(ep)).port(port);
  return {key.bytes, data.bytes};
}

/// The pool ID under which `chain` (a balancing chain of `port` the backend programmed) looks
/// clients up.
std::uint32_t poolIdOf(const NftablesBackend& backend, const sdk::ServicePort& port, const std::string& chain,
                       plan::Pool pool) {
  const auto& chains = backend.mirror().of(net::Family::kIPv4).chains;
  auto it = chains.find(chain);
  REQUIRE(it != chains.end());
  REQUIRE(it->second.slotBase.has_value());
  return affinityPoolId(*it->second.slotBase, port, pool);
}

}  // namespace

TEST_CASE("backend: first sync is full and reads the kernel; partial syncs do not", "[unit]") {
  Fixture f;
  auto first = f.backend->syncFrom(f.snap, {}, false);  // first sync is full whatever asked
  REQUIRE(first.has_value());
  CHECK(f.kernel->readBacks == 1);
  CHECK(first->operations > 60);

  auto& p = f.snap.ports()[3];
  testing::setEndpoints(p, {p.clusterEndpoints[0]});
  auto partial = f.backend->syncFrom(f.snap, {{net::Family::kIPv4, p.key}}, false);
  REQUIRE(partial.has_value());
  CHECK(f.kernel->readBacks == 1);
  // The old two-interval layout out, the one-interval layout in, the hairpin pair out.
  CHECK(partial->operations == 7);
  for (const auto& op : f.backend->lastOps())
    CHECK((op.kind == OpKind::kAddElement || op.kind == OpKind::kDeleteElement));

  auto unchanged = f.backend->syncFrom(f.snap, {{net::Family::kIPv4, f.snap.ports()[4].key}}, false);
  REQUIRE(unchanged.has_value());
  CHECK(unchanged->operations == 0);
  auto quiet = f.backend->syncFrom(f.snap, {}, false);
  CHECK(quiet->operations == 0);
}

TEST_CASE("backend: a removed service is cleaned up by a partial sync", "[unit]") {
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  auto chainsBefore = f.kernel->tables[net::Family::kIPv4].chains.size();
  auto gone = f.snap.ports().back();
  f.snap.ports().pop_back();
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, gone.key}}, false).has_value());
  REQUIRE(f.backend->syncFrom(f.snap, {}, false).has_value());
  CHECK(f.kernel->tables[net::Family::kIPv4].chains.size() == chainsBefore - 1);  // its service chain
  CHECK_FALSE(f.kernel->tables[net::Family::kIPv4].elements["cluster-ips"].empty());
  // A full sync afterwards agrees: nothing to do.
  auto full = f.backend->syncFrom(f.snap, {}, true);
  CHECK(full->operations == 0);
}

TEST_CASE("backend: two ports of one service share the cluster-ips element", "[unit]") {
  Fixture f;
  auto a = clusterIP("ns", "multi", "172.30.9.1", 80, {endpoint("10.9.0.1", 80)}, sdk::Protocol::kTCP, "http");
  auto b = clusterIP("ns", "multi", "172.30.9.1", 443, {endpoint("10.9.0.1", 443)}, sdk::Protocol::kTCP, "https");
  f.snap.ports().push_back(a);
  f.snap.ports().push_back(b);
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  f.snap.ports().pop_back();
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, b.key}}, false).has_value());
  KeyBuilder k;
  k.address(*net::Prefix::parse("172.30.9.1"));
  CHECK(f.kernel->tables[net::Family::kIPv4].elements["cluster-ips"].contains(k.bytes));
}

TEST_CASE("backend: a refused batch leaves kernel and mirror; the next sync is full", "[unit]") {
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  auto kernelBefore = f.kernel->tables[net::Family::kIPv4].chains.size();
  auto& p = f.snap.ports()[0];
  testing::setEndpoints(p, {endpoint("10.5.5.5", 80)});
  f.kernel->failNextBatchAt(1);
  auto failed = f.backend->syncFrom(f.snap, {{net::Family::kIPv4, p.key}}, false);
  REQUIRE_FALSE(failed.has_value());
  CHECK(failed.error().message.find("kube-proxy") != std::string::npos);
  CHECK(f.kernel->tables[net::Family::kIPv4].chains.size() == kernelBefore);
  CHECK(f.backend->needsFullSync());
  auto retry = f.backend->syncFrom(f.snap, {}, false);
  REQUIRE(retry.has_value());
  CHECK(f.kernel->readBacks == 2);
  KeyBuilder data;
  data.address(*net::Prefix::parse("10.5.5.5")).port(80);
  bool found = false;
  std::string wanted(1, '=');
  wanted += data.bytes;
  for (const auto& [set, elems] : f.kernel->tables[net::Family::kIPv4].elements)
    for (const auto& [key, value] : elems)
      if (value == wanted) found = true;
  CHECK(found);
}

TEST_CASE("backend: a full sync removes foreign rules and restores deleted ones", "[unit]") {
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  std::string svc = serviceChainName(f.snap.ports()[2]);
  {
    auto& t = f.kernel->tables[net::Family::kIPv4];  // the fake replaces its tables on each batch
    t.chains["services"].rules.push_back({0, {}, "counter"});
    t.chains[svc].rules.clear();
  }
  auto partial = f.backend->syncFrom(f.snap, {}, false);
  CHECK(partial->operations == 0);  // partial syncs trust the mirror
  auto full = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE(full.has_value());
  CHECK(full->operations == 1 + 2 + 1);  // flush+refill services (2 rules), refill svc (its DNAT)
  auto& t = f.kernel->tables[net::Family::kIPv4];
  CHECK(t.chains["services"].rules.size() == 2);
  for (const auto& r : t.chains["services"].rules) CHECK(r.hash != 0);
  CHECK(t.chains[svc].rules.size() == 1);
}

TEST_CASE("backend: restart over an unchanged kernel applies nothing", "[unit]") {
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  auto state = f.kernel->tables;
  auto k = std::make_unique<FakeKernelNftables>();
  k->tables = state;
  auto* raw = k.get();
  NftablesBackend restarted(sdk::Host(nullptr), BackendSettings{}, std::move(k));
  auto out = restarted.syncFrom(f.snap, {}, false);
  REQUIRE(out.has_value());
  CHECK(out->operations == 0);
  CHECK(raw->batches == 0);
}

namespace {

/// What was written to a memstream since `mark`, and the new mark.
std::string printedSince(std::FILE* out, const char* buf, std::size_t len, std::size_t& mark) {
  std::fflush(out);
  std::string text(buf + mark, len - mark);
  mark = len;
  return text;
}

}  // namespace

TEST_CASE("backend: dry-run prints through PrintingNftables exactly what a kernel is handed", "[unit]") {
  // As the factory does for --dry-run: the printer over empty tables in memory.
  char* buf = nullptr;
  std::size_t len = 0;
  std::size_t mark = 0;
  std::FILE* out = open_memstream(&buf, &len);
  auto memory = std::make_unique<FakeKernelNftables>();
  FakeKernelNftables* tables = memory.get();
  BackendSettings s;
  s.dryRun = true;
  s.dryRunOutput = out;
  NftablesBackend dry(sdk::Host(nullptr), s, std::make_unique<PrintingNftables>(std::move(memory), out));
  // The same syncs against a kernel, for what it is handed.
  Fixture f;

  auto first = dry.syncFrom(f.snap, {}, true);
  REQUIRE(first.has_value());
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  const std::string full = printedSince(out, buf, len, mark);
  // One line per op, in the batch's phases; the tables in memory end as the kernel's.
  CHECK(first->operations == f.kernel->lastBatchSize);
  CHECK(static_cast<std::size_t>(std::count(full.begin(), full.end(), '\n')) == f.kernel->lastBatchSize);
  CHECK(full.starts_with("add table ip kube-proxy\n"));
  CHECK(full.find("add rule ip kube-proxy nat-prerouting jump services\n") != std::string::npos);
  CHECK(full.find("add element ip kube-proxy service-ips { 172.30.0.3 . tcp . 80 : goto service-") !=
        std::string::npos);
  CHECK(full.find("add rule") < full.find("add element"));
  CHECK(tables->batches == 1);
  CHECK(tables->tables.at(net::Family::kIPv4).chains.size() == f.kernel->tables.at(net::Family::kIPv4).chains.size());
  CHECK(tables->tables.at(net::Family::kIPv4).elements == f.kernel->tables.at(net::Family::kIPv4).elements);

  // A changed endpoint: only its change is printed, as the kernel is sent it.
  kproxy::nftables::testing::setEndpoints(f.snap.ports()[3], {endpoint("10.0.0.3", 80), endpoint("10.9.9.9", 80)});
  const std::vector<sdk::ChangedKey> changed{{net::Family::kIPv4, f.snap.ports()[3].key}};
  auto partial = dry.syncFrom(f.snap, changed, false);
  REQUIRE(partial.has_value());
  REQUIRE(f.backend->syncFrom(f.snap, changed, false).has_value());
  const std::string delta = printedSince(out, buf, len, mark);
  INFO(delta);
  CHECK(partial->operations == f.kernel->lastBatchSize);
  CHECK(static_cast<std::size_t>(std::count(delta.begin(), delta.end(), '\n')) == f.kernel->lastBatchSize);
  CHECK(delta.find("10.9.9.9") != std::string::npos);
  CHECK(delta.find("add table") == std::string::npos);
  CHECK(tables->tables.at(net::Family::kIPv4).elements == f.kernel->tables.at(net::Family::kIPv4).elements);

  // A full sync over what the dry run already printed prints nothing.
  auto again = dry.syncFrom(f.snap, {}, true);
  REQUIRE(again.has_value());
  CHECK(again->operations == 0);
  CHECK(printedSince(out, buf, len, mark).empty());

  // Cleanup prints the tables' deletion and removes them from memory only.
  REQUIRE(dry.cleanup().has_value());
  CHECK(printedSince(out, buf, len, mark) == "delete table ip kube-proxy\ndelete table ip6 kube-proxy\n");
  CHECK(tables->tables.empty());
  CHECK_FALSE(f.kernel->tables.empty());
  std::fclose(out);
  std::free(buf);
}

TEST_CASE("PrintingNftables: ops in the batch's phase order, for its table, refused ones too", "[unit]") {
  char* buf = nullptr;
  std::size_t len = 0;
  std::size_t mark = 0;
  std::FILE* out = open_memstream(&buf, &len);
  auto memory = std::make_unique<FakeKernelNftables>();
  FakeKernelNftables* inner = memory.get();
  PrintingNftables printer(std::move(memory), out, "kproxy-test");
  Op table;
  table.kind = OpKind::kAddTable;
  table.family = net::Family::kIPv4;
  Op chain;
  chain.kind = OpKind::kAddChain;
  chain.family = net::Family::kIPv4;
  chain.name = "c";
  Op gone;
  gone.kind = OpKind::kDeleteChain;
  gone.family = net::Family::kIPv4;
  gone.name = "old";
  // The chain deletion goes last whatever its place; the inner refuses it (no such chain).
  CHECK_FALSE(printer.apply({gone, table, chain}).has_value());
  const std::string text = printedSince(out, buf, len, mark);
  CHECK(text == table.toText("kproxy-test") + "\n" + chain.toText("kproxy-test") + "\n" +
                    gone.toText("kproxy-test") + "\n");
  CHECK(text.starts_with("add table ip kproxy-test\n"));
  // A batch prints at commit.
  auto batch = printer.beginBatch();
  batch->append(std::vector<Op>{table, chain});
  CHECK(printedSince(out, buf, len, mark).empty());
  REQUIRE(batch->commit().has_value());
  CHECK(printedSince(out, buf, len, mark) == table.toText("kproxy-test") + "\n" + chain.toText("kproxy-test") + "\n");
  CHECK(inner->tables.at(net::Family::kIPv4).chains.contains("c"));
  std::fclose(out);
  std::free(buf);
}

TEST_CASE("backend: affinity entries of a removed endpoint or service are deleted", "[unit]") {
  Fixture f;
  auto sticky = clusterIP("ns", "sticky", "172.30.5.1", 80, {endpoint("10.5.0.1", 80), endpoint("10.5.0.2", 80)});
  sticky.sessionAffinityClientIP = true;
  auto other = clusterIP("ns", "other", "172.30.5.2", 80, {endpoint("10.5.0.3", 80)});
  other.sessionAffinityClientIP = true;
  f.snap.ports().push_back(sticky);
  f.snap.ports().push_back(other);
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());

  const std::uint32_t stickyId = poolIdOf(*f.backend, sticky, serviceChainName(sticky), plan::Pool::kCluster);
  const std::uint32_t otherId = poolIdOf(*f.backend, other, serviceChainName(other), plan::Pool::kCluster);
  auto entry = [&](const char* client, const char* vip, const char* ep) {
    return affinityEntry(client, std::string_view(vip) == "172.30.5.1" ? stickyId : otherId, ep, 80);
  };
  auto& entries = f.kernel->dataPathEntries[net::Family::kIPv4][names::kAffinityMap];
  for (auto [k, d] : {entry("192.0.2.1", "172.30.5.1", "10.5.0.1"), entry("192.0.2.2", "172.30.5.1", "10.5.0.2"),
                      entry("192.0.2.3", "172.30.5.2", "10.5.0.3")})
    entries[k] = d;

  // 10.5.0.2 leaves "sticky": only the entry pointing at it goes.
  auto& p = f.snap.ports()[f.snap.ports().size() - 2];
  testing::setEndpoints(p, {endpoint("10.5.0.1", 80)});
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, p.key}}, false).has_value());
  CHECK(entries.size() == 2);
  CHECK(entries.contains(entry("192.0.2.1", "172.30.5.1", "10.5.0.1").first));
  CHECK_FALSE(entries.contains(entry("192.0.2.2", "172.30.5.1", "10.5.0.2").first));

  // "other" goes: a full sync deletes its entry, and keeps the valid one.
  auto gone = f.snap.ports().back();
  f.snap.ports().pop_back();
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  CHECK(entries.size() == 1);
  CHECK(entries.contains(entry("192.0.2.1", "172.30.5.1", "10.5.0.1").first));
}

TEST_CASE("backend: a pod behind two ports leaving both in one sync deletes its hairpin pair once",
          "[unit]") {
  Fixture f;
  auto a = clusterIP("ns", "multi", "172.30.9.1", 80, {endpoint("10.9.0.1", 80), endpoint("10.9.0.2", 80)},
                     sdk::Protocol::kTCP, "http");
  auto b = clusterIP("ns", "multi", "172.30.9.1", 443, {endpoint("10.9.0.1", 443), endpoint("10.9.0.2", 443)},
                     sdk::Protocol::kTCP, "https");
  f.snap.ports().push_back(a);
  f.snap.ports().push_back(b);
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  auto n = f.snap.ports().size();
  testing::setEndpoints(f.snap.ports()[n - 2], {endpoint("10.9.0.2", 80)});
  testing::setEndpoints(f.snap.ports()[n - 1], {endpoint("10.9.0.2", 443)});
  // The fake kernel refuses a second deletion of the same element, as the real one does.
  auto out = f.backend->syncFrom(f.snap, {{net::Family::kIPv4, a.key}, {net::Family::kIPv4, b.key}}, false);
  REQUIRE(out.has_value());
  KeyBuilder k;
  k.address(*net::Prefix::parse("10.9.0.1")).address(*net::Prefix::parse("10.9.0.1"));
  CHECK_FALSE(f.kernel->tables[net::Family::kIPv4].elements["hairpin-ips"].contains(k.bytes));
  CHECK_FALSE(f.backend->needsFullSync());
}

TEST_CASE("backend: affinity entries are judged by the pool they were recorded for", "[unit]") {
  auto k = std::make_unique<FakeKernelNftables>();
  auto* kernel = k.get();
  BackendSettings settings;
  settings.render.common.clusterCIDRs.push_back("10.0.0.0/8");
  NftablesBackend backend(sdk::Host(nullptr), settings, std::move(k));
  auto lb = clusterIP("ns", "lb", "172.30.7.1", 443,
                      {endpoint("10.7.0.1", 443, true), endpoint("10.7.0.2", 443, false)});
  lb.type = sdk::ServiceType::kLoadBalancer;
  lb.loadBalancerIPs = {"198.51.100.7"};
  lb.externalPolicyLocal = true;
  lb.localEndpoints = {lb.clusterEndpoints[0]};
  lb.sessionAffinityClientIP = true;
  VectorSnapshot snap({lb});
  REQUIRE(backend.syncFrom(snap, {}, true).has_value());

  // eTP=Local: the external chain balances the local endpoint under the local pool's ID; the
  // service chain (ClusterIP, and the short-circuit of pods and the node) both endpoints.
  const std::uint32_t cluster = poolIdOf(backend, lb, serviceChainName(lb), plan::Pool::kCluster);
  const std::uint32_t local = poolIdOf(backend, lb, externalChainName(lb), plan::Pool::kLocal);
  REQUIRE(cluster != local);
  auto& entries = kernel->dataPathEntries[net::Family::kIPv4][names::kAffinityMap];
  const auto outsiderRemote = affinityEntry("203.0.113.9", local, "10.7.0.2", 443);  // never valid
  const auto outsiderLocal = affinityEntry("203.0.113.10", local, "10.7.0.1", 443);
  const auto podRemote = affinityEntry("10.0.0.5", cluster, "10.7.0.2", 443);
  for (const auto& e : {outsiderRemote, outsiderLocal, podRemote}) entries[e.first] = e.second;
  REQUIRE(backend.syncFrom(snap, {}, true).has_value());
  CHECK_FALSE(entries.contains(outsiderRemote.first));
  CHECK(entries.contains(outsiderLocal.first));
  CHECK(entries.contains(podRemote.first));

  // The local endpoint stops being local: its local-pool entry goes, its cluster one stays.
  const auto podLocal = affinityEntry("10.0.0.6", cluster, "10.7.0.1", 443);
  entries[podLocal.first] = podLocal.second;
  snap.ports()[0].clusterEndpoints[0].isLocal = false;
  snap.ports()[0].localEndpoints.clear();
  REQUIRE(backend.syncFrom(snap, {{net::Family::kIPv4, lb.key}}, false).has_value());
  CHECK_FALSE(entries.contains(outsiderLocal.first));
  CHECK(entries.contains(podLocal.first));
  CHECK(entries.contains(podRemote.first));
}

TEST_CASE("backend: a refused affinity clean-up is retried", "[unit]") {
  Fixture f;
  auto sticky = clusterIP("ns", "sticky", "172.30.5.1", 80, {endpoint("10.5.0.1", 80)});
  sticky.sessionAffinityClientIP = true;
  f.snap.ports().push_back(sticky);
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  const auto [key, gone] =
      affinityEntry("192.0.2.1", poolIdOf(*f.backend, sticky, serviceChainName(sticky), plan::Pool::kCluster),
                    "10.5.0.9", 80);
  auto& entries = f.kernel->dataPathEntries[net::Family::kIPv4][names::kAffinityMap];
  entries[key] = gone;
  // A full sync over an unchanged table sends no batch; the clean-up's first batch is refused.
  f.kernel->failNextBatchAt(0);
  auto out = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE(out.has_value());
  CHECK(out->operations == 0);
  CHECK(entries.empty());
}

TEST_CASE("backend: the affinity map is listed only when an endpoint may have left", "[unit]") {
  Fixture f;
  auto sticky = clusterIP("ns", "sticky", "172.30.5.1", 80, {endpoint("10.5.0.1", 80)});
  sticky.sessionAffinityClientIP = true;
  f.snap.ports().push_back(sticky);
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  auto& p = f.snap.ports().back();
  const auto listings = f.kernel->mapListings;

  // An endpoint joins: every entry stays valid, nothing to list.
  testing::setEndpoints(p, {endpoint("10.5.0.1", 80), endpoint("10.5.0.2", 80)});
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, p.key}}, false).has_value());
  CHECK(f.kernel->mapListings == listings);
  // A service without affinity changes: nothing to list either.
  auto& plain = f.snap.ports()[0];
  testing::setEndpoints(plain, {plain.clusterEndpoints[0]});
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, plain.key}}, false).has_value());
  CHECK(f.kernel->mapListings == listings);
  // One leaves: listed.
  testing::setEndpoints(p, {endpoint("10.5.0.2", 80)});
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, p.key}}, false).has_value());
  CHECK(f.kernel->mapListings == listings + 1);
  // The service goes: listed.
  auto gone = f.snap.ports().back();
  f.snap.ports().pop_back();
  REQUIRE(f.backend->syncFrom(f.snap, {{net::Family::kIPv4, gone.key}}, false).has_value());
  CHECK(f.kernel->mapListings == listings + 2);
}

TEST_CASE("backend: a slot layout recorded as range and size expands to the rendered elements",
          "[unit]") {
  // Ownership records keep a balancing chain's slot-map elements as (range, number of
  // intervals); expanding that must give back exactly what the renderer produced, in order.
  NftablesRenderer renderer{RenderConfig{}};
  for (int n : {1, 2, 3, 7, 10, 64, 301}) {
    std::vector<sdk::Endpoint> eps;
    for (int i = 0; i < n; ++i) eps.push_back(endpoint("10.7." + std::to_string(i / 256) + "." + std::to_string(i % 256), 80));
    auto port = clusterIP("ns", "svc-" + std::to_string(n), "172.30.7." + std::to_string(n % 256), 80, eps);
    port.type = sdk::ServiceType::kNodePort;
    port.nodePort = 30000 + n;
    port.externalPolicyLocal = true;  // a second balancing chain (external-…) with its own range
    for (std::size_t i = 0; i < port.clusterEndpoints.size(); i += 2) port.clusterEndpoints[i].isLocal = true;
    port.localEndpoints.clear();
    for (const auto& e : port.clusterEndpoints)
      if (e.isLocal) port.localEndpoints.push_back(e);
    Fragment f = renderer.renderServicePort(port);
    std::vector<std::pair<std::string, bool>> rendered;
    PackedElements packed;
    std::string lastRange;
    for (const auto& e : f.elements) {
      if (!e.set.starts_with("service-endpoints-")) continue;
      rendered.emplace_back(e.key, e.intervalEnd);
      const std::string range = e.key.substr(0, 2);
      if (range == lastRange) continue;
      lastRange = range;
      const auto r = static_cast<std::uint32_t>(static_cast<std::uint8_t>(e.key[0]) << 8 | static_cast<std::uint8_t>(e.key[1]));
      std::uint32_t k = 0;
      for (std::size_t b = 5; b < 9; ++b) k = k << 8 | static_cast<std::uint8_t>(e.key[b]);
      packed.addLayout(7, r, k);
    }
    INFO(n << " endpoints");
    REQUIRE(rendered.size() >= 2 * static_cast<std::size_t>(n));
    std::vector<std::pair<std::string, bool>> expanded;
    packed.forEach([&](const PackedElements::Ref& ref) {
      CHECK(ref.set == 7);
      expanded.emplace_back(std::string(ref.key), ref.intervalEnd);
    });
    CHECK(expanded == rendered);
    CHECK(packed.bytes() == 10 * (rendered.size() > 2 * static_cast<std::size_t>(n) ? 2 : 1));
  }
}

TEST_CASE("backend: a full sync over a table holding a set kproxy does not declare", "[unit]") {
  // The table may hold sets kproxy's renderer does not declare: an older kproxy's (it had 256
  // endpoint maps), upstream kube-proxy's per-service affinity sets after a switch, an admin's.
  // Read-back lists them; the full sync must not fail on them.
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  {
    auto& t = f.kernel->tables[net::Family::kIPv4];
    SetSpec extra{"service-endpoints-200", {DataType::kSlot}, {DataType::kIPv4Addr, DataType::kInetService},
                  false, 0, 0};
    extra.interval = true;
    t.sets.emplace(extra.name, extra);
    KeyBuilder start, end;
    start.slot(200u << 16);
    end.slot((200u << 16) + 65535);
    KeyBuilder data;
    data.address(*net::Prefix::parse("10.200.0.1")).port(80);
    t.elements[extra.name][start.bytes] = "=" + data.bytes;
    t.elements[extra.name][end.bytes] = "end";
    t.sets.emplace("admin-set", SetSpec{"admin-set", {DataType::kIPv4Addr}, {}, false, 0, 0});
    t.elements["admin-set"];  // empty
  }
  sdk::Expected<sdk::SyncOutcome> full = sdk::fail("not run");
  REQUIRE_NOTHROW(full = f.backend->syncFrom(f.snap, {}, true));
  REQUIRE(full.has_value());
  // As any object of the table that nothing renders, its elements go (the set stays).
  CHECK(full->operations == 2);
  CHECK(f.kernel->tables[net::Family::kIPv4].sets.contains("service-endpoints-200"));
  CHECK(f.kernel->tables[net::Family::kIPv4].elements["service-endpoints-200"].empty());
  CHECK_FALSE(f.backend->needsFullSync());
  auto again = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE(again.has_value());
  CHECK(again->operations == 0);
}

TEST_CASE("backend: a stale base chain left for a later sync is a base chain in the mirror", "[unit]") {
  // A base chain kproxy does not render (another version's, one added by hand to the table)
  // is flushed by a full sync and deleted by a later one; meanwhile
  // the mirror must describe it as the kernel holds it.
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  {
    auto& c = f.kernel->tables[net::Family::kIPv4].chains["filter-legacy"];
    c.base = true;
    c.rules.push_back({0, {}, "counter"});
  }
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  CHECK(f.kernel->tables[net::Family::kIPv4].chains.at("filter-legacy").rules.empty());
  auto kernel = f.kernel->readBack(NftablesRenderer{RenderConfig{}}.setSpecs(net::Family::kIPv4),
                                   NftablesRenderer{RenderConfig{}}.setSpecs(net::Family::kIPv6));
  REQUIRE(kernel.has_value());
  const auto& mine = f.backend->mirror().ip.chains;
  REQUIRE(mine.contains("filter-legacy"));
  CHECK(mine.at("filter-legacy").base == kernel->ip.chains.at("filter-legacy").base);
  // The next sync deletes it.
  REQUIRE(f.backend->syncFrom(f.snap, {}, false).has_value());
  CHECK_FALSE(f.kernel->tables[net::Family::kIPv4].chains.contains("filter-legacy"));
}

namespace {
/// A kernel whose next batch throws while it is being filled (as std::bad_alloc would).
class ThrowingKernel final : public FakeKernelNftables {
 public:
  bool throwNext = false;
  std::unique_ptr<KernelBatch> beginBatch() override {
    if (!throwNext) return FakeKernelNftables::beginBatch();
    throwNext = false;
    struct Throwing final : KernelBatch {
      void append(std::span<const Op>) override { throw std::bad_alloc(); }
      std::size_t size() const override { return 0; }
      core::Result<void> commit() override { return {}; }
    };
    return std::make_unique<Throwing>();
  }
};
}  // namespace

TEST_CASE("backend: a full sync interrupted by an exception leaves the next sync full", "[unit]") {
  // A full sync drops the mirror and the ownership records before it builds the batch; if it
  // does not finish, a partial sync must not diff against the empty mirror.
  auto k = std::make_unique<ThrowingKernel>();
  auto* kernel = k.get();
  NftablesBackend backend(sdk::Host(nullptr), BackendSettings{}, std::move(k));
  VectorSnapshot snap({clusterIP("ns", "a", "172.30.0.1", 80, {endpoint("10.0.0.1", 80)})});
  REQUIRE(backend.syncFrom(snap, {}, true).has_value());
  const auto rules = kernel->tables[net::Family::kIPv4].chains.at("nat-prerouting").rules.size();
  kernel->throwNext = true;
  CHECK_THROWS_AS(backend.syncFrom(snap, {}, true), std::bad_alloc);
  CHECK(backend.needsFullSync());
  REQUIRE(backend.syncFrom(snap, {}, false).has_value());
  CHECK(kernel->tables[net::Family::kIPv4].chains.at("nat-prerouting").rules.size() == rules);
}

TEST_CASE("backend: a refused batch's error category follows the kernel's errno", "[unit]") {
  auto [errnum, category] = GENERATE(table<int, sdk::ErrorCategory>({
      {EINVAL, sdk::ErrorCategory::kKernelRefused},
      {ENOENT, sdk::ErrorCategory::kKernelRefused},
      {ENOBUFS, sdk::ErrorCategory::kTransient},
      {EBUSY, sdk::ErrorCategory::kTransient},
  }));
  Fixture f;
  f.kernel->failNextBatchAt(1, errnum);
  auto failed = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE_FALSE(failed.has_value());
  INFO(failed.error().message);
  CHECK(failed.error().errnum == errnum);
  CHECK(failed.error().category == category);
}

TEST_CASE("backend: bad options are invalid input", "[unit]") {
  auto made = makeNftablesBackend(sdk::Host(nullptr), {{"masquerade-bit", "40"}});
  REQUIRE_FALSE(made.has_value());
  CHECK(made.error().category == sdk::ErrorCategory::kInvalidInput);
}

TEST_CASE("backend: its metrics reach the host and count what its tables hold", "[unit]") {
  plugins::PluginMetrics metrics;
  const kproxy_host_api api = plugins::makeHostApi(&metrics);
  auto registered = NftablesBackend::registerMetrics(sdk::Host(&api));
  REQUIRE(registered.has_value());
  Fixture f;
  f.backend->useMetrics(*registered);
  auto first = f.backend->syncFrom(f.snap, {}, true);
  REQUIRE(first.has_value());
  auto families = metrics.collect();
  REQUIRE(families.size() == 2);
  CHECK(families[0].name == "kproxy_nftables_kernel_operations_total");
  CHECK(families[0].samples.at({}) == static_cast<double>(first->operations));
  CHECK(families[1].name == "kproxy_nftables_objects");
  const auto& mirror = f.backend->mirror().of(net::Family::kIPv4);
  CHECK(families[1].samples.at({"ipv4", "chain"}) == static_cast<double>(mirror.chains.size()));
  CHECK(families[1].samples.at({"ipv4", "set"}) == static_cast<double>(mirror.sets.size()));
  CHECK(families[1].samples.at({"ipv4", "chain"}) > 20);  // a chain per service at least
  CHECK(families[1].samples.at({"ipv4", "element"}) >= 20);
  CHECK(families[1].samples.at({"ipv6", "chain"}) == 0);

  // One service fewer: fewer set elements, and the removal's operations are counted on top.
  const double elementsBefore = families[1].samples.at({"ipv4", "element"});
  auto gone = f.snap.ports().back();
  f.snap.ports().pop_back();
  auto partial = f.backend->syncFrom(f.snap, {{net::Family::kIPv4, gone.key}}, false);
  REQUIRE(partial.has_value());
  families = metrics.collect();
  CHECK(families[0].samples.at({}) == static_cast<double>(first->operations + partial->operations));
  // (Its chains go in a later sync: stale chains are deleted one sync late.)
  CHECK(families[1].samples.at({"ipv4", "element"}) < elementsBefore);

  // A second backend (kproxy --cleanup creates one per plugin) gets the same metrics.
  CHECK(NftablesBackend::registerMetrics(sdk::Host(&api)).has_value());
}

TEST_CASE("backend: a ServiceCIDR change rewrites cluster-ips-check only, in a partial sync", "[unit]") {
  Fixture f;
  REQUIRE(f.backend->syncFrom(f.snap, {}, true).has_value());
  f.snap.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"kubernetes", "fd00:10:96::/112"}});
  auto added = f.backend->syncFrom(f.snap, {}, false);
  REQUIRE(added.has_value());
  // Flush cluster-ips-check, then its reject and the new drop: nothing else is touched.
  std::vector<std::string> ops;
  for (const auto& op : f.backend->lastOps()) ops.push_back(op.toText());
  CHECK(ops == std::vector<std::string>{
                   "flush chain ip kube-proxy cluster-ips-check",
                   "add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject",
                   "add rule ip kube-proxy cluster-ips-check ip daddr 172.30.0.0/16 drop",
               });
  CHECK(f.backend->syncFrom(f.snap, {}, false)->operations == 0);
  // A restart (full sync over the same kernel) agrees.
  CHECK(f.backend->syncFrom(f.snap, {}, true)->operations == 0);

  f.snap.setServiceCIDRs({});
  auto removed = f.backend->syncFrom(f.snap, {}, false);
  REQUIRE(removed.has_value());
  CHECK(removed->operations == 2);  // flush, and the reject back
}
