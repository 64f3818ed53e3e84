#include "nftnl_encode.h"

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_nat.h>
#include <linux/netfilter/nf_tables.h>
#include <net/if.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <libnftnl/chain.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/udata.h>

namespace kproxy::nftables {
namespace {

// nft's register numbering: a field at 32-bit offset `idx` of a concatenation lives in
// NFT_REG_1+idx/4 when aligned to a 128-bit register, else in NFT_REG32_00+idx.
std::uint32_t reg32(std::uint32_t idx) { return idx % 4 == 0 ? NFT_REG_1 + idx / 4 : NFT_REG32_00 + idx; }

class RuleEncoder {
 public:
  RuleEncoder(net::Family family, nftnl_rule* rule) : family_(family), rule_(rule) {}

  void add(nftnl_expr* e) { nftnl_rule_add_expr(rule_, e); }

  nftnl_expr* expr(const char* name) { return nftnl_expr_alloc(name); }

  std::uint32_t addrLen() const { return family_ == net::Family::kIPv4 ? 4 : 16; }
  std::uint32_t saddrOffset() const { return family_ == net::Family::kIPv4 ? 12 : 8; }
  std::uint32_t daddrOffset() const { return family_ == net::Family::kIPv4 ? 16 : 24; }

  void payload(std::uint32_t base, std::uint32_t offset, std::uint32_t len, std::uint32_t dreg) {
    auto* e = expr("payload");
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, dreg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, base);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, offset);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, len);
    add(e);
  }
  void meta(std::uint32_t key, std::uint32_t dreg) {
    auto* e = expr("meta");
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_DREG, dreg);
    add(e);
  }
  void cmp(std::uint32_t op, const void* data, std::uint32_t len) {
    auto* e = expr("cmp");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, op);
    nftnl_expr_set(e, NFTNL_EXPR_CMP_DATA, data, len);
    add(e);
  }
  void bitwise(const void* mask, const void* xorv, std::uint32_t len) {
    auto* e = expr("bitwise");
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, len);
    nftnl_expr_set(e, NFTNL_EXPR_BITWISE_MASK, mask, len);
    nftnl_expr_set(e, NFTNL_EXPR_BITWISE_XOR, xorv, len);
    add(e);
  }
  // `fib saddr type local` or `fib daddr type local`, as `which` (NFTA_FIB_F_SADDR/DADDR) says.
  void matchFibAddressLocal(std::uint32_t which) {
    auto* e = expr("fib");
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_DREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
    nftnl_expr_set_u32(e, NFTNL_EXPR_FIB_FLAGS, which);
    add(e);
    std::uint32_t local = 2;  // RTN_LOCAL
    cmp(NFT_CMP_EQ, &local, 4);
  }
  void immediate(std::uint32_t dreg, const void* data, std::uint32_t len) {
    auto* e = expr("immediate");
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, dreg);
    nftnl_expr_set(e, NFTNL_EXPR_IMM_DATA, data, len);
    add(e);
  }
  void lookup(const std::string& set, std::uint32_t sreg, std::optional<std::uint32_t> dreg) {
    auto* e = expr("lookup");
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_SREG, sreg);
    if (dreg) nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_DREG, *dreg);
    nftnl_expr_set_str(e, NFTNL_EXPR_LOOKUP_SET, set.c_str());
    add(e);
  }
  /// Loads `ip saddr . ip daddr . meta l4proto . th dport` (or a suffix of it) from 32-bit
  /// register offset 0; returns the next free offset.
  std::uint32_t concatKey(bool withSource, bool withAddress) {
    std::uint32_t idx = 0;
    if (withSource) {
      payload(NFT_PAYLOAD_NETWORK_HEADER, saddrOffset(), addrLen(), reg32(idx));
      idx += addrLen() / 4;
    }
    if (withAddress) {
      payload(NFT_PAYLOAD_NETWORK_HEADER, daddrOffset(), addrLen(), reg32(idx));
      idx += addrLen() / 4;
    }
    meta(NFT_META_L4PROTO, reg32(idx));
    idx += 1;
    payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg32(idx));
    idx += 1;
    return idx;
  }

  void operator()(const MatchAddress& s) {
    payload(NFT_PAYLOAD_NETWORK_HEADER, s.source ? saddrOffset() : daddrOffset(), addrLen(),
            NFT_REG_1);
    if (!s.address.isHost()) {
      std::uint8_t mask[16] = {};
      std::uint8_t zero[16] = {};
      for (int i = 0; i < s.address.length; ++i) mask[i / 8] |= 0x80u >> (i % 8);
      bitwise(mask, zero, addrLen());
    }
    cmp(s.negate ? NFT_CMP_NEQ : NFT_CMP_EQ, s.address.bytes.data(), addrLen());
  }
  void operator()(const MatchL4Proto& s) {
    meta(NFT_META_L4PROTO, NFT_REG_1);
    cmp(NFT_CMP_EQ, &s.proto, 1);
  }
  void operator()(const MatchDestPort& s) {
    payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
    std::uint16_t port = htons(s.port);
    cmp(NFT_CMP_EQ, &port, 2);
  }
  void operator()(const MatchCtStateNew&) {
    auto* e = expr("ct");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, NFT_CT_STATE);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, NFT_REG_1);
    add(e);
    std::uint32_t mask = 1u << 3;  // NF_CT_STATE_BIT(IP_CT_NEW)
    std::uint32_t zero = 0;
    bitwise(&mask, &zero, 4);
    cmp(NFT_CMP_NEQ, &zero, 4);
  }
  void operator()(const MatchMarkClear& s) {
    meta(NFT_META_MARK, NFT_REG_1);
    std::uint32_t zero = 0;
    bitwise(&s.bit, &zero, 4);
    cmp(NFT_CMP_EQ, &zero, 4);
  }
  void operator()(const MatchFibSourceLocal&) { matchFibAddressLocal(NFTA_FIB_F_SADDR); }
  void operator()(const MatchFibDestLocal&) { matchFibAddressLocal(NFTA_FIB_F_DADDR); }
  void operator()(const MatchInputInterface& s) {
    meta(NFT_META_IIFNAME, NFT_REG_1);
    // An exact name compares all IFNAMSIZ bytes (zero padded); a prefix only its own bytes.
    char name[IFNAMSIZ] = {};
    std::memcpy(name, s.name.data(), std::min<std::size_t>(s.name.size(), IFNAMSIZ - 1));
    const auto len = static_cast<std::uint32_t>(s.prefix ? std::min<std::size_t>(s.name.size(), IFNAMSIZ - 1) : IFNAMSIZ);
    cmp(s.negate ? NFT_CMP_NEQ : NFT_CMP_EQ, name, len);
  }
  void operator()(const MatchNumgen& s) {
    auto* e = expr("numgen");
    nftnl_expr_set_u32(e, NFTNL_EXPR_NG_DREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_NG_MODULUS, s.modulus);
    nftnl_expr_set_u32(e, NFTNL_EXPR_NG_TYPE, NFT_NG_RANDOM);
    nftnl_expr_set_u32(e, NFTNL_EXPR_NG_OFFSET, 0);
    add(e);
    std::uint32_t zero = 0;
    cmp(NFT_CMP_EQ, &zero, 4);
  }
  void operator()(const MatchDestInSet& s) {
    payload(NFT_PAYLOAD_NETWORK_HEADER, daddrOffset(), addrLen(), NFT_REG_1);
    lookup(s.set, NFT_REG_1, std::nullopt);
  }
  void operator()(const VmapLookup& s) {
    concatKey(false, s.withAddress);
    lookup(s.map, NFT_REG_1, NFT_REG_VERDICT);
  }
  void operator()(const SetMark& s) {
    meta(NFT_META_MARK, NFT_REG_1);
    std::uint32_t mask = s.toggle ? 0xffffffffu : ~s.bit;
    bitwise(&mask, &s.bit, 4);
    auto* e = expr("meta");
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, NFT_META_MARK);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_SREG, NFT_REG_1);
    add(e);
  }
  void operator()(const Masquerade&) {
    auto* e = expr("masq");
    nftnl_expr_set_u32(e, NFTNL_EXPR_MASQ_FLAGS, NF_NAT_RANGE_PROTO_RANDOM_FULLY);
    add(e);
  }
  void natDnat(std::uint32_t addrReg, std::uint32_t protoReg, std::optional<std::uint32_t> flags) {
    auto* e = expr("nat");
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_TYPE, NFT_NAT_DNAT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_FAMILY, nfproto(family_));
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_REG_ADDR_MIN, addrReg);
    nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_REG_PROTO_MIN, protoReg);
    if (flags) nftnl_expr_set_u32(e, NFTNL_EXPR_NAT_FLAGS, *flags);
    add(e);
  }
  void operator()(const DnatTo& s) {
    immediate(NFT_REG_1, s.address.bytes.data(), addrLen());
    std::uint16_t port = htons(s.port);
    immediate(NFT_REG_2, &port, 2);
    natDnat(NFT_REG_1, NFT_REG_2, NF_NAT_RANGE_PROTO_SPECIFIED);
  }
  /// Loads `ip saddr . numgen random mod 1 offset ID` (the affinity key) from register offset 0.
  void affinityKey(std::uint32_t id) {
    payload(NFT_PAYLOAD_NETWORK_HEADER, saddrOffset(), addrLen(), reg32(0));
    auto* ng = expr("numgen");
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_DREG, reg32(addrLen() / 4));
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_MODULUS, 1);
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_TYPE, NFT_NG_RANDOM);
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_OFFSET, id);
    add(ng);
  }
  void operator()(const DnatFromAffinity& s) {
    affinityKey(s.id);
    lookup(s.map, NFT_REG_1, NFT_REG_1);
    natDnat(NFT_REG_1, reg32(addrLen() / 4), std::nullopt);
  }
  void operator()(const DnatFromSlots& s) {
    auto* ng = expr("numgen");
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_DREG, NFT_REG_1);
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_MODULUS, kSlotsPerRange);
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_TYPE, NFT_NG_RANDOM);
    nftnl_expr_set_u32(ng, NFTNL_EXPR_NG_OFFSET, s.base);
    add(ng);
    // numgen leaves a host-order number; the interval map orders keys as big-endian bytes.
    auto* bo = expr("byteorder");
    nftnl_expr_set_u32(bo, NFTNL_EXPR_BYTEORDER_SREG, NFT_REG_1);
    nftnl_expr_set_u32(bo, NFTNL_EXPR_BYTEORDER_DREG, NFT_REG_1);
    nftnl_expr_set_u32(bo, NFTNL_EXPR_BYTEORDER_OP, NFT_BYTEORDER_HTON);
    nftnl_expr_set_u32(bo, NFTNL_EXPR_BYTEORDER_LEN, 4);
    nftnl_expr_set_u32(bo, NFTNL_EXPR_BYTEORDER_SIZE, 4);
    add(bo);
    lookup(s.map, NFT_REG_1, NFT_REG_1);
    natDnat(NFT_REG_1, reg32(addrLen() / 4), std::nullopt);
  }
  void ct(std::uint32_t key, std::uint32_t dreg, bool original) {
    auto* e = expr("ct");
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, dreg);
    if (original) nftnl_expr_set_u8(e, NFTNL_EXPR_CT_DIR, 0 /* IP_CT_DIR_ORIGINAL */);
    add(e);
  }
  std::uint32_t ctOriginalDaddrKey() const {
    return family_ == net::Family::kIPv4 ? NFT_CT_DST_IP : NFT_CT_DST_IP6;
  }
  void operator()(const MatchCtStatusDnat&) {
    ct(NFT_CT_STATUS, NFT_REG_1, false);
    std::uint32_t mask = 1u << 5;  // IPS_DST_NAT
    std::uint32_t zero = 0;
    bitwise(&mask, &zero, 4);
    cmp(NFT_CMP_NEQ, &zero, 4);
  }
  void operator()(const MatchHairpin& s) {
    (*this)(MatchCtStatusDnat{});
    payload(NFT_PAYLOAD_NETWORK_HEADER, saddrOffset(), addrLen(), NFT_REG_1);
    payload(NFT_PAYLOAD_NETWORK_HEADER, daddrOffset(), addrLen(), reg32(addrLen() / 4));
    lookup(s.set, NFT_REG_1, std::nullopt);
  }
  void operator()(const VmapLookupOriginal& s) {
    (*this)(MatchL4Proto{s.proto});
    std::uint32_t idx = 0;
    ct(ctOriginalDaddrKey(), NFT_REG_1, true);
    if (s.nodePorts)
      lookup("nodeport-ips", NFT_REG_1, std::nullopt);
    else
      idx += addrLen() / 4;
    meta(NFT_META_L4PROTO, reg32(idx));
    ct(NFT_CT_PROTO_DST, reg32(idx + 1), true);
    lookup(s.map, NFT_REG_1, NFT_REG_VERDICT);
  }
  void operator()(const RecordAffinity& s) {
    (*this)(MatchL4Proto{s.proto});
    // Key: client . pool ID; data (the endpoint) at the next 128-bit register, as nft puts it.
    affinityKey(s.id);
    const std::uint32_t dataIdx = (addrLen() / 4 + 1 + 3) / 4 * 4;
    payload(NFT_PAYLOAD_NETWORK_HEADER, daddrOffset(), addrLen(), reg32(dataIdx));
    payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg32(dataIdx + addrLen() / 4));
    auto* e = expr("dynset");
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SREG_KEY, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SREG_DATA, reg32(dataIdx));
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_OP, NFT_DYNSET_OP_UPDATE);
    nftnl_expr_set_u64(e, NFTNL_EXPR_DYNSET_TIMEOUT,
                       static_cast<std::uint64_t>(s.timeoutSeconds) * 1000);
    nftnl_expr_set_str(e, NFTNL_EXPR_DYNSET_SET_NAME, s.map.c_str());
    add(e);
  }
  void operator()(const RedirectTo& s) {
    std::uint16_t port = htons(s.port);
    immediate(NFT_REG_1, &port, 2);
    auto* e = expr("redir");
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_REG_PROTO_MIN, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
    add(e);
  }
  void operator()(const Reject& s) {
    auto* e = expr("reject");
    if (s.tcpReset) {
      nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_TCP_RST);
      nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, 0);
    } else {
      nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH);
      // ICMP_PORT_UNREACH (3) / ICMPV6_PORT_UNREACH (4)
      nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, family_ == net::Family::kIPv4 ? 3 : 4);
    }
    add(e);
  }
  void operator()(const Verdict& s) {
    auto* e = expr("immediate");
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT, verdictCode(s.kind));
    if (s.kind == VerdictKind::kJump || s.kind == VerdictKind::kGoto)
      nftnl_expr_set_str(e, NFTNL_EXPR_IMM_CHAIN, s.chain.c_str());
    add(e);
  }

 private:
  net::Family family_;
  nftnl_rule* rule_;
};

