#include "net_util.h"

#include <catch2/catch.hpp>

using namespace kproxy::cli;

TEST_CASE("ipFamilyOf tells the family of a plain IP literal", "[unit]") {
  CHECK(ipFamilyOf("10.0.0.1") == kproxy::net::Family::kIPv4);
  CHECK(ipFamilyOf("fd00::1") == kproxy::net::Family::kIPv6);
  CHECK(ipFamilyOf("::ffff:10.0.0.1") == kproxy::net::Family::kIPv6);
  CHECK_FALSE(ipFamilyOf(""));
  CHECK_FALSE(ipFamilyOf("10.0.0.0/8"));
  CHECK_FALSE(ipFamilyOf("[fd00::1]"));
  CHECK_FALSE(ipFamilyOf("10.0.0.256"));
  CHECK_FALSE(ipFamilyOf("example.com"));
}

TEST_CASE("isCIDR accepts prefixes with an in-range length", "[unit]") {
  CHECK(isCIDR("10.0.0.0/8"));
  CHECK(isCIDR("10.1.2.3/32"));
  CHECK(isCIDR("0.0.0.0/0"));
  CHECK(isCIDR("fd00::/64"));
  CHECK(isCIDR("fd00::1/128"));
  CHECK_FALSE(isCIDR("10.0.0.1"));
  CHECK_FALSE(isCIDR("10.0.0.0/33"));
  CHECK_FALSE(isCIDR("fd00::/129"));
  CHECK_FALSE(isCIDR("10.0.0.0/"));
  CHECK_FALSE(isCIDR("10.0.0.0/-1"));
  CHECK_FALSE(isCIDR("10.0.0.0/0008"));
  CHECK_FALSE(isCIDR("10.0.0.0/8x"));
  CHECK_FALSE(isCIDR("host/8"));
}
