#pragma once
/// explainPacket: `kproxy explain` for the nftables backend. Renders the service ports of the
/// packet's family as the backend would (NftablesRenderer with the backend's RenderConfig),
/// traces the packet through them (NftablesTracer) and says which service port it hits, which
/// endpoints are candidates and why each is in or out, the verdict, masquerade, and the trace
/// rule by rule. Touches no kernel.
///
/// Thread-safety: a pure function of its inputs.

#include <span>
#include <string>

#include "kproxy/nftables/renderer.h"
#include "kproxy/nftables/tracer.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::nftables {

/// The tracer over what a sync with `config` renders for `family`: the service ports of
/// `family` in `ports`, the global objects for `node`, and `serviceCIDRs` (explainPacket's, and
/// ebpf mode's for its nftables part).
NftablesTracer plannedTracer(const RenderConfig& config, net::Family family,
                             std::span<const sdk::ServicePort> ports, const sdk::NodeInfo& node,
                             std::span<const sdk::ServiceCIDR> serviceCIDRs);

/// Text (or, with request.json, one JSON object) explaining where `request`'s packet goes.
/// `ports` may hold both families; those of the packet's family are used. `serviceCIDRs` are
/// the cluster's (unallocated ClusterIPs inside them are dropped, and the answer names the
/// ServiceCIDR). Fails when an address does not parse or the two addresses differ in family.
sdk::Expected<std::string> explainPacket(const RenderConfig& config,
                                         std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node,
                                         const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs = {});

}  // namespace kproxy::nftables
