#include "netlink_replay.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>

#include "kproxy/kernel/netlink_socket.h"

namespace kproxy::bench {
namespace {

using core::ErrorCategory;
using core::makeError;

constexpr std::uint16_t nftType(std::uint16_t msg) {
  return static_cast<std::uint16_t>((NFNL_SUBSYS_NFTABLES << 8) | msg);
}

/// Appends a message of `type` for `family` to `out` and returns its offset.
std::size_t putHeader(std::vector<char>& out, std::uint16_t type, std::uint16_t flags, std::uint8_t family,
                      std::uint16_t resId, std::uint32_t seq) {
  const std::size_t at = out.size();
  out.resize(at + MNL_NLMSG_HDRLEN + MNL_ALIGN(sizeof(nfgenmsg)));
  auto* nlh = reinterpret_cast<nlmsghdr*>(out.data() + at);
  std::memset(nlh, 0, out.size() - at);
  nlh->nlmsg_len = static_cast<std::uint32_t>(out.size() - at);
  nlh->nlmsg_type = type;
  nlh->nlmsg_flags = flags;
  nlh->nlmsg_seq = seq;
  auto* nfg = reinterpret_cast<nfgenmsg*>(out.data() + at + MNL_NLMSG_HDRLEN);
  nfg->nfgen_family = family;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = htons(resId);
  return at;
}

/// What a dump reply carries that a creation message must not: the kernel's own bookkeeping.
bool dropped(std::uint16_t msg, std::uint16_t attr) {
  auto any = [attr](std::initializer_list<int> types) {
    return std::find(types.begin(), types.end(), attr) != types.end();
  };
  switch (msg) {
    case NFT_MSG_NEWTABLE: return any({NFTA_TABLE_HANDLE, NFTA_TABLE_USE});
    case NFT_MSG_NEWCHAIN: return any({NFTA_CHAIN_HANDLE, NFTA_CHAIN_USE, NFTA_CHAIN_COUNTERS, NFTA_CHAIN_ID});
    case NFT_MSG_NEWRULE:
      return any({NFTA_RULE_HANDLE, NFTA_RULE_POSITION, NFTA_RULE_ID, NFTA_RULE_POSITION_ID});
    default: return false;
  }
}

template <typename Fn>
void forEachNested(const nlattr* nest, Fn&& fn) {
  const char* end = static_cast<const char*>(mnl_attr_get_payload(nest)) + mnl_attr_get_payload_len(nest);
  for (auto* a = static_cast<const nlattr*>(mnl_attr_get_payload(nest));
       mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a))
    fn(a);
}

/// " in TABLE CHAIN, expressions a, b, ..." for the message with sequence number `seq`.
std::string describe(const NftReplay& replay, std::uint32_t seq) {
  int left = static_cast<int>(replay.messages.size());
  for (auto* nlh = reinterpret_cast<const nlmsghdr*>(replay.messages.data()); mnl_nlmsg_ok(nlh, left);
       nlh = mnl_nlmsg_next(nlh, &left)) {
    if (nlh->nlmsg_seq != seq) continue;
    std::string out;
    const char* end = static_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
    for (auto* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(nfgenmsg)));
         mnl_attr_ok(attr, static_cast<int>(end - reinterpret_cast<const char*>(attr))); attr = mnl_attr_next(attr)) {
      const auto type = mnl_attr_get_type(attr);
      if (type == NFTA_RULE_TABLE || type == NFTA_RULE_CHAIN) {
        out += " ";
        out += mnl_attr_get_str(attr);
      } else if (type == NFTA_RULE_EXPRESSIONS) {
        out += ", expressions";
        forEachNested(attr, [&](const nlattr* elem) {
          forEachNested(elem, [&](const nlattr* field) {
            if (mnl_attr_get_type(field) == NFTA_EXPR_NAME) out += std::string(" ") + mnl_attr_get_str(field);
          });
        });
      } else {
        out += ", attr " + std::to_string(type);
      }
    }
    return " in" + out;
  }
  return "";
}

/// The protocol an xtables match or target of the rule depends on. iptables-nft sends it as
/// NFTA_RULE_COMPAT, which the kernel uses to check the extension (`-m tcp` needs TCP) but does
/// not dump; it is the value of the rule's `meta l4proto` comparison. nullopt: the rule has no
/// xtables expression and needs none.
struct Compat {
  std::uint32_t proto = 0;
  bool inverted = false;
};
std::optional<Compat> ruleCompat(const nlattr* expressions) {
  Compat compat;
  bool xtables = false, afterL4proto = false;
  forEachNested(expressions, [&](const nlattr* elem) {
    std::string name;
    const nlattr* data = nullptr;
    forEachNested(elem, [&](const nlattr* field) {
      if (mnl_attr_get_type(field) == NFTA_EXPR_NAME) name = mnl_attr_get_str(field);
      if (mnl_attr_get_type(field) == NFTA_EXPR_DATA) data = field;
    });
    const bool l4proto = afterL4proto;
    afterL4proto = false;
    if (name == "match" || name == "target") xtables = true;
    if (data == nullptr) return;
    if (name == "meta")
      forEachNested(data, [&](const nlattr* a) {
        if (mnl_attr_get_type(a) == NFTA_META_KEY && ntohl(mnl_attr_get_u32(a)) == NFT_META_L4PROTO) afterL4proto = true;
      });
    if (name == "cmp" && l4proto)
      forEachNested(data, [&](const nlattr* a) {
        if (mnl_attr_get_type(a) == NFTA_CMP_OP) compat.inverted = ntohl(mnl_attr_get_u32(a)) == NFT_CMP_NEQ;
        if (mnl_attr_get_type(a) == NFTA_CMP_DATA)
          forEachNested(a, [&](const nlattr* v) {
            if (mnl_attr_get_type(v) == NFTA_DATA_VALUE && mnl_attr_get_payload_len(v) >= 1)
              compat.proto = *static_cast<const std::uint8_t*>(mnl_attr_get_payload(v));
          });
      });
  });
  if (!xtables) return std::nullopt;
  return compat;
}

