#include "kproxy/iptables/kernel_netlink.h"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_nat.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/x_tables.h>
#include <linux/netfilter/xt_addrtype.h>
#include <linux/netfilter/xt_comment.h>
#include <linux/netfilter/xt_mark.h>
#include <linux/netfilter/xt_nfacct.h>
#include <linux/netfilter/xt_recent.h>
#include <linux/netfilter/xt_sctp.h>
#include <linux/netfilter/xt_statistic.h>
#include <linux/netfilter/xt_tcpudp.h>
#include <net/if.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/kernel/netlink_socket.h"
#include "kproxy/net/ip.h"
#include "rule_words.h"

namespace kproxy::iptables {
namespace {

using net::Prefix;
using core::ErrorCategory;
using core::makeError;

std::unexpected<core::Error> unsupported(std::string why) { return makeError(ErrorCategory::kInvalidArgument, std::move(why)); }

bool isV6(net::Family family) { return family == net::Family::kIPv6; }

/// An address condition (-s / -d): the address already masked, and its mask.
struct AddressMatch {
  bool set = false;
  bool negate = false;
  std::array<std::uint8_t, 16> address{};
  std::array<std::uint8_t, 16> mask{};
};

/// A module's match, in the order of the spec: native (a port, a mark) as iptables-nft 1.8
/// writes them, or an xtables match carrying the kernel's structure.
struct Match {
  enum class Kind : std::uint8_t { kXt, kDestPort, kMark } kind = Kind::kXt;
  std::string name;  ///< kXt
  std::uint32_t revision = 0;
  std::vector<std::uint8_t> info;  ///< kXt: the extension's structure, XT_ALIGNed
  std::uint16_t port = 0;          ///< kDestPort
  std::uint32_t value = 0, mask = 0;
  bool negate = false;  ///< kMark
};

struct Target {
  enum class Kind : std::uint8_t { kNone, kVerdict, kJump, kXt } kind = Kind::kNone;
  std::int32_t verdict = 0;
  std::string chain;  ///< kJump
  std::string name;   ///< kXt
  std::uint32_t revision = 0;
  std::vector<std::uint8_t> info;
};

struct ParsedRule {
  std::string inInterface;
  bool inNegate = false;
  std::uint8_t protocol = 0;
  bool protocolNegate = false;
  AddressMatch source, destination;
  std::vector<Match> matches;
  Target target;
};

template <typename T>
std::vector<std::uint8_t> bytesOf(const T& info) {
  std::vector<std::uint8_t> out(XT_ALIGN(sizeof(T)), 0);
  std::memcpy(out.data(), &info, sizeof(T));
  return out;
}

std::optional<std::uint8_t> protocolNumber(std::string_view name) {
  if (name == "tcp") return IPPROTO_TCP;
  if (name == "udp") return IPPROTO_UDP;
  if (name == "sctp") return IPPROTO_SCTP;
  return std::nullopt;
}

std::optional<AddressMatch> parseAddress(net::Family family, std::string_view text) {
  auto p = net::Prefix::parse(text);
  if (!p || p->v6() != isV6(family) || p->length == 0) return std::nullopt;
  AddressMatch a;
  a.set = true;
  const std::size_t size = p->size();
  for (std::size_t i = 0; i < size; ++i) {
    const int bits = std::clamp(static_cast<int>(p->length) - static_cast<int>(i * 8), 0, 8);
    a.mask[i] = static_cast<std::uint8_t>(0xff00 >> bits);
    a.address[i] = p->bytes[i] & a.mask[i];
  }
  return a;
}

/// "ADDR:PORT" or "[ADDR]:PORT" of DNAT --to-destination.
bool parseNatDestination(net::Family family, std::string_view text, nf_nat_range2& range) {
  std::string_view host, port;
  if (text.starts_with('[')) {
    const auto close = text.find("]:");
    if (close == std::string_view::npos) return false;
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || isV6(family)) return false;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto p = net::Prefix::parse(host);
  auto n = parseRulePort(port);
  if (!p || !p->isHost() || p->v6() != isV6(family) || !n || *n == 0) return false;
  range.flags = NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED;
  std::memcpy(&range.min_addr, p->bytes.data(), p->size());
  std::memcpy(&range.max_addr, p->bytes.data(), p->size());
  range.min_proto.all = htons(*n);
  range.max_proto.all = htons(*n);
  return true;
}

constexpr std::size_t kMaxMatches = 8;

/// Parses the words of a rule spec into what iptables-nft would build from them. Only the
/// options the renderer writes are known; anything else is an error.
class NftRuleParser {
 public:
  NftRuleParser(net::Family family, std::string_view spec) : family_(family), spec_(spec), words_(spec) {}

