#include "kproxy/iptables/tracer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "rule_words.h"

namespace kproxy::iptables {

using net::Prefix;

// ---- the parsed ruleset ------------------------------------------------------------------

namespace {

enum class MatchKind : std::uint8_t {
  kAlways,       // -m comment, -m nfacct, recent --set: match every packet
  kSource,       // -s
  kDestination,  // -d
  kInInterface,  // -i (a trailing '+' is a prefix)
  kProtocol,     // -p
  kDestPort,     // --dport / --dports
  kSrcTypeLocal,  // -m addrtype --src-type LOCAL
  kDstTypeLocal,  // -m addrtype --dst-type LOCAL
  kCtState,      // -m conntrack --ctstate / -m state --state
  kMark,         // -m mark --mark v/m
  kRandom,       // -m statistic --mode random --probability p
  kRecentHit,    // -m recent --rcheck / --update / --remove: the list holds nothing yet
  kSet,          // -m set --match-set NAME FLAGS: text is the set, states the flags
  kIpvsProto,    // -m ipvs --vproto N: the virtual service the scheduler named
  kIpvsAddress,  // -m ipvs --vaddr A
  kIpvsPort,     // -m ipvs --vport P
  kPhysdevIsIn,  // -m physdev --physdev-is-in: the packet came in on a bridge port (never here)
  kConnmark,     // -m connmark --mark v/m
  kUnknown,      // what the tracer cannot evaluate
};

struct Match {
  MatchKind kind = MatchKind::kAlways;
  bool negate = false;
  net::Prefix prefix;
  std::string text;  // interface, or what is unknown
  bool interfacePrefix = false;
  std::uint8_t protocol = 0;
  std::vector<std::pair<std::uint16_t, std::uint16_t>> ports;  // inclusive ranges
  std::uint32_t value = 0;
  std::uint32_t mask = 0xffffffff;
  double probability = 0;
  std::vector<std::string> states;
};

enum class TargetKind : std::uint8_t {
  kNone,  // no -j: the rule only counts, evaluation goes on
  kJump,
  kGoto,
  kReturn,
  kAccept,
  kDrop,
  kReject,
  kMark,
  kDnat,
  kSourceNat,  // MASQUERADE, SNAT
  kConnmark,   // CONNMARK --set-xmark v/m
  kNoop,       // LOG and other targets that change nothing the trace follows
  kUnknown,
};

struct Target {
  TargetKind kind = TargetKind::kNone;
  std::string name;  // chain, or the target's name
  std::uint32_t value = 0;
  std::uint32_t mask = 0;
  std::optional<net::Prefix> address;
  std::optional<std::uint16_t> port;
  std::string problem;  // kUnknown: why
};

struct Rule {
  std::string spec;
  std::vector<Match> matches;  // IP header matches first, then the modules in order
  Target target;
  plan::DropReason reason = plan::DropReason::kNone;  // the renderer's tag (tagRules)
};

struct Chain {
  std::string name;
  std::string policy;  // "-" for a user-defined chain
  std::vector<Rule> rules;
};

std::optional<std::uint8_t> protocolNumber(std::string_view name) {
  if (name == "tcp") return 6;
  if (name == "udp") return 17;
  if (name == "sctp") return 132;
  if (name == "icmp") return 1;
  if (name == "icmpv6" || name == "ipv6-icmp") return 58;
  unsigned v = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec == std::errc() && p == name.data() + name.size() && v < 256) return static_cast<std::uint8_t>(v);
  return std::nullopt;
}

std::string_view protocolName(std::uint8_t p) {
  switch (p) {
    case 6: return "tcp";
    case 17: return "udp";
    case 132: return "sctp";
    default: return "ip";
  }
}

std::vector<std::string> splitList(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    out.emplace_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

/// "80", "80:90".
std::optional<std::pair<std::uint16_t, std::uint16_t>> parsePortRange(std::string_view text) {
  auto colon = text.find(':');
  auto lo = parseRuleNumber(text.substr(0, colon));
  auto hi = colon == std::string_view::npos ? lo : parseRuleNumber(text.substr(colon + 1));
  if (!lo || !hi || *lo > 65535 || *hi > 65535) return std::nullopt;
  return std::pair{static_cast<std::uint16_t>(*lo), static_cast<std::uint16_t>(*hi)};
}

/// "10.0.0.1:80", "10.0.0.1", "[fd00::1]:80", "fd00::1", ":80" (the port only).
bool parseNatDestination(std::string_view text, Target& t) {
  std::string_view addr = text;
  std::string_view port;
  if (text.starts_with(':')) {
    auto range = parsePortRange(text.substr(1));
    if (!range || range->first != range->second) return false;
    t.port = range->first;
    return true;
  }
  if (text.starts_with('[')) {
    auto close = text.find(']');
    if (close == std::string_view::npos) return false;
    addr = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return false;
      port = text.substr(close + 2);
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    auto colon = text.find(':');
    addr = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto a = net::Prefix::parse(addr);
  if (!a || !a->isHost()) return false;
  t.address = *a;
  if (!port.empty()) {
    auto range = parsePortRange(port);
    if (!range || range->first != range->second) return false;  // a port range: not modelled
    t.port = range->first;
  }
  return true;
}

/// The word after `key` among a target's options.
std::optional<std::string_view> optionValue(const std::vector<std::string_view>& options, std::string_view key) {
  for (std::size_t k = 0; k + 1 < options.size(); ++k)
    if (options[k] == key) return options[k + 1];
  return std::nullopt;
}

/// The value and mask a MARK target sets (mark = (mark & ~mask) ^ value), from whichever of
/// its options it has.
void parseMarkTarget(const std::vector<std::string_view>& options, Target& t) {
  t.kind = TargetKind::kMark;
  std::optional<std::pair<std::uint32_t, std::uint32_t>> vm;
  if (auto x = optionValue(options, "--set-xmark")) {
    vm = parseValueMask(*x);
  } else if (auto s = optionValue(options, "--set-mark")) {  // value/mask: mark = (mark & ~mask) | value
    vm = parseValueMask(*s);
    if (vm) vm = std::pair{vm->first, vm->second | vm->first};
  } else if (auto o = optionValue(options, "--or-mark")) {
    auto v = parseRuleNumber(*o);
    if (v) vm = std::pair{*v, *v};
  } else if (auto x2 = optionValue(options, "--xor-mark")) {
    auto v = parseRuleNumber(*x2);
    if (v) vm = std::pair{*v, 0u};
  } else if (auto a = optionValue(options, "--and-mark")) {
    auto v = parseRuleNumber(*a);
    if (v) vm = std::pair{0u, ~*v};
  }
  if (vm) {
    t.value = vm->first;
    t.mask = vm->second;
  } else {
    t.kind = TargetKind::kUnknown;
    t.problem = "MARK without a mark the tracer understands";
  }
}

/// A rule's target from "-j NAME" and the words after it. What the tracer cannot follow is a
/// kUnknown target that says why.
Target parseTarget(std::string_view name, const std::vector<std::string_view>& options) {
  Target t;
  t.name = std::string(name);
  auto option = [&](std::string_view key) { return optionValue(options, key); };
  if (name == "ACCEPT") {
    t.kind = TargetKind::kAccept;
  } else if (name == "DROP") {
    t.kind = TargetKind::kDrop;
  } else if (name == "RETURN") {
    t.kind = TargetKind::kReturn;
  } else if (name == "REJECT") {
    t.kind = TargetKind::kReject;
  } else if (name == "MASQUERADE" || name == "SNAT") {
    t.kind = TargetKind::kSourceNat;
  } else if (name == "CONNMARK") {
    auto vm = option("--set-xmark") ? parseValueMask(*option("--set-xmark")) : std::nullopt;
    t.kind = vm ? TargetKind::kConnmark : TargetKind::kUnknown;
    if (vm) t.value = vm->first, t.mask = vm->second;
    else t.problem = "CONNMARK other than --set-xmark";
  } else if (name == "LOG" || name == "NFLOG" || name == "TRACE") {
    t.kind = TargetKind::kNoop;
  } else if (name == "DNAT") {
    auto to = option("--to-destination");
    t.kind = to && parseNatDestination(*to, t) ? TargetKind::kDnat : TargetKind::kUnknown;
    if (t.kind == TargetKind::kUnknown) t.problem = "DNAT without a single --to-destination address[:port]";
  } else if (name == "MARK") {
    parseMarkTarget(options, t);
  } else {
    // Not a built-in target: a user-defined chain (resolved when the rule runs).
    t.kind = TargetKind::kJump;
  }
  return t;
}

/// Parses one rule's words. What it cannot evaluate becomes a kUnknown match or target.
class TracedRuleParser {
 public:
  explicit TracedRuleParser(std::string spec) : words_(spec) { rule_.spec = std::move(spec); }

  Rule parse() && {
    for (; !words_.atEnd(); words_.step()) {
      const std::string& w = words_.word();
      if (w == "!") {
        negate_ = true;
        continue;
      }
      if (!headerOption(w) && !matchOption(w) && !moduleOption(w)) {
        unknown(fmt::format("{}{}", negate_ ? "! " : "", w));
        words_.skipArguments();
      }
      negate_ = false;
    }
    rule_.matches = std::move(header_);
    rule_.matches.insert(rule_.matches.end(), std::make_move_iterator(modules_.begin()),
                         std::make_move_iterator(modules_.end()));
    return std::move(rule_);
  }

 private:
  /// The next word, consumed ("" at the end).
  std::string next() { return std::string(words_.value().value_or("")); }
  void unknown(std::string what) {
    Match m;
    m.kind = MatchKind::kUnknown;
    m.text = std::move(what);
    modules_.push_back(std::move(m));
  }
  void add(std::vector<Match>& to, Match m) const {
    m.negate = negate_;
    to.push_back(std::move(m));
  }
  void addModule(MatchKind kind) {
    Match m;
    m.kind = kind;
    add(modules_, std::move(m));
  }

  /// The IP header's options, -m, and the target (-j, -g).
  bool headerOption(const std::string& w) {
    if (w == "-s" || w == "--source" || w == "-d" || w == "--destination") {
      auto v = words_.value();
      auto p = v ? net::Prefix::parse(*v) : std::nullopt;
      if (!p) {
        unknown(fmt::format("{} {}", w, v.value_or("")));
      } else {
        Match m;
        m.kind = w == "-s" || w == "--source" ? MatchKind::kSource : MatchKind::kDestination;
        m.prefix = *p;
        add(header_, std::move(m));
      }
    } else if (w == "-i" || w == "--in-interface") {
      Match m;
      m.kind = MatchKind::kInInterface;
      m.text = next();
      if (m.text.ends_with('+')) {
        m.text.pop_back();
        m.interfacePrefix = true;
      }
      add(header_, std::move(m));
    } else if (w == "-o" || w == "--out-interface") {
      unknown(fmt::format("{}{} {} (the output interface is not modelled)", negate_ ? "! " : "", w, next()));
    } else if (w == "-p" || w == "--protocol") {
      protocol(next());
    } else if (w == "-m" || w == "--match") {
      module_ = next();
      static const std::set<std::string, std::less<>> kModules{
          "tcp", "udp", "sctp", "comment", "addrtype", "conntrack", "state", "mark", "statistic", "recent",
          "multiport", "nfacct", "set", "ipvs", "physdev", "connmark"};
      if (!kModules.contains(module_)) unknown("-m " + module_);
    } else if (w == "-j" || w == "--jump") {
      const std::string name = next();
      rule_.target = parseTarget(name, words_.remaining());
    } else if (w == "-g" || w == "--goto") {
      rule_.target.kind = TargetKind::kGoto;
      rule_.target.name = next();
    } else {
      return false;
    }
    return true;
  }

  void protocol(const std::string& v) {
    if (v == "all") {
      if (negate_) unknown("! -p all");
    } else if (auto p = protocolNumber(v)) {
      Match m;
      m.kind = MatchKind::kProtocol;
      m.protocol = *p;
      add(header_, std::move(m));
    } else {
      unknown("-p " + v);
    }
  }

  /// Options that match on the packet or its connection: ports, address types, states, sets,
  /// `-m ipvs`, bridge ports.
  bool matchOption(const std::string& w) {
    if (w == "--dport" || w == "--destination-port" || w == "--dports" || w == "--destination-ports") {
      Match m;
      m.kind = MatchKind::kDestPort;
      const std::string v = next();
      bool ok = !v.empty();
      for (const auto& item : splitList(v)) {
        auto r = parsePortRange(item);
        if (!r) ok = false;
        else m.ports.push_back(*r);
      }
      if (!ok) unknown(w + " " + v);
      else add(modules_, std::move(m));
    } else if (w == "--src-type" || w == "--dst-type") {
      const std::string v = next();
      if (v != "LOCAL") unknown(fmt::format("{}{} {} (only LOCAL is modelled)", negate_ ? "! " : "", w, v));
      else addModule(w == "--src-type" ? MatchKind::kSrcTypeLocal : MatchKind::kDstTypeLocal);
    } else if (w == "--ctstate" || w == "--state") {
      Match m;
      m.kind = MatchKind::kCtState;
      m.states = splitList(next());
      add(modules_, std::move(m));
    } else if (w == "--match-set") {
      Match m;
      m.kind = MatchKind::kSet;
      m.text = next();
      m.states = splitList(next());
      add(modules_, std::move(m));
    } else if (w == "--vproto" || w == "--vaddr" || w == "--vport") {
      ipvsMatch(w, next());
    } else if (w == "--physdev-is-in") {
      addModule(MatchKind::kPhysdevIsIn);
    } else {
      return false;
    }
    return true;
  }

  void ipvsMatch(const std::string& w, const std::string& v) {
    Match m;
    m.kind = w == "--vproto" ? MatchKind::kIpvsProto : w == "--vaddr" ? MatchKind::kIpvsAddress : MatchKind::kIpvsPort;
    auto proto = protocolNumber(v);
    auto prefix = net::Prefix::parse(v);
    auto port = parsePortRange(v);
    if (m.kind == MatchKind::kIpvsProto && proto) m.protocol = *proto;
    else if (m.kind == MatchKind::kIpvsAddress && prefix) m.prefix = *prefix;
    else if (m.kind == MatchKind::kIpvsPort && port) m.ports.push_back(*port);
    else m.kind = MatchKind::kUnknown, m.text = w + " " + v;
    add(modules_, std::move(m));
  }

  /// The options of -m comment, nfacct, recent, mark, connmark and statistic.
  bool moduleOption(const std::string& w) {
    if (w == "--comment" || w == "--nfacct-name" || w == "--name" || w == "--seconds" || w == "--hitcount" ||
        w == "--mask") {
      (void)next();  // no effect on one new connection
    } else if (w == "--reap" || w == "--rsource" || w == "--rdest" || w == "--rttl") {
      // flags of -m recent
    } else if (w == "--mark" && (module_ == "connmark" || module_ == "mark")) {
      const std::string v = next();
      if (auto vm = parseValueMask(v)) {
        Match m;
        m.kind = module_ == "connmark" ? MatchKind::kConnmark : MatchKind::kMark;
        m.value = vm->first;
        m.mask = vm->second;
        add(modules_, std::move(m));
      } else {
        unknown("--mark " + v);
      }
    } else if (w == "--mode") {
      const std::string v = next();
      if (v != "random") {
        unknown("-m statistic --mode " + v);
      } else {
        Match m;
        m.kind = MatchKind::kRandom;
        m.probability = 0.5;  // xt_statistic's default
        add(modules_, std::move(m));
      }
    } else if (w == "--probability") {
      probability(next());
    } else if (w == "--rcheck" || w == "--update" || w == "--remove") {
      addModule(MatchKind::kRecentHit);
    } else if (w == "--set") {
      if (negate_) unknown("! --set");  // a recent --set always matches; negated it never does
      else add(modules_, Match{});
    } else if (w == "--syn") {
      if (negate_) unknown("! --syn");  // the first TCP packet is a SYN
    } else {
      return false;
    }
    return true;
  }

  void probability(const std::string& v) {
    char* end = nullptr;
    const double p = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || modules_.empty() || modules_.back().kind != MatchKind::kRandom) {
      unknown("--probability " + v);
      return;
    }
    modules_.back().probability = p;
    if (negate_) modules_.back().negate = true;
  }

  RuleWords words_;
  Rule rule_;
  std::vector<Match> header_, modules_;
  std::string module_;
  bool negate_ = false;
};

Rule parseRule(std::string spec) { return TracedRuleParser(std::move(spec)).parse(); }

std::string describe(const Match& m) {
  return m.kind == MatchKind::kUnknown ? m.text : std::string("a match");
}

}  // namespace

struct IptablesTracer::Ruleset {
  /// table name → chain name → chain
  std::unordered_map<std::string, std::unordered_map<std::string, Chain>> tables;

