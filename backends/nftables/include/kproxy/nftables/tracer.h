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

// The packet, the trace and its result types are the plan's explain kit (plan/trace.h): every
// backend answers alike.
using plan::jsonString;
using plan::mergePaths;
using plan::Packet;
using plan::Trace;
using plan::TraceOutcome;
using plan::TracePath;
using plan::TraceStep;
using plan::TraceVerdict;
using plan::verdictName;

/// Interprets the rendered objects of one family.
class NftablesTracer {
 public:
  /// `localAddresses`: the node's own addresses (`fib saddr type local`, and input vs. forward
  /// after DNAT); loopback addresses are always local.
  NftablesTracer(const GlobalObjects& global, std::span<const Fragment> fragments,
                 std::vector<net::Prefix> localAddresses);

  /// Renders `ports` of `family` (others are skipped) and the global objects for `node` with
  /// `renderer`, and traces over the result. The node's local addresses are
  /// plan::nodeLocalAddresses with the renderer's node IPs.
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