  core::Result<ParsedRule> parse() && {
    bool negate = false;
    for (; !words_.atEnd(); words_.step()) {
      const std::string& w = words_.word();
      if (w == "!") {
        if (negate) return bad("! !");
        negate = true;
        continue;
      }
      const bool inverted = std::exchange(negate, false);
      if (w == "-j") {
        if (auto t = target(inverted); !t) return std::unexpected(t.error());
        break;
      }
      const bool header = w == "-s" || w == "-d" || w == "-i" || w == "-p" || w == "-m";
      if (auto r = header ? headerOption(w, inverted) : moduleOption(w, inverted); !r)
        return std::unexpected(r.error());
    }
    if (negate) return bad("a trailing !");
    if (auto done = finishModule(); !done) return std::unexpected(done.error());
    // A message is built in a buffer of kMessageRoom bytes: the renderer's rules carry at most
    // four matches of at most 296 bytes.
    if (rule_.matches.size() > kMaxMatches) return bad("more than 8 matches");
    return std::move(rule_);
  }

 private:
  std::unexpected<core::Error> bad(std::string_view what) const {
    return unsupported(fmt::format("\"{}\" in \"{}\"", what, spec_));
  }

  /// -s, -d, -i, -p and -m.
  core::Result<void> headerOption(const std::string& w, bool inverted) {
    auto v = words_.value();
    if (w == "-s" || w == "-d") {
      auto a = v ? parseAddress(family_, *v) : std::nullopt;
      if (!a) return bad(w + " " + std::string(v.value_or("")));
      a->negate = inverted;
      (w == "-s" ? rule_.source : rule_.destination) = *a;
    } else if (w == "-i") {
      if (!v || v->empty() || v->size() >= IFNAMSIZ) return bad("-i");
      rule_.inInterface = std::string(*v);
      rule_.inNegate = inverted;
    } else if (w == "-p") {
      auto p = v ? protocolNumber(*v) : std::nullopt;
      if (!p) return bad("-p " + std::string(v.value_or("")));
      rule_.protocol = *p;
      rule_.protocolNegate = inverted;
    } else {
      if (!v) return bad("-m");
      if (inverted) return bad("! -m");
      return startModule(*v);
    }
    return {};
  }

  /// An option of the current module (-m NAME).
  core::Result<void> moduleOption(const std::string& w, bool inverted) {
    if (module_ == "comment" && w == "--comment") {
      auto v = words_.value();
      if (!v || v->size() >= XT_MAX_COMMENT_LEN || inverted) return bad("--comment");
      std::memcpy(comment_.comment, v->data(), v->size());
    } else if ((module_ == "tcp" || module_ == "udp") && w == "--dport") {
      auto v = words_.value();
      auto port = v ? parseRulePort(*v) : std::nullopt;
      if (!port || inverted || portSeen_) return bad("--dport");
      Match m;
      m.kind = Match::Kind::kDestPort;
      m.port = *port;
      rule_.matches.push_back(std::move(m));
      portSeen_ = true;
    } else if (module_ == "sctp" && w == "--dport") {
      auto v = words_.value();
      auto port = v ? parseRulePort(*v) : std::nullopt;
      if (!port || inverted) return bad("--dport");
      sctp_.dpts[0] = sctp_.dpts[1] = *port;
      sctp_.flags |= XT_SCTP_DEST_PORTS;
    } else if (module_ == "mark" && w == "--mark") {
      auto v = words_.value();
      auto vm = v ? parseValueMask(*v) : std::nullopt;
      if (!vm) return bad("--mark");
      Match m;
      m.kind = Match::Kind::kMark;
      m.value = vm->first;
      m.mask = vm->second;
      m.negate = inverted;
      rule_.matches.push_back(std::move(m));
    } else if (module_ == "nfacct" && w == "--nfacct-name") {
      auto v = words_.value();
      if (!v || v->empty() || v->size() >= NFACCT_NAME_MAX || inverted) return bad("--nfacct-name");
      std::memcpy(nfacct_.name, v->data(), v->size());
    } else if (module_ == "statistic") {
      return statisticOption(w, inverted);
    } else if (module_ == "recent") {
      return recentOption(w, inverted);
    } else if (module_ == "addrtype" && (w == "--src-type" || w == "--dst-type")) {
      auto v = words_.value();
      if (!v || *v != "LOCAL") return bad(w);
      if (w == "--src-type") {
        addrtype_.source |= XT_ADDRTYPE_LOCAL;
        if (inverted) addrtype_.flags |= XT_ADDRTYPE_INVERT_SOURCE;
      } else {
        addrtype_.dest |= XT_ADDRTYPE_LOCAL;
        if (inverted) addrtype_.flags |= XT_ADDRTYPE_INVERT_DEST;
      }
    } else {
      return bad(w);
    }
    return {};
  }

