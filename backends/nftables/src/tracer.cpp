#include "kproxy/nftables/tracer.h"
#include "kproxy/net/host_port.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace kproxy::nftables {
namespace {

// The kernel's jump stack depth (NFT_JUMP_STACK_SIZE).
constexpr int kMaxJumpDepth = 16;
// Random choices multiply; a ruleset that needs more paths than this is not traced exhaustively.
constexpr std::size_t kMaxPaths = 4096;

/// How evaluation of a chain (or rule) ended.
enum class Flow : std::uint8_t {
  kNext,    // the rule did not match, or it matched without a verdict: go on
  kReturn,  // return (or fell off a chain, or a goto came back): back to the caller
  kAccept,  // accept: this base chain is done, the packet goes on to the next one
  kNat,     // a NAT statement: terminal like accept, the translation is recorded
  kDrop,
  kReject,
};
bool terminal(Flow f) { return f == Flow::kAccept || f == Flow::kNat || f == Flow::kDrop || f == Flow::kReject; }

using ChoiceOracle = plan::ChoiceExplorer;

bool isLoopback(const net::Prefix& a) {
  if (a.family == net::Family::kIPv4) return a.bytes[0] == 127;
  static constexpr std::array<std::uint8_t, 16> kLoopback6{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return a.bytes == kLoopback6;
}

std::string endpointText(const net::Prefix& a, std::uint16_t port) {
  return net::joinHostPort(a.addressText(), port);
}

std::uint32_t slotOf(std::string_view key) {
  if (key.size() < 4) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(key.data());
  return static_cast<std::uint32_t>(p[0]) << 24 | static_cast<std::uint32_t>(p[1]) << 16 |
         static_cast<std::uint32_t>(p[2]) << 8 | p[3];
}

/// An address and port decoded from a map value `ADDR . inet_service`.
struct Target {
  net::Prefix address;
  std::uint16_t port = 0;
};
std::optional<Target> decodeTarget(std::string_view data, net::Family family) {
  Target t;
  t.address.family = family;
  const std::size_t n = t.address.size();
  if (data.size() < n + 2) return std::nullopt;
  std::memcpy(t.address.bytes.data(), data.data(), n);
  t.address.length = static_cast<std::uint8_t>(n * 8);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + n);
  t.port = static_cast<std::uint16_t>(p[0] << 8 | p[1]);
  return t;
}


}  // namespace

// ---- the interpreter ---------------------------------------------------------------------

namespace {

/// What a run reads of the tracer.
struct Ruleset {
  net::Family family_;
  const std::vector<net::Prefix>& localAddresses_;
  const std::unordered_map<std::string, Chain>& chains_;
  const std::unordered_map<std::string, SetSpec>& sets_;
  const std::unordered_map<std::string, std::vector<Element>>& elements_;
};

/// One run of a packet through every hook with one combination of random choices.
class PacketRun {
 public:
  PacketRun(const Ruleset& tracer, const Packet& packet, ChoiceOracle& oracle, TracePath& path,
            std::set<std::string>& warnings)
      : t_(tracer),
        oracle_(oracle),
        path_(path),
        warnings_(warnings),
        src_(packet.source),
        dst_(packet.destination),
        dport_(packet.destinationPort),
        proto_(packet.protocol),
        origDst_(packet.destination),
        origDport_(packet.destinationPort),
        fromNode_(packet.fromNode),
        inputInterface_(packet.fromNode ? std::string() : packet.inputInterface) {}

  void run() {
    bool alive = true;
    if (!fromNode_) {
      alive = hook("prerouting");
      if (alive && isLocal(dst_)) {
        alive = hook("input");
      } else if (alive) {
        alive = hook("forward") && hook("postrouting");
      }
    } else {
      alive = hook("output") && hook("postrouting");
      // Delivered to the node itself: the packet comes back in on loopback.
      if (alive && isLocal(dst_)) alive = hook("prerouting") && hook("input");
    }
    auto& out = path_.outcome;
    out.masqueraded = masqueraded_;
    if (!alive) return;  // verdict, chain, rule set where it ended
    if (dnat_) {
      out.verdict = TraceVerdict::kDnat;
      out.endpoints = {endpointText(dst_, dport_)};
    } else {
      out.verdict = TraceVerdict::kAccepted;
    }
  }

 private:
  bool isLocal(const net::Prefix& a) const {
    if (isLoopback(a)) return true;
    return std::any_of(t_.localAddresses_.begin(), t_.localAddresses_.end(),
                       [&](const net::Prefix& l) { return l.family == a.family && l.bytes == a.bytes; });
  }