/// Appends a nested NFTA_RULE_COMPAT to the message at `at` in `out`.
void putCompat(std::vector<char>& out, std::size_t at, const Compat& compat) {
  const std::size_t start = out.size();
  out.resize(start + MNL_ALIGN(MNL_ATTR_HDRLEN) + 2 * MNL_ALIGN(MNL_ATTR_HDRLEN + sizeof(std::uint32_t)), 0);
  auto* nest = reinterpret_cast<nlattr*>(out.data() + start);
  nest->nla_type = NFTA_RULE_COMPAT | NLA_F_NESTED;
  nest->nla_len = static_cast<std::uint16_t>(out.size() - start);
  auto put = [&](std::size_t offset, std::uint16_t type, std::uint32_t value) {
    auto* a = reinterpret_cast<nlattr*>(out.data() + start + offset);
    a->nla_type = type;
    a->nla_len = MNL_ATTR_HDRLEN + sizeof value;
    const std::uint32_t be = htonl(value);
    std::memcpy(out.data() + start + offset + MNL_ATTR_HDRLEN, &be, sizeof be);
  };
  put(MNL_ATTR_HDRLEN, NFTA_RULE_COMPAT_PROTO, compat.proto);
  put(MNL_ATTR_HDRLEN + MNL_ALIGN(MNL_ATTR_HDRLEN + sizeof(std::uint32_t)), NFTA_RULE_COMPAT_FLAGS,
      compat.inverted ? NFT_RULE_COMPAT_F_INV : 0);
  reinterpret_cast<nlmsghdr*>(out.data() + at)->nlmsg_len = static_cast<std::uint32_t>(out.size() - at);
}

}  // namespace

core::Result<NftReplay> dumpIpv4Ruleset() {
  auto socket = kernel::NetlinkSocket::open(NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  NftReplay replay;
  std::uint32_t seq = 1;
  for (std::uint16_t msg : {NFT_MSG_NEWTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE}) {
    const std::uint16_t get = msg == NFT_MSG_NEWTABLE   ? NFT_MSG_GETTABLE
                              : msg == NFT_MSG_NEWCHAIN ? NFT_MSG_GETCHAIN
                                                        : NFT_MSG_GETRULE;
    std::vector<char> request;
    putHeader(request, nftType(get), NLM_F_REQUEST | NLM_F_DUMP, NFPROTO_IPV4, 0, socket->nextSeq());
    std::size_t& count = msg == NFT_MSG_NEWTABLE ? replay.tables : msg == NFT_MSG_NEWCHAIN ? replay.chains : replay.rules;
    auto dumped = socket->dump(reinterpret_cast<const nlmsghdr*>(request.data()), [&](const nlmsghdr* nlh) {
      if (nlh->nlmsg_type != nftType(msg)) return false;
      std::uint16_t flags = NLM_F_REQUEST | NLM_F_CREATE;
      if (msg == NFT_MSG_NEWRULE) flags |= NLM_F_APPEND;
      const std::size_t at = putHeader(replay.messages, nftType(msg), flags, NFPROTO_IPV4, 0, seq++);
      const char* payloadEnd = static_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
      std::optional<Compat> compat;
      for (auto* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(nfgenmsg)));
           mnl_attr_ok(attr, static_cast<int>(payloadEnd - reinterpret_cast<const char*>(attr)));
           attr = mnl_attr_next(attr)) {
        if (dropped(msg, mnl_attr_get_type(attr))) continue;
        if (msg == NFT_MSG_NEWRULE && mnl_attr_get_type(attr) == NFTA_RULE_EXPRESSIONS) compat = ruleCompat(attr);
        const std::size_t len = MNL_ALIGN(attr->nla_len);
        const std::size_t end = replay.messages.size();
        replay.messages.resize(end + len);
        std::memcpy(replay.messages.data() + end, attr, attr->nla_len);
      }
      reinterpret_cast<nlmsghdr*>(replay.messages.data() + at)->nlmsg_len =
          static_cast<std::uint32_t>(replay.messages.size() - at);
      if (compat) putCompat(replay.messages, at, *compat);
      ++count;
      return true;
    });
    if (!dumped) return std::unexpected(dumped.error());
  }
  return replay;
}

core::Result<void> sendReplay(const NftReplay& replay) {
  auto socket = kernel::NetlinkSocket::open(NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  std::vector<char> begin, end;
  putHeader(begin, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, AF_UNSPEC, NFNL_SUBSYS_NFTABLES, socket->nextSeq());
  putHeader(end, NFNL_MSG_BATCH_END, NLM_F_REQUEST, AF_UNSPEC, NFNL_SUBSYS_NFTABLES, socket->nextSeq());
  const std::span<const char> parts[] = {begin, replay.messages, end};
  auto failures = socket->sendBatch(parts);
  if (!failures) return std::unexpected(failures.error());
  if (!failures->empty()) {
    const auto& f = failures->front();
    // Sequence numbers count the dumped objects from 1: tables, then chains, then rules.
    const std::size_t n = f.seq;
    const char* what = n <= replay.tables ? "table" : n <= replay.tables + replay.chains ? "chain" : "rule";
    return makeError(ErrorCategory::kKernel,
                     "netlink replay: the kernel refused object " + std::to_string(n) + " (a " + what + describe(replay, f.seq) + ")",
                     f.errnum);
  }
  return {};
}

}  // namespace kproxy::bench