  core::Result<void> statisticOption(const std::string& w, bool inverted) {
    if (w == "--mode") {
      auto v = words_.value();
      if (!v || *v != "random" || inverted) return bad("--mode");
      statistic_.mode = XT_STATISTIC_MODE_RANDOM;
    } else if (w == "--probability") {
      auto v = words_.value();
      if (!v) return bad("--probability");
      const std::string text(*v);
      char* end = nullptr;
      const double p = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || p < 0 || p > 1) return bad("--probability " + text);
      statistic_.u.random.probability = static_cast<std::uint32_t>(std::lround(2147483648.0 * p));
      if (inverted) statistic_.flags |= XT_STATISTIC_INVERT;
    } else {
      return bad(w);
    }
    return {};
  }

  core::Result<void> recentOption(const std::string& w, bool inverted) {
    if (w == "--set" || w == "--update" || w == "--rcheck" || w == "--remove") {
      const int flag = w == "--set"      ? int{XT_RECENT_SET}
                       : w == "--update" ? int{XT_RECENT_UPDATE}
                       : w == "--rcheck" ? int{XT_RECENT_CHECK}
                                         : int{XT_RECENT_REMOVE};
      recent_.check_set = static_cast<std::uint8_t>(recent_.check_set | flag);
      if (inverted) recent_.invert = 1;
    } else if (w == "--seconds") {
      auto v = words_.value();
      auto s = v ? parseRuleNumber(*v) : std::nullopt;
      if (!s) return bad("--seconds");
      recent_.seconds = *s;
      if (inverted) recent_.invert = 1;
    } else if (w == "--reap") {
      recent_.check_set |= XT_RECENT_REAP;
    } else if (w == "--name") {
      auto v = words_.value();
      if (!v || v->empty() || v->size() >= XT_RECENT_NAME_LEN) return bad("--name");
      std::memset(recent_.name, 0, sizeof recent_.name);
      std::memcpy(recent_.name, v->data(), v->size());
    } else if (w == "--mask") {
      auto v = words_.value();
      auto p = v ? net::Prefix::parse(*v) : std::nullopt;
      if (!p || !p->isHost() || p->v6() != isV6(family_)) return bad("--mask");
      std::memset(&recent_.mask, 0, sizeof recent_.mask);
      std::memcpy(&recent_.mask, p->bytes.data(), p->size());
    } else if (w == "--rsource" || w == "--rdest") {
      recent_.side = w == "--rsource" ? XT_RECENT_SOURCE : XT_RECENT_DEST;
    } else {
      return bad(w);
    }
    return {};
  }

