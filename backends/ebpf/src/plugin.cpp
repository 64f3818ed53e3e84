// The plugin entry point: --proxy-mode=ebpf.
#include "kproxy/ebpf/backend.h"
#include "kproxy/plugin/sdk.h"

KPROXY_DEFINE_PLUGIN("ebpf", "0.1.0",
                     "socket-level load balancing on cgroup v2 BPF hooks (libbpf): no per-packet NAT for the node's own traffic",
                     kproxy::ebpf::makeEbpfBackend)
