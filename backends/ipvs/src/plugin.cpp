// The plugin entry point: --proxy-mode=ipvs.
#include "kproxy/ipvs/backend.h"
#include "kproxy/plugin/sdk.h"

KPROXY_DEFINE_PLUGIN(
    "ipvs", "0.1.0",
    "IPVS over generic netlink: upstream kube-proxy's virtual servers, kube-ipvs0, ipsets and "
    "iptables rules, minimal changes (no transactions: idempotent steps, full resync after a "
    "failure)",
    kproxy::ipvs::makeIpvsBackend)
