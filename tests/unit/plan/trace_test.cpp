// The trace result types every backend's tracer fills (plan/trace.h): the choice explorer, the
// merge of paths, the text and JSON forms.

#include "kproxy/plan/trace.h"

#include <catch2/catch.hpp>

using namespace kproxy;
using namespace kproxy::plan;

namespace {

TracePath dnatPath(std::string endpoint, bool masq = false) {
  TracePath p;
  p.outcome.verdict = TraceVerdict::kDnat;
  p.outcome.endpoints = {std::move(endpoint)};
  p.outcome.masqueraded = masq;
  return p;
}

}  // namespace

TEST_CASE("plan trace: the choice explorer visits every combination once, depth first", "[unit]") {
  ChoiceExplorer explorer;
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  do {
    const std::size_t a = explorer.choose(2);
    // The second choice exists only on the first alternative of the first.
    const std::size_t b = a == 0 ? explorer.choose(3) : 9;
    seen.emplace_back(a, b);
  } while (explorer.next());
  CHECK(seen == std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {0, 1}, {0, 2}, {1, 9}});
}

TEST_CASE("plan trace: paths merge into the endpoint set, sorted by address", "[unit]") {
  std::vector<TracePath> paths{dnatPath("10.0.1.10:80"), dnatPath("10.0.1.2:80", true), dnatPath("10.0.1.2:80")};
  TraceOutcome o = mergePaths(paths);
  CHECK(o.verdict == TraceVerdict::kDnat);
  CHECK(o.endpoints == std::vector<std::string>{"10.0.1.2:80", "10.0.1.10:80"});
  CHECK(o.masqueraded);
  CHECK_FALSE(o.mixed);
  CHECK(o.toText() == "10.0.1.2:80, 10.0.1.10:80");

  TracePath dropped;
  dropped.outcome.verdict = TraceVerdict::kDropped;
  dropped.outcome.chain = "filter KUBE-SERVICES";
  paths.push_back(dropped);
  o = mergePaths(paths);
  CHECK(o.verdict == TraceVerdict::kDnat);
  CHECK(o.mixed);
  o = mergePaths(std::vector<TracePath>{dropped});
  CHECK(o.toText() == "DROP");
  CHECK(o.chain == "filter KUBE-SERVICES");
  CHECK(o.toJson() ==
        R"({"verdict":"drop","endpoints":[],"masqueraded":false,"mixed":false,"chain":"filter KUBE-SERVICES","rule":""})");
}

TEST_CASE("plan trace: JSON strings and endpoints are written alike by every backend", "[unit]") {
  CHECK(jsonString("a\"b\\c\nd\x01") == R"("a\"b\\c\nd\u0001")");
  CHECK(endpointText("10.0.0.1", 80) == "10.0.0.1:80");
  CHECK(endpointText("fd00::1", 80) == "[fd00::1]:80");
  CHECK(verdictName(TraceVerdict::kRejected) == "reject");
}

TEST_CASE("plan trace: an unallocated ClusterIP names its ServiceCIDR", "[unit]") {
  const std::vector<sdk::ServiceCIDR> cidrs{{"kubernetes", "172.30.0.0/16"}};
  CHECK(unallocatedClusterIPReason(cidrs, net::Family::kIPv4, "172.30.0.9") ==
        "dropped: unallocated ClusterIP in ServiceCIDR kubernetes (172.30.0.0/16)");
  CHECK(unallocatedClusterIPReason(cidrs, net::Family::kIPv4, "10.0.0.1") == "dropped: unallocated ClusterIP");
}