  void step(const std::string& chain, const Rule* rule, std::string detail) {
    path_.steps.push_back(TraceStep{chain, rule ? rule->toText(t_.family_) : std::string(), std::move(detail)});
  }
  void warn(std::string message) { warnings_.insert(std::move(message)); }

  // Runs every base chain of `hook` by priority. False when the packet was dropped or rejected.
  bool hook(std::string_view hookName) {
    std::vector<const Chain*> chains;
    for (const auto& [name, chain] : t_.chains_)
      if (chain.base && chain.base->hook == hookName) chains.push_back(&chain);
    std::sort(chains.begin(), chains.end(), [](const Chain* a, const Chain* b) {
      return std::tie(a->base->priority, a->name) < std::tie(b->base->priority, b->name);
    });
    const bool destinationNat = hookName == "prerouting" || hookName == "output";
    bool& natDone = destinationNat ? dnatSetUp_ : snatSetUp_;
    const bool natDoneBefore = natDone;
    for (const Chain* chain : chains) {
      const bool nat = chain->base->type == "nat";
      if (nat && (natDoneBefore || natDone)) {
        // The kernel runs a connection's NAT chains once per direction.
        if (natDoneBefore)
          step(chain->name, nullptr,
               fmt::format("hook {}: not evaluated, the connection's {} NAT is already set up", hookName,
                           destinationNat ? "destination" : "source"));
        continue;
      }
      step(chain->name, nullptr,
           fmt::format("hook {}, {} priority {}", hookName, chain->base->type, chain->base->priority));
      Flow f = runChain(*chain, 0);
      if (f == Flow::kDrop || f == Flow::kReject) return false;
      if (nat && f == Flow::kNat) natDone = true;
    }
    if (std::any_of(chains.begin(), chains.end(), [](const Chain* c) { return c->base->type == "nat"; }))
      natDone = true;  // no rule translated: the kernel sets up a null binding
    return true;
  }

  Flow runChain(const Chain& chain, int depth) {
    if (depth > kMaxJumpDepth) {
      warn(fmt::format("jumps nested deeper than {} at chain {}: not followed", kMaxJumpDepth, chain.name));
      return Flow::kReturn;
    }
    for (const auto& rule : chain.rules) {
      Flow f = runRule(chain, rule, depth);
      if (f == Flow::kReturn) return Flow::kReturn;
      if (terminal(f)) return f;
    }
    return Flow::kReturn;  // end of chain (a base chain's policy is accept)
  }

  Flow jumpTo(const std::string& target, int depth) {
    auto it = t_.chains_.find(target);
    if (it == t_.chains_.end()) {
      warn("jump to unknown chain " + target + ": treated as an empty chain");
      return Flow::kReturn;
    }
    return runChain(it->second, depth + 1);
  }

  Flow applyVerdict(const Chain& chain, const Rule& rule, const Verdict& v, int depth, std::string detail) {
    switch (v.kind) {
      case VerdictKind::kAccept:
        step(chain.name, &rule, std::move(detail));
        return Flow::kAccept;
      case VerdictKind::kDrop:
        step(chain.name, &rule, std::move(detail));
        end(TraceVerdict::kDropped, chain, rule);
        return Flow::kDrop;
      case VerdictKind::kReturn:
        step(chain.name, &rule, std::move(detail));
        return Flow::kReturn;
      case VerdictKind::kJump:
      case VerdictKind::kGoto: {
        step(chain.name, &rule, std::move(detail));
        // A tagged jump names the reason of what ends below it (ir.h, Rule::reason).
        const plan::DropReason outer = reasonOfCaller_;
        if (outer == plan::DropReason::kNone) reasonOfCaller_ = rule.reason;
        Flow f = jumpTo(v.chain, depth);
        reasonOfCaller_ = outer;
        if (terminal(f)) return f;
        // A jump comes back to the next rule; a goto returns to this chain's caller.
        return v.kind == VerdictKind::kGoto ? Flow::kReturn : Flow::kNext;
      }
    }
    return Flow::kNext;
  }

  void end(TraceVerdict verdict, const Chain& chain, const Rule& rule) {
    path_.outcome.verdict = verdict;
    path_.outcome.chain = chain.name;
    path_.outcome.rule = rule.toText(t_.family_);
    path_.outcome.reason = reasonOfCaller_ != plan::DropReason::kNone ? reasonOfCaller_ : rule.reason;
  }

