// The generic netlink encoding of IPVS requests and the decoding of the kernel's replies, on
// messages built in memory (the VM tests check the same against a real kernel).
#include "ipvs_wire.h"

#include <arpa/inet.h>
#include <linux/ip_vs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <array>
#include <cstring>

#include <netlink/attr.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>

namespace net = kproxy::net;

using namespace kproxy::ipvs;

namespace {

constexpr int kFamilyId = 0x2a;

/// The attributes of the nested `type` (IPVS_CMD_ATTR_SERVICE / _DEST) in `msg`, unvalidated.
template <std::size_t N>
std::array<nlattr*, N> nested(nl_msg* msg, int type) {
  std::array<nlattr*, IPVS_CMD_ATTR_MAX + 1> top{};
  REQUIRE(genlmsg_parse(nlmsg_hdr(msg), 0, top.data(), IPVS_CMD_ATTR_MAX, nullptr) == 0);
  REQUIRE(top[type] != nullptr);
  std::array<nlattr*, N> inner{};
  REQUIRE(nla_parse_nested(inner.data(), N - 1, top[type], nullptr) == 0);
  return inner;
}

std::vector<std::uint8_t> bytes(nlattr* attr) {
  REQUIRE(attr != nullptr);
  auto* p = static_cast<const std::uint8_t*>(nla_data(attr));
  return {p, p + nla_len(attr)};
}

VirtualServer service(const char* address, std::uint16_t port) {
  VirtualServer vs;
  vs.address = *net::Prefix::parse(address);
  vs.family = vs.address.v6() ? net::Family::kIPv6 : net::Family::kIPv4;
  vs.port = port;
  return vs;
}

wire::Message request(std::uint8_t cmd, int flags = 0) {
  auto msg = wire::newRequest(kFamilyId, cmd, flags);
  REQUIRE(msg);
  return std::move(*msg);
}

}  // namespace

