/* The layout of the ebpf mode's maps, shared by the BPF programs (kproxy_sock.bpf.c) and the
 * plugin (kernel_libbpf.cpp, renderer.cpp). Plain C, no includes: each side brings its own
 * __u8/__u16/__u32/__u64 (vmlinux.h in BPF, <linux/types.h> in C++) before including it.
 *
 * Addresses are 16 bytes in network order; an IPv4 address fills the first 4 and leaves the
 * rest zero. Ports are in network order, as the sock_addr context holds them. Every struct is
 * laid out without implicit padding, so that keys compare byte for byte. */
#ifndef KPROXY_EBPF_MAP_LAYOUT_H
#define KPROXY_EBPF_MAP_LAYOUT_H

#define KPROXY_FAMILY_IPV4 4
#define KPROXY_FAMILY_IPV6 6

/* The service's internal traffic (a ClusterIP) with internalTrafficPolicy Local: pick among
 * the local slots, not the cluster ones. */
#define KPROXY_SERVICE_LOCAL_POOL 0x1u
/* ClientIP session affinity: remember the choice per client in the affinity map. */
#define KPROXY_SERVICE_AFFINITY 0x2u

/* Slots of the local pool start here; the cluster pool's start at 0. Two ranges, so that a
 * change of one pool never renumbers the other's slots. */
#define KPROXY_LOCAL_SLOT_BASE 0x10000u
/* At most this many endpoints per pool. */
#define KPROXY_MAX_POOL 0xffffu

/* What a connect or datagram to a service without endpoints fails with: ECONNREFUSED (the
 * program's return 0 alone would give EPERM). The plugin's explain says the same. */
#define KPROXY_ECONNREFUSED 111

/* services: (address, port, protocol) of a ClusterIP, externalIP, LoadBalancer IP or NodePort. */
struct kproxy_lb_service_key {
  __u8 address[16];
  __u16 port;     /* network order */
  __u8 protocol;  /* IPPROTO_TCP, IPPROTO_UDP */
  __u8 family;    /* KPROXY_FAMILY_* */
};

/* No endpoint in the pool the flags choose (count 0): the connect or datagram is refused. */
struct kproxy_lb_service_value {
  __u32 id;           /* the service port's id: the slots' and the affinity's key */
  __u16 count;        /* slots of the cluster pool: 0 .. count-1 */
  __u16 local_count;  /* slots of the local pool: KPROXY_LOCAL_SLOT_BASE .. + local_count-1 */
  __u32 flags;        /* KPROXY_SERVICE_* */
  __u32 affinity_timeout; /* seconds, with KPROXY_SERVICE_AFFINITY */
};

struct kproxy_lb_slot_key {
  __u32 service_id;
  __u32 slot;
};

struct kproxy_lb_endpoint {
  __u8 address[16];
  __u16 port;  /* network order */
  __u8 family;
  __u8 pad;
};

/* affinity (LRU): the client, as its network namespace (a pod; the node's processes share
 * one), and the service port. */
struct kproxy_lb_affinity_key {
  __u64 netns_cookie;
  __u32 service_id;
  __u32 pad;
};

struct kproxy_lb_affinity_value {
  struct kproxy_lb_endpoint endpoint;
  __u32 slot;
  __u64 last_used_ns; /* bpf_ktime_get_ns() */
};

/* reverse (LRU): for a socket and the endpoint it was steered to, the service address it
 * asked for; recvmsg and getpeername answer with it. */
struct kproxy_lb_reverse_key {
  __u64 socket_cookie;
  struct kproxy_lb_endpoint endpoint;
  __u32 pad;
};

struct kproxy_lb_reverse_value {
  struct kproxy_lb_endpoint service;
};

/* The stale-socket passes (iter/udp): what the listing pass writes for each connected UDP
 * socket with a reverse element, i.e. one the connect hook steered to `endpoint`. */
struct kproxy_lb_socket_record {
  __u64 socket_cookie;
  struct kproxy_lb_endpoint local;     /* the socket's own address and port */
  struct kproxy_lb_endpoint service;   /* what it connected to (the reverse element's value) */
  struct kproxy_lb_endpoint endpoint;  /* its peer */
  __u32 pad;
};

/* destroy: socket cookie -> the endpoint it must still be connected to, for the ending pass;
 * the plugin fills it with the stale sockets of one listing, at most this many at a time, and
 * empties it after the pass. The ending pass writes each ended socket's cookie (a __u64). */
#define KPROXY_DESTROY_BATCH 4096

#endif
