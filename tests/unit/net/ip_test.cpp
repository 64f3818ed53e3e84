// net/: the one address type, Go's sloppy parsers and host:port.

#include <catch2/catch.hpp>

#include "kproxy/net/host_port.h"
#include "kproxy/net/ip.h"

namespace net = kproxy::net;

TEST_CASE("net::Prefix parses addresses and prefixes of both families", "[unit]") {
  auto host = net::Prefix::parse("10.1.2.3");
  REQUIRE(host);
  CHECK(host->isHost());
  CHECK_FALSE(host->v6());
  CHECK(host->toString() == "10.1.2.3");
  auto prefix = net::Prefix::parse("10.1.2.3/16");
  REQUIRE(prefix);
  CHECK(prefix->toString() == "10.1.0.0/16");  // host bits cleared
  CHECK(prefix->cidrText() == "10.1.0.0/16");
  CHECK(host->cidrText() == "10.1.2.3/32");
  CHECK(prefix->host().toString() == "10.1.0.0");
  CHECK(prefix->contains(*host));
  CHECK_FALSE(prefix->contains(*net::Prefix::parse("10.2.0.1")));
  auto v6 = net::Prefix::parse("fd00:10::/64");
  REQUIRE(v6);
  CHECK(v6->v6());
  CHECK(v6->contains(*net::Prefix::parse("fd00:10::7")));
  CHECK_FALSE(v6->contains(*host));  // never across families
  CHECK(net::Prefix::parse("0.0.0.0/0")->contains(*host));
  CHECK(net::Prefix::parse("fd00::1")->toString() == "fd00::1");
}

TEST_CASE("net::Prefix refuses malformed text", "[unit]") {
  for (const char* bad : {"", "10.0.0", "10.0.0.256", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "fd00::/129",
                          "/8", "10.0.0.1/8/8", "nonsense", "fd00:::1"})
    CHECK_FALSE(net::Prefix::parse(bad).has_value());
}

TEST_CASE("net::Prefix::parse is strict: no leading zeros, a mapped address stays IPv6", "[unit]") {
  CHECK_FALSE(net::Prefix::parse("010.0.0.1").has_value());
  CHECK(net::Prefix::parse("::ffff:10.0.0.1")->family == net::Family::kIPv6);
  CHECK_FALSE(net::Prefix::parse("10.0.0.0/-1").has_value());
}

TEST_CASE("IP parsing is sloppy like Go's ParseIPSloppy", "[unit]") {
  CHECK(net::parseIPSloppy("010.001.000.009")->toString() == "10.1.0.9");
  CHECK(net::parseIPSloppy("FD00:0::1")->toString() == "fd00::1");
  CHECK(net::parseIPSloppy("::ffff:10.0.0.1")->family == net::Family::kIPv4);
  CHECK(net::parseIPSloppy("::ffff:10.0.0.1")->toString() == "10.0.0.1");
  CHECK_FALSE(net::parseIPSloppy("1.2.3"));
  CHECK_FALSE(net::parseIPSloppy("1.2.3.4.5"));
  CHECK_FALSE(net::parseIPSloppy("1.2.3.256"));
  CHECK_FALSE(net::parseIPSloppy(""));
  CHECK_FALSE(net::parseIPSloppy("10.0.0.0/8"));
  CHECK(net::parseCIDRSloppy("2001:db8::1/32")->cidrText() == "2001:db8::/32");
  CHECK(net::parseCIDRSloppy("0.0.0.0/0")->cidrText() == "0.0.0.0/0");
  CHECK(net::parseCIDRSloppy("010.1.2.3/8")->cidrText() == "10.0.0.0/8");
  CHECK(net::parseCIDRSloppy("10.1.2.3/32")->cidrText() == "10.1.2.3/32");
  CHECK_FALSE(net::parseCIDRSloppy("10.0.0.0"));
  CHECK_FALSE(net::parseCIDRSloppy("10.0.0.0/"));
  CHECK_FALSE(net::parseCIDRSloppy("10.0.0.0/33"));
  CHECK(net::parseSloppy("10.0.0.1")->isHost());
  CHECK(net::parseSloppy("10.0.0.0/8")->length == 8);
}

TEST_CASE("families are the ABI's values and spelled as Kubernetes spells them", "[unit]") {
  CHECK(static_cast<int>(net::Family::kIPv4) == 4);
  CHECK(static_cast<int>(net::Family::kIPv6) == 6);
  CHECK(std::string(net::toString(net::Family::kIPv6)) == "IPv6");
  CHECK(net::bitsOf(net::Family::kIPv4) == 32);
  CHECK(net::otherFamily(net::Family::kIPv4) == net::Family::kIPv6);
}

TEST_CASE("splitHostPort splits like Go's net.SplitHostPort", "[unit]") {
  auto v4 = net::splitHostPort("127.0.0.1:10249");
  REQUIRE(v4);
  CHECK(v4->host == "127.0.0.1");
  CHECK(v4->port == "10249");
  auto v6 = net::splitHostPort("[::1]:10256");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
  CHECK_FALSE(net::splitHostPort("::1:10256"));
  CHECK_FALSE(net::splitHostPort("10.0.0.1"));
}

TEST_CASE("joinHostPort brackets an IPv6 host like Go's net.JoinHostPort", "[unit]") {
  CHECK(net::joinHostPort("10.0.0.1", std::uint16_t{80}) == "10.0.0.1:80");
  CHECK(net::joinHostPort("fd00::1", std::uint16_t{8080}) == "[fd00::1]:8080");
  CHECK(net::joinHostPort("", "10256") == ":10256");
}