  /// `-m NAME`: ends the module before it and starts filling in NAME's structure.
  core::Result<void> startModule(std::string_view name) {
    if (auto done = finishModule(); !done) return done;
    module_ = std::string(name);
    portSeen_ = false;
    if (name == "comment") {
      comment_ = {};
    } else if (name == "statistic") {
      statistic_ = {};
      statistic_.mode = 0xffff;  // none yet
    } else if (name == "recent") {
      recent_ = {};
      std::strncpy(recent_.name, "DEFAULT", sizeof recent_.name - 1);
      recent_.side = XT_RECENT_SOURCE;
      std::memset(&recent_.mask, 0xff, sizeof recent_.mask);
    } else if (name == "addrtype") {
      addrtype_ = {};
    } else if (name == "nfacct") {
      nfacct_ = {};
    } else if (name == "sctp") {
      sctp_ = {};
      for (auto& flag : sctp_.flag_info) flag.chunktype = 0xff;  // libxt_sctp's "none"
    } else if (name == "tcp" || name == "udp") {
      if (protocolNumber(name) != rule_.protocol || rule_.protocolNegate) return bad("-m " + module_);
    } else if (name != "mark") {
      return bad("-m " + module_);
    }
    return {};
  }

  /// Adds the current module's match, its structure filled in by the options that followed.
  core::Result<void> finishModule() {
    if (module_.empty()) return {};
    Match m;
    m.name = module_;
    if (module_ == "comment") {
      m.info = bytesOf(comment_);
    } else if (module_ == "statistic") {
      if (statistic_.mode != XT_STATISTIC_MODE_RANDOM) return bad("-m statistic without --mode random");
      // libxt_statistic's final check copies the first word of the union into the counter of
      // the nth mode, whatever the mode.
      statistic_.u.nth.count = statistic_.u.nth.every;
      m.info = bytesOf(statistic_);
    } else if (module_ == "recent") {
      m.revision = 1;
      m.info = bytesOf(recent_);
    } else if (module_ == "addrtype") {
      m.revision = 1;
      m.info = bytesOf(addrtype_);
    } else if (module_ == "nfacct") {
      // Revision 1, as iptables-nft-restore picks it (the highest the kernel has); the kernel
      // finds the object by name when the rule is added (ENOENT without it).
      if (nfacct_.name[0] == '\0') return bad("-m nfacct without --nfacct-name");
      m.revision = 1;
      m.info = bytesOf(nfacct_);
    } else if (module_ == "sctp") {
      m.info = bytesOf(sctp_);
    } else if (module_ == "tcp" || module_ == "udp") {
      if (portSeen_) return {};  // already added, native
      m.info = module_ == "tcp" ? tcpMatchInfo() : udpMatchInfo();
    } else if (module_ == "mark") {
      return {};  // added, native, at --mark
    }
    rule_.matches.push_back(std::move(m));
    return {};
  }

  static std::vector<std::uint8_t> tcpMatchInfo() {
    xt_tcp tcp{};
    tcp.spts[1] = tcp.dpts[1] = 0xffff;
    return bytesOf(tcp);
  }
  static std::vector<std::uint8_t> udpMatchInfo() {
    xt_udp udp{};
    udp.spts[1] = udp.dpts[1] = 0xffff;
    return bytesOf(udp);
  }

