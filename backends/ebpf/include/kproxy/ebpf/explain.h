#pragma once
/// `kproxy explain` in ebpf mode: renders the service ports of the packet's family as a sync
/// would (EbpfRenderer with the backend's RenderConfig) into the maps' contents, traces the
/// packet through them with the data path's own decision (tracer.h), and answers in the plan's
/// explanation kit, as every mode does: the service port hit, the candidate endpoints, the
/// verdict ("dnat" for a steered connect, "reject" for one refused with ECONNREFUSED, "accept"
/// for one the hooks leave alone; for traffic from other hosts, the nftables part's verdicts),
/// the trace. Touches no kernel and no map.
///
/// Service port ids are numbered for the trace (1, 2, … in the order of the ports): the
/// running backend's come from its hash and probing, so the trace's slots "7/0" name the
/// slot's place, not the id a `bpftool map dump` shows.
///
/// Thread-safety: pure functions of their inputs.

#include <span>
#include <string>

#include "kproxy/ebpf/renderer.h"
#include "kproxy/ebpf/tracer.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ebpf {

/// What a sync would write for the service ports of `family` in `ports`, with ids numbered
/// from 1. `renderer` must have been given the node.
MapContents plannedMaps(const EbpfRenderer& renderer, net::Family family, std::span<const sdk::ServicePort> ports);

/// Text (or, with request.json, one JSON object) explaining where `request`'s packet goes.
/// A packet no socket hook sees (from another host) is traced through the nftables part as
/// nftables mode's explain traces its table (nftables::plannedTracer with
/// nftablesPartConfig(config), the same ports and `serviceCIDRs`); so is, after the hook, a
/// connect the hook leaves unchanged. Fails when an address does not parse or the two
/// addresses differ in family.
sdk::Expected<std::string> explainPacket(const RenderConfig& config, std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node, const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs);

}  // namespace kproxy::ebpf
