#include "kproxy/userspace/endpoint_chooser.h"

#include <catch2/catch.hpp>

using namespace kproxy::userspace;
using namespace std::chrono_literals;

namespace {
const Target a{"10.0.0.1", 80}, b{"10.0.0.2", 80}, c{"10.0.0.3", 80}, d{"10.0.0.4", 80};
const EndpointChooser::TimePoint t0{};
}  // namespace

TEST_CASE("round robin: each connection starts one further and tries the rest in order", "[unit]") {
  EndpointChooser ch;
  ch.setEndpoints({a, b, c}, 0s);
  CHECK(ch.order("1.1.1.1", t0, 4) == std::vector<Target>{a, b, c});
  CHECK(ch.order("1.1.1.1", t0, 4) == std::vector<Target>{b, c, a});
  CHECK(ch.order("2.2.2.2", t0, 4) == std::vector<Target>{c, a, b});
  CHECK(ch.order("2.2.2.2", t0, 4) == std::vector<Target>{a, b, c});
}

TEST_CASE("attempts are bounded, each endpoint tried once", "[unit]") {
  EndpointChooser ch;
  ch.setEndpoints({a, b, c, d}, 0s);
  CHECK(ch.order("x", t0, 2) == std::vector<Target>{a, b});
  CHECK(ch.order("x", t0, 10) == std::vector<Target>{b, c, d, a});
  CHECK(ch.order("x", t0, 0).empty());
  EndpointChooser empty;
  CHECK(empty.order("x", t0, 4).empty());
}

TEST_CASE("an endpoint change keeps the round-robin position", "[unit]") {
  EndpointChooser ch;
  ch.setEndpoints({a, b, c}, 0s);
  ch.order("x", t0, 1);
  ch.order("x", t0, 1);  // next is index 2
  ch.setEndpoints({a, b, c, d}, 0s);
  CHECK(ch.order("x", t0, 1) == std::vector<Target>{c});
  ch.setEndpoints({a, b}, 0s);  // position 3 % 2
  CHECK(ch.order("x", t0, 1) == std::vector<Target>{b});
}

TEST_CASE("ClientIP affinity: the client's endpoint first, the others after it as retries", "[unit]") {
  EndpointChooser ch;
  ch.setEndpoints({a, b, c}, 10s);
  auto first = ch.order("1.1.1.1", t0, 4);
  REQUIRE(first == std::vector<Target>{a, b, c});
  // a refused, b served: the client sticks to b.
  ch.served("1.1.1.1", b, t0);
  CHECK(ch.order("1.1.1.1", t0 + 5s, 4) == std::vector<Target>{b, c, a});
  CHECK(ch.order("1.1.1.1", t0 + 9s, 2) == std::vector<Target>{b, c});
  // Another client is not affected.
  CHECK(ch.order("2.2.2.2", t0, 1).size() == 1);
  CHECK(ch.affinityEntries() == 1);
}

TEST_CASE("affinity expires after its timeout and goes with its endpoint", "[unit]") {
  EndpointChooser ch;
  ch.setEndpoints({a, b, c}, 10s);
  ch.served("1.1.1.1", c, t0);
  ch.served("2.2.2.2", a, t0 + 8s);
  // Expired: plain round robin (starts at a).
  CHECK(ch.order("1.1.1.1", t0 + 11s, 1) == std::vector<Target>{a});
  CHECK(ch.affinityEntries() == 1);
  ch.expire(t0 + 19s);
  CHECK(ch.affinityEntries() == 0);
  ch.served("3.3.3.3", b, t0);
  ch.setEndpoints({a, c}, 10s);
  CHECK(ch.affinityEntries() == 0);
  ch.served("3.3.3.3", c, t0);
  ch.setEndpoints({a, c}, 0s);  // affinity off
  CHECK(ch.affinityEntries() == 0);
}

TEST_CASE("Target prints IPv6 in brackets", "[unit]") {
  CHECK(a.toString() == "10.0.0.1:80");
  CHECK(Target{"fd00::1", 443}.toString() == "[fd00::1]:443");
}