  /// `-j NAME OPTIONS…`: the rest of the spec.
  core::Result<void> target(bool inverted) {
    auto v = words_.value();
    if (!v || inverted) return bad("-j");
    if (auto done = finishModule(); !done) return done;
    module_.clear();
    const std::string name(*v);
    const std::vector<std::string_view> options = words_.remaining();
    Target& t = rule_.target;
    if (name == "RETURN" || name == "ACCEPT" || name == "DROP") {
      if (!options.empty()) return bad("-j " + name + " with options");
      t.kind = Target::Kind::kVerdict;
      t.verdict = name == "RETURN" ? int{NFT_RETURN} : name == "ACCEPT" ? int{NF_ACCEPT} : int{NF_DROP};
    } else if (name == "MARK") {
      auto vm = options.size() == 2 && options[0] == "--set-xmark" ? parseValueMask(options[1]) : std::nullopt;
      if (!vm) return bad("-j MARK other than --set-xmark VALUE/MASK");
      xt_mark_tginfo2 info{};
      info.mark = vm->first;
      info.mask = vm->second;
      t.kind = Target::Kind::kXt;
      t.name = "MARK";
      t.revision = 2;
      t.info = bytesOf(info);
    } else if (name == "MASQUERADE") {
      if (options.size() > 1 || (options.size() == 1 && options[0] != "--random-fully"))
        return bad("-j MASQUERADE with options other than --random-fully");
      t.kind = Target::Kind::kXt;
      t.name = "MASQUERADE";
      t.info = masqueradeInfo(options.empty() ? 0 : NF_NAT_RANGE_PROTO_RANDOM_FULLY);
    } else if (name == "DNAT") {
      nf_nat_range2 range{};
      if (options.size() != 2 || options[0] != "--to-destination" ||
          !parseNatDestination(family_, options[1], range))
        return bad("-j DNAT other than --to-destination ADDRESS:PORT");
      t.kind = Target::Kind::kXt;
      t.name = "DNAT";
      t.revision = 2;
      t.info = bytesOf(range);
    } else if (!name.empty() && name.find_first_of("abcdefghijklmnopqrstuvwxyz") == std::string::npos &&
               name.starts_with(backends::kKubePrefix) && options.empty()) {
      t.kind = Target::Kind::kJump;
      t.chain = name;
    } else {
      return bad("-j " + name);
    }
    return {};
  }

  std::vector<std::uint8_t> masqueradeInfo(unsigned flags) const {
    if (isV6(family_)) {
      nf_nat_range range{};
      range.flags = flags;
      return bytesOf(range);
    }
    nf_nat_ipv4_multi_range_compat range{};
    range.rangesize = 1;
    range.range[0].flags = flags;
    return bytesOf(range);
  }

  net::Family family_;
  std::string_view spec_;
  RuleWords words_;
  ParsedRule rule_;
  std::string module_;
  bool portSeen_ = false;
  // The structure of the xtables match the words after `-m NAME` fill in.
  xt_comment_info comment_{};
  xt_statistic_info statistic_{};
  xt_recent_mtinfo_v1 recent_{};
  xt_nfacct_match_info_v1 nfacct_{};
  xt_addrtype_info_v1 addrtype_{};
  xt_sctp_info sctp_{};
};

core::Result<ParsedRule> parseRule(net::Family family, std::string_view spec) {
  return NftRuleParser(family, spec).parse();
}

// ---- encoding, as iptables-nft 1.8 builds a rule (nft_ipv4_add / nft_ipv6_add) ----

using ExprPtr = nftnl_expr*;

void cmp(nftnl_rule* r, std::uint32_t op, const void* data, std::uint32_t len) {
  ExprPtr e = nftnl_expr_alloc("cmp");
  nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
  nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, op);
  nftnl_expr_set(e, NFTNL_EXPR_CMP_DATA, data, len);
  nftnl_rule_add_expr(r, e);
}
void meta(nftnl_rule* r, std::uint32_t key) {
  ExprPtr e = nftnl_expr_alloc("meta");
  nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
  nftnl_expr_set_u32(e, NFTNL_EXPR_META_DREG, NFT_REG_1);
  nftnl_rule_add_expr(r, e);
}
void payload(nftnl_rule* r, std::uint32_t base, std::uint32_t offset, std::uint32_t len) {
  ExprPtr e = nftnl_expr_alloc("payload");
  nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, base);
  nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, NFT_REG_1);
  nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, offset);
  nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, len);
  nftnl_rule_add_expr(r, e);
}
void bitwise(nftnl_rule* r, const void* mask, std::uint32_t len) {
  const std::array<std::uint8_t, 16> zero{};
  ExprPtr e = nftnl_expr_alloc("bitwise");
  nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, NFT_REG_1);
  nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, NFT_REG_1);
  nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, len);
  nftnl_expr_set(e, NFTNL_EXPR_BITWISE_MASK, mask, len);
  nftnl_expr_set(e, NFTNL_EXPR_BITWISE_XOR, zero.data(), len);
  nftnl_rule_add_expr(r, e);
}
void xt(nftnl_rule* r, const char* kind, const std::string& name, std::uint32_t revision,
        const std::vector<std::uint8_t>& info) {
  const bool match = std::strcmp(kind, "match") == 0;
  ExprPtr e = nftnl_expr_alloc(kind);
  const auto len = static_cast<std::uint32_t>(info.size());
  // libnftnl keeps the info's pointer and frees it with the expression.
  void* copy = std::calloc(1, info.size());
  std::memcpy(copy, info.data(), info.size());
  if (match) {
    nftnl_expr_set_str(e, NFTNL_EXPR_MT_NAME, name.c_str());
    nftnl_expr_set_u32(e, NFTNL_EXPR_MT_REV, revision);
    nftnl_expr_set(e, NFTNL_EXPR_MT_INFO, copy, len);
  } else {
    nftnl_expr_set_str(e, NFTNL_EXPR_TG_NAME, name.c_str());
    nftnl_expr_set_u32(e, NFTNL_EXPR_TG_REV, revision);
    nftnl_expr_set(e, NFTNL_EXPR_TG_INFO, copy, len);
  }
  nftnl_rule_add_expr(r, e);
}