/// The typeof descriptions nft keeps in a set's userdata, so that `nft list` prints the slot
/// maps as `typeof numgen random mod 65535 : ip daddr . th dport` and the affinity map as
/// `typeof ip saddr . numgen random mod 1 : ip daddr . th dport` (nft's own numbering of
/// expressions and header fields).
class TypeofWriter {
 public:
  TypeofWriter(nftnl_udata_buf* ud, net::Family family) : ud_(ud), family_(family) {}

  void numgen(std::uint8_t at, std::uint32_t modulus) {
    auto* item = nftnl_udata_nest_start(ud_, at);
    numgenBody(modulus);
    nftnl_udata_nest_end(ud_, item);
  }
  void address(std::uint8_t at, bool source) {
    if (family_ == net::Family::kIPv4)
      payload(at, 12 /* ip */, source ? 11 /* saddr */ : 12 /* daddr */);
    else
      payload(at, 13 /* ip6 */, source ? 8 /* saddr */ : 9 /* daddr */);
  }
  void destinationPort(std::uint8_t at) { payload(at, 11 /* th */, 2 /* dport */); }
  /// A concatenation at `at`; `fields` adds its items at 0, 1, ...
  template <typename Fields>
  void concat(std::uint8_t at, Fields&& fields) {
    auto* outer = nftnl_udata_nest_start(ud_, at);
    nftnl_udata_put_u32(ud_, 0, kExprConcat);
    auto* list = nftnl_udata_nest_start(ud_, 1);
    fields();
    nftnl_udata_nest_end(ud_, list);
    nftnl_udata_nest_end(ud_, outer);
  }
  /// A single expression as the key: its items written at 0 and 1 of the typeof attribute.
  template <typename Expr>
  void single(std::uint8_t at, Expr&& expr) {
    auto* outer = nftnl_udata_nest_start(ud_, at);
    expr();
    nftnl_udata_nest_end(ud_, outer);
  }
  void numgenBody(std::uint32_t modulus) {
    nftnl_udata_put_u32(ud_, 0, kExprNumgen);
    auto* ng = nftnl_udata_nest_start(ud_, 1);
    nftnl_udata_put_u32(ud_, 0, NFT_NG_RANDOM);
    nftnl_udata_put_u32(ud_, 1, modulus);
    nftnl_udata_put_u32(ud_, 2, 0);
    nftnl_udata_nest_end(ud_, ng);
  }

