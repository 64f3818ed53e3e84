#include "kproxy/nftables/ir.h"
#include "kproxy/net/host_port.h"

#include <arpa/inet.h>
#include <linux/netfilter.h>

#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace kproxy::nftables {

std::string_view familyKeyword(net::Family family) { return family == net::Family::kIPv4 ? "ip" : "ip6"; }
std::uint16_t nfproto(net::Family family) {
  return family == net::Family::kIPv4 ? NFPROTO_IPV4 : NFPROTO_IPV6;
}

std::string_view protoName(std::uint8_t proto) {
  switch (proto) {
    case 6: return "tcp";
    case 17: return "udp";
    case 132: return "sctp";
    default: return "unknown";
  }
}

// ---- rules -----------------------------------------------------------------------------

std::string Verdict::toString() const {
  switch (kind) {
    case VerdictKind::kAccept: return "accept";
    case VerdictKind::kDrop: return "drop";
    case VerdictKind::kReturn: return "return";
    case VerdictKind::kJump: return "jump " + chain;
    case VerdictKind::kGoto: return "goto " + chain;
  }
  return "accept";
}

namespace {

struct TextVisitor {
  net::Family family;
  std::string_view ip() const { return familyKeyword(family); }

  std::string operator()(const MatchAddress& s) const {
    return fmt::format("{} {} {}{}", ip(), s.source ? "saddr" : "daddr", s.negate ? "!= " : "",
                       s.address.toString());
  }
  std::string operator()(const MatchL4Proto& s) const {
    return fmt::format("meta l4proto {}", protoName(s.proto));
  }
  std::string operator()(const MatchDestPort& s) const { return fmt::format("th dport {}", s.port); }
  std::string operator()(const MatchCtStateNew&) const { return "ct state new"; }
  std::string operator()(const MatchCtStatusDnat&) const { return "ct status dnat"; }
  std::string operator()(const MatchMarkClear& s) const {
    return fmt::format("meta mark & {:#010x} == 0", s.bit);
  }
  std::string operator()(const MatchFibSourceLocal&) const { return "fib saddr type local"; }
  std::string operator()(const MatchFibDestLocal&) const { return "fib daddr type local"; }
  std::string operator()(const MatchInputInterface& s) const {
    return fmt::format("iifname {}\"{}{}\"", s.negate ? "!= " : "", s.name, s.prefix ? "*" : "");
  }
  std::string operator()(const MatchNumgen& s) const {
    return fmt::format("numgen random mod {} == 0", s.modulus);
  }
  std::string operator()(const MatchDestInSet& s) const {
    return fmt::format("{} daddr @{}", ip(), s.set);
  }
  std::string operator()(const VmapLookup& s) const {
    if (s.withAddress) return fmt::format("{} daddr . meta l4proto . th dport vmap @{}", ip(), s.map);
    return fmt::format("meta l4proto . th dport vmap @{}", s.map);
  }
  std::string operator()(const SetMark& s) const {
    return fmt::format("meta mark set meta mark {} {:#010x}", s.toggle ? "^" : "|", s.bit);
  }
  std::string operator()(const Masquerade&) const { return "masquerade fully-random"; }
  std::string operator()(const DnatTo& s) const {
    return "dnat to " + net::joinHostPort(s.address.addressText(), s.port);
  }
  std::string operator()(const DnatFromAffinity& s) const {
    return fmt::format("dnat to {} saddr . numgen random mod 1 offset {} map @{}", ip(), s.id, s.map);
  }
  std::string operator()(const DnatFromSlots& s) const {
    return fmt::format("dnat {} to numgen random mod {} offset {} map @{}", ip(), kSlotsPerRange,
                       s.base, s.map);
  }
  std::string operator()(const MatchHairpin& s) const {
    return fmt::format("ct status dnat {0} saddr . {0} daddr @{1}", ip(), s.set);
  }
  std::string operator()(const VmapLookupOriginal& s) const {
    if (s.nodePorts)
      return fmt::format(
          "meta l4proto {} ct original {} daddr @nodeport-ips meta l4proto . ct original proto-dst vmap @{}",
          protoName(s.proto), ip(), s.map);
    return fmt::format("meta l4proto {} ct original {} daddr . meta l4proto . ct original proto-dst vmap @{}",
                       protoName(s.proto), ip(), s.map);
  }
  std::string operator()(const RecordAffinity& s) const {
    return fmt::format(
        "meta l4proto {1} update @{2} {{ {0} saddr . numgen random mod 1 offset {3} timeout {4}s : "
        "{0} daddr . th dport }}",
        ip(), protoName(s.proto), s.map, s.id, s.timeoutSeconds);
  }
  std::string operator()(const RedirectTo& s) const { return fmt::format("redirect to :{}", s.port); }
  std::string operator()(const Reject& s) const {
    return s.tcpReset ? "reject with tcp reset" : "reject";
  }
  std::string operator()(const Verdict& s) const { return s.toString(); }
};

}  // namespace