/// add_addr: a prefix on a byte boundary compares only its leading bytes; any other mask
/// loads the whole address and masks it.
void address(nftnl_rule* r, std::uint32_t offset, std::uint32_t size, const AddressMatch& a) {
  std::uint32_t len = 0;
  while (len < size && a.mask[len] == 0xff) ++len;
  bool masked = false;
  for (std::uint32_t j = len; j < size; ++j) masked = masked || a.mask[j] != 0;
  if (masked) len = size;
  payload(r, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
  if (masked) bitwise(r, a.mask.data(), len);
  cmp(r, a.negate ? NFT_CMP_NEQ : NFT_CMP_EQ, a.address.data(), len);
}

void encode(net::Family family, const ParsedRule& p, nftnl_rule* r) {
  if (!p.inInterface.empty()) {
    meta(r, NFT_META_IIFNAME);
    const std::uint32_t op = p.inNegate ? NFT_CMP_NEQ : NFT_CMP_EQ;
    if (p.inInterface.ends_with('+')) {
      if (p.inInterface.size() > 1)
        cmp(r, op, p.inInterface.data(), static_cast<std::uint32_t>(p.inInterface.size() - 1));
      else if (op != NFT_CMP_EQ)
        cmp(r, NFT_CMP_EQ, "INVAL/D", sizeof "INVAL/D");
    } else {
      cmp(r, op, p.inInterface.c_str(), static_cast<std::uint32_t>(p.inInterface.size() + 1));
    }
  }
  if (p.protocol != 0) {
    meta(r, NFT_META_L4PROTO);
    cmp(r, p.protocolNegate ? NFT_CMP_NEQ : NFT_CMP_EQ, &p.protocol, 1);
  }
  const std::uint32_t size = isV6(family) ? 16 : 4;
  if (p.source.set) address(r, isV6(family) ? 8 : 12, size, p.source);
  if (p.destination.set) address(r, isV6(family) ? 24 : 16, size, p.destination);
  nftnl_rule_set_u32(r, NFTNL_RULE_COMPAT_PROTO, p.protocol);
  nftnl_rule_set_u32(r, NFTNL_RULE_COMPAT_FLAGS, p.protocolNegate ? NFT_RULE_COMPAT_F_INV : 0);
  for (const auto& m : p.matches) {
    switch (m.kind) {
      case Match::Kind::kXt: xt(r, "match", m.name, m.revision, m.info); break;
      case Match::Kind::kDestPort: {
        payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
        const std::uint16_t port = htons(m.port);
        cmp(r, NFT_CMP_EQ, &port, 2);
        break;
      }
      case Match::Kind::kMark: {
        meta(r, NFT_META_MARK);
        if (m.mask != 0xffffffff) bitwise(r, &m.mask, 4);
        cmp(r, m.negate ? NFT_CMP_NEQ : NFT_CMP_EQ, &m.value, 4);
        break;
      }
    }
  }
  ExprPtr counter = nftnl_expr_alloc("counter");
  nftnl_expr_set_u64(counter, NFTNL_EXPR_CTR_PACKETS, 0);
  nftnl_expr_set_u64(counter, NFTNL_EXPR_CTR_BYTES, 0);
  nftnl_rule_add_expr(r, counter);
  const Target& t = p.target;
  switch (t.kind) {
    case Target::Kind::kNone: break;
    case Target::Kind::kVerdict:
    case Target::Kind::kJump: {
      ExprPtr e = nftnl_expr_alloc("immediate");
      nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
      nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT,
                         static_cast<std::uint32_t>(t.kind == Target::Kind::kJump ? int{NFT_JUMP} : t.verdict));
      if (t.kind == Target::Kind::kJump) nftnl_expr_set_str(e, NFTNL_EXPR_IMM_CHAIN, t.chain.c_str());
      nftnl_rule_add_expr(r, e);
      break;
    }
    case Target::Kind::kXt: xt(r, "target", t.name, t.revision, t.info); break;
  }
}

