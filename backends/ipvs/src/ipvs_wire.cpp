#include "ipvs_wire.h"

#include <arpa/inet.h>
#include <linux/ip_vs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <netlink/attr.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>

namespace kproxy::ipvs::wire {
namespace {

core::Result<void> invalid(std::string what) {
  return core::makeError(core::ErrorCategory::kInvalidArgument, "ipvs: " + what, EINVAL);
}

core::Error decodeError(std::string what) {
  return core::Error{core::ErrorCategory::kDecode, EPROTO, "ipvs: kernel reply: " + what};
}

core::Result<void> full(const char* what) {
  return core::makeError(core::ErrorCategory::kInternal,
                         fmt::format("ipvs: netlink message too small for {}", what), EMSGSIZE);
}

int protocolNumber(Protocol protocol) {
  switch (protocol) {
    case Protocol::kTcp: return IPPROTO_TCP;
    case Protocol::kUdp: return IPPROTO_UDP;
    case Protocol::kSctp: return IPPROTO_SCTP;
  }
  return 0;
}

std::uint8_t hostLength(net::Family family) { return family == net::Family::kIPv4 ? 32 : 128; }
int addressFamily(net::Family family) { return family == net::Family::kIPv4 ? AF_INET : AF_INET6; }

/// The netmask attribute: an IPv4 mask in network byte order, or an IPv6 prefix length as a
/// plain number (the kernel checks 1..128 on the raw value; ipvsadm sends it the same way).
std::uint32_t encodeNetmask(net::Family family, std::uint8_t length) {
  if (family == net::Family::kIPv6) return length;
  const std::uint32_t mask = length == 0 ? 0 : ~std::uint32_t{0} << (32 - length);
  return htonl(mask);
}

std::optional<std::uint8_t> decodeNetmask(net::Family family, std::uint32_t raw) {
  if (family == net::Family::kIPv6) return raw <= 128 ? std::optional<std::uint8_t>(raw) : std::nullopt;
  const std::uint32_t mask = ntohl(raw);
  const int ones = std::countl_one(mask);
  if (ones < 32 && (mask << ones) != 0) return std::nullopt;  // not contiguous
  return static_cast<std::uint8_t>(ones);
}

core::Result<void> putAddress(nl_msg* msg, int type, const net::Prefix& address) {
  if (nla_put(msg, type, static_cast<int>(address.size()), address.bytes.data()) < 0) return full("an address");
  return {};
}

std::optional<net::Prefix> getAddress(nlattr* attr, net::Family family) {
  net::Prefix address;
  address.family = family;
  address.length = hostLength(family);
  // The kernel always sends the 16 bytes of union nf_inet_addr; IPv4 is the first four.
  if (nla_len(attr) < static_cast<int>(address.size())) return std::nullopt;
  std::memcpy(address.bytes.data(), nla_data(attr), address.size());
  return address;
}

std::optional<net::Family> familyOf(std::uint16_t af) {
  if (af == AF_INET) return net::Family::kIPv4;
  if (af == AF_INET6) return net::Family::kIPv6;
  return std::nullopt;
}

std::array<nla_policy, IPVS_SVC_ATTR_MAX + 1> servicePolicy() {
  std::array<nla_policy, IPVS_SVC_ATTR_MAX + 1> p{};
  p[IPVS_SVC_ATTR_AF].type = NLA_U16;
  p[IPVS_SVC_ATTR_PROTOCOL].type = NLA_U16;
  p[IPVS_SVC_ATTR_ADDR].type = NLA_UNSPEC;
  p[IPVS_SVC_ATTR_ADDR].minlen = 4;
  p[IPVS_SVC_ATTR_PORT].type = NLA_U16;
  p[IPVS_SVC_ATTR_FWMARK].type = NLA_U32;
  p[IPVS_SVC_ATTR_SCHED_NAME].type = NLA_STRING;
  p[IPVS_SVC_ATTR_FLAGS].type = NLA_UNSPEC;
  p[IPVS_SVC_ATTR_FLAGS].minlen = sizeof(ip_vs_flags);
  p[IPVS_SVC_ATTR_TIMEOUT].type = NLA_U32;
  p[IPVS_SVC_ATTR_NETMASK].type = NLA_U32;
  p[IPVS_SVC_ATTR_STATS].type = NLA_NESTED;
  p[IPVS_SVC_ATTR_STATS64].type = NLA_NESTED;
  return p;
}

std::array<nla_policy, IPVS_DEST_ATTR_MAX + 1> destPolicy() {
  std::array<nla_policy, IPVS_DEST_ATTR_MAX + 1> p{};
  p[IPVS_DEST_ATTR_ADDR].type = NLA_UNSPEC;
  p[IPVS_DEST_ATTR_ADDR].minlen = 4;
  p[IPVS_DEST_ATTR_PORT].type = NLA_U16;
  p[IPVS_DEST_ATTR_FWD_METHOD].type = NLA_U32;
  p[IPVS_DEST_ATTR_WEIGHT].type = NLA_U32;
  p[IPVS_DEST_ATTR_U_THRESH].type = NLA_U32;
  p[IPVS_DEST_ATTR_L_THRESH].type = NLA_U32;
  p[IPVS_DEST_ATTR_ACTIVE_CONNS].type = NLA_U32;
  p[IPVS_DEST_ATTR_INACT_CONNS].type = NLA_U32;
  p[IPVS_DEST_ATTR_PERSIST_CONNS].type = NLA_U32;
  p[IPVS_DEST_ATTR_STATS].type = NLA_NESTED;
  p[IPVS_DEST_ATTR_ADDR_FAMILY].type = NLA_U16;
  p[IPVS_DEST_ATTR_STATS64].type = NLA_NESTED;
  return p;
}

std::array<nla_policy, IPVS_CMD_ATTR_MAX + 1> commandPolicy() {
  std::array<nla_policy, IPVS_CMD_ATTR_MAX + 1> p{};
  p[IPVS_CMD_ATTR_SERVICE].type = NLA_NESTED;
  p[IPVS_CMD_ATTR_DEST].type = NLA_NESTED;
  p[IPVS_CMD_ATTR_DAEMON].type = NLA_NESTED;
  p[IPVS_CMD_ATTR_TIMEOUT_TCP].type = NLA_U32;
  p[IPVS_CMD_ATTR_TIMEOUT_TCP_FIN].type = NLA_U32;
  p[IPVS_CMD_ATTR_TIMEOUT_UDP].type = NLA_U32;
  return p;
}

using CommandAttrs = std::array<nlattr*, IPVS_CMD_ATTR_MAX + 1>;

core::Result<CommandAttrs> parseCommand(nl_msg* msg) {
  CommandAttrs attrs{};
  auto policy = commandPolicy();
  if (int rc = genlmsg_parse(nlmsg_hdr(msg), 0, attrs.data(), IPVS_CMD_ATTR_MAX, policy.data()); rc < 0)
    return std::unexpected(decodeError(fmt::format("malformed message ({})", nl_geterror(rc))));
  return attrs;
}

}  // namespace

void MessageDeleter::operator()(nl_msg* msg) const { nlmsg_free(msg); }

core::Result<Message> newRequest(int familyId, std::uint8_t cmd, int flags) {
  Message msg(nlmsg_alloc());
  if (!msg) return core::makeError(core::ErrorCategory::kTransient, "ipvs: nlmsg_alloc", ENOMEM);
  if (genlmsg_put(msg.get(), NL_AUTO_PORT, NL_AUTO_SEQ, familyId, 0, flags, cmd, IPVS_GENL_VERSION) == nullptr)
    return core::makeError(core::ErrorCategory::kInternal, "ipvs: genlmsg_put", EMSGSIZE);
  return msg;
}

core::Result<void> checkService(const VirtualServer& vs, bool fullEntry) {
  if (vs.fwmark == 0 && vs.address.v6() != (vs.family == net::Family::kIPv6))
    return invalid(fmt::format("virtual server {}: address is not {}", vs.describe(), toString(vs.family)));
  if (fullEntry && (vs.scheduler.empty() || vs.scheduler.size() >= IP_VS_SCHEDNAME_MAXLEN))
    return invalid(fmt::format("virtual server {}: scheduler name '{}' must have 1 to {} characters",
                               vs.describe(), vs.scheduler, IP_VS_SCHEDNAME_MAXLEN - 1));
  if (vs.netmask && *vs.netmask > hostLength(vs.family))
    return invalid(fmt::format("virtual server {}: netmask /{} is too long", vs.describe(), *vs.netmask));
  return {};
}

core::Result<void> checkDest(const RealServer& rs) {
  if (rs.weight < 0) return invalid(fmt::format("real server {}: negative weight {}", rs.describe(), rs.weight));
  if (rs.upperThreshold != 0 && rs.lowerThreshold > rs.upperThreshold)
    return invalid(fmt::format("real server {}: lower threshold {} above upper threshold {}", rs.describe(),
                               rs.lowerThreshold, rs.upperThreshold));
  return {};
}

core::Result<void> putService(nl_msg* msg, const VirtualServer& vs, bool fullEntry) {
  if (auto r = checkService(vs, fullEntry); !r) return r;
  nlattr* nest = nla_nest_start(msg, IPVS_CMD_ATTR_SERVICE);
  if (nest == nullptr) return full("a service");
  if (nla_put_u16(msg, IPVS_SVC_ATTR_AF, static_cast<std::uint16_t>(addressFamily(vs.family))) < 0) return full("a service");
  if (vs.fwmark != 0) {
    if (nla_put_u32(msg, IPVS_SVC_ATTR_FWMARK, vs.fwmark) < 0) return full("a service");
  } else {
    if (nla_put_u16(msg, IPVS_SVC_ATTR_PROTOCOL, static_cast<std::uint16_t>(protocolNumber(vs.protocol))) < 0)
      return full("a service");
    if (auto r = putAddress(msg, IPVS_SVC_ATTR_ADDR, vs.address); !r) return r;
    if (nla_put_u16(msg, IPVS_SVC_ATTR_PORT, htons(vs.port)) < 0) return full("a service");
  }
  if (fullEntry) {
    // The kernel keeps the flags outside the mask; all ones replaces them all.
    const ip_vs_flags flags{vs.flags, ~std::uint32_t{0}};
    if (nla_put_string(msg, IPVS_SVC_ATTR_SCHED_NAME, vs.scheduler.c_str()) < 0 ||
        nla_put(msg, IPVS_SVC_ATTR_FLAGS, sizeof flags, &flags) < 0 ||
        nla_put_u32(msg, IPVS_SVC_ATTR_TIMEOUT, vs.timeout) < 0 ||
        nla_put_u32(msg, IPVS_SVC_ATTR_NETMASK,
                    encodeNetmask(vs.family, vs.netmask.value_or(hostLength(vs.family)))) < 0)
      return full("a service");
  }
  nla_nest_end(msg, nest);
  return {};
}

core::Result<void> putDest(nl_msg* msg, const RealServer& rs, bool fullEntry) {
  if (auto r = checkDest(rs); !r) return r;
  nlattr* nest = nla_nest_start(msg, IPVS_CMD_ATTR_DEST);
  if (nest == nullptr) return full("a destination");
  if (auto r = putAddress(msg, IPVS_DEST_ATTR_ADDR, rs.address); !r) return r;
  if (nla_put_u16(msg, IPVS_DEST_ATTR_PORT, htons(rs.port)) < 0 ||
      nla_put_u16(msg, IPVS_DEST_ATTR_ADDR_FAMILY, rs.address.v6() ? AF_INET6 : AF_INET) < 0)
    return full("a destination");
  if (fullEntry) {
    if (nla_put_u32(msg, IPVS_DEST_ATTR_FWD_METHOD, static_cast<std::uint32_t>(rs.forwarding)) < 0 ||
        nla_put_u32(msg, IPVS_DEST_ATTR_WEIGHT, static_cast<std::uint32_t>(rs.weight)) < 0 ||
        nla_put_u32(msg, IPVS_DEST_ATTR_U_THRESH, rs.upperThreshold) < 0 ||
        nla_put_u32(msg, IPVS_DEST_ATTR_L_THRESH, rs.lowerThreshold) < 0)
      return full("a destination");
  }
  nla_nest_end(msg, nest);
  return {};
}

core::Result<void> putTimeouts(nl_msg* msg, const Timeouts& timeouts) {
  if (timeouts.tcp < 0 || timeouts.tcpFin < 0 || timeouts.udp < 0)
    return invalid(fmt::format("negative timeout (tcp {} tcpfin {} udp {})", timeouts.tcp, timeouts.tcpFin,
                               timeouts.udp));
  const std::pair<int, std::int32_t> values[] = {{IPVS_CMD_ATTR_TIMEOUT_TCP, timeouts.tcp},
                                                 {IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, timeouts.tcpFin},
                                                 {IPVS_CMD_ATTR_TIMEOUT_UDP, timeouts.udp}};
  for (auto [type, value] : values)
    if (value != 0 && nla_put_u32(msg, type, static_cast<std::uint32_t>(value)) < 0) return full("timeouts");
  return {};
}

core::Result<VirtualServer> parseService(nlattr* nested) {
  std::array<nlattr*, IPVS_SVC_ATTR_MAX + 1> a{};
  auto policy = servicePolicy();
  if (int rc = nla_parse_nested(a.data(), IPVS_SVC_ATTR_MAX, nested, policy.data()); rc < 0)
    return std::unexpected(decodeError(fmt::format("malformed service ({})", nl_geterror(rc))));
  if (a[IPVS_SVC_ATTR_AF] == nullptr) return std::unexpected(decodeError("service without address family"));
  auto family = familyOf(nla_get_u16(a[IPVS_SVC_ATTR_AF]));
  if (!family) return std::unexpected(decodeError("service of an unknown address family"));
  VirtualServer vs;
  vs.family = *family;
  if (a[IPVS_SVC_ATTR_FWMARK] != nullptr && nla_get_u32(a[IPVS_SVC_ATTR_FWMARK]) != 0) {
    vs.fwmark = nla_get_u32(a[IPVS_SVC_ATTR_FWMARK]);
  } else {
    if (a[IPVS_SVC_ATTR_PROTOCOL] == nullptr || a[IPVS_SVC_ATTR_ADDR] == nullptr || a[IPVS_SVC_ATTR_PORT] == nullptr)
      return std::unexpected(decodeError("service without protocol, address or port"));
    switch (nla_get_u16(a[IPVS_SVC_ATTR_PROTOCOL])) {
      case IPPROTO_TCP: vs.protocol = Protocol::kTcp; break;
      case IPPROTO_UDP: vs.protocol = Protocol::kUdp; break;
      case IPPROTO_SCTP: vs.protocol = Protocol::kSctp; break;
      default:
        return std::unexpected(
            decodeError(fmt::format("service of protocol {}", nla_get_u16(a[IPVS_SVC_ATTR_PROTOCOL]))));
    }
    auto address = getAddress(a[IPVS_SVC_ATTR_ADDR], vs.family);
    if (!address) return std::unexpected(decodeError("service address too short"));
    vs.address = *address;
    vs.port = ntohs(nla_get_u16(a[IPVS_SVC_ATTR_PORT]));
  }
  if (a[IPVS_SVC_ATTR_SCHED_NAME] != nullptr) vs.scheduler = nla_get_string(a[IPVS_SVC_ATTR_SCHED_NAME]);
  if (a[IPVS_SVC_ATTR_FLAGS] != nullptr) {
    ip_vs_flags flags{};
    std::memcpy(&flags, nla_data(a[IPVS_SVC_ATTR_FLAGS]), sizeof flags);
    vs.flags = flags.flags & ~std::uint32_t{IP_VS_SVC_F_HASHED};
  }
  if (a[IPVS_SVC_ATTR_TIMEOUT] != nullptr) vs.timeout = nla_get_u32(a[IPVS_SVC_ATTR_TIMEOUT]);
  if (a[IPVS_SVC_ATTR_NETMASK] != nullptr) {
    auto length = decodeNetmask(vs.family, nla_get_u32(a[IPVS_SVC_ATTR_NETMASK]));
    if (!length) return std::unexpected(decodeError("service netmask is not a prefix"));
    if (*length != hostLength(vs.family)) vs.netmask = length;
  }
  return vs;
}

core::Result<RealServer> parseDest(nlattr* nested, net::Family serviceFamily) {
  std::array<nlattr*, IPVS_DEST_ATTR_MAX + 1> a{};
  auto policy = destPolicy();
  if (int rc = nla_parse_nested(a.data(), IPVS_DEST_ATTR_MAX, nested, policy.data()); rc < 0)
    return std::unexpected(decodeError(fmt::format("malformed destination ({})", nl_geterror(rc))));
  net::Family family = serviceFamily;
  if (a[IPVS_DEST_ATTR_ADDR_FAMILY] != nullptr) {
    auto f = familyOf(nla_get_u16(a[IPVS_DEST_ATTR_ADDR_FAMILY]));
    if (!f) return std::unexpected(decodeError("destination of an unknown address family"));
    family = *f;
  }
  if (a[IPVS_DEST_ATTR_ADDR] == nullptr || a[IPVS_DEST_ATTR_PORT] == nullptr)
    return std::unexpected(decodeError("destination without address or port"));
  RealServer rs;
  auto address = getAddress(a[IPVS_DEST_ATTR_ADDR], family);
  if (!address) return std::unexpected(decodeError("destination address too short"));
  rs.address = *address;
  rs.port = ntohs(nla_get_u16(a[IPVS_DEST_ATTR_PORT]));
  auto u32 = [&](int type) { return a[type] != nullptr ? nla_get_u32(a[type]) : 0U; };
  rs.weight = static_cast<std::int32_t>(u32(IPVS_DEST_ATTR_WEIGHT));
  // Only the forwarding bits: the kernel may report connection flags beside them.
  rs.forwarding = static_cast<ForwardingMethod>(u32(IPVS_DEST_ATTR_FWD_METHOD) & IP_VS_CONN_F_FWD_MASK);
  rs.upperThreshold = u32(IPVS_DEST_ATTR_U_THRESH);
  rs.lowerThreshold = u32(IPVS_DEST_ATTR_L_THRESH);
  rs.activeConnections = u32(IPVS_DEST_ATTR_ACTIVE_CONNS);
  rs.inactiveConnections = u32(IPVS_DEST_ATTR_INACT_CONNS);
  rs.persistentConnections = u32(IPVS_DEST_ATTR_PERSIST_CONNS);
  return rs;
}

core::Result<VirtualServer> parseServiceReply(nl_msg* msg) {
  auto attrs = parseCommand(msg);
  if (!attrs) return std::unexpected(attrs.error());
  if ((*attrs)[IPVS_CMD_ATTR_SERVICE] == nullptr) return std::unexpected(decodeError("no service in reply"));
  return parseService((*attrs)[IPVS_CMD_ATTR_SERVICE]);
}

core::Result<RealServer> parseDestReply(nl_msg* msg, net::Family serviceFamily) {
  auto attrs = parseCommand(msg);
  if (!attrs) return std::unexpected(attrs.error());
  if ((*attrs)[IPVS_CMD_ATTR_DEST] == nullptr) return std::unexpected(decodeError("no destination in reply"));
  return parseDest((*attrs)[IPVS_CMD_ATTR_DEST], serviceFamily);
}

core::Result<Timeouts> parseTimeoutsReply(nl_msg* msg) {
  auto attrs = parseCommand(msg);
  if (!attrs) return std::unexpected(attrs.error());
  auto& a = *attrs;
  if (a[IPVS_CMD_ATTR_TIMEOUT_TCP] == nullptr || a[IPVS_CMD_ATTR_TIMEOUT_TCP_FIN] == nullptr ||
      a[IPVS_CMD_ATTR_TIMEOUT_UDP] == nullptr)
    return std::unexpected(decodeError("timeouts missing from reply"));
  return Timeouts{static_cast<std::int32_t>(nla_get_u32(a[IPVS_CMD_ATTR_TIMEOUT_TCP])),
                  static_cast<std::int32_t>(nla_get_u32(a[IPVS_CMD_ATTR_TIMEOUT_TCP_FIN])),
                  static_cast<std::int32_t>(nla_get_u32(a[IPVS_CMD_ATTR_TIMEOUT_UDP]))};
}

}  // namespace kproxy::ipvs::wire