  static constexpr std::uint8_t kKeyTypeof = 3;   // NFTNL_UDATA_SET_KEY_TYPEOF
  static constexpr std::uint8_t kDataTypeof = 4;  // NFTNL_UDATA_SET_DATA_TYPEOF

 private:
  static constexpr std::uint32_t kExprNumgen = 23, kExprConcat = 13, kExprPayload = 7;
  void payload(std::uint8_t at, std::uint32_t desc, std::uint32_t field) {
    auto* item = nftnl_udata_nest_start(ud_, at);
    nftnl_udata_put_u32(ud_, 0, kExprPayload);
    auto* p = nftnl_udata_nest_start(ud_, 1);
    nftnl_udata_put_u32(ud_, 0, desc);
    nftnl_udata_put_u32(ud_, 1, field);
    nftnl_udata_nest_end(ud_, p);
    nftnl_udata_nest_end(ud_, item);
  }
  nftnl_udata_buf* ud_;
  net::Family family_;
};

void putEndpointDataTypeof(TypeofWriter& w) {
  w.concat(TypeofWriter::kDataTypeof, [&] {
    w.address(0, false);
    w.destinationPort(1);
  });
}

void putSlotMapTypeof(nftnl_udata_buf* ud, net::Family family) {
  TypeofWriter w(ud, family);
  w.single(TypeofWriter::kKeyTypeof, [&] { w.numgenBody(kSlotsPerRange); });
  putEndpointDataTypeof(w);
}

