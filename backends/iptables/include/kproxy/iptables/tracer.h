#pragma once
/// IptablesTracer: follows one NEW connection's first packet through an iptables ruleset (as
/// iptables-save prints it: kproxy's rendered rules, or what was read back from the kernel)
/// and says where it would go. It interprets every rule's matches and target as the kernel
/// would; it knows nothing of services, so what it reports is what the rules mean.
///
/// Tables run in the kernel's hook order (mangle before nat before filter where a hook has
/// several; a table's built-in chain the ruleset lacks is empty, policy ACCEPT):
///   arriving on an interface: PREROUTING (mangle, nat), then INPUT (mangle, filter, nat) when
///   the destination is local after DNAT, else FORWARD (mangle, filter) and POSTROUTING
///   (mangle, nat);
///   sent by the node: OUTPUT (mangle, nat, filter), POSTROUTING (mangle, nat), and, when the
///   destination is local, INPUT (mangle, filter) on loopback.
/// A connection's nat chains run once per direction, as in the kernel: destination NAT at
/// PREROUTING / OUTPUT, source NAT at POSTROUTING / INPUT.
///
/// The packet is the first of a new connection: conntrack state NEW (plus DNAT once it was
/// DNAT'ed), every `-m recent` list empty. `-m statistic --mode random` is explored
/// exhaustively: each outcome is traced as its own path and the outcome merges them, so a DNAT
/// reports the SET of endpoints the connection can reach. The packet mark starts at 0 and is
/// changed by MARK targets. A match or target the tracer cannot evaluate is a warning in the
/// trace (the rule is then taken as not matching, or the target as doing nothing).
///
/// Between the hooks a ConnectionScheduler may schedule the connection to another
/// destination, as the kernel's ip_vs does (setScheduler; IPVS mode gives the tracer its own):
/// after filter INPUT for arriving packets (LOCAL_IN, before nat INPUT; not for packets on
/// loopback) and right after nat OUTPUT for the node's own (LOCAL_OUT). A scheduled packet
/// leaves through LOCAL_OUT again (filter OUTPUT sees the new destination, `-m ipvs` matches
/// the virtual service the scheduler names) and POSTROUTING. The rules may match ipsets
/// (`-m set --match-set`), whose members the tracer is given (setIpsets). `-m connmark` and
/// CONNMARK follow the connection mark, which starts at 0.
///
/// Thread-safety: a const tracer may be used from several threads.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/net/ip.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/core/error.h"
#include "kproxy/iptables/renderer.h"
#include "kproxy/plan/trace.h"

namespace kproxy::iptables {

// The packet, the trace and its result types are the plan's explain kit (plan/trace.h).
using plan::Packet;
using plan::Trace;
using plan::TraceOutcome;
using plan::TracePath;
using plan::TraceStep;
using plan::TraceVerdict;

/// Schedules connections between netfilter's hooks, as the kernel's ip_vs does: the tracer
/// calls it where ip_vs is called, and a backend that schedules (IPVS mode) implements it. The
/// tracer knows nothing of what it schedules to.
///
/// Thread-safety: schedule() is const and may be called from several threads at once.
class ConnectionScheduler {
 public:
  /// Where the tracer calls the scheduler.
  enum class Hook : std::uint8_t {
    kLocalIn,   ///< a packet arriving for a local address, after filter INPUT, before nat INPUT
    kLocalOut,  ///< a packet the node sends, right after nat OUTPUT
  };
  /// The connection's first packet as it stands at the hook.
  struct Connection {
    Hook hook = Hook::kLocalIn;
    std::uint8_t protocol = 6;
    net::Prefix source;
    net::Prefix destination;
    std::uint16_t destinationPort = 0;
    std::uint32_t mark = 0;  ///< the packet mark (firewall-mark services)
  };
  /// The virtual service a connection was scheduled by: what `-m ipvs --vproto / --vaddr /
  /// --vport` match afterwards.
  struct VirtualService {
    std::uint8_t protocol = 6;
    net::Prefix address;
    std::uint16_t port = 0;
  };
  struct Decision {
    enum class Kind : std::uint8_t {
      kPass,       ///< not scheduled: the packet goes on through the hooks unchanged
      kScheduled,  ///< sent to `destination`:`destinationPort` (a DNAT), by `service`
      kRejected,   ///< refused (ICMP port unreachable)
    };
    Kind kind = Kind::kPass;
    net::Prefix destination;
    std::uint16_t destinationPort = 0;
    VirtualService service;
    /// kRejected: where the trace ends (TraceOutcome::chain, rule) and why.
    std::string chain;
    std::string rule;
    plan::DropReason reason = plan::DropReason::kNone;
  };

  virtual ~ConnectionScheduler() = default;
  /// What happens to `connection` at its hook. The scheduler records what it did as steps of
  /// `path`, and each alternative it explores (a real server) as one of `choices`' choice
  /// points, naming the one taken in `path.choices`.
  virtual Decision schedule(const Connection& connection, plan::ChoiceExplorer& choices, TracePath& path) const = 0;
};

/// An ipset as the rules match it (`-m set --match-set NAME FLAGS`).
struct TracedIpset {
  /// "hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net" or "bitmap:port".
  std::string type;
  std::vector<std::string> members;  ///< as `ipset save` prints them: "10.96.0.10,tcp:80", "30080"
};

/// Interprets one family's ruleset.
class IptablesTracer {
 public:
  /// `localAddresses`: the node's own addresses (`-m addrtype --src-type/--dst-type LOCAL`,
  /// and INPUT vs. FORWARD after DNAT); loopback addresses are always local. Every rule is
  /// parsed here, once.
  IptablesTracer(const backends::IptablesSave& ruleset, std::vector<net::Prefix> localAddresses);
  /// Parses iptables-save / iptables-restore text first; fails when it does not parse.
  static core::Result<IptablesTracer> fromText(std::string_view text,
                                               std::vector<net::Prefix> localAddresses);

  IptablesTracer(IptablesTracer&&) noexcept;
  IptablesTracer& operator=(IptablesTracer&&) noexcept;
  ~IptablesTracer();

  const std::vector<net::Prefix>& localAddresses() const { return localAddresses_; }

  /// The renderer's tags of the rules that drop or reject: a trace that ends at a tagged rule
  /// carries its reason (TraceOutcome::reason). A tag naming no rule of the ruleset is ignored.
  void tagRules(std::span<const RuleTag> tags);

  /// The ipsets the rules match, by name. A set the tracer is not given matches nothing (a
  /// warning in the trace).
  void setIpsets(std::vector<std::pair<std::string, TracedIpset>> sets);
  /// What schedules connections between the hooks; none (the default): nothing does.
  void setScheduler(std::shared_ptr<const ConnectionScheduler> scheduler);

  /// Traces a packet.
  Trace trace(const Packet& packet) const;

  struct Ruleset;  ///< the parsed rules (private to the tracer)

 private:
  std::vector<net::Prefix> localAddresses_;
  std::unique_ptr<Ruleset> rules_;
  std::vector<std::pair<std::string, TracedIpset>> sets_;
  std::shared_ptr<const ConnectionScheduler> scheduler_;
};

}  // namespace kproxy::iptables
