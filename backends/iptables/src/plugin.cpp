// The plugin entry point: --proxy-mode=iptables.
#include "kproxy/iptables/backend.h"
#include "kproxy/plugin/sdk.h"

KPROXY_DEFINE_PLUGIN("iptables", "0.1.0",
                     "iptables-restore (nft or legacy): upstream kube-proxy's KUBE-* chains, minimal partial restores",
                     kproxy::iptables::makeIptablesBackend)
