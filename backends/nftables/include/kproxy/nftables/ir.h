#pragma once
/// The intermediate representation of what kproxy programs into nftables: tables, chains,
/// sets/maps, elements and rules. A rule is a short list of structured statements; the same
/// list renders to nft syntax (dry-run, logs, error messages) and to libnftnl expressions
/// (nftnl_encode.h), so both views come from one source of truth.
///
/// Only the statement forms kproxy needs exist here; this is not a general nft model.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kproxy::nftables {

enum class Family : std::uint8_t { kIPv4, kIPv6 };

/// "ip" or "ip6": the nft family keyword and the payload protocol keyword.
std::string_view familyKeyword(Family family);
/// NFPROTO_IPV4 / NFPROTO_IPV6.
std::uint16_t nfproto(Family family);

/// The one table kproxy owns in each family.
inline constexpr std::string_view kTableName = "kube-proxy";

/// An address or a prefix of `family`.
struct Address {
  Family family = Family::kIPv4;
  std::array<std::uint8_t, 16> bytes{};
  std::uint8_t prefixLength = 32;  ///< 32 / 128 for a host address

  std::size_t size() const { return family == Family::kIPv4 ? 4 : 16; }
  bool isHost() const { return prefixLength == size() * 8; }
  std::string toString() const;  ///< "10.0.0.1", "10.0.0.0/8", "fd00::1"
  bool operator==(const Address&) const = default;

  /// Parses "10.0.0.1" or "10.0.0.0/8" (host bits are cleared). nullopt when malformed.
  static std::optional<Address> parse(std::string_view text);
  /// Whether `other` (a host address) lies inside this prefix.
  bool contains(const Address& other) const;
};

// ---- statements ------------------------------------------------------------------------

/// `ip saddr|daddr [!=] ADDR[/LEN]`
struct MatchAddress {
  bool source = false;
  bool negate = false;
  Address address;
  bool operator==(const MatchAddress&) const = default;
};
/// `meta l4proto tcp|udp|sctp`
struct MatchL4Proto {
  std::uint8_t proto = 6;
  bool operator==(const MatchL4Proto&) const = default;
};
/// `th dport N`
struct MatchDestPort {
  std::uint16_t port = 0;
  bool operator==(const MatchDestPort&) const = default;
};
/// `ct state new`
struct MatchCtStateNew {
  bool operator==(const MatchCtStateNew&) const = default;
};
/// `meta mark & BIT == 0`
struct MatchMarkClear {
  std::uint32_t bit = 0;
  bool operator==(const MatchMarkClear&) const = default;
};
/// `fib saddr type local`
struct MatchFibSourceLocal {
  bool operator==(const MatchFibSourceLocal&) const = default;
};
/// `numgen random mod K == 0`
struct MatchNumgen {
  std::uint32_t modulus = 1;
  bool operator==(const MatchNumgen&) const = default;
};
/// `ip daddr @SET`
struct MatchDestInSet {
  std::string set;
  bool operator==(const MatchDestInSet&) const = default;
};
/// `ip daddr . meta l4proto . th dport vmap @MAP` or, without the address,
/// `meta l4proto . th dport vmap @MAP`. A verdict statement.
struct VmapLookup {
  bool withAddress = true;
  std::string map;
  bool operator==(const VmapLookup&) const = default;
};
/// `meta mark set meta mark | BIT` (or `^ BIT` when `toggle`).
struct SetMark {
  std::uint32_t bit = 0;
  bool toggle = false;
  bool operator==(const SetMark&) const = default;
};
/// `masquerade fully-random`
struct Masquerade {
  bool operator==(const Masquerade&) const = default;
};
/// `dnat to ADDR:PORT` (a preceding MatchL4Proto gives nft the protocol context).
struct DnatTo {
  Address address;
  std::uint16_t port = 0;
  bool operator==(const DnatTo&) const = default;
};
/// `dnat to ip saddr . ip daddr . meta l4proto . th dport map @MAP`: session affinity hit.
struct DnatFromAffinity {
  std::string map;
  bool operator==(const DnatFromAffinity&) const = default;
};
/// `update @MAP { ip saddr . ip daddr . meta l4proto . th dport timeout Ns : ADDR . PORT }`
struct UpdateAffinity {
  std::string map;
  std::uint32_t timeoutSeconds = 10800;
  Address address;
  std::uint16_t port = 0;
  bool operator==(const UpdateAffinity&) const = default;
};
/// `reject` (ICMP port unreachable) or `reject with tcp reset`.
struct Reject {
  bool tcpReset = false;
  bool operator==(const Reject&) const = default;
};