void putAffinityMapTypeof(nftnl_udata_buf* ud, net::Family family) {
  TypeofWriter w(ud, family);
  w.concat(TypeofWriter::kKeyTypeof, [&] {
    w.address(0, true);
    w.numgen(1, 1);
  });
  putEndpointDataTypeof(w);
}

}  // namespace

std::uint32_t verdictCode(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::kAccept: return NF_ACCEPT;
    case VerdictKind::kDrop: return NF_DROP;
    case VerdictKind::kReturn: return static_cast<std::uint32_t>(NFT_RETURN);
    case VerdictKind::kJump: return static_cast<std::uint32_t>(NFT_JUMP);
    case VerdictKind::kGoto: return static_cast<std::uint32_t>(NFT_GOTO);
  }
  return NF_ACCEPT;
}

nftnl_rule* encodeRule(net::Family family, std::string_view table, std::string_view chain, const Rule& rule,
                       std::uint64_t hash) {
  nftnl_rule* r = nftnl_rule_alloc();
  nftnl_rule_set_u32(r, NFTNL_RULE_FAMILY, nfproto(family));
  nftnl_rule_set_str(r, NFTNL_RULE_TABLE, std::string(table).c_str());
  nftnl_rule_set_str(r, NFTNL_RULE_CHAIN, std::string(chain).c_str());
  RuleEncoder encoder(family, r);
  for (const auto& s : rule.statements) std::visit(encoder, s);
  nftnl_udata_buf* ud = nftnl_udata_buf_alloc(32);
  nftnl_udata_put(ud, kRuleHashUdataType, sizeof hash, &hash);
  nftnl_rule_set_data(r, NFTNL_RULE_USERDATA, nftnl_udata_buf_data(ud), nftnl_udata_buf_len(ud));
  nftnl_udata_buf_free(ud);
  return r;
}