struct RuleDeleter {
  void operator()(nftnl_rule* r) const { nftnl_rule_free(r); }
};
struct ChainDeleter {
  void operator()(nftnl_chain* c) const { nftnl_chain_free(c); }
};

/// Room for one message: the largest rule the renderer writes is well under 2 KiB.
constexpr std::size_t kMessageRoom = 16 * 1024;

}  // namespace

core::Result<void> checkNftRuleSpec(net::Family family, std::string_view spec) {
  auto parsed = parseRule(family, spec);
  if (!parsed) return std::unexpected(parsed.error());
  return {};
}

NftRuleBatch::NftRuleBatch(net::Family family, std::string table) : family_(family), table_(std::move(table)) {}

core::Result<void> NftRuleBatch::add(std::span<const NftChainRewrite> chains) {
  // Parsed first: a refusal leaves the batch as it was.
  // Encoded straight into the batch; a refusal cuts it back to where it was.
  const std::size_t bytesBefore = messages_.size(), sentBefore = sent_.size(), namesBefore = names_.size();
  const std::size_t rulesBefore = rules_, chainsBefore = chains_;
  const std::uint16_t family = isV6(family_) ? NFPROTO_IPV6 : NFPROTO_IPV4;
  std::array<char, kMessageRoom> room;
  auto append = [&](nlmsghdr* nlh, std::uint32_t chain, std::uint32_t rule) {
    messages_.append({reinterpret_cast<const char*>(nlh), nlh->nlmsg_len});
    sent_.push_back(Sent{chain, rule});
  };
  auto seq = [&]() { return static_cast<std::uint32_t>(sent_.size() + 1); };
  const std::size_t firstName = names_.size();
  for (const auto& c : chains) {
    const auto index = static_cast<std::uint32_t>(names_.size());
    names_.emplace_back(c.name);
    chainMessage(NFT_MSG_NEWCHAIN, NLM_F_CREATE, index);
    chainMessage(NFT_MSG_DELRULE, 0, index);  // emptied: a chain kept from before holds its old rules
    ++chains_;
  }
  for (std::size_t c = 0; c < chains.size(); ++c) {
    const auto index = static_cast<std::uint32_t>(firstName + c);
    for (std::size_t k = 0; k < chains[c].rules.size(); ++k) {
      auto parsed = parseRule(family_, chains[c].rules[k]);
      if (!parsed) {
        messages_.truncate(bytesBefore);
        sent_.resize(sentBefore);
        names_.resize(namesBefore);
        rules_ = rulesBefore;
        chains_ = chainsBefore;
        return makeError(ErrorCategory::kInvalidArgument, fmt::format("chain {}: not written over netlink: {}",
                                                                      chains[c].name, parsed.error().message()));
      }
      std::unique_ptr<nftnl_rule, RuleDeleter> rule(nftnl_rule_alloc());
      nftnl_rule_set_u32(rule.get(), NFTNL_RULE_FAMILY, family);
      nftnl_rule_set_str(rule.get(), NFTNL_RULE_TABLE, table_.c_str());
      nftnl_rule_set_str(rule.get(), NFTNL_RULE_CHAIN, names_[index].c_str());
      encode(family_, *parsed, rule.get());
      nlmsghdr* nlh =
          nftnl_nlmsg_build_hdr(room.data(), NFT_MSG_NEWRULE, family, NLM_F_APPEND | NLM_F_CREATE, seq());
      nftnl_rule_nlmsg_build_payload(nlh, rule.get());
      append(nlh, index, static_cast<std::uint32_t>(k + 1));
      ++rules_;
    }
  }
  return {};
}

