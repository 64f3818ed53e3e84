// The plugin entry point: --proxy-mode=nftables.
#include "kproxy/nftables/backend.h"
#include "kproxy/plugin/sdk.h"

KPROXY_DEFINE_PLUGIN("nftables", "0.1.0",
                     "nftables over netlink (libnftnl): tables ip/ip6 kube-proxy, atomic minimal diffs",
                     kproxy::nftables::makeNftablesBackend)
