#include "net_util.h"

#include <catch2/catch.hpp>

using namespace kproxy::cli;

TEST_CASE("parseIP tells the family of a plain IP literal", "[unit]") {
  CHECK(parseIP("10.0.0.1") == IPKind::kIPv4);
  CHECK(parseIP("fd00::1") == IPKind::kIPv6);
  CHECK(parseIP("::ffff:10.0.0.1") == IPKind::kIPv6);
  CHECK(parseIP("") == IPKind::kNone);
  CHECK(parseIP("10.0.0.0/8") == IPKind::kNone);
  CHECK(parseIP("[fd00::1]") == IPKind::kNone);
  CHECK(parseIP("10.0.0.256") == IPKind::kNone);
  CHECK(parseIP("example.com") == IPKind::kNone);
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