  const std::vector<Element>* elementsOf(const std::string& set) const {
    auto it = t_.elements_.find(set);
    return it == t_.elements_.end() ? nullptr : &it->second;
  }
  bool knownSet(const std::string& set) {
    if (t_.sets_.contains(set) || t_.elements_.contains(set)) return true;
    warn("lookup in unknown set or map " + set + ": treated as empty");
    return false;
  }
  const Element* find(const std::string& set, std::string_view key) {
    if (!knownSet(set)) return nullptr;
    const auto* elements = elementsOf(set);
    if (elements == nullptr) return nullptr;
    for (const auto& e : *elements)
      if (!e.intervalEnd && e.kernelKey() == key) return &e;
    return nullptr;
  }

  std::string hitText(const std::string& set, const Element& e) const {
    std::string out = fmt::format("@{} hit: {}", set, e.keyText);
    if (e.value) out += " : " + e.value->toString();
    if (!e.dataText.empty()) out += " : " + e.dataText;
    return out;
  }

  // DNAT to `target`: the translation every later hook sees.
  Flow dnatTo(const Chain& chain, const Rule& rule, const Target& target, std::string detail) {
    dst_ = target.address;
    dport_ = target.port;
    dnat_ = true;
    step(chain.name, &rule, std::move(detail));
    return Flow::kNat;
  }

  // `dnat to numgen random mod 65535 offset BASE map @MAP`: every interval of the numgen range
  // is one alternative; a slot that no interval covers makes the lookup miss (the rule ends).
  Flow dnatFromSlots(const Chain& chain, const Rule& rule, const DnatFromSlots& s) {
    if (!knownSet(s.map)) return Flow::kNext;
    const auto* elements = elementsOf(s.map);
    const std::uint64_t first = s.base;
    const std::uint64_t last = first + kSlotsPerRange;  // exclusive
    // Boundaries inside the range; a lookup at key k takes the greatest element key <= k, a
    // start winning over an end at the same key (adjacent intervals).
    std::vector<std::uint64_t> points{first};
    if (elements)
      for (const auto& e : *elements) {
        std::uint64_t k = slotOf(e.kernelKey());
        if (k > first && k < last) points.push_back(k);
      }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    struct Segment {
      std::uint64_t from, to;
      std::optional<Target> target;
    };
    std::vector<Segment> segments;
    for (std::size_t i = 0; i < points.size(); ++i) {
      const std::uint64_t from = points[i];
      const std::uint64_t to = i + 1 < points.size() ? points[i + 1] : last;
      const Element* best = nullptr;
      std::uint64_t bestKey = 0;
      if (elements)
        for (const auto& e : *elements) {
          std::uint64_t k = slotOf(e.kernelKey());
          if (k > from) continue;
          if (best == nullptr || k > bestKey || (k == bestKey && best->intervalEnd && !e.intervalEnd)) {
            best = &e;
            bestKey = k;
          }
        }
      std::optional<Target> target;
      if (best && !best->intervalEnd) {
        target = decodeTarget(best->data, t_.family_);
        if (!target) warn(fmt::format("element {} of {} has no address . port value", best->keyText, s.map));
      }
      segments.push_back(Segment{from, to, target});
    }
    const std::size_t pick = oracle_.choose(segments.size());
    const auto& seg = segments[pick];
    const std::string where =
        fmt::format("slots {}-{} ({} of {} intervals of {}-{})", seg.from, seg.to - 1, pick + 1, segments.size(),
                    first, last - 1);
    if (!seg.target) {
      path_.choices.push_back(where + ": no endpoint");
      step(chain.name, &rule, where + " map to nothing: the lookup misses, the rule does not match");
      return Flow::kNext;
    }
    const std::string ep = endpointText(seg.target->address, seg.target->port);
    path_.choices.push_back(where + " -> " + ep);
    return dnatTo(chain, rule, *seg.target, fmt::format("@{}: {} -> dnat to {}", s.map, where, ep));
  }

  Flow runRule(const Chain& chain, const Rule& rule, int depth) {
    for (const auto& statement : rule.statements) {
      // Each case either fails the match (kNext ends the rule), continues to the next
      // statement (std::nullopt), or ends the rule with a flow.
      std::optional<Flow> flow = std::visit(
          [&](const auto& s) -> std::optional<Flow> { return evaluate(chain, rule, s, depth); }, statement);
      if (flow) return *flow;
    }
    return Flow::kNext;
  }

