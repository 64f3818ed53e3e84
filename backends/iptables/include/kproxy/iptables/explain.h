#pragma once
/// explainPacket: `kproxy explain` for the iptables backend. Renders the service ports of the
/// packet's family as the backend would (IptablesRenderer with the backend's RenderConfig, the
/// whole ruleset as renderRuleset writes it), traces the packet through those rules
/// (IptablesTracer) and says which service port it hits, which endpoints are candidates and
/// why each is in or out, the verdict, masquerade, and the trace rule by rule, in the same
/// format as every other backend (plan/trace.h). Touches no kernel.
///
/// Thread-safety: a pure function of its inputs.

#include <span>
#include <string>

#include "kproxy/iptables/renderer.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::iptables {

/// Text (or, with request.json, one JSON object) explaining where `request`'s packet goes.
/// `ports` may hold both families; those of the packet's family are used. `serviceCIDRs` are
/// the cluster's (unallocated ClusterIPs inside them are dropped, and the answer names the
/// ServiceCIDR). `nfacct`: the nfacct objects the rules count into, as a full sync renders
/// them. Fails when an address does not parse or the two addresses differ in family.
sdk::Expected<std::string> explainPacket(const RenderConfig& config, std::span<const sdk::ServicePort> ports,
                                         const sdk::NodeInfo& node, const sdk::ExplainRequest& request,
                                         std::span<const sdk::ServiceCIDR> serviceCIDRs = {},
                                         NfacctObjects nfacct = {});

}  // namespace kproxy::iptables