TEST_CASE("wire: a request names the IPVS family, the command and the version", "[unit]") {
  auto msg = request(IPVS_CMD_GET_SERVICE, NLM_F_DUMP);
  nlmsghdr* hdr = nlmsg_hdr(msg.get());
  CHECK(hdr->nlmsg_type == kFamilyId);
  CHECK((hdr->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP);
  auto* genl = static_cast<genlmsghdr*>(nlmsg_data(hdr));
  CHECK(genl->cmd == IPVS_CMD_GET_SERVICE);
  CHECK(genl->version == IPVS_GENL_VERSION);
}

TEST_CASE("wire: an IPv4 service in network byte order, with a netmask as a mask", "[unit]") {
  auto vs = service("10.96.0.10", 8080);
  vs.protocol = Protocol::kUdp;
  vs.scheduler = "sh";
  vs.flags = kFlagPersistent | kFlagSourceHashPort;
  vs.timeout = 10800;
  vs.netmask = 24;
  auto msg = request(IPVS_CMD_NEW_SERVICE);
  REQUIRE(wire::putService(msg.get(), vs, true));
  auto a = nested<IPVS_SVC_ATTR_MAX + 1>(msg.get(), IPVS_CMD_ATTR_SERVICE);
  CHECK(nla_get_u16(a[IPVS_SVC_ATTR_AF]) == AF_INET);
  CHECK(nla_get_u16(a[IPVS_SVC_ATTR_PROTOCOL]) == IPPROTO_UDP);
  CHECK(bytes(a[IPVS_SVC_ATTR_ADDR]) == std::vector<std::uint8_t>{10, 96, 0, 10});
  CHECK(bytes(a[IPVS_SVC_ATTR_PORT]) == std::vector<std::uint8_t>{0x1f, 0x90});  // 8080, big-endian
  CHECK(std::string(nla_get_string(a[IPVS_SVC_ATTR_SCHED_NAME])) == "sh");
  ip_vs_flags flags{};
  REQUIRE(nla_len(a[IPVS_SVC_ATTR_FLAGS]) == sizeof flags);
  std::memcpy(&flags, nla_data(a[IPVS_SVC_ATTR_FLAGS]), sizeof flags);
  CHECK(flags.flags == (IP_VS_SVC_F_PERSISTENT | IP_VS_SVC_F_SCHED_SH_PORT));
  CHECK(flags.mask == 0xffffffffU);
  CHECK(nla_get_u32(a[IPVS_SVC_ATTR_TIMEOUT]) == 10800);
  CHECK(bytes(a[IPVS_SVC_ATTR_NETMASK]) == std::vector<std::uint8_t>{255, 255, 255, 0});
  CHECK(a[IPVS_SVC_ATTR_FWMARK] == nullptr);

  // And it decodes back to itself.
  auto back = wire::parseServiceReply(msg.get());
  REQUIRE(back);
  CHECK(*back == vs);
}

TEST_CASE("wire: an IPv6 service; the netmask is a prefix length; the host one decodes as nullopt", "[unit]") {
  auto vs = service("fd00::10", 443);
  vs.protocol = Protocol::kSctp;
  auto msg = request(IPVS_CMD_NEW_SERVICE);
  REQUIRE(wire::putService(msg.get(), vs, true));
  auto a = nested<IPVS_SVC_ATTR_MAX + 1>(msg.get(), IPVS_CMD_ATTR_SERVICE);
  CHECK(nla_get_u16(a[IPVS_SVC_ATTR_AF]) == AF_INET6);
  CHECK(nla_get_u16(a[IPVS_SVC_ATTR_PROTOCOL]) == IPPROTO_SCTP);
  CHECK(nla_len(a[IPVS_SVC_ATTR_ADDR]) == 16);
  CHECK(nla_get_u32(a[IPVS_SVC_ATTR_NETMASK]) == 128);
  auto back = wire::parseServiceReply(msg.get());
  REQUIRE(back);
  CHECK(*back == vs);
  CHECK_FALSE(back->netmask.has_value());

  vs.netmask = 64;
  auto msg64 = request(IPVS_CMD_SET_SERVICE);
  REQUIRE(wire::putService(msg64.get(), vs, true));
  CHECK(nla_get_u32(nested<IPVS_SVC_ATTR_MAX + 1>(msg64.get(), IPVS_CMD_ATTR_SERVICE)[IPVS_SVC_ATTR_NETMASK]) == 64);
  CHECK(wire::parseServiceReply(msg64.get())->netmask == 64);
}

TEST_CASE("wire: identity-only services and firewall marks", "[unit]") {
  auto vs = service("10.96.0.10", 80);
  auto msg = request(IPVS_CMD_DEL_SERVICE);
  REQUIRE(wire::putService(msg.get(), vs, false));
  auto a = nested<IPVS_SVC_ATTR_MAX + 1>(msg.get(), IPVS_CMD_ATTR_SERVICE);
  CHECK(a[IPVS_SVC_ATTR_SCHED_NAME] == nullptr);
  CHECK(a[IPVS_SVC_ATTR_FLAGS] == nullptr);

  VirtualServer mark;
  mark.fwmark = 0x4000;
  mark.family = net::Family::kIPv6;
  auto mmsg = request(IPVS_CMD_NEW_SERVICE);
  REQUIRE(wire::putService(mmsg.get(), mark, true));
  auto m = nested<IPVS_SVC_ATTR_MAX + 1>(mmsg.get(), IPVS_CMD_ATTR_SERVICE);
  CHECK(nla_get_u32(m[IPVS_SVC_ATTR_FWMARK]) == 0x4000);
  CHECK(m[IPVS_SVC_ATTR_ADDR] == nullptr);
  CHECK(m[IPVS_SVC_ATTR_PORT] == nullptr);
  auto back = wire::parseServiceReply(mmsg.get());
  REQUIRE(back);
  CHECK(back->sameIdentity(mark));
}

TEST_CASE("wire: userspace refuses inconsistent services and destinations before sending", "[unit]") {
  auto msg = request(IPVS_CMD_NEW_SERVICE);
  auto vs = service("10.96.0.10", 80);
  vs.family = net::Family::kIPv6;
  CHECK_FALSE(wire::putService(msg.get(), vs, true));
  vs = service("10.96.0.10", 80);
  vs.scheduler = "";
  CHECK_FALSE(wire::putService(msg.get(), vs, true));
  CHECK(wire::putService(msg.get(), vs, false));  // the scheduler is not part of the identity
  RealServer rs{.address = *net::Prefix::parse("10.1.0.1"), .port = 80, .weight = -1};
  CHECK_FALSE(wire::putDest(msg.get(), rs, true));
  rs.weight = 1;
  rs.upperThreshold = 5;
  rs.lowerThreshold = 6;
  CHECK_FALSE(wire::putDest(msg.get(), rs, true));
  auto timeouts = request(IPVS_CMD_SET_CONFIG);
  CHECK_FALSE(wire::putTimeouts(timeouts.get(), {-5, 0, 0}));
}

TEST_CASE("wire: a destination: address family, port, forwarding, weight, thresholds", "[unit]") {
  RealServer rs{.address = *net::Prefix::parse("fd00::1:5"),
                .port = 8443,
                .weight = 0,
                .upperThreshold = 100,
                .lowerThreshold = 10};
  auto msg = request(IPVS_CMD_NEW_DEST);
  REQUIRE(wire::putService(msg.get(), service("fd00::10", 443), false));
  REQUIRE(wire::putDest(msg.get(), rs, true));
  auto a = nested<IPVS_DEST_ATTR_MAX + 1>(msg.get(), IPVS_CMD_ATTR_DEST);
  CHECK(nla_len(a[IPVS_DEST_ATTR_ADDR]) == 16);
  CHECK(nla_get_u16(a[IPVS_DEST_ATTR_ADDR_FAMILY]) == AF_INET6);
  CHECK(bytes(a[IPVS_DEST_ATTR_PORT]) == std::vector<std::uint8_t>{0x20, 0xfb});
  CHECK(nla_get_u32(a[IPVS_DEST_ATTR_FWD_METHOD]) == IP_VS_CONN_F_MASQ);
  CHECK(nla_get_u32(a[IPVS_DEST_ATTR_WEIGHT]) == 0);
  CHECK(nla_get_u32(a[IPVS_DEST_ATTR_U_THRESH]) == 100);
  CHECK(nla_get_u32(a[IPVS_DEST_ATTR_L_THRESH]) == 10);
  auto back = wire::parseDestReply(msg.get(), net::Family::kIPv6);
  REQUIRE(back);
  CHECK(*back == rs);
}

TEST_CASE("wire: a service as the kernel sends it: 16-byte address, hashed flag, stats", "[unit]") {
  auto msg = request(IPVS_CMD_NEW_SERVICE);
  nlattr* svc = nla_nest_start(msg.get(), IPVS_CMD_ATTR_SERVICE);
  nla_put_u16(msg.get(), IPVS_SVC_ATTR_AF, AF_INET);
  nla_put_u16(msg.get(), IPVS_SVC_ATTR_PROTOCOL, IPPROTO_TCP);
  const std::uint8_t addr[16] = {10, 96, 0, 1};  // union nf_inet_addr
  nla_put(msg.get(), IPVS_SVC_ATTR_ADDR, sizeof addr, addr);
  nla_put_u16(msg.get(), IPVS_SVC_ATTR_PORT, htons(443));
  nla_put_string(msg.get(), IPVS_SVC_ATTR_SCHED_NAME, "wrr");
  const ip_vs_flags flags{IP_VS_SVC_F_PERSISTENT | IP_VS_SVC_F_HASHED, 0xffffffffU};
  nla_put(msg.get(), IPVS_SVC_ATTR_FLAGS, sizeof flags, &flags);
  nla_put_u32(msg.get(), IPVS_SVC_ATTR_TIMEOUT, 180);
  nla_put_u32(msg.get(), IPVS_SVC_ATTR_NETMASK, 0xffffffffU);
  nlattr* stats = nla_nest_start(msg.get(), IPVS_SVC_ATTR_STATS);
  nla_put_u32(msg.get(), IPVS_STATS_ATTR_CONNS, 12);
  nla_nest_end(msg.get(), stats);
  nla_nest_end(msg.get(), svc);

  auto vs = wire::parseServiceReply(msg.get());
  REQUIRE(vs);
  CHECK(vs->describe() == "TCP 10.96.0.1:443");
  CHECK(vs->scheduler == "wrr");
  CHECK(vs->flags == kFlagPersistent);  // the kernel's hashed flag is not ours
  CHECK(vs->timeout == 180);
  CHECK_FALSE(vs->netmask.has_value());
}

TEST_CASE("wire: a destination as an older kernel sends it: no address family, counters", "[unit]") {
  auto msg = request(IPVS_CMD_NEW_DEST);
  nlattr* dest = nla_nest_start(msg.get(), IPVS_CMD_ATTR_DEST);
  const std::uint8_t addr[16] = {10, 244, 1, 5};
  nla_put(msg.get(), IPVS_DEST_ATTR_ADDR, sizeof addr, addr);
  nla_put_u16(msg.get(), IPVS_DEST_ATTR_PORT, htons(8080));
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_FWD_METHOD, IP_VS_CONN_F_MASQ | IP_VS_CONN_F_NFCT);
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_WEIGHT, 3);
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_U_THRESH, 0);
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_L_THRESH, 0);
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_ACTIVE_CONNS, 4);
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_INACT_CONNS, 2);
  nla_put_u32(msg.get(), IPVS_DEST_ATTR_PERSIST_CONNS, 1);
  nla_nest_end(msg.get(), dest);

  auto rs = wire::parseDestReply(msg.get(), net::Family::kIPv4);
  REQUIRE(rs);
  CHECK(rs->describe() == "10.244.1.5:8080");
  CHECK(rs->forwarding == ForwardingMethod::kMasquerade);
  CHECK(rs->weight == 3);
  CHECK(rs->activeConnections == 4);
  CHECK(rs->inactiveConnections == 2);
  CHECK(rs->persistentConnections == 1);
}

