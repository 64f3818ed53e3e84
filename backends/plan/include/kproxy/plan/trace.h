#pragma once
/// What a backend's packet tracer reports, and the answer `kproxy explain` prints, independent
/// of the kernel API the rules were rendered for. Every backend's tracer fills these types, so
/// `kproxy explain` answers in one format (text and JSON) whatever --proxy-mode is.
///
/// Thread-safety: value types and pure functions.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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
/// each once); otherwise the first path's verdict; masquerade if any path masquerades; mixed
/// when the paths disagree. `paths` must not be empty.
TraceOutcome mergePaths(std::span<const TracePath> paths);

/// Multi-line, human-readable: "packet <packetText>", each path's steps, the warnings, the
/// outcome.
std::string traceText(std::string_view packetText, std::span<const TracePath> paths,
                      std::span<const std::string> warnings, const TraceOutcome& outcome);

/// Why a drop in a backend's unallocated-ClusterIP check happened: "dropped: unallocated
/// ClusterIP in ServiceCIDR <names> (<cidr>)" for the range holding `destination`.
std::string unallocatedClusterIPReason(std::span<const sdk::ServiceCIDR> serviceCIDRs, net::Family family,
                                       std::string_view destination);

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

/// An Explanation of `packet` (a backend's packet: source, destination, destinationPort,
/// fromNode, inputInterface, toString()) against the service ports of `family`, and the
/// `trace` of it (paths, outcome, warnings, toText(); it must outlive the Explanation). The
/// backend adds destinationLocal and, where it can say more, the reason.
template <typename Packet, typename Trace>
Explanation explanationOf(const Packet& packet, sdk::Protocol protocol, std::span<const sdk::ServicePort> ports,
                          net::Family family, const Trace& trace) {
  Explanation x;
  x.source = packet.source.toString();
  x.destination = packet.destination.toString();
  x.port = packet.destinationPort;
  x.protocol = protocol;
  x.fromNode = packet.fromNode;
  x.inputInterface = packet.inputInterface;
  x.packetText = packet.toString();
  for (const auto& p : ports)
    if (p.family == family) x.ports.push_back(&p);
  x.paths = trace.paths;
  x.outcome = trace.outcome;
  x.warnings = trace.warnings;
  x.traceText = trace.toText();
  return x;
}

/// The answer: the service port hit, the candidate endpoints and why each is in or out, the
/// verdict, masquerade, the trace rule by rule; text, or one JSON object when `json`.
std::string explanationText(const Explanation& explanation, bool json);

}  // namespace kproxy::plan
