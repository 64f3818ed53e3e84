#pragma once
/// The explain kit every backend's tracer and `kproxy explain` share, independent of the kernel
/// API the rules were rendered for: the packet traced (from an explain request), the node's own
/// addresses as a tracer takes them, what a tracer reports, and the answer `kproxy explain`
/// prints. Every backend fills these types, so `kproxy explain` answers in one format (text and
/// JSON) whatever --proxy-mode is.
///
/// Thread-safety: value types and pure functions.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/net/ip.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::plan {

/// `s` as a JSON string literal, quotes included (the tracers' and explain's JSON output).
std::string jsonString(std::string_view s);

/// "ip:port", "[ip]:port" when `ip` is IPv6 (how tracers write endpoints).
std::string endpointText(std::string_view ip, std::uint16_t port);

/// One thing the packet met: a hook entered, a rule that matched, a map hit, a choice.
struct TraceStep {
  std::string chain;   ///< the chain evaluated (empty for a choice made between hooks)
  std::string rule;    ///< the rule as the backend prints it; empty for a hook entry
  std::string detail;  ///< what matched, e.g. "service-ips: 172.30.0.41 . tcp . 80 : goto …"
};

enum class TraceVerdict : std::uint8_t {
  kAccepted,  ///< no DNAT and nothing dropped it: not a service (or not one of kproxy's)
  kDnat,      ///< DNAT'ed to one of `endpoints`
  kDropped,
  kRejected,
};
/// "accept", "dnat", "drop", "reject".
std::string_view verdictName(TraceVerdict verdict);

/// Why a rule drops or rejects, as the renderer that wrote it tags it. The tag is the
/// renderer's note to the tracer, never part of what the kernel is given: explain reads the
/// tag, not the rule's text, comment or chain.
enum class DropReason : std::uint8_t {
  kNone,                  ///< untagged (a rule read back from the kernel, or no reason given)
  kUnallocatedClusterIP,  ///< inside a ServiceCIDR, but no Service holds the address
  kNoEndpoints,           ///< the service port has no endpoint for this traffic
  kNoLocalEndpoints,      ///< externalTrafficPolicy Local without a local endpoint
  kSourceRange,           ///< loadBalancerSourceRanges does not admit the source
  kClusterIPPort,         ///< a ClusterIP's port that no service port serves
  /// A port of a service address the node holds (IPVS mode's kube-ipvs0: ClusterIPs, external
  /// and load-balancer IPs) that no service port serves.
  kServiceAddressPort,
  kInvalidConnection,  ///< conntrack finds the packet INVALID (it would reach a pod un-NATed)
  kLocalnet,           ///< to a loopback address from elsewhere, not DNAT'ed (route_localnet)
};
/// "", "unallocated-cluster-ip", "no-endpoints", "no-local-endpoints", "source-range",
/// "cluster-ip-port", "service-address-port", "invalid-connection", "localnet".
std::string_view dropReasonName(DropReason reason);

/// Where a packet ends up. Plain fields, so a caller can print them as JSON as they are.
struct TraceOutcome {
  TraceVerdict verdict = TraceVerdict::kAccepted;
  /// kDnat: every endpoint reachable, "ip:port" ("[ip]:port" for IPv6), sorted and unique.
  std::vector<std::string> endpoints;
  /// kDropped / kRejected: the chain and rule text that decided.
  std::string chain;
  std::string rule;
  /// Source NAT (masquerade) on at least one path.
  bool masqueraded = false;
  /// The paths disagree on the verdict (e.g. a random choice between DNAT and drop); `verdict`
  /// is then kDnat if any path DNATs, else the first path's.
  bool mixed = false;
  /// The node's port a `redirect` sent the packet to (the userspace proxy's listener, which
  /// its explain turns into the proxy's endpoints); 0 when none. Not part of toJson().
  std::uint16_t redirectPort = 0;
  /// kDropped / kRejected: the reason the renderer tagged the deciding rule with (kNone when
  /// untagged). Not part of toJson(); explain turns it into words.
  DropReason reason = DropReason::kNone;

  /// Short text as upstream's packet-flow tests write it: "10.180.0.1:80, 10.180.2.1:80",
  /// "DROP", "REJECT", or "" when the packet is accepted untouched.
  std::string toText() const;
  /// One JSON object: {"verdict":…,"endpoints":[…],"masqueraded":…,"chain":…,"rule":…}.
  std::string toJson() const;
  bool operator==(const TraceOutcome&) const = default;
};

/// One way through the rules: the random choices taken, what the packet met, where it ended.
struct TracePath {
  std::vector<std::string> choices;
  std::vector<TraceStep> steps;
  TraceOutcome outcome;  ///< of this path alone (at most one endpoint)
};

/// Explores a tracer's random choices exhaustively by re-running the trace: each run takes the
/// choices recorded so far and the first alternative at every new choice point; next() moves to
/// the next combination, depth first, and is false when every combination was run.
class ChoiceExplorer {
 public:
  /// The alternative (0 .. alternatives-1) this run takes at its next choice point.
  std::size_t choose(std::size_t alternatives);
  bool next();

 private:
  std::vector<std::size_t> taken_;
  std::vector<std::size_t> limits_;
  std::size_t position_ = 0;
};

