#include "kproxy/kernel/conntrack_table.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "kproxy/kernel/netlink_socket.h"

namespace kproxy::kernel {
namespace {

using core::ErrorCategory;
using net::Family;
using core::makeError;
using core::Protocol;

// Dump filter flags of ctnetlink (kernel 5.10+). They are kernel ABI but not exported by the
// uapi header, so they are spelled here.
constexpr std::uint32_t kFilterFlagProtoNum = 1u << 3;

// Deletes per sendmsg: the kernel handles each message of one sendmsg in turn, and only the
// failures answer (no NLM_F_ACK), so a chunk's replies always fit the receive buffer.
constexpr std::size_t kDeletesPerSend = 512;
constexpr std::size_t kMaxDeleteMessage = 256;

std::uint8_t ipProto(Protocol p) {
  switch (p) {
    case Protocol::kTCP: return IPPROTO_TCP;
    case Protocol::kUDP: return IPPROTO_UDP;
    case Protocol::kSCTP: return IPPROTO_SCTP;
  }
  return IPPROTO_UDP;
}

std::optional<Protocol> fromIpProto(std::uint8_t p) {
  switch (p) {
    case IPPROTO_TCP: return Protocol::kTCP;
    case IPPROTO_UDP: return Protocol::kUDP;
    case IPPROTO_SCTP: return Protocol::kSCTP;
    default: return std::nullopt;
  }
}

std::uint8_t addressFamily(net::Family f) { return f == net::Family::kIPv4 ? AF_INET : AF_INET6; }

std::string addressText(int af, const void* bytes) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(af, bytes, buf, sizeof buf) == nullptr) return {};
  return buf;
}

/// Attributes of one nesting level, indexed by type (unknown or too-high types are dropped).
template <std::size_t N>
struct AttrTable {
  std::array<const nlattr*, N> at{};
  static int collect(const nlattr* attr, void* data) {
    auto* self = static_cast<AttrTable*>(data);
    auto type = mnl_attr_get_type(attr);
    if (type < N) self->at[type] = attr;
    return MNL_CB_OK;
  }
  bool parseNested(const nlattr* nest) { return mnl_attr_parse_nested(nest, &collect, this) >= 0; }
  const nlattr* operator[](std::size_t i) const { return at[i]; }
};

bool parseTuple(const nlattr* nest, net::Family family, ConntrackTuple& out, std::uint8_t& proto) {
  AttrTable<CTA_TUPLE_MAX + 1> tuple;
  if (nest == nullptr || !tuple.parseNested(nest)) return false;
  if (tuple[CTA_TUPLE_IP] == nullptr || tuple[CTA_TUPLE_PROTO] == nullptr) return false;
  AttrTable<CTA_IP_MAX + 1> ip;
  if (!ip.parseNested(tuple[CTA_TUPLE_IP])) return false;
  int af = family == net::Family::kIPv4 ? AF_INET : AF_INET6;
  int srcType = family == net::Family::kIPv4 ? CTA_IP_V4_SRC : CTA_IP_V6_SRC;
  int dstType = family == net::Family::kIPv4 ? CTA_IP_V4_DST : CTA_IP_V6_DST;
  std::size_t len = family == net::Family::kIPv4 ? 4 : 16;
  for (auto [type, field] : {std::pair{srcType, &out.srcIP}, std::pair{dstType, &out.dstIP}}) {
    const nlattr* a = ip[static_cast<std::size_t>(type)];
    if (a == nullptr || mnl_attr_get_payload_len(a) < len) return false;
    *field = addressText(af, mnl_attr_get_payload(a));
  }
  AttrTable<CTA_PROTO_MAX + 1> l4;
  if (!l4.parseNested(tuple[CTA_TUPLE_PROTO]) || l4[CTA_PROTO_NUM] == nullptr) return false;
  proto = mnl_attr_get_u8(l4[CTA_PROTO_NUM]);
  if (l4[CTA_PROTO_SRC_PORT] != nullptr) out.srcPort = ntohs(mnl_attr_get_u16(l4[CTA_PROTO_SRC_PORT]));
  if (l4[CTA_PROTO_DST_PORT] != nullptr) out.dstPort = ntohs(mnl_attr_get_u16(l4[CTA_PROTO_DST_PORT]));
  return true;
}