  static std::optional<Flow> pass(bool matched) {
    return matched ? std::nullopt : std::optional<Flow>(Flow::kNext);
  }

  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchAddress& s, int) {
    const net::Prefix& a = s.source ? src_ : dst_;
    return pass(s.address.contains(a) != s.negate);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchL4Proto& s, int) {
    return pass(proto_ == s.proto);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchDestPort& s, int) {
    return pass(dport_ == s.port);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchCtStateNew&, int) {
    return pass(true);  // the tracer follows the first packet of a new connection
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchCtStatusDnat&, int) {
    return pass(dnat_);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchMarkClear& s, int) {
    return pass((mark_ & s.bit) == 0);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchFibSourceLocal&, int) {
    return pass(isLocal(src_));
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchFibDestLocal&, int) {
    return pass(isLocal(dst_));
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchInputInterface& s, int) {
    const std::string& in = inputInterface_;
    const bool same = s.prefix ? in.starts_with(s.name) : in == s.name;
    return pass(same != s.negate);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule& rule, const MatchNumgen& s, int) {
    if (s.modulus <= 1) return pass(true);
    const bool hit = oracle_.choose(2) == 0;
    path_.choices.push_back(fmt::format("numgen random mod {} {} 0 ({})", s.modulus, hit ? "==" : "!=",
                                        rule.toText(t_.family_)));
    return pass(hit);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchDestInSet& s, int) {
    KeyBuilder k;
    k.address(dst_);
    return pass(find(s.set, k.bytes) != nullptr);
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const VmapLookup& s, int depth) {
    KeyBuilder k;
    if (s.withAddress) k.address(dst_);
    k.proto(proto_).port(dport_);
    const Element* e = find(s.map, k.bytes);
    if (e == nullptr || !e->value) return Flow::kNext;
    // The element's own tag says why it drops, over the lookup rule's (a map of many causes).
    const plan::DropReason outer = reasonOfCaller_;
    if (outer == plan::DropReason::kNone) reasonOfCaller_ = e->reason;
    auto flow = applyVerdict(chain, rule, *e->value, depth, hitText(s.map, *e));
    reasonOfCaller_ = outer;
    return flow;
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const SetMark& s, int) {
    mark_ = s.toggle ? (mark_ ^ s.bit) : (mark_ | s.bit);
    step(chain.name, &rule, fmt::format("mark is now {:#010x}", mark_));
    return std::nullopt;
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const Masquerade&, int) {
    masqueraded_ = true;
    step(chain.name, &rule, "source NAT: masqueraded");
    return Flow::kNat;
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const DnatTo& s, int) {
    Target target{s.address, s.port};
    return dnatTo(chain, rule, target, "dnat to " + endpointText(s.address, s.port));
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const DnatFromAffinity& s, int) {
    KeyBuilder k;
    k.address(src_).poolId(s.id);
    const Element* e = find(s.map, k.bytes);
    if (e == nullptr) return Flow::kNext;  // no recorded client: the map lookup misses
    auto target = decodeTarget(e->data, t_.family_);
    if (!target) {
      warn(fmt::format("element {} of {} has no address . port value", e->keyText, s.map));
      return Flow::kNext;
    }
    return dnatTo(chain, rule, *target, hitText(s.map, *e));
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const DnatFromSlots& s, int) {
    return dnatFromSlots(chain, rule, s);
  }
  std::optional<Flow> evaluate(const Chain&, const Rule&, const MatchHairpin& s, int) {
    if (!dnat_) return Flow::kNext;
    KeyBuilder k;
    k.address(src_).address(dst_);
    return pass(find(s.set, k.bytes) != nullptr);
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const VmapLookupOriginal& s, int depth) {
    if (proto_ != s.proto) return Flow::kNext;
    KeyBuilder k;
    if (s.nodePorts) {
      KeyBuilder ip;
      ip.address(origDst_);
      if (find(names::kNodePortIPsSet, ip.bytes) == nullptr) return Flow::kNext;
    } else {
      k.address(origDst_);
    }
    k.proto(proto_).port(origDport_);
    const Element* e = find(s.map, k.bytes);
    if (e == nullptr || !e->value) return Flow::kNext;
    return applyVerdict(chain, rule, *e->value, depth, hitText(s.map, *e));
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const RecordAffinity& s, int) {
    if (proto_ != s.proto) return Flow::kNext;
    step(chain.name, &rule,
         fmt::format("@{} would record {} . {} : {} for {}s", s.map, src_.toString(), s.id,
                     endpointText(dst_, dport_), s.timeoutSeconds));
    return std::nullopt;
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const RedirectTo& s, int) {
    // Not rendered by the nftables mode (the userspace proxy's table): the node itself answers,
    // on the proxy's listener; the userspace explain turns the port into the proxy's endpoints.
    step(chain.name, &rule, fmt::format("redirected to this node's port {}", s.port));
    path_.outcome.redirectPort = s.port;
    return Flow::kNat;
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const Reject& s, int) {
    step(chain.name, &rule, s.tcpReset ? "rejected with a TCP reset" : "rejected (ICMP port unreachable)");
    end(TraceVerdict::kRejected, chain, rule);
    return Flow::kReject;
  }
  std::optional<Flow> evaluate(const Chain& chain, const Rule& rule, const Verdict& v, int depth) {
    std::string detail;
    // The renderer tags the drop of what is left inside a service CIDR: say so.
    if (v.kind == VerdictKind::kDrop && rule.reason == plan::DropReason::kUnallocatedClusterIP)
      for (const auto& st : rule.statements)
        if (const auto* m = std::get_if<MatchAddress>(&st); m && !m->source && !m->negate)
          detail = fmt::format("unallocated ClusterIP: {} is inside service CIDR {} and no Service holds it",
                               dst_.toString(), m->address.toString());
    return applyVerdict(chain, rule, v, depth, std::move(detail));
  }