std::uint64_t decodeRuleHash(const void* data, std::uint32_t length) {
  std::uint64_t hash = 0;
  nftnl_udata_parse(
      data, length,
      [](const nftnl_udata* attr, void* out) -> int {
        if (nftnl_udata_type(attr) == kRuleHashUdataType &&
            nftnl_udata_len(attr) == sizeof(std::uint64_t))
          std::memcpy(out, nftnl_udata_get(attr), sizeof(std::uint64_t));
        return 0;
      },
      &hash);
  return hash;
}

nftnl_set* encodeSet(net::Family family, std::string_view table, const SetSpec& spec) {
  nftnl_set* s = nftnl_set_alloc();
  nftnl_set_set_u32(s, NFTNL_SET_FAMILY, nfproto(family));
  nftnl_set_set_str(s, NFTNL_SET_TABLE, std::string(table).c_str());
  nftnl_set_set_str(s, NFTNL_SET_NAME, spec.name.c_str());
  // The kernel requires a transaction-local set id (it lets rules refer to a new set by id).
  static std::uint32_t nextId = 0;
  nftnl_set_set_u32(s, NFTNL_SET_ID, ++nextId);
  std::uint32_t flags = 0;
  if (spec.isMap()) flags |= NFT_SET_MAP;
  if (spec.interval) flags |= NFT_SET_INTERVAL;
  if (spec.dynamic) flags |= NFT_SET_TIMEOUT | NFT_SET_EVAL;
  nftnl_set_set_u32(s, NFTNL_SET_FLAGS, flags);
  nftnl_set_set_u32(s, NFTNL_SET_KEY_TYPE, SetSpec::typeId(spec.key));
  nftnl_set_set_u32(s, NFTNL_SET_KEY_LEN, spec.keyLength());
  if (spec.isVerdictMap()) {
    nftnl_set_set_u32(s, NFTNL_SET_DATA_TYPE, NFT_DATA_VERDICT);
    nftnl_set_set_u32(s, NFTNL_SET_DATA_LEN, 0);
  } else if (spec.isMap()) {
    nftnl_set_set_u32(s, NFTNL_SET_DATA_TYPE, SetSpec::typeId(spec.data));
    nftnl_set_set_u32(s, NFTNL_SET_DATA_LEN, spec.dataLength());
  }
  if (spec.timeoutSeconds != 0)
    nftnl_set_set_u64(s, NFTNL_SET_TIMEOUT, static_cast<std::uint64_t>(spec.timeoutSeconds) * 1000);
  if (spec.size != 0) nftnl_set_set_u32(s, NFTNL_SET_DESC_SIZE, spec.size);
  // nft's set userdata: key (and data) byte order, so `nft list` prints addresses and ports.
  nftnl_udata_buf* ud = nftnl_udata_buf_alloc(256);
  const bool slotKey = spec.key.size() == 1 && spec.key[0] == DataType::kSlot;
  nftnl_udata_put_u32(ud, 0 /* NFTNL_UDATA_SET_KEYBYTEORDER */,
                      slotKey ? 1 /* BYTEORDER_HOST_ENDIAN */ : 2 /* BYTEORDER_BIG_ENDIAN */);
  if (spec.isMap() && !spec.isVerdictMap())
    nftnl_udata_put_u32(ud, 1 /* NFTNL_UDATA_SET_DATABYTEORDER */, 2);
  if (slotKey) putSlotMapTypeof(ud, family);
  if (spec.key.size() == 2 && spec.key[1] == DataType::kPoolId) putAffinityMapTypeof(ud, family);
  nftnl_set_set_data(s, NFTNL_SET_USERDATA, nftnl_udata_buf_data(ud), nftnl_udata_buf_len(ud));
  nftnl_udata_buf_free(ud);
  return s;
}