TEST_CASE("wire: timeouts: only the values that are set; the reply needs all three", "[unit]") {
  auto msg = request(IPVS_CMD_SET_CONFIG);
  REQUIRE(wire::putTimeouts(msg.get(), {0, 30, 60}));
  std::array<nlattr*, IPVS_CMD_ATTR_MAX + 1> a{};
  REQUIRE(genlmsg_parse(nlmsg_hdr(msg.get()), 0, a.data(), IPVS_CMD_ATTR_MAX, nullptr) == 0);
  CHECK(a[IPVS_CMD_ATTR_TIMEOUT_TCP] == nullptr);
  CHECK(nla_get_u32(a[IPVS_CMD_ATTR_TIMEOUT_TCP_FIN]) == 30);
  CHECK(nla_get_u32(a[IPVS_CMD_ATTR_TIMEOUT_UDP]) == 60);
  auto partial = wire::parseTimeoutsReply(msg.get());
  REQUIRE_FALSE(partial);
  CHECK(partial.error().category == kproxy::core::ErrorCategory::kDecode);

  auto full = request(IPVS_CMD_GET_CONFIG);
  REQUIRE(wire::putTimeouts(full.get(), {900, 120, 300}));
  CHECK(*wire::parseTimeoutsReply(full.get()) == Timeouts{900, 120, 300});
}