enum class VerdictKind : std::uint8_t { kAccept, kDrop, kReturn, kJump, kGoto };
/// `accept`, `drop`, `return`, `jump CHAIN`, `goto CHAIN`.
struct Verdict {
  VerdictKind kind = VerdictKind::kAccept;
  std::string chain;
  std::string toString() const;
  bool operator==(const Verdict&) const = default;
};

using Statement =
    std::variant<MatchAddress, MatchL4Proto, MatchDestPort, MatchCtStateNew, MatchMarkClear,
                 MatchFibSourceLocal, MatchNumgen, MatchDestInSet, VmapLookup, SetMark, Masquerade,
                 DnatTo, DnatFromAffinity, UpdateAffinity, Reject, Verdict>;

struct Rule {
  std::vector<Statement> statements;
  /// nft syntax of the statements in `family`, e.g. "ct state new jump services".
  std::string toText(Family family) const;
  /// Chains this rule jumps or goes to.
  std::vector<std::string> targets() const;
  bool operator==(const Rule&) const = default;
};

/// The canonical identity of a rule in a chain: stored in the rule's userdata in the kernel
/// so that read-back can compare rules without decoding expressions.
std::uint64_t ruleHash(Family family, std::string_view chain, const Rule& rule);

// ---- chains, sets, elements ------------------------------------------------------------

struct BaseHook {
  std::string type;  ///< "filter" | "nat"
  std::string hook;  ///< "prerouting" | "input" | "forward" | "output" | "postrouting"
  std::int32_t priority = 0;
  bool operator==(const BaseHook&) const = default;
};

struct Chain {
  std::string name;
  std::optional<BaseHook> base;
  std::vector<Rule> rules;
};

/// Data types of set keys and map values, with nft's type ids.
enum class DataType : std::uint32_t {
  kVerdict = 1,
  kIPv4Addr = 7,
  kIPv6Addr = 8,
  kInetProto = 12,
  kInetService = 13,
};
std::string_view dataTypeName(DataType type);
/// Size of one field in a concatenation, padded to 32-bit registers.
std::uint32_t paddedSize(DataType type);

struct SetSpec {
  std::string name;
  std::vector<DataType> key;
  std::vector<DataType> data;  ///< empty: a set; {kVerdict}: a verdict map
  bool dynamic = false;        ///< `flags dynamic,timeout` (elements added by the data path)
  std::uint32_t timeoutSeconds = 0;
  std::uint32_t size = 0;
  bool isMap() const { return !data.empty(); }
  bool isVerdictMap() const { return data.size() == 1 && data[0] == DataType::kVerdict; }
  std::uint32_t keyLength() const;
  std::uint32_t dataLength() const;
  /// nft's numeric id of a (concatenated) type.
  static std::uint32_t typeId(const std::vector<DataType>& types);
  /// "add map ip kube-proxy NAME { type ... ; }" without the leading "add ".
  std::string declaration(Family family) const;
};

/// A set or map element. `key` holds the kernel's bytes (fields padded to 32 bits), which
/// makes comparison with read-back exact; `keyText` is its nft syntax.
struct Element {
  std::string set;
  std::string key;  ///< binary
  std::string keyText;
  std::optional<Verdict> value;  ///< verdict maps only
};

/// Builders of element keys in the kernel's layout.
struct KeyBuilder {
  std::string bytes;
  std::string text;
  KeyBuilder& address(const Address& a);
  KeyBuilder& proto(std::uint8_t p);
  KeyBuilder& port(std::uint16_t p);
};
/// Renders kernel key bytes as nft text using the set's key types.
std::string keyToText(const SetSpec& spec, std::string_view bytes, Family family);

std::string_view protoName(std::uint8_t proto);

}  // namespace kproxy::nftables
