// FakeIpvs refuses what the kernel refuses, with the same errnos, and reads back as the kernel
// does.
#include "kproxy/ipvs/kernel.h"

#include <catch2/catch.hpp>

#include <cerrno>

namespace net = kproxy::net;

using namespace kproxy::ipvs;
using kproxy::core::ErrorCategory;

namespace {

VirtualServer service(const char* address, std::uint16_t port, Protocol protocol = Protocol::kTcp) {
  VirtualServer vs;
  vs.address = *net::Prefix::parse(address);
  vs.family = vs.address.v6() ? net::Family::kIPv6 : net::Family::kIPv4;
  vs.port = port;
  vs.protocol = protocol;
  return vs;
}

RealServer backend(const char* address, std::uint16_t port, std::int32_t weight = 1) {
  return RealServer{.address = *net::Prefix::parse(address), .port = port, .weight = weight};
}

}  // namespace

TEST_CASE("FakeIpvs: virtual servers are added once, updated and deleted; missing ones are ESRCH", "[unit]") {
  FakeIpvs ipvs;
  auto vs = service("10.96.0.10", 80);
  REQUIRE(ipvs.addVirtualServer(vs));
  auto again = ipvs.addVirtualServer(vs);
  REQUIRE_FALSE(again);
  CHECK(again.error().errnum == EEXIST);

  vs.scheduler = "wrr";
  vs.flags = kFlagPersistent;
  vs.timeout = 10800;
  REQUIRE(ipvs.updateVirtualServer(vs));
  auto listed = ipvs.listVirtualServers();
  REQUIRE(listed);
  REQUIRE(listed->size() == 1);
  CHECK(listed->front() == vs);

  REQUIRE(ipvs.deleteVirtualServer(vs));
  for (auto r : {ipvs.deleteVirtualServer(vs), ipvs.updateVirtualServer(vs)}) {
    REQUIRE_FALSE(r);
    CHECK(r.error().errnum == ESRCH);
    CHECK(r.error().category == ErrorCategory::kNotFound);
  }
  auto rs = ipvs.listRealServers(vs);
  REQUIRE_FALSE(rs);
  CHECK(rs.error().errnum == ESRCH);
}

TEST_CASE("FakeIpvs: an unknown scheduler is ENOENT, as a missing ip_vs_<name> module", "[unit]") {
  FakeIpvs ipvs;
  auto vs = service("10.96.0.10", 80);
  vs.scheduler = "nosuch";
  auto r = ipvs.addVirtualServer(vs);
  REQUIRE_FALSE(r);
  CHECK(r.error().errnum == ENOENT);
  CHECK(r.error().context.find("ip_vs_nosuch") != std::string::npos);
  CHECK(ipvs.entries.empty());
  vs.scheduler = "lc";
  REQUIRE(ipvs.addVirtualServer(vs));
  vs.scheduler = "nosuch";
  r = ipvs.updateVirtualServer(vs);
  REQUIRE_FALSE(r);
  CHECK(r.error().errnum == ENOENT);
  CHECK(ipvs.entries.front().vs.scheduler == "lc");
}

TEST_CASE("FakeIpvs: real servers: EEXIST, ENOENT when missing, ESRCH without the service", "[unit]") {
  FakeIpvs ipvs;
  auto vs = service("fd00::10", 443);
  auto rs = backend("fd00::1:5", 8443);
  auto noService = ipvs.addRealServer(vs, rs);
  REQUIRE_FALSE(noService);
  CHECK(noService.error().errnum == ESRCH);

  REQUIRE(ipvs.addVirtualServer(vs));
  REQUIRE(ipvs.addRealServer(vs, rs));
  auto dup = ipvs.addRealServer(vs, rs);
  REQUIRE_FALSE(dup);
  CHECK(dup.error().errnum == EEXIST);
  CHECK(dup.error().context.find("real server exists") != std::string::npos);

  ipvs.entries.front().realServers.front().activeConnections = 4;  // traffic the kernel counted
  rs.weight = 0;  // graceful termination
  REQUIRE(ipvs.updateRealServer(vs, rs));
  auto listed = ipvs.listRealServers(vs);
  REQUIRE(listed);
  REQUIRE(listed->size() == 1);
  CHECK(listed->front().weight == 0);
  CHECK(listed->front().activeConnections == 4);

  auto other = backend("fd00::1:6", 8443);
  for (auto r : {ipvs.updateRealServer(vs, other), ipvs.deleteRealServer(vs, other)}) {
    REQUIRE_FALSE(r);
    CHECK(r.error().errnum == ENOENT);
  }
  auto wrongFamily = ipvs.addRealServer(vs, backend("10.0.0.1", 80));
  REQUIRE_FALSE(wrongFamily);
  CHECK(wrongFamily.error().errnum == EINVAL);

  REQUIRE(ipvs.deleteRealServer(vs, rs));
  listed = ipvs.listRealServers(vs);
  REQUIRE(listed);
  CHECK(listed->empty());
}

