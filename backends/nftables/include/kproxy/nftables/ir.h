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

#include "kproxy/net/ip.h"
#include "kproxy/plan/trace.h"

namespace kproxy::nftables {

/// "ip" or "ip6": the nft family keyword and the payload protocol keyword.
std::string_view familyKeyword(net::Family family);
/// NFPROTO_IPV4 / NFPROTO_IPV6.
std::uint16_t nfproto(net::Family family);

/// Slots per balanced service range: a range is 65,536 keys wide and its slots are
/// [base, base + 65535), so the key base + 65535 ends the range's last interval without
/// colliding with the next range's first start.
inline constexpr std::uint32_t kSlotsPerRange = 65535;

/// The one table kproxy owns in each family.
inline constexpr std::string_view kTableName = "kube-proxy";

// ---- statements ------------------------------------------------------------------------

/// `ip saddr|daddr [!=] ADDR[/LEN]`
struct MatchAddress {
  bool source = false;
  bool negate = false;
  net::Prefix address;
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
/// `ct status dnat`
struct MatchCtStatusDnat {
  bool operator==(const MatchCtStatusDnat&) const = default;
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
/// `fib daddr type local`: the destination is one of the node's own addresses (NodePorts with
/// --nodeport-addresses matching every local address, as upstream).
struct MatchFibDestLocal {
  bool operator==(const MatchFibDestLocal&) const = default;
};
/// `iifname [!=] "NAME"`, or with `prefix`, `iifname [!=] "NAME*"`: the packet came in on
/// the interface (or one whose name starts with NAME); --detect-local-mode BridgeInterface and
/// InterfaceNamePrefix.
struct MatchInputInterface {
  std::string name;
  bool prefix = false;
  bool negate = false;
  bool operator==(const MatchInputInterface&) const = default;
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
  net::Prefix address;
  std::uint16_t port = 0;
  bool operator==(const DnatTo&) const = default;
};
/// `dnat to ip saddr . numgen random mod 1 offset ID map @MAP`: session affinity hit. The
/// key is the client and the ID of the endpoint pool the rule's chain balances (see
/// RecordAffinity), not the address the client used, so every address of a service port shares
/// the client's endpoint. nft cannot parse a constant inside a looked-up concatenation, so the
/// ID is written, and encoded, as `numgen random mod 1 offset ID`, which always yields ID.
struct DnatFromAffinity {
  std::string map;
  std::uint32_t id = 0;
  bool operator==(const DnatFromAffinity&) const = default;
};
/// `dnat to numgen random mod 65535 offset BASE map @MAP`: the endpoint is looked up by slot in
/// an interval map that holds every balanced service's slot range, so changing a service's
/// endpoints changes map elements only, never a rule (see renderer.h).
struct DnatFromSlots {
  std::string map;
  std::uint32_t base = 0;
  bool operator==(const DnatFromSlots&) const = default;
};
/// `ct status dnat ip saddr . ip daddr @SET`: a DNAT'ed packet sent back to its own source.
struct MatchHairpin {
  std::string set;
  bool operator==(const MatchHairpin&) const = default;
};
/// `meta l4proto P ct original ip daddr . meta l4proto . ct original proto-dst vmap @MAP`, or
/// with `nodePorts`, `meta l4proto P ct original ip daddr @nodeport-ips
/// meta l4proto . ct original proto-dst vmap @MAP`:
/// dispatch of a connection after DNAT by the service address it was sent to.
struct VmapLookupOriginal {
  std::uint8_t proto = 6;
  bool nodePorts = false;
  std::string map;
  bool operator==(const VmapLookupOriginal&) const = default;
};
/// `meta l4proto P update @MAP { ip saddr . numgen random mod 1 offset ID timeout Ns :
/// ip daddr . th dport }`: after DNAT, records the endpoint a client was DNAT'ed to under the
/// ID of the pool that chose it, or, when the client already has an entry (an affinity hit),
/// restarts the entry's timeout and keeps its endpoint.
struct RecordAffinity {
  std::uint8_t proto = 6;
  std::string map;
  std::uint32_t timeoutSeconds = 10800;
  std::uint32_t id = 0;
  bool operator==(const RecordAffinity&) const = default;
};
/// `redirect to :PORT`: DNAT to the node itself at PORT (the primary address of the input
/// interface in prerouting, loopback in output); the userspace proxy's listeners. A preceding
/// MatchL4Proto gives nft the protocol context.
struct RedirectTo {
  std::uint16_t port = 0;
  bool operator==(const RedirectTo&) const = default;
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
    std::variant<MatchAddress, MatchL4Proto, MatchDestPort, MatchCtStateNew, MatchCtStatusDnat, MatchMarkClear,
                 MatchFibSourceLocal, MatchFibDestLocal, MatchInputInterface, MatchNumgen, MatchDestInSet, VmapLookup, SetMark, Masquerade,
                 DnatTo, DnatFromAffinity, DnatFromSlots, MatchHairpin, VmapLookupOriginal,
                 RecordAffinity, RedirectTo, Reject, Verdict>;

struct Rule {
  std::vector<Statement> statements;
  /// Why the rule drops or rejects (its own verdict, or the verdict a map it looks up gives),
  /// as the renderer tags it for the tracer. On a rule that jumps or goes to a chain (itself or
  /// through a map), it is the reason of any drop or reject reached through it, over the tags
  /// of the rules there: a chain shared by several causes is told apart by its callers. Never sent to the kernel, so a rule read back has
  /// none, and it is no part of the rule's identity: equality compares the statements only.
  plan::DropReason reason = plan::DropReason::kNone;
  /// nft syntax of the statements in `family`, e.g. "ct state new jump services".
  std::string toText(net::Family family) const;
  /// Chains this rule jumps or goes to.
  std::vector<std::string> targets() const;
  bool operator==(const Rule& other) const { return statements == other.statements; }
};

/// The canonical identity of a rule in a chain: stored in the rule's userdata in the kernel
/// so that read-back can compare rules without decoding expressions.
std::uint64_t ruleHash(net::Family family, std::string_view chain, const Rule& rule);

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
  /// A 32-bit number: the slot of `numgen` (typeof numgen in nft), big-endian in the slot
  /// maps' keys (the interval lookup byte-swaps it).
  kSlot = 4,
  /// A 32-bit number in host byte order, as `numgen` leaves it: the pool ID of an affinity key.
  /// nft's type is `integer` (4) as for kSlot; the high bits only keep the enumerators apart.
  kPoolId = 0x100 | 4,
};
std::string_view dataTypeName(DataType type);
/// nft's numeric id of a type.
std::uint32_t nftTypeId(DataType type);
/// Size of one field in a concatenation, padded to 32-bit registers.
std::uint32_t paddedSize(DataType type);

struct SetSpec {
  std::string name;
  std::vector<DataType> key;
  std::vector<DataType> data;  ///< empty: a set; {kVerdict}: a verdict map
  bool dynamic = false;        ///< `flags dynamic,timeout` (elements added by the data path)
  std::uint32_t timeoutSeconds = 0;
  std::uint32_t size = 0;
  bool interval = false;       ///< `flags interval`
  bool isMap() const { return !data.empty(); }
  bool isVerdictMap() const { return data.size() == 1 && data[0] == DataType::kVerdict; }
  std::uint32_t keyLength() const;
  std::uint32_t dataLength() const;
  /// nft's numeric id of a (concatenated) type.
  static std::uint32_t typeId(const std::vector<DataType>& types);
  /// "add map ip kube-proxy NAME { type ... ; }" without the leading "add " (in `table`).
  std::string declaration(net::Family family, std::string_view table = kTableName) const;
};

/// A set or map element. `key` holds the kernel's bytes (fields padded to 32 bits), which
/// makes comparison with read-back exact; `keyText` is its nft syntax.
///
///
/// Interval sets hold each interval as two elements, as the kernel does: the start (with the
/// data) and the end (the first key after it, flagged). The kernel refuses an interval edit
/// that would pass through overlapping intervals, so a balancing chain's layout is replaced
/// as a whole when its number of endpoints changes: an interval element's `key` carries a
/// suffix after the kernel's bytes (intervalIdentity: start/end marker and the layout's number
/// of intervals), which keeps the end of one interval and the start of the next distinct and
/// makes every element of an old layout differ from every element of a new one.
struct Element {
  std::string set;
  std::string key;  ///< binary (+ identitySuffix bytes)
  std::string keyText;
  std::optional<Verdict> value;  ///< verdict maps only
  std::string data{};            ///< data maps: the value's kernel bytes
  std::string dataText{};
  bool intervalEnd = false;
  std::uint8_t identitySuffix = 0;
  /// A verdict map element that drops or rejects: why, as the renderer tags it for the tracer
  /// (as Rule::reason, and over the lookup rule's tag). Never sent to the kernel and no part of
  /// the element's identity or value.
  plan::DropReason reason = plan::DropReason::kNone;