nftnl_chain* encodeChain(net::Family family, std::string_view table, std::string_view name, const BaseHook* base) {
  nftnl_chain* c = nftnl_chain_alloc();
  nftnl_chain_set_u32(c, NFTNL_CHAIN_FAMILY, nfproto(family));
  nftnl_chain_set_str(c, NFTNL_CHAIN_TABLE, std::string(table).c_str());
  nftnl_chain_set_str(c, NFTNL_CHAIN_NAME, std::string(name).c_str());
  if (base != nullptr) {
    std::uint32_t hook = NF_INET_PRE_ROUTING;
    if (base->hook == "input") hook = NF_INET_LOCAL_IN;
    else if (base->hook == "forward") hook = NF_INET_FORWARD;
    else if (base->hook == "output") hook = NF_INET_LOCAL_OUT;
    else if (base->hook == "postrouting") hook = NF_INET_POST_ROUTING;
    nftnl_chain_set_u32(c, NFTNL_CHAIN_HOOKNUM, hook);
    nftnl_chain_set_s32(c, NFTNL_CHAIN_PRIO, base->priority);
    nftnl_chain_set_str(c, NFTNL_CHAIN_TYPE, base->type.c_str());
    nftnl_chain_set_u32(c, NFTNL_CHAIN_POLICY, NF_ACCEPT);
  }
  return c;
}

}  // namespace kproxy::nftables