std::string Rule::toText(net::Family family) const {
  std::string out;
  for (const auto& s : statements) {
    if (!out.empty()) out += ' ';
    out += std::visit(TextVisitor{family}, s);
  }
  return out;
}

std::vector<std::string> Rule::targets() const {
  std::vector<std::string> out;
  for (const auto& s : statements) {
    if (const auto* v = std::get_if<Verdict>(&s)) {
      if (v->kind == VerdictKind::kJump || v->kind == VerdictKind::kGoto) out.push_back(v->chain);
    }
  }
  return out;
}

std::uint64_t ruleHash(net::Family family, std::string_view chain, const Rule& rule) {
  // FNV-1a 64 over "family chain text": stable across processes and versions of kproxy that
  // render the same rule the same way, which is exactly the identity read-back needs.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  };
  mix(familyKeyword(family));
  mix(chain);
  mix(rule.toText(family));
  return h == 0 ? 1 : h;  // 0 means "no kproxy identity" on read-back
}

// ---- sets ------------------------------------------------------------------------------

std::string_view dataTypeName(DataType type) {
  switch (type) {
    case DataType::kVerdict: return "verdict";
    case DataType::kIPv4Addr: return "ipv4_addr";
    case DataType::kIPv6Addr: return "ipv6_addr";
    case DataType::kInetProto: return "inet_proto";
    case DataType::kInetService: return "inet_service";
    case DataType::kSlot:
    case DataType::kPoolId: return "integer";
  }
  return "verdict";
}

std::uint32_t nftTypeId(DataType type) { return static_cast<std::uint32_t>(type) & 0xff; }

std::uint32_t paddedSize(DataType type) {
  switch (type) {
    case DataType::kVerdict: return 0;
    case DataType::kIPv4Addr: return 4;
    case DataType::kIPv6Addr: return 16;
    case DataType::kInetProto: return 4;
    case DataType::kInetService: return 4;
    case DataType::kSlot:
    case DataType::kPoolId: return 4;
  }
  return 0;
}

std::uint32_t SetSpec::keyLength() const {
  std::uint32_t n = 0;
  for (auto t : key) n += paddedSize(t);
  return n;
}
std::uint32_t SetSpec::dataLength() const {
  std::uint32_t n = 0;
  for (auto t : data) n += paddedSize(t);
  return n;
}

std::uint32_t SetSpec::typeId(const std::vector<DataType>& types) {
  // nft packs a concatenation's type as 6-bit fields (TYPE_BITS), first type highest.
  std::uint32_t id = 0;
  for (auto t : types) id = (id << 6) | nftTypeId(t);
  return id;
}