  const Chain* find(const std::string& table, const std::string& chain) const {
    auto t = tables.find(table);
    if (t == tables.end()) return nullptr;
    auto c = t->second.find(chain);
    return c == t->second.end() ? nullptr : &c->second;
  }
};

// ---- the interpreter -------------------------------------------------------------------------

namespace {

constexpr int kMaxJumpDepth = 64;
constexpr std::size_t kMaxPaths = 4096;

/// How evaluation of a chain (or rule) ended.
enum class Flow : std::uint8_t {
  kNext,    // the rule did not match, or matched without a terminal target: go on
  kReturn,  // RETURN, end of chain, or a goto came back: back to the caller
  kAccept,  // this table's chain of the hook is done
  kNat,     // DNAT / MASQUERADE / SNAT: terminal like ACCEPT, the translation is recorded
  kDrop,
  kReject,
};
bool terminal(Flow f) { return f == Flow::kAccept || f == Flow::kNat || f == Flow::kDrop || f == Flow::kReject; }

bool isLoopback(const net::Prefix& a) {
  if (!a.v6()) return a.bytes[0] == 127;
  static constexpr std::array<std::uint8_t, 16> kLoopback6{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return a.bytes == kLoopback6;
}

/// One run of the packet through every hook with one combination of random choices.
class PacketRun {
 public:
  PacketRun(const IptablesTracer::Ruleset& rules, const std::vector<net::Prefix>& local, const Packet& packet,
            plan::ChoiceExplorer& choices, TracePath& path, std::set<std::string>& warnings,
            const std::vector<std::pair<std::string, TracedIpset>>& sets, const ConnectionScheduler* scheduler)
      : sets_(sets),
        scheduler_(scheduler),
        rules_(rules),
        local_(local),
        choices_(choices),
        path_(path),
        warnings_(warnings),
        src_(packet.source),
        dst_(packet.destination),
        dport_(packet.destinationPort),
        proto_(packet.protocol),
        fromNode_(packet.fromNode),
        inputInterface_(packet.fromNode ? std::string() : packet.inputInterface) {}

  void run() {
    bool alive = true;
    if (!fromNode_) {
      alive = hook("PREROUTING", {"raw", "mangle", "nat"});
      if (alive && isLocal(dst_)) {
        alive = hook("INPUT", {"mangle", "filter"});
        // The scheduler's LOCAL_IN hook sits between filter and nat INPUT; a scheduled packet
        // leaves for its new destination through LOCAL_OUT and POSTROUTING.
        const Scheduled scheduled = alive ? schedule(ConnectionScheduler::Hook::kLocalIn) : Scheduled::kNo;
        if (scheduled == Scheduled::kRejected) alive = false;
        else if (scheduled == Scheduled::kYes)
          alive = hook("OUTPUT", {"mangle", "filter"}) && hook("POSTROUTING", {"mangle", "nat"});
        else if (alive)
          alive = hook("INPUT", {"nat"});
      } else if (alive) {
        alive = hook("FORWARD", {"mangle", "filter"}) && hook("POSTROUTING", {"mangle", "nat"});
      }
    } else {
      // The scheduler's LOCAL_OUT hook comes right after nat OUTPUT.
      alive = hook("OUTPUT", {"raw", "mangle", "nat"});
      const Scheduled scheduled = alive ? schedule(ConnectionScheduler::Hook::kLocalOut) : Scheduled::kNo;
      if (scheduled == Scheduled::kRejected) alive = false;
      if (scheduled == Scheduled::kYes) alive = hook("OUTPUT", {"mangle", "filter"});
      if (scheduled == Scheduled::kNo && alive) alive = hook("OUTPUT", {"filter"});
      alive = alive && hook("POSTROUTING", {"mangle", "nat"});
      if (alive && isLocal(dst_)) {
        // Delivered to the node itself: the packet comes back in on loopback.
        inputInterface_ = "lo";
        alive = hook("PREROUTING", {"raw", "mangle", "nat"}) && hook("INPUT", {"mangle", "filter", "nat"});
      }
    }
    auto& out = path_.outcome;
    out.masqueraded = masqueraded_;
    if (!alive) return;  // verdict, chain and rule were set where it ended
    if (dnat_) {
      out.verdict = TraceVerdict::kDnat;
      out.endpoints = {plan::endpointText(dst_.toString(), dport_)};
    } else {
      out.verdict = TraceVerdict::kAccepted;
    }
  }

 private:
  enum class Scheduled : std::uint8_t { kNo, kYes, kRejected };

  /// The scheduler's decision at `hook`; a scheduled connection is DNAT'ed, and `-m ipvs`
  /// matches its virtual service from then on.
  Scheduled schedule(ConnectionScheduler::Hook hook) {
    if (scheduler_ == nullptr) return Scheduled::kNo;
    const ConnectionScheduler::Decision d =
        scheduler_->schedule(ConnectionScheduler::Connection{hook, proto_, src_, dst_, dport_, mark_}, choices_, path_);
    switch (d.kind) {
      case ConnectionScheduler::Decision::Kind::kPass: return Scheduled::kNo;
      case ConnectionScheduler::Decision::Kind::kRejected:
        path_.outcome.verdict = TraceVerdict::kRejected;
        path_.outcome.chain = d.chain;
        path_.outcome.rule = d.rule;
        path_.outcome.reason = d.reason;
        return Scheduled::kRejected;
      case ConnectionScheduler::Decision::Kind::kScheduled: break;
    }
    virtualService_ = d.service;
    dst_ = d.destination;
    dport_ = d.destinationPort;
    dnat_ = true;
    return Scheduled::kYes;
  }

  /// Whether the packet is in `set` as `flags` select its fields ("dst,dst": destination
  /// address and port); nullopt when the set is unknown.
  std::optional<bool> inSet(const std::string& name, const std::vector<std::string>& flags) const {
    const TracedIpset* set = nullptr;
    for (const auto& [n, s] : sets_)
      if (n == name) set = &s;
    if (set == nullptr) return std::nullopt;
    auto address = [&](std::size_t k) { return k < flags.size() && flags[k] == "src" ? src_ : dst_; };
    // The source port of a new connection is not modelled: a "src" port never matches.
    auto port = [&](std::size_t k) { return k < flags.size() && flags[k] == "src" ? -1 : int(dport_); };
    auto sameAddress = [](std::string_view text, const net::Prefix& a) {
      auto p = net::Prefix::parse(text);
      return p && *p == a;
    };
    auto sameProtoPort = [&](std::string_view text, std::size_t k) {  // "tcp:80"
      const auto colon = text.find(':');
      if (colon == std::string_view::npos || text.substr(0, colon) != protocolName(proto_)) return false;
      auto v = parseRuleNumber(text.substr(colon + 1));
      return v && int(*v) == port(k);
    };
    for (const auto& member : set->members) {
      const std::vector<std::string> parts = splitList(member);
      bool hit = false;
      if (set->type == "hash:ip") {
        hit = parts.size() == 1 && sameAddress(parts[0], address(0));
      } else if (set->type == "bitmap:port") {
        auto v = parseRuleNumber(member);
        hit = v && int(*v) == port(0);
      } else if (set->type == "hash:ip,port") {
        hit = parts.size() == 2 && sameAddress(parts[0], address(0)) && sameProtoPort(parts[1], 1);
      } else if (set->type == "hash:ip,port,ip") {
        hit = parts.size() == 3 && sameAddress(parts[0], address(0)) && sameProtoPort(parts[1], 1) &&
              sameAddress(parts[2], address(2));
      } else if (set->type == "hash:ip,port,net") {
        auto net = parts.size() == 3 ? net::Prefix::parse(parts[2]) : std::nullopt;
        hit = net && sameAddress(parts[0], address(0)) && sameProtoPort(parts[1], 1) && net->contains(address(2));
      } else {
        return std::nullopt;
      }
      if (hit) return true;
    }
    return false;
  }

  bool isLocal(const net::Prefix& a) const {
    if (isLoopback(a)) return true;
    return std::any_of(local_.begin(), local_.end(),
                       [&](const net::Prefix& l) { return l.v6() == a.v6() && l.bytes == a.bytes; });
  }

  static std::string where(const std::string& table, const std::string& chain) { return table + " " + chain; }

  void step(const std::string& table, const std::string& chain, const Rule* rule, std::string detail) {
    path_.steps.push_back(TraceStep{where(table, chain), rule ? rule->spec : std::string(), std::move(detail)});
  }
  void warn(std::string message) { warnings_.insert(std::move(message)); }

  void end(TraceVerdict verdict, const std::string& table, const std::string& chain, std::string rule,
           plan::DropReason reason = plan::DropReason::kNone) {
    path_.outcome.verdict = verdict;
    path_.outcome.chain = where(table, chain);
    path_.outcome.rule = std::move(rule);
    path_.outcome.reason = reason;
  }

  // Runs the built-in chain `hookName` of each table in order. False when the packet was
  // dropped or rejected.
  bool hook(const std::string& hookName, std::initializer_list<const char*> tables) {
    const bool destinationNat = hookName == "PREROUTING" || hookName == "OUTPUT";
    for (const char* tableName : tables) {
      const std::string table = tableName;
      const bool nat = table == "nat";
      bool& natDone = destinationNat ? dnatSetUp_ : snatSetUp_;
      const Chain* chain = rules_.find(table, hookName);
      if (nat && natDone) {
        if (chain)
          step(table, hookName, nullptr,
               fmt::format("not evaluated: the connection's {} NAT is already set up",
                           destinationNat ? "destination" : "source"));
        continue;
      }
      if (nat) natDone = true;  // evaluated once; without a translation the kernel binds a null NAT
      if (chain == nullptr) continue;
      step(table, hookName, nullptr, fmt::format("hook {}, table {}", hookName, table));
      const Flow f = runChain(table, *chain, 0);
      if (f == Flow::kDrop || f == Flow::kReject) return false;
      if (!terminal(f) && chain->policy == "DROP") {
        step(table, hookName, nullptr, "end of the chain: policy DROP");
        end(TraceVerdict::kDropped, table, hookName, "policy DROP");
        return false;
      }
    }
    return true;
  }

  Flow runChain(const std::string& table, const Chain& chain, int depth) {
    if (depth > kMaxJumpDepth) {
      warn(fmt::format("jumps nested deeper than {} at chain {} of {}: not followed", kMaxJumpDepth, chain.name, table));
      return Flow::kReturn;
    }
    for (const auto& rule : chain.rules) {
      const Flow f = runRule(table, chain, rule, depth);
      if (f == Flow::kReturn || terminal(f)) return f;
    }
    return Flow::kReturn;
  }

  bool matches(const std::string& table, const Chain& chain, const Rule& rule) {
    for (const auto& m : rule.matches) {
      bool hit = false;
      switch (m.kind) {
        case MatchKind::kAlways: hit = true; break;
        case MatchKind::kSource: hit = m.prefix.contains(src_); break;
        case MatchKind::kDestination: hit = m.prefix.contains(dst_); break;
        case MatchKind::kInInterface:
          hit = m.interfacePrefix ? inputInterface_.starts_with(m.text) : inputInterface_ == m.text;
          break;
        case MatchKind::kProtocol: hit = proto_ == m.protocol; break;
        case MatchKind::kDestPort:
          hit = std::any_of(m.ports.begin(), m.ports.end(),
                            [&](const auto& r) { return dport_ >= r.first && dport_ <= r.second; });
          break;
        case MatchKind::kSrcTypeLocal: hit = isLocal(src_); break;
        case MatchKind::kDstTypeLocal: hit = isLocal(dst_); break;
        case MatchKind::kCtState:
          // The first packet: NEW, and DNAT once its destination was translated.
          hit = std::any_of(m.states.begin(), m.states.end(),
                            [&](const std::string& s) { return s == "NEW" || (s == "DNAT" && dnat_); });
          break;
        case MatchKind::kMark: hit = (mark_ & m.mask) == m.value; break;
        case MatchKind::kRandom: {
          if (m.probability >= 1.0 || m.probability <= 0.0) {
            hit = m.probability >= 1.0;
            break;
          }
          hit = choices_.choose(2) == 0;
          path_.choices.push_back(fmt::format("{} {}: random {} (probability {})", where(table, chain.name), rule.spec,
                                              hit ? "hit" : "miss", m.probability));
          break;
        }
        case MatchKind::kRecentHit: hit = false; break;  // the recent lists start empty
        case MatchKind::kSet: {
          auto in = inSet(m.text, m.states);
          if (!in) {
            warn(fmt::format("{} rule \"{}\": set {} is not known (or of a type the tracer does not model): taken as "
                             "not matching",
                             where(table, chain.name), rule.spec, m.text));
            return false;
          }
          hit = *in;
          break;
        }
        case MatchKind::kIpvsProto: hit = virtualService_ && virtualService_->protocol == m.protocol; break;
        case MatchKind::kIpvsAddress: hit = virtualService_ && m.prefix.contains(virtualService_->address); break;
        case MatchKind::kIpvsPort:
          hit = virtualService_ && virtualService_->port >= m.ports.front().first &&
                virtualService_->port <= m.ports.front().second;
          break;
        case MatchKind::kPhysdevIsIn: hit = false; break;
        case MatchKind::kConnmark: hit = (connmark_ & m.mask) == m.value; break;
        case MatchKind::kUnknown:
          warn(fmt::format("{} rule \"{}\": cannot evaluate {}: taken as not matching", where(table, chain.name),
                           rule.spec, describe(m)));
          return false;
      }
      if (hit == m.negate) return false;
    }
    return true;
  }

  Flow runRule(const std::string& table, const Chain& chain, const Rule& rule, int depth) {
    if (!matches(table, chain, rule)) return Flow::kNext;
    const Target& t = rule.target;
    switch (t.kind) {
      case TargetKind::kNone:
        step(table, chain.name, &rule, "matched, no target: evaluation goes on");
        return Flow::kNext;
      case TargetKind::kNoop:
        step(table, chain.name, &rule, t.name + ": nothing the trace follows changes");
        return Flow::kNext;
      case TargetKind::kUnknown:
        warn(fmt::format("{} rule \"{}\": {}: taken as doing nothing", where(table, chain.name), rule.spec, t.problem));
        step(table, chain.name, &rule, "target not understood: taken as doing nothing");
        return Flow::kNext;
      case TargetKind::kJump:
      case TargetKind::kGoto: {
        const Chain* next = rules_.find(table, t.name);
        if (next == nullptr || next->policy != "-") {
          warn(fmt::format("{} rule \"{}\": jump to {}, which is not a chain of table {} nor a target the tracer "
                           "knows: not followed",
                           where(table, chain.name), rule.spec, t.name, table));
          step(table, chain.name, &rule, "not followed: unknown chain or target " + t.name);
          return Flow::kNext;
        }
        step(table, chain.name, &rule, {});
        const Flow f = runChain(table, *next, depth + 1);
        if (terminal(f)) return f;
        // A jump comes back to the next rule; a goto returns to this chain's caller.
        return t.kind == TargetKind::kGoto ? Flow::kReturn : Flow::kNext;
      }
      case TargetKind::kReturn:
        step(table, chain.name, &rule, {});
        return Flow::kReturn;
      case TargetKind::kAccept:
        step(table, chain.name, &rule, {});
        return Flow::kAccept;
      case TargetKind::kDrop:
        step(table, chain.name, &rule, {});
        end(TraceVerdict::kDropped, table, chain.name, rule.spec, rule.reason);
        return Flow::kDrop;
      case TargetKind::kReject:
        step(table, chain.name, &rule, {});
        end(TraceVerdict::kRejected, table, chain.name, rule.spec, rule.reason);
        return Flow::kReject;
      case TargetKind::kMark:
        mark_ = (mark_ & ~t.mask) ^ t.value;
        step(table, chain.name, &rule, fmt::format("mark is now {:#x}", mark_));
        return Flow::kNext;
      case TargetKind::kConnmark:
        connmark_ = (connmark_ & ~t.mask) ^ t.value;
        step(table, chain.name, &rule, fmt::format("connection mark is now {:#x}", connmark_));
        return Flow::kNext;
      case TargetKind::kDnat:
        if (t.address) dst_ = *t.address;
        if (t.port) dport_ = *t.port;
        dnat_ = true;
        step(table, chain.name, &rule, "dnat to " + plan::endpointText(dst_.toString(), dport_));
        return Flow::kNat;
      case TargetKind::kSourceNat:
        masqueraded_ = true;
        step(table, chain.name, &rule, "source NAT: masqueraded");
        return Flow::kNat;
    }
    return Flow::kNext;
  }

  const std::vector<std::pair<std::string, TracedIpset>>& sets_;
  const ConnectionScheduler* scheduler_;
  std::optional<ConnectionScheduler::VirtualService> virtualService_;  // once scheduled
  std::uint32_t connmark_ = 0;
  const IptablesTracer::Ruleset& rules_;
  const std::vector<net::Prefix>& local_;
  plan::ChoiceExplorer& choices_;
  TracePath& path_;
  std::set<std::string>& warnings_;

  net::Prefix src_;
  net::Prefix dst_;
  std::uint16_t dport_;
  std::uint8_t proto_;
  bool fromNode_;
  std::string inputInterface_;
  std::uint32_t mark_ = 0;
  bool dnat_ = false;
  bool masqueraded_ = false;
  bool dnatSetUp_ = false;
  bool snatSetUp_ = false;
};

}  // namespace

// ---- IptablesTracer ------------------------------------------------------------------------

IptablesTracer::IptablesTracer(const backends::IptablesSave& ruleset, std::vector<net::Prefix> localAddresses)
    : localAddresses_(std::move(localAddresses)), rules_(std::make_unique<Ruleset>()) {
  for (const auto& table : ruleset.tables) {
    auto& chains = rules_->tables[table.name];
    for (const auto& c : table.chains) {
      Chain chain{c.name, c.policy, {}};
      chain.rules.reserve(c.rules.size());
      for (const auto& r : c.rules) chain.rules.push_back(parseRule(r.spec));
      chains.insert_or_assign(c.name, std::move(chain));
    }
  }
}

core::Result<IptablesTracer> IptablesTracer::fromText(std::string_view text, std::vector<net::Prefix> localAddresses) {
  auto parsed = backends::parseIptablesSave(text);
  if (!parsed) return std::unexpected(parsed.error());
  return IptablesTracer(*parsed, std::move(localAddresses));
}

void IptablesTracer::setIpsets(std::vector<std::pair<std::string, TracedIpset>> sets) { sets_ = std::move(sets); }

void IptablesTracer::setScheduler(std::shared_ptr<const ConnectionScheduler> scheduler) {
  scheduler_ = std::move(scheduler);
}

void IptablesTracer::tagRules(std::span<const RuleTag> tags) {
  for (const auto& tag : tags) {
    auto t = rules_->tables.find(std::string(tableName(tag.table)));
    if (t == rules_->tables.end()) continue;
    auto c = t->second.find(tag.chain);
    if (c == t->second.end()) continue;
    for (auto& rule : c->second.rules)
      if (rule.spec == tag.spec) rule.reason = tag.reason;
  }
}

IptablesTracer::IptablesTracer(IptablesTracer&&) noexcept = default;
IptablesTracer& IptablesTracer::operator=(IptablesTracer&&) noexcept = default;
IptablesTracer::~IptablesTracer() = default;

Trace IptablesTracer::trace(const Packet& packet) const {
  Trace trace;
  trace.packet = packet;
  plan::ChoiceExplorer choices;
  std::set<std::string> warnings;
  do {
    if (trace.paths.size() == kMaxPaths) {
      warnings.insert(fmt::format("more than {} paths: the rest are not traced", kMaxPaths));
      break;
    }
    TracePath& path = trace.paths.emplace_back();
    PacketRun(*rules_, localAddresses_, packet, choices, path, warnings, sets_, scheduler_.get()).run();
  } while (choices.next());
  trace.warnings.assign(warnings.begin(), warnings.end());
  trace.outcome = plan::mergePaths(trace.paths);
  return trace;
}

}  // namespace kproxy::iptables
