#pragma once
/// The ebpf data path's decision for one connect, mirrored in C++, and the tracer `kproxy
/// explain` answers with in ebpf mode.
///
/// decideConnect() is choose() of bpf/kproxy_sock.bpf.c over map contents: the services
/// element of (address, port, protocol); the pool its flags name (KPROXY_SERVICE_LOCAL_POOL)
/// with that pool's count and first slot (KPROXY_LOCAL_SLOT_BASE); refusal with ECONNREFUSED
/// when the count is 0, or when the slot drawn is missing. The constants are map_layout.h's,
/// which the program includes too; tracer.cpp checks maps.h's names against them at compile
/// time. What depends on time and chance is left open: every slot of the pool is a candidate
/// (the program draws one at random), and the decision is a client's first connect (a later
/// one under ClientIP affinity keeps the endpoint of its affinity element while it lasts).
///
/// EbpfTracer: a connect (or unconnected datagram) from a socket of this node, the node's own
/// processes or its pods (recognised as the plan recognises pod traffic), is looked up as the
/// program would look it up. Traffic from other hosts never meets a socket hook: it goes to
/// the Unhooked tracer, the one branch point where the part that programs such traffic answers
/// (explain gives it the nftables part's tracer, explain.h); without one it is "not steered by
/// the socket hooks".
///
/// Thread-safety: value types and const functions.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kproxy/ebpf/maps.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plan/trace.h"

namespace kproxy::ebpf {

/// What a refused connect or datagram fails with (map_layout.h's KPROXY_ECONNREFUSED).
inline constexpr int kRefusedErrno = 111;

enum class Decision : std::uint8_t {
  kNotTranslated,  ///< not TCP or UDP: the hooks return before any lookup
  kNotAService,    ///< no services element: the connect goes out unchanged
  kRefused,        ///< ECONNREFUSED at once
  kSteered,        ///< the socket is given one of `slots`' endpoints
};

/// One slot the program's random choice may draw; a missing one refuses the connect.
struct SlotChoice {
  SlotKey slot;
  std::optional<SocketAddress> endpoint;
  bool operator==(const SlotChoice&) const = default;
};

struct ConnectDecision {
  Decision decision = Decision::kNotAService;
  std::optional<ServiceValue> service;  ///< the element found
  bool localPool = false;               ///< the flags name the local pool
  std::uint32_t base = 0;               ///< the pool's first slot
  std::uint32_t count = 0;              ///< the pool's count
  /// Every slot the random choice may draw (base .. base+count-1), in order.
  std::vector<SlotChoice> slots;
};

/// The program's choose() for a connect to `key`, over `maps`.
ConnectDecision decideConnect(const MapContents& maps, const ServiceKey& key);

class EbpfTracer {
 public:
  /// What traffic the socket hooks never see meets (from other hosts to NodePorts,
  /// LoadBalancer IPs and externalIPs), traced by the part that programs it; a connect a hook
  /// sees but leaves unchanged (no element, not TCP or UDP) meets it too, after the hook.
  using Unhooked = std::function<plan::Trace(const plan::Packet&)>;

  /// `maps`: the contents a sync would write for the packet's family; `detector`: how pod
  /// traffic of this node is recognised (plan::applyNode's); `unhooked`: empty for
  /// notSteered().
  EbpfTracer(MapContents maps, plan::LocalTrafficDetector detector, Unhooked unhooked = {});

  /// Whether a socket hook sees `packet`'s connect: sent by the node, or from one of its pods.
  bool hooked(const plan::Packet& packet) const;
  plan::Trace trace(const plan::Packet& packet) const;
  /// The answer for traffic no socket hook sees while nothing else programs it: untouched.
  static plan::Trace notSteered(const plan::Packet& packet);

  const MapContents& maps() const { return maps_; }

 private:
  /// A connect the hook leaves unchanged (`steps` so far): its packets meet `unhooked_` as
  /// any other, or, without it, go out untouched.
  plan::Trace goesOut(const plan::Packet& packet, std::vector<plan::TraceStep> steps) const;
  /// Why `packet` is a socket of this node ("sent by the node", "from a pod: …"); empty if not.
  std::string hookedBecause(const plan::Packet& packet) const;

  MapContents maps_;
  plan::LocalTrafficDetector detector_;
  Unhooked unhooked_;
};

/// The note explain gives a packet no socket hook sees ("not steered by the socket hooks: …").
std::string notSteeredNote(const plan::Packet& packet);

}  // namespace kproxy::ebpf
