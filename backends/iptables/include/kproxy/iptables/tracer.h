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
/// IPVS mode (setIpvs): the rules match ipsets (`-m set --match-set`), whose members the
/// tracer is given, and IPVS schedules connections between the hooks as the kernel's ip_vs
/// does: after filter INPUT for arriving packets (LOCAL_IN, before nat INPUT; not for packets
/// on loopback) and right after nat OUTPUT for the node's own (LOCAL_OUT). A virtual server is
/// looked up by the packet mark first (firewall-mark services), then by protocol, destination
/// and port; each real server is a path (DNAT), none is a reject (ICMP port unreachable). A
/// scheduled packet leaves through LOCAL_OUT again (filter OUTPUT sees the real server as the
/// destination, `-m ipvs` matches the virtual server) and POSTROUTING. `-m connmark` and
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

/// An ipset as IPVS mode's rules match it.
struct TracedIpset {
  /// "hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net" or "bitmap:port".
  std::string type;
  std::vector<std::string> members;  ///< as `ipset save` prints them: "10.96.0.10,tcp:80", "30080"
};

/// An IPVS virtual server as the tracer schedules connections to it.
struct TracedVirtualServer {
  std::uint32_t fwmark = 0;  ///< not 0: matched by the packet mark, not by address
  std::uint8_t protocol = 6;
  net::Prefix address;
  std::uint16_t port = 0;
  std::vector<std::pair<net::Prefix, std::uint16_t>> realServers;
  /// A persistent firewall-mark service: connections keep the packet's destination port (the
  /// kernel uses a real server's port only when the packet's equals the service's, 0 here).
  bool keepsPort = false;
  std::string text;  ///< how the trace names it ("ipvsadm -A -t 10.96.0.10:80 -s rr")
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

  /// IPVS mode: the sets the rules match (by name) and the virtual servers that schedule.
  void setIpvs(std::vector<std::pair<std::string, TracedIpset>> sets, std::vector<TracedVirtualServer> servers);

  /// Traces a packet.
  Trace trace(const Packet& packet) const;

  struct Ruleset;  ///< the parsed rules (private to the tracer)

 private:
  std::vector<net::Prefix> localAddresses_;
  std::unique_ptr<Ruleset> rules_;
  bool ipvs_ = false;
  std::vector<std::pair<std::string, TracedIpset>> sets_;
  std::vector<TracedVirtualServer> virtualServers_;
};

}  // namespace kproxy::iptables