TEST_CASE("FakeIpvs: userspace refusals come before the kernel's", "[unit]") {
  FakeIpvs ipvs;
  auto vs = service("10.96.0.10", 80);
  vs.family = net::Family::kIPv6;  // an IPv4 address
  auto r = ipvs.addVirtualServer(vs);
  REQUIRE_FALSE(r);
  CHECK(r.error().category == ErrorCategory::kInvalidArgument);
  vs = service("10.96.0.10", 80);
  vs.scheduler = "a-name-far-too-long";
  CHECK_FALSE(ipvs.addVirtualServer(vs));
  vs.scheduler = "rr";
  vs.netmask = 33;
  CHECK_FALSE(ipvs.addVirtualServer(vs));
  vs.netmask.reset();
  REQUIRE(ipvs.addVirtualServer(vs));
  auto negative = ipvs.addRealServer(vs, backend("10.1.0.1", 80, -1));
  REQUIRE_FALSE(negative);
  CHECK(negative.error().category == ErrorCategory::kInvalidArgument);
}

TEST_CASE("FakeIpvs: read-back normalises as the kernel does", "[unit]") {
  FakeIpvs ipvs;
  auto vs = service("10.96.0.10", 80);
  vs.netmask = 32;  // the host: reported as nullopt
  REQUIRE(ipvs.addVirtualServer(vs));
  VirtualServer mark;
  mark.fwmark = 9;
  mark.port = 1234;  // not part of a firewall-mark service
  REQUIRE(ipvs.addVirtualServer(mark));
  auto listed = ipvs.listVirtualServers();
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK_FALSE((*listed)[0].netmask.has_value());
  CHECK((*listed)[1].fwmark == 9);
  CHECK((*listed)[1].port == 0);
  RealServer rs = backend("10.1.0.1", 80);
  rs.activeConnections = 7;  // ignored when adding
  REQUIRE(ipvs.addRealServer(mark, rs));
  CHECK(ipvs.listRealServers(mark)->front().activeConnections == 0);
}

TEST_CASE("FakeIpvs: flush, timeouts and injected failures", "[unit]") {
  FakeIpvs ipvs;
  REQUIRE(ipvs.addVirtualServer(service("10.96.0.10", 80)));
  REQUIRE(ipvs.addVirtualServer(service("10.96.0.10", 53, Protocol::kUdp)));
  REQUIRE(ipvs.flush());
  CHECK(ipvs.listVirtualServers()->empty());

  CHECK(*ipvs.timeouts() == Timeouts{900, 120, 300});
  REQUIRE(ipvs.setTimeouts({0, 30, 0}));  // 0 leaves a value alone
  CHECK(*ipvs.timeouts() == Timeouts{900, 30, 300});
  CHECK_FALSE(ipvs.setTimeouts({-1, 0, 0}));

  ipvs.failNext(IpvsOperation::kAddVirtualServer, ENOMEM);
  auto r = ipvs.addVirtualServer(service("10.96.0.11", 80));
  REQUIRE_FALSE(r);
  CHECK(r.error().category == ErrorCategory::kTransient);
  CHECK(ipvs.entries.empty());
  REQUIRE(ipvs.addVirtualServer(service("10.96.0.11", 80)));  // the injection cleared itself
}
