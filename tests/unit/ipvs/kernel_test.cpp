// The value types' names and the errors the adapters and the fake report.
#include "kproxy/ipvs/kernel.h"

#include <catch2/catch.hpp>

#include <cerrno>

namespace net = kproxy::net;

using namespace kproxy::ipvs;
using kproxy::core::ErrorCategory;

namespace {

VirtualServer tcp(const char* address, std::uint16_t port) {
  VirtualServer vs;
  vs.address = *net::Prefix::parse(address);
  vs.family = vs.address.v6() ? net::Family::kIPv6 : net::Family::kIPv4;
  vs.port = port;
  return vs;
}

}  // namespace

TEST_CASE("virtual and real servers describe themselves as ipvsadm names them", "[unit]") {
  CHECK(tcp("10.96.0.10", 80).describe() == "TCP 10.96.0.10:80");
  VirtualServer udp6 = tcp("fd00::10", 53);
  udp6.protocol = Protocol::kUdp;
  CHECK(udp6.describe() == "UDP [fd00::10]:53");
  VirtualServer mark;
  mark.fwmark = 7;
  mark.family = net::Family::kIPv6;
  CHECK(mark.describe() == "FWM 7 IPv6");
  RealServer rs{.address = *net::Prefix::parse("10.244.1.5"), .port = 8080};
  CHECK(rs.describe() == "10.244.1.5:8080");
  rs.address = *net::Prefix::parse("fd00::5");
  CHECK(rs.describe() == "[fd00::5]:8080");
}

TEST_CASE("identity ignores settings; a firewall-mark service is its mark and family", "[unit]") {
  VirtualServer a = tcp("10.0.0.1", 80);
  VirtualServer b = a;
  b.scheduler = "sh";
  b.flags = kFlagPersistent;
  b.timeout = 10800;
  CHECK(a.sameIdentity(b));
  b.port = 81;
  CHECK_FALSE(a.sameIdentity(b));
  b = a;
  b.protocol = Protocol::kSctp;
  CHECK_FALSE(a.sameIdentity(b));

  VirtualServer m1, m2;
  m1.fwmark = m2.fwmark = 5;
  m2.port = 99;  // unused with a mark
  CHECK(m1.sameIdentity(m2));
  m2.family = net::Family::kIPv6;
  CHECK_FALSE(m1.sameIdentity(m2));

  RealServer r1{.address = *net::Prefix::parse("10.1.0.1"), .port = 80, .weight = 1};
  RealServer r2 = r1;
  r2.weight = 0;
  r2.activeConnections = 3;
  CHECK(r1.sameIdentity(r2));
  CHECK_FALSE(r1.sameSettings(r2));
  r2.weight = 1;
  CHECK(r1.sameSettings(r2));  // counters are not settings
}

TEST_CASE("errors name the operation, the objects and what the errno means for IPVS", "[unit]") {
  VirtualServer vs = tcp("10.96.0.10", 80);
  vs.scheduler = "nope";
  RealServer rs{.address = *net::Prefix::parse("10.244.1.5"), .port = 8080};

  auto e = ipvsError(IpvsOperation::kAddVirtualServer, ENOENT, &vs);
  CHECK(e.category == ErrorCategory::kNotFound);
  CHECK(e.errnum == ENOENT);
  CHECK(e.context ==
        "ipvs: add virtual server TCP 10.96.0.10:80: scheduler 'nope' is not available (the kernel could "
        "not load module ip_vs_nope)");
  CHECK(ipvsError(IpvsOperation::kUpdateVirtualServer, ENOENT, &vs).context.find("module ip_vs_nope") !=
        std::string::npos);

  e = ipvsError(IpvsOperation::kDeleteVirtualServer, ESRCH, &vs);
  CHECK(e.category == ErrorCategory::kNotFound);
  CHECK(e.context == "ipvs: delete virtual server TCP 10.96.0.10:80: no such virtual server");

  e = ipvsError(IpvsOperation::kAddRealServer, ESRCH, &vs, &rs);
  CHECK(e.context == "ipvs: add real server 10.244.1.5:8080 to TCP 10.96.0.10:80: no such virtual server");
  e = ipvsError(IpvsOperation::kUpdateRealServer, ENOENT, &vs, &rs);
  CHECK(e.context == "ipvs: update real server 10.244.1.5:8080 of TCP 10.96.0.10:80: no such real server");
  e = ipvsError(IpvsOperation::kAddRealServer, EEXIST, &vs, &rs);
  CHECK(e.category == ErrorCategory::kKernel);
  CHECK(e.context == "ipvs: add real server 10.244.1.5:8080 to TCP 10.96.0.10:80: real server exists");
  CHECK(ipvsError(IpvsOperation::kAddVirtualServer, EEXIST, &vs).context ==
        "ipvs: add virtual server TCP 10.96.0.10:80: virtual server exists");
  CHECK(ipvsError(IpvsOperation::kFlush, ENOBUFS).category == ErrorCategory::kTransient);
  CHECK(ipvsError(IpvsOperation::kSetTimeouts, EPERM).message() == "ipvs: set IPVS timeouts: Operation not permitted");
}
