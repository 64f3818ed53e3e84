#pragma once
// Private: IR → libnftnl objects. The kernel-side twin of Rule::toText.

#include <cstdint>
#include <string_view>

#include "kproxy/nftables/ir.h"

struct nftnl_rule;
struct nftnl_set;
struct nftnl_chain;

namespace kproxy::nftables {

/// The rule userdata TLV type that carries kproxy's rule hash (8 bytes). nft ignores unknown
/// rule userdata types, so `nft list` still works.
inline constexpr std::uint8_t kRuleHashUdataType = 0xa0;

/// A new nftnl_rule for `rule` in `chain` of `table`, carrying `hash` in its userdata. Caller
/// frees.
nftnl_rule* encodeRule(net::Family family, std::string_view table, std::string_view chain, const Rule& rule,
                       std::uint64_t hash);
/// A new nftnl_set for `spec` in `table`. Caller frees.
nftnl_set* encodeSet(net::Family family, std::string_view table, const SetSpec& spec);
/// A new nftnl_chain of `table` (base chains carry their hook). Caller frees.
nftnl_chain* encodeChain(net::Family family, std::string_view table, std::string_view name, const BaseHook* base);

/// The kernel's verdict code (NF_ACCEPT, NF_DROP, NFT_RETURN, NFT_JUMP, NFT_GOTO).
std::uint32_t verdictCode(VerdictKind kind);

/// The kproxy hash in a rule's userdata, 0 when absent (a rule someone else added).
std::uint64_t decodeRuleHash(const void* data, std::uint32_t length);

}  // namespace kproxy::nftables