/// Decodes one CT_NEW dump reply. nullopt for entries of other protocols or families.
std::optional<ConntrackFlow> parseFlow(const nlmsghdr* nlh, net::Family family, bool& malformed) {
  malformed = false;
  const auto* nfg = static_cast<const nfgenmsg*>(mnl_nlmsg_get_payload(nlh));
  if (nfg->nfgen_family != addressFamily(family)) return std::nullopt;
  AttrTable<CTA_MAX + 1> top;
  if (mnl_attr_parse(nlh, sizeof(nfgenmsg), &decltype(top)::collect, &top) < 0) {
    malformed = true;
    return std::nullopt;
  }
  ConntrackFlow flow;
  flow.family = family;
  std::uint8_t proto = 0;
  std::uint8_t replyProto = 0;
  if (!parseTuple(top[CTA_TUPLE_ORIG], family, flow.original, proto) ||
      !parseTuple(top[CTA_TUPLE_REPLY], family, flow.reply, replyProto)) {
    malformed = true;
    return std::nullopt;
  }
  auto p = fromIpProto(proto);
  if (!p) return std::nullopt;
  flow.protocol = *p;
  if (top[CTA_ZONE] != nullptr) flow.zone = ntohs(mnl_attr_get_u16(top[CTA_ZONE]));
  return flow;
}

nlmsghdr* putRequest(char* buf, std::uint16_t type, std::uint16_t flags, net::Family family,
                     std::uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = static_cast<std::uint16_t>((NFNL_SUBSYS_CTNETLINK << 8) | type);
  nlh->nlmsg_flags = flags;
  nlh->nlmsg_seq = seq;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = addressFamily(family);
  nfg->version = NFNETLINK_V0;
  nfg->res_id = 0;
  return nlh;
}

void putTuple(nlmsghdr* nlh, std::uint16_t type, const ConntrackFlow& flow, const ConntrackTuple& t) {
  nlattr* tuple = mnl_attr_nest_start(nlh, type);
  nlattr* ip = mnl_attr_nest_start(nlh, CTA_TUPLE_IP);
  int af = flow.family == net::Family::kIPv4 ? AF_INET : AF_INET6;
  std::array<unsigned char, 16> src{};
  std::array<unsigned char, 16> dst{};
  inet_pton(af, t.srcIP.c_str(), src.data());
  inet_pton(af, t.dstIP.c_str(), dst.data());
  std::size_t len = flow.family == net::Family::kIPv4 ? 4 : 16;
  mnl_attr_put(nlh, flow.family == net::Family::kIPv4 ? CTA_IP_V4_SRC : CTA_IP_V6_SRC, len, src.data());
  mnl_attr_put(nlh, flow.family == net::Family::kIPv4 ? CTA_IP_V4_DST : CTA_IP_V6_DST, len, dst.data());
  mnl_attr_nest_end(nlh, ip);
  nlattr* proto = mnl_attr_nest_start(nlh, CTA_TUPLE_PROTO);
  mnl_attr_put_u8(nlh, CTA_PROTO_NUM, ipProto(flow.protocol));
  mnl_attr_put_u16(nlh, CTA_PROTO_SRC_PORT, htons(t.srcPort));
  mnl_attr_put_u16(nlh, CTA_PROTO_DST_PORT, htons(t.dstPort));
  mnl_attr_nest_end(nlh, proto);
  mnl_attr_nest_end(nlh, tuple);
}

class NetlinkConntrackTable final : public ConntrackTable {
 public:
  core::Result<std::vector<ConntrackFlow>> list(net::Family family, Protocol protocol) override {
    if (auto opened = ensureOpen(); !opened) return std::unexpected(opened.error());
    auto filtered = dump(family, protocol, true);
    // A kernel that cannot filter dumps by protocol says EINVAL/EOPNOTSUPP; filter here then.
    if (!filtered && (filtered.error().errnum == EINVAL || filtered.error().errnum == EOPNOTSUPP))
      return dump(family, protocol, false);
    return filtered;
  }

