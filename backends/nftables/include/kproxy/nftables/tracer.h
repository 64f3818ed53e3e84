#pragma once
/// NftablesTracer: follows one NEW connection's first packet through kproxy's rendered nftables
/// objects and says where it would go. It interprets the IR (ir.h) statement by statement, as
/// the kernel evaluates the rules; it knows nothing of services, so what it reports is what the
/// rendered rules mean, not what the renderer meant them to do.
///
/// Hooks run in the kernel's order, every base chain of a hook by priority:
///   arriving on an interface: prerouting, then input (destination local after DNAT) or
///   forward + postrouting;
///   locally originated: output, postrouting, and, when the destination is local,
///   prerouting + input (on loopback).
/// NAT chains of a direction run once per connection, as in the kernel: destination NAT at the
/// first prerouting / output hook, source NAT at postrouting / input.
///
/// Choices the data path makes at random (`numgen`, the slot of a balancing map) are explored
/// exhaustively: every alternative is traced as its own path, and the outcome merges them, so
/// a DNAT reports the SET of endpoints the connection can reach. Dynamic maps filled by the
/// data path (session affinity) hold only the elements given to the tracer, usually none, so
/// an affinity lookup misses.
///
/// Thread-safety: a const tracer may be used from several threads.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kproxy/nftables/ir.h"
#include "kproxy/nftables/renderer.h"
#include "kproxy/plan/trace.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::nftables {

// The trace result types are the service plan's (plan/trace.h): every backend answers alike.
using plan::jsonString;
using plan::mergePaths;
using plan::TraceOutcome;
using plan::TracePath;
using plan::TraceStep;
using plan::TraceVerdict;
using plan::verdictName;

/// The first packet of a new connection.
struct Packet {
  net::Prefix source;
  net::Prefix destination;
  std::uint16_t destinationPort = 0;
  std::uint8_t protocol = 6;  ///< IP protocol number: 6 tcp, 17 udp, 132 sctp
  /// true: sent by a process on the node (output path); false: arriving on an interface
  /// (prerouting path).
  bool fromNode = false;
  /// The interface an arriving packet came in on (`iifname`); empty when sent by the node.
  std::string inputInterface;

  /// A packet from "a.b.c.d" to "e.f.g.h":port over "tcp" | "udp" | "sctp"; nullopt when an
  /// address or the protocol does not parse, or the two addresses are of different families.
  static std::optional<Packet> make(std::string_view source, std::string_view destination,
                                    std::uint16_t port, std::string_view protocol = "tcp",
                                    bool fromNode = false);
  std::string toString() const;  ///< "10.0.0.2 -> 172.30.0.41:80/tcp (arriving)"
};

struct Trace {
  Packet packet;
  /// Every path (at least one). Their steps are equal up to their first choice.
  std::vector<TracePath> paths;
  TraceOutcome outcome;  ///< the paths merged
  /// What the tracer could not evaluate exactly (unknown chain, missing map, too many paths).
  std::vector<std::string> warnings;

  /// Multi-line, human-readable: the packet, each path's steps, the outcome.
  std::string toText() const;
};

/// The addresses a tracer takes for the node's own: the node's host addresses (else
/// `fallback`), and the interface addresses its NodePorts answer on.
std::vector<net::Prefix> tracerLocalAddresses(const sdk::NodeInfo& node, std::span<const net::Prefix> fallback);

/// Interprets the rendered objects of one family.
class NftablesTracer {
 public:
  /// `localAddresses`: the node's own addresses (`fib saddr type local`, and input vs. forward
  /// after DNAT); loopback addresses are always local.
  NftablesTracer(const GlobalObjects& global, std::span<const Fragment> fragments,
                 std::vector<net::Prefix> localAddresses);

  /// Renders `ports` of `family` (others are skipped) and the global objects for `node` with
  /// `renderer`, and traces over the result. The node's addresses are its local addresses.
  static NftablesTracer fromServicePorts(NftablesRenderer& renderer, net::Family family,
                                         std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node);

  net::Family family() const { return family_; }
  const std::vector<net::Prefix>& localAddresses() const { return localAddresses_; }

  /// Traces a packet. A packet of another family than the tracer's is accepted untouched.
  Trace trace(const Packet& packet) const;

 private:
  net::Family family_;
  std::vector<net::Prefix> localAddresses_;
  std::unordered_map<std::string, Chain> chains_;
  std::unordered_map<std::string, SetSpec> sets_;
  std::unordered_map<std::string, std::vector<Element>> elements_;  ///< by set name
};

}  // namespace kproxy::nftables
