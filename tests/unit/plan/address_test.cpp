// IPPrefix: the address parser every backend and the plan share.

#include <catch2/catch.hpp>

#include "kproxy/backends/common/address.h"

using kproxy::backends::IPPrefix;

TEST_CASE("IPPrefix parses addresses and prefixes of both families", "[unit]") {
  auto host = IPPrefix::parse("10.1.2.3");
  REQUIRE(host);
  CHECK(host->isHost());
  CHECK_FALSE(host->v6);
  CHECK(host->toString() == "10.1.2.3");
  auto net = IPPrefix::parse("10.1.2.3/16");
  REQUIRE(net);
  CHECK(net->toString() == "10.1.0.0/16");  // host bits cleared
  CHECK(net->contains(*host));
  CHECK_FALSE(net->contains(*IPPrefix::parse("10.2.0.1")));
  auto v6 = IPPrefix::parse("fd00:10::/64");
  REQUIRE(v6);
  CHECK(v6->v6);
  CHECK(v6->contains(*IPPrefix::parse("fd00:10::7")));
  CHECK_FALSE(v6->contains(*host));  // never across families
  CHECK(IPPrefix::parse("0.0.0.0/0")->contains(*host));
  CHECK(IPPrefix::parse("fd00::1")->toString() == "fd00::1");
}

TEST_CASE("IPPrefix refuses malformed text", "[unit]") {
  for (const char* bad : {"", "10.0.0", "10.0.0.256", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "fd00::/129",
                          "/8", "10.0.0.1/8/8", "nonsense", "fd00:::1"})
    CHECK_FALSE(IPPrefix::parse(bad).has_value());
}