std::string SetSpec::declaration(net::Family family, std::string_view table) const {
  auto join = [](const std::vector<DataType>& types) {
    std::string s;
    for (auto t : types) {
      if (!s.empty()) s += " . ";
      s += dataTypeName(t);
    }
    return s;
  };
  std::string out;
  if (key.size() == 1 && key[0] == DataType::kSlot) {
    // Only nft's typeof can declare a key that numgen is looked up in.
    out = fmt::format("map {0} {1} {2} {{ typeof numgen random mod {3} : {0} daddr . th dport ;",
                      familyKeyword(family), table, name, kSlotsPerRange);
  } else if (key.size() == 2 && key[1] == DataType::kPoolId) {
    out = fmt::format("map {0} {1} {2} {{ typeof {0} saddr . numgen random mod 1 : {0} daddr . th dport ;",
                      familyKeyword(family), table, name);
  } else {
    out = fmt::format("{} {} {} {} {{ type {}", isMap() ? "map" : "set", familyKeyword(family),
                      table, name, join(key));
    if (isMap()) out += " : " + join(data);
    out += " ;";
  }
  if (dynamic) out += " flags dynamic,timeout ;";
  if (interval) out += " flags interval ;";
  if (timeoutSeconds != 0) out += fmt::format(" timeout {}s ;", timeoutSeconds);
  if (size != 0) out += fmt::format(" size {} ;", size);
  out += " }";
  return out;
}

std::string Element::valueText() const {
  if (value) return value->toString();
  if (intervalEnd) return "end";
  if (!data.empty()) {
    std::string out(1, '=');
    out += data;
    return out;
  }
  return {};
}

std::string intervalIdentity(bool end, std::uint32_t intervals) {
  std::string out(1, end ? '\x01' : '\x02');
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((intervals >> shift) & 0xff));
  return out;
}

KeyBuilder& KeyBuilder::slot(std::uint32_t s) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>((s >> shift) & 0xff));
  if (!text.empty()) text += " . ";
  text += std::to_string(s);
  return *this;
}

KeyBuilder& KeyBuilder::poolId(std::uint32_t id) {
  bytes.append(reinterpret_cast<const char*>(&id), sizeof id);
  if (!text.empty()) text += " . ";
  text += std::to_string(id);
  return *this;
}

KeyBuilder& KeyBuilder::address(const net::Prefix& a) {
  bytes.append(reinterpret_cast<const char*>(a.bytes.data()), a.size());
  if (!text.empty()) text += " . ";
  text += a.toString();
  return *this;
}
KeyBuilder& KeyBuilder::proto(std::uint8_t p) {
  bytes.push_back(static_cast<char>(p));
  bytes.append(3, '\0');
  if (!text.empty()) text += " . ";
  text += protoName(p);
  return *this;
}
KeyBuilder& KeyBuilder::port(std::uint16_t p) {
  bytes.push_back(static_cast<char>(p >> 8));
  bytes.push_back(static_cast<char>(p & 0xff));
  bytes.append(2, '\0');
  if (!text.empty()) text += " . ";
  text += std::to_string(p);
  return *this;
}

std::string keyToText(const SetSpec& spec, std::string_view bytes, net::Family family) {
  KeyBuilder b;
  std::size_t off = 0;
  for (auto t : spec.key) {
    std::size_t n = paddedSize(t);
    if (off + n > bytes.size()) break;
    const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data() + off);
    switch (t) {
      case DataType::kIPv4Addr:
      case DataType::kIPv6Addr: {
        net::Prefix a;
        a.family = t == DataType::kIPv4Addr ? net::Family::kIPv4 : net::Family::kIPv6;
        std::memcpy(a.bytes.data(), p, a.size());
        a.length = static_cast<std::uint8_t>(a.size() * 8);
        b.address(a);
        break;
      }
      case DataType::kInetProto: b.proto(p[0]); break;
      case DataType::kInetService: b.port(static_cast<std::uint16_t>((p[0] << 8) | p[1])); break;
      case DataType::kSlot:
        b.slot(static_cast<std::uint32_t>(p[0]) << 24 | static_cast<std::uint32_t>(p[1]) << 16 |
               static_cast<std::uint32_t>(p[2]) << 8 | p[3]);
        break;
      case DataType::kPoolId: {
        std::uint32_t id = 0;
        std::memcpy(&id, p, sizeof id);
        b.poolId(id);
        break;
      }
      case DataType::kVerdict: break;
    }
    off += n;
  }
  (void)family;
  return b.text;
}

}  // namespace kproxy::nftables