  core::Result<std::size_t> remove(const std::vector<ConntrackFlow>& flows) override {
    if (flows.empty()) return std::size_t{0};
    if (auto opened = ensureOpen(); !opened) return std::unexpected(opened.error());
    std::size_t deleted = 0;
    std::vector<char> buf;
    for (std::size_t first = 0; first < flows.size(); first += kDeletesPerSend) {
      std::size_t count = std::min(kDeletesPerSend, flows.size() - first);
      buf.assign(count * kMaxDeleteMessage, 0);
      std::uint32_t seq = socket_->nextSeq(static_cast<std::uint32_t>(count));
      std::size_t used = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const ConntrackFlow& flow = flows[first + i];
        nlmsghdr* nlh = putRequest(buf.data() + used, IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST,
                                   flow.family, seq + static_cast<std::uint32_t>(i));
        putTuple(nlh, CTA_TUPLE_ORIG, flow, flow.original);
        if (flow.zone != 0) mnl_attr_put_u16(nlh, CTA_ZONE, htons(flow.zone));
        used += nlh->nlmsg_len;
      }
      auto failures = socket_->sendBatch(std::span<const char>(buf.data(), used));
      if (!failures) return std::unexpected(failures.error());
      std::size_t gone = 0;
      for (const auto& f : *failures) {
        // ENOENT: the flow expired or someone else deleted it first; that is the goal anyway.
        if (f.errnum == ENOENT) {
          ++gone;
          continue;
        }
        std::size_t index = first + (f.seq - seq);
        std::string what = index < flows.size() ? flows[index].str() : std::string("a flow");
        return makeError(ErrorCategory::kKernel, "conntrack: deleting " + what, f.errnum);
      }
      deleted += count - gone;
    }
    return deleted;
  }

 private:
  core::Result<void> ensureOpen() {
    if (auto opened = keptSocket(socket_, NETLINK_NETFILTER); !opened) return std::unexpected(opened.error());
    return {};
  }

  core::Result<std::vector<ConntrackFlow>> dump(net::Family family, Protocol protocol, bool kernelFilter) {
    std::array<char, 512> buf{};
    nlmsghdr* nlh = putRequest(buf.data(), IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, family,
                               socket_->nextSeq());
    if (kernelFilter) {
      // Only the protocol number is compared (CTA_FILTER_ORIG_FLAGS); the family comes from
      // the nfgenmsg header.
      nlattr* tuple = mnl_attr_nest_start(nlh, CTA_TUPLE_ORIG);
      nlattr* proto = mnl_attr_nest_start(nlh, CTA_TUPLE_PROTO);
      mnl_attr_put_u8(nlh, CTA_PROTO_NUM, ipProto(protocol));
      mnl_attr_nest_end(nlh, proto);
      mnl_attr_nest_end(nlh, tuple);
      nlattr* filter = mnl_attr_nest_start(nlh, CTA_FILTER);
      mnl_attr_put_u32(nlh, CTA_FILTER_ORIG_FLAGS, kFilterFlagProtoNum);
      mnl_attr_put_u32(nlh, CTA_FILTER_REPLY_FLAGS, 0);
      mnl_attr_nest_end(nlh, filter);
    }
    std::vector<ConntrackFlow> flows;
    auto done = socket_->dump(nlh, [&](const nlmsghdr* reply) {
      bool malformed = false;
      auto flow = parseFlow(reply, family, malformed);
      if (flow && flow->protocol == protocol) flows.push_back(std::move(*flow));
      return !malformed;
    });
    if (!done) {
      auto err = done.error();
      err.context = "conntrack: listing " + std::string(core::toString(protocol)) + " flows (" +
                    err.context + ")";
      return std::unexpected(err);
    }
    return flows;
  }

  std::optional<NetlinkSocket> socket_;
};

}  // namespace

std::string ConntrackFlow::str() const {
  // Appends piece by piece: g++ 12 at -O3 reports a false -Wrestrict on "literal" + string&&.
  std::string out = protocol == Protocol::kUDP ? "udp" : protocol == Protocol::kSCTP ? "sctp" : "tcp";
  auto append = [&](const char* sep, const std::string& ip, std::uint16_t port) {
    out += sep;
    if (family == net::Family::kIPv6) {
      out += '[';
      out += ip;
      out += ']';
    } else {
      out += ip;
    }
    out += ':';
    out += std::to_string(port);
  };
  append(" ", original.srcIP, original.srcPort);
  append("->", original.dstIP, original.dstPort);
  append(" reply ", reply.srcIP, reply.srcPort);
  append("->", reply.dstIP, reply.dstPort);
  if (zone != 0) {
    out += " zone ";
    out += std::to_string(zone);
  }
  return out;
}

std::unique_ptr<ConntrackTable> makeNetlinkConntrackTable() {
  return std::make_unique<NetlinkConntrackTable>();
}

core::Result<std::vector<ConntrackFlow>> FakeConntrackTable::list(net::Family family, Protocol protocol) {
  ++listCalls;
  if (failList) return makeError(ErrorCategory::kKernel, "conntrack: listing (fake)", EPERM);
  std::vector<ConntrackFlow> out;
  for (const auto& f : flows)
    if (f.family == family && f.protocol == protocol) out.push_back(f);
  return out;
}

core::Result<std::size_t> FakeConntrackTable::remove(const std::vector<ConntrackFlow>& toDelete) {
  if (failRemove) return makeError(ErrorCategory::kKernel, "conntrack: deleting (fake)", EPERM);
  std::size_t deleted = 0;
  for (const auto& d : toDelete) {
    // The kernel matches the original tuple, protocol and zone.
    auto it = std::find_if(flows.begin(), flows.end(), [&d](const ConntrackFlow& f) {
      return f.family == d.family && f.protocol == d.protocol && f.zone == d.zone &&
             f.original == d.original;
    });
    if (it == flows.end()) continue;
    removed.push_back(*it);
    flows.erase(it);
    ++deleted;
  }
  return deleted;
}

}  // namespace kproxy::kernel
