// FakeDummyLink refuses what rtnetlink refuses.
#include "kproxy/ipvs/kernel.h"

#include <catch2/catch.hpp>

#include <cerrno>

namespace net = kproxy::net;

using namespace kproxy::ipvs;

TEST_CASE("FakeDummyLink: ensureLink is idempotent; someone else's link is left alone", "[unit]") {
  FakeDummyLink links;
  auto first = links.ensureLink(kDummyLinkName);
  REQUIRE(first);
  CHECK_FALSE(*first);
  auto second = links.ensureLink(kDummyLinkName);
  REQUIRE(second);
  CHECK(*second);

  links.links.emplace_back("eth0", FakeDummyLink::FakeLink{.kind = "veth", .addresses = {}});
  auto foreign = links.ensureLink("eth0");
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().errnum == EEXIST);
  CHECK(foreign.error().context.find("not dummy") != std::string::npos);
  CHECK_FALSE(links.deleteLink("eth0"));

  REQUIRE(links.deleteLink(kDummyLinkName));
  REQUIRE(links.deleteLink(kDummyLinkName));  // a missing link is not an error
  CHECK(links.links.size() == 1);
}

TEST_CASE("FakeDummyLink: addresses: EEXIST, EADDRNOTAVAIL, ENODEV", "[unit]") {
  FakeDummyLink links;
  auto v4 = *net::Prefix::parse("10.96.0.10");
  auto v6 = *net::Prefix::parse("fd00::10");
  auto noLink = links.addAddress(kDummyLinkName, v4);
  REQUIRE_FALSE(noLink);
  CHECK(noLink.error().errnum == ENODEV);
  CHECK(noLink.error().context == "ipvs: add address 10.96.0.10 to kube-ipvs0: no such link");

  REQUIRE(links.ensureLink(kDummyLinkName));
  REQUIRE(links.addAddress(kDummyLinkName, v4));
  REQUIRE(links.addAddress(kDummyLinkName, v6));
  auto dup = links.addAddress(kDummyLinkName, v4);
  REQUIRE_FALSE(dup);
  CHECK(dup.error().errnum == EEXIST);
  auto listed = links.listAddresses(kDummyLinkName);
  REQUIRE(listed);
  CHECK(*listed == std::vector<net::Prefix>{v4, v6});

  REQUIRE(links.deleteAddress(kDummyLinkName, v4));
  auto gone = links.deleteAddress(kDummyLinkName, v4);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().errnum == EADDRNOTAVAIL);
  CHECK(*links.listAddresses(kDummyLinkName) == std::vector<net::Prefix>{v6});
  CHECK_FALSE(links.listAddresses("nope"));
}