void NftRuleBatch::remove(std::span<const std::string_view> names) {
  for (const auto name : names) {
    const auto index = static_cast<std::uint32_t>(names_.size());
    names_.emplace_back(name);
    // Created first, as the tool's ":CHAIN" before "-X CHAIN": a chain someone deleted already
    // is no error. Then emptied and deleted.
    chainMessage(NFT_MSG_NEWCHAIN, NLM_F_CREATE, index);
    chainMessage(NFT_MSG_DELRULE, 0, index);
    chainMessage(NFT_MSG_DELCHAIN, 0, index);
  }
}

void NftRuleBatch::chainMessage(std::uint16_t type, std::uint16_t flags, std::uint32_t index) {
  const std::uint16_t family = isV6(family_) ? NFPROTO_IPV6 : NFPROTO_IPV4;
  std::array<char, kMessageRoom> room;
  nlmsghdr* nlh =
      nftnl_nlmsg_build_hdr(room.data(), type, family, flags, static_cast<std::uint32_t>(sent_.size() + 1));
  if (type == NFT_MSG_DELRULE) {  // a flush: the chain's every rule
    std::unique_ptr<nftnl_rule, RuleDeleter> flush(nftnl_rule_alloc());
    nftnl_rule_set_str(flush.get(), NFTNL_RULE_TABLE, table_.c_str());
    nftnl_rule_set_str(flush.get(), NFTNL_RULE_CHAIN, names_[index].c_str());
    nftnl_rule_nlmsg_build_payload(nlh, flush.get());
  } else {
    std::unique_ptr<nftnl_chain, ChainDeleter> chain(nftnl_chain_alloc());
    nftnl_chain_set_str(chain.get(), NFTNL_CHAIN_TABLE, table_.c_str());
    nftnl_chain_set_str(chain.get(), NFTNL_CHAIN_NAME, names_[index].c_str());
    nftnl_chain_nlmsg_build_payload(nlh, chain.get());
  }
  messages_.append({reinterpret_cast<const char*>(nlh), nlh->nlmsg_len});
  sent_.push_back(Sent{index, 0});
}

core::Result<void> NftRuleBatch::commit() {
  if (messages_.empty()) return {};
  auto socket = kernel::NetlinkSocket::open(NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  return commit(*socket);
}

core::Result<void> NftRuleBatch::commit(kernel::NetlinkSocket& socket) {
  if (messages_.empty()) return {};
  std::array<char, 256> begin{}, end{};
  nlmsghdr* b = nftnl_batch_begin(begin.data(), 0);
  nlmsghdr* e = nftnl_batch_end(end.data(), static_cast<std::uint32_t>(sent_.size() + 1));
  const std::span<const char> parts[] = {{begin.data(), b->nlmsg_len}, messages_.data(), {end.data(), e->nlmsg_len}};
  auto failures = socket.sendBatch(parts);
  messages_.clear();  // the capacity stays for the next transaction
  auto sent = std::move(sent_);
  auto names = std::move(names_);
  sent_.clear();
  names_.clear();
  const std::size_t rules = std::exchange(rules_, 0);
  chains_ = 0;
  if (!failures) return std::unexpected(failures.error());
  if (failures->empty()) return {};
  // The first refusal is the cause; the kernel applied nothing of the batch.
  const auto& f = failures->front();
  std::string what = "the batch";
  if (f.seq >= 1 && f.seq <= sent.size()) {
    const Sent& s = sent[f.seq - 1];
    what = s.rule == 0 ? fmt::format("chain {} (its creation, flush or deletion)", names[s.chain])
                       : fmt::format("rule {} of chain {}", s.rule, names[s.chain]);
  }
  return makeError(ErrorCategory::kKernel,
                   fmt::format("iptables-nft over netlink: the kernel refused {} ({} rules in one transaction, none "
                               "applied)",
                               what, rules),
                   f.errnum);
}

}  // namespace kproxy::iptables