  const Ruleset& t_;
  ChoiceOracle& oracle_;
  TracePath& path_;
  plan::DropReason reasonOfCaller_ = plan::DropReason::kNone;  // the tag of the jump that led here
  std::set<std::string>& warnings_;

  net::Prefix src_;
  net::Prefix dst_;
  std::uint16_t dport_;
  std::uint8_t proto_;
  net::Prefix origDst_;
  std::uint16_t origDport_;
  bool fromNode_;
  std::string inputInterface_;
  std::uint32_t mark_ = 0;
  bool dnat_ = false;
  bool masqueraded_ = false;
  bool dnatSetUp_ = false;
  bool snatSetUp_ = false;
};

}  // namespace

// ---- NftablesTracer ----------------------------------------------------------------------

NftablesTracer::NftablesTracer(const GlobalObjects& global, std::span<const Fragment> fragments,
                               std::vector<net::Prefix> localAddresses)
    : family_(global.family), localAddresses_(std::move(localAddresses)) {
  for (const auto& spec : global.sets) sets_.emplace(spec.name, spec);
  auto add = [&](const std::vector<Chain>& chains, const std::vector<Element>& elements) {
    for (const auto& c : chains) chains_.insert_or_assign(c.name, c);
    for (const auto& e : elements) elements_[e.set].push_back(e);
  };
  add(global.chains, global.elements);
  for (const auto& f : fragments)
    if (f.family == family_) add(f.chains, f.elements);
}

NftablesTracer NftablesTracer::fromServicePorts(NftablesRenderer& renderer, net::Family family,
                                                std::span<const sdk::ServicePort> ports,
                                                const sdk::NodeInfo& node) {
  renderer.setNode(node);  // as the backend does before rendering a sync
  std::vector<Fragment> fragments;
  for (const auto& p : ports)
    if (p.family == family) fragments.push_back(renderer.renderServicePort(p));
  return NftablesTracer(
      renderer.renderGlobal(family, node), fragments,
      plan::nodeLocalAddresses(node, renderer.config().common.nodeIPs, node.nodePortAddresses.addresses));
}

Trace NftablesTracer::trace(const Packet& packet) const {
  Trace trace;
  trace.packet = packet;
  if (packet.source.family != family_ || packet.destination.family != family_) {
    trace.paths.push_back(TracePath{{}, {TraceStep{{}, {}, "packet of another family: no rule of this table applies"}}, {}});
    return trace;
  }
  const Ruleset ruleset{family_, localAddresses_, chains_, sets_, elements_};
  ChoiceOracle oracle;
  std::set<std::string> warnings;
  do {
    if (trace.paths.size() == kMaxPaths) {
      warnings.insert(fmt::format("more than {} paths: the rest are not traced", kMaxPaths));
      break;
    }
    TracePath& path = trace.paths.emplace_back();
    PacketRun(ruleset, packet, oracle, path, warnings).run();
  } while (oracle.next());
  trace.warnings.assign(warnings.begin(), warnings.end());

  trace.outcome = mergePaths(trace.paths);
  return trace;
}

}  // namespace kproxy::nftables