/// The paths' outcomes merged: the endpoints of every DNAT path (sorted by address, then port,
/// each once); otherwise the first path's verdict, chain, rule and reason; masquerade if any path masquerades; mixed
/// when the paths disagree. `paths` must not be empty.
TraceOutcome mergePaths(std::span<const TracePath> paths);

/// Multi-line, human-readable: "packet <packetText>", each path's steps, the warnings, the
/// outcome.
std::string traceText(std::string_view packetText, std::span<const TracePath> paths,
                      std::span<const std::string> warnings, const TraceOutcome& outcome);

/// The first packet of a new connection, as every tracer takes it.
struct Packet {
  net::Prefix source;       ///< a host prefix
  net::Prefix destination;  ///< a host prefix of the source's family
  std::uint16_t destinationPort = 0;
  std::uint8_t protocol = 6;  ///< IP protocol number: 6 tcp, 17 udp, 132 sctp
  /// true: sent by a process on the node (the output path); false: arriving on an interface
  /// (the prerouting path).
  bool fromNode = false;
  /// The interface an arriving packet came in on; empty when sent by the node or unknown.
  std::string inputInterface;

  /// A packet from "a.b.c.d" to "e.f.g.h":port over "tcp" | "udp" | "sctp"; nullopt when an
  /// address or the protocol does not parse, or the two addresses are of different families.
  static std::optional<Packet> make(std::string_view source, std::string_view destination, std::uint16_t port,
                                    std::string_view protocol = "tcp", bool fromNode = false);
  std::string toString() const;  ///< "10.0.0.2 -> 172.30.0.41:80/tcp (arriving)"
};

/// The packet of an explain request (its input interface only when it arrives), or the error
/// `kproxy explain` reports when the addresses are not numeric or not of one family.
sdk::Expected<Packet> packetOf(const sdk::ExplainRequest& request);

/// What a tracer found for one packet.
struct Trace {
  Packet packet;
  /// Every path (at least one). Their steps are equal up to their first choice.
  std::vector<TracePath> paths;
  TraceOutcome outcome;  ///< the paths merged
  /// What the tracer could not evaluate exactly (an unknown match or chain, too many paths).
  std::vector<std::string> warnings;

  /// Multi-line, human-readable: the packet, each path's steps, the outcome (traceText()).
  std::string toText() const;
};

/// The addresses a tracer takes for the node's own (`fib ... type local`, `-m addrtype LOCAL`,
/// input versus forward after DNAT): the Node's host addresses, else `nodeIPs` (the options'
/// node IPs), then `nodePortAddresses` (the interface addresses the mode's NodePorts answer
/// on). Addresses that are not numeric host addresses are skipped; loopback is local to every
/// tracer without being listed.
std::vector<net::Prefix> nodeLocalAddresses(const sdk::NodeInfo& node, std::span<const std::string> nodeIPs,
                                            std::span<const std::string> nodePortAddresses);

/// Why a drop in a backend's unallocated-ClusterIP check happened: "dropped: unallocated
/// ClusterIP in ServiceCIDR <names> (<cidr>)" for the range holding `destination`.
std::string unallocatedClusterIPReason(std::span<const sdk::ServiceCIDR> serviceCIDRs, net::Family family,
                                       std::string_view destination);

/// What `kproxy explain` says of a dropped or rejected `outcome`, from the renderer's tag:
/// "dropped: ..." / "rejected: ..." (for an unallocated ClusterIP, unallocatedClusterIPReason);
/// empty when the packet is not dropped or rejected, or the deciding rule is untagged. Every
/// backend's explain says it through this one function.
std::string dropReasonText(const TraceOutcome& outcome, std::span<const sdk::ServiceCIDR> serviceCIDRs,
                           net::Family family, std::string_view destination);

/// What `kproxy explain` says about one traced packet.
struct Explanation {
  // The packet, as the request gave it (addresses canonical).
  std::string source;
  std::string destination;
  std::uint16_t port = 0;
  sdk::Protocol protocol = sdk::Protocol::kTCP;
  bool fromNode = false;
  std::string inputInterface;
  std::string packetText;  ///< "10.0.0.2 -> 172.30.0.41:80/tcp (arriving)"
  /// The service ports of the packet's family.
  std::vector<const sdk::ServicePort*> ports;
  /// The destination is one of the node's addresses NodePorts answer on (or loopback).
  bool destinationLocal = false;
  // The trace.
  std::span<const TracePath> paths;
  TraceOutcome outcome;
  std::span<const std::string> warnings;
  std::string traceText;  ///< traceText() of the trace
  std::string reason;     ///< why it was dropped, when the rules say more than the chain
};

/// An Explanation of `packet` against the service ports of `family`, and the `trace` of it
/// (which must outlive the Explanation). The backend adds destinationLocal and, where it can
/// say more, the reason.
Explanation explanationOf(const Packet& packet, sdk::Protocol protocol, std::span<const sdk::ServicePort> ports,
                          net::Family family, const Trace& trace);

/// The answer: the service port hit, the candidate endpoints and why each is in or out, the
/// verdict, masquerade, the trace rule by rule; text, or one JSON object when `json`.
std::string explanationText(const Explanation& explanation, bool json);

}  // namespace kproxy::plan