  /// The kernel's key bytes (without the identity suffix).
  std::string_view kernelKey() const {
    return std::string_view(key).substr(0, key.size() - identitySuffix);
  }
  /// What the mirror records as the element's value: the verdict text, "=" + data bytes, or
  /// "end" for an interval end; empty for a plain set element.
  std::string valueText() const;
  /// This element as a deletion: identity (set, key, end flag) and text only.
  Element identity() const {
    return Element{set, key, keyText, std::nullopt, {}, {}, intervalEnd, identitySuffix};
  }
};
/// The identity suffix of an element of an interval layout with `intervals` intervals.
std::string intervalIdentity(bool end, std::uint32_t intervals);
inline constexpr std::uint8_t kIntervalIdentitySize = 5;

/// Builders of element keys in the kernel's layout.
struct KeyBuilder {
  std::string bytes;
  std::string text;
  KeyBuilder& address(const net::Prefix& a);
  KeyBuilder& proto(std::uint8_t p);
  KeyBuilder& port(std::uint16_t p);
  KeyBuilder& slot(std::uint32_t s);  ///< big-endian, as the byteorder expression leaves it
  KeyBuilder& poolId(std::uint32_t id);  ///< host byte order, as numgen leaves it
};
/// Renders kernel key bytes as nft text using the set's key types.
std::string keyToText(const SetSpec& spec, std::string_view bytes, net::Family family);

std::string_view protoName(std::uint8_t proto);

}  // namespace kproxy::nftables