TEST_CASE("wire: malformed replies are decode errors, not crashes", "[unit]") {
  auto noService = request(IPVS_CMD_NEW_SERVICE);
  CHECK(wire::parseServiceReply(noService.get()).error().category == kproxy::core::ErrorCategory::kDecode);

  auto noFamily = request(IPVS_CMD_NEW_SERVICE);
  nlattr* svc = nla_nest_start(noFamily.get(), IPVS_CMD_ATTR_SERVICE);
  nla_put_u16(noFamily.get(), IPVS_SVC_ATTR_PROTOCOL, IPPROTO_TCP);
  nla_nest_end(noFamily.get(), svc);
  CHECK_FALSE(wire::parseServiceReply(noFamily.get()));

  auto shortAddr = request(IPVS_CMD_NEW_SERVICE);
  svc = nla_nest_start(shortAddr.get(), IPVS_CMD_ATTR_SERVICE);
  nla_put_u16(shortAddr.get(), IPVS_SVC_ATTR_AF, AF_INET6);
  nla_put_u16(shortAddr.get(), IPVS_SVC_ATTR_PROTOCOL, IPPROTO_TCP);
  const std::uint8_t four[4] = {1, 2, 3, 4};
  nla_put(shortAddr.get(), IPVS_SVC_ATTR_ADDR, sizeof four, four);
  nla_put_u16(shortAddr.get(), IPVS_SVC_ATTR_PORT, htons(1));
  nla_nest_end(shortAddr.get(), svc);
  auto r = wire::parseServiceReply(shortAddr.get());
  REQUIRE_FALSE(r);
  CHECK(r.error().context.find("too short") != std::string::npos);

  auto badMask = request(IPVS_CMD_NEW_SERVICE);
  svc = nla_nest_start(badMask.get(), IPVS_CMD_ATTR_SERVICE);
  nla_put_u16(badMask.get(), IPVS_SVC_ATTR_AF, AF_INET);
  nla_put_u32(badMask.get(), IPVS_SVC_ATTR_FWMARK, 3);
  nla_put_u32(badMask.get(), IPVS_SVC_ATTR_NETMASK, htonl(0xff00ff00U));
  nla_nest_end(badMask.get(), svc);
  CHECK_FALSE(wire::parseServiceReply(badMask.get()));
}
