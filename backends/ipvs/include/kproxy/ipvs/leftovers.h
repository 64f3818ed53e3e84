#pragma once
/// Removal of what upstream kube-proxy's IPVS mode leaves outside iptables, as its
/// ipvs.CleanupLeftovers (called from platformCleanup in cmd/kube-proxy/app/server_linux.go):
/// every IPVS virtual server, the `kube-ipvs0` dummy interface and the ipsets named KUBE-*. The
/// iptables part is the iptables backend's (kproxy/iptables/leftovers.h); the ipsets go after
/// it, as a set that a rule still refers to cannot be destroyed. Names come from the catalogue
/// (kproxy/backends/common/chain_names.h).
/// Each step logs each removal (key=value) and each failure as an error, and returns true when
/// everything that was found was removed (nothing found is success), so a second run succeeds
/// and removes nothing.
/// Thread-safety: as thread-safe as the LeftoverSystem.

#include "kproxy/backends/common/leftover_system.h"

namespace kproxy::ipvs {

/// Every IPVS virtual server (as upstream's Flush: only kube-proxy is expected to create them),
/// where the kernel has IPVS. Needs ipvsadm then.
bool cleanUpIpvsLeftovers(backends::LeftoverSystem& system);

/// The kube-ipvs0 dummy interface, as upstream's DeleteDummyDevice: absent is fine; one that is
/// not a dummy device is not ours to delete and is reported.
bool cleanUpDummyInterfaceLeftover(backends::LeftoverSystem& system);

/// The ipsets named KUBE-* (when the ipset tool is installed). Call after the iptables cleanup.
bool cleanUpIpsetLeftovers(backends::LeftoverSystem& system);

}  // namespace kproxy::ipvs
