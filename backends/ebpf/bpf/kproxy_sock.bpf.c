// SPDX-License-Identifier: GPL-2.0
/* ebpf mode's data path: socket-level load balancing on cgroup v2 hooks. A connect, or a
 * datagram sent without one, to a service address is given an endpoint's address before the
 * kernel routes it; nothing is rewritten per packet and no conntrack entry names the service.
 *   connect4/6      TCP and UDP connect (connect6 also to IPv4-mapped addresses)
 *   sendmsg4/6      unconnected UDP
 *   recvmsg4/6      UDP replies are reported from the service address
 *   getpeername4/6  answers the service address
 *   sock_release    a connected socket's reverse translation goes with the socket
 *   iter/udp        (two passes, run by the plugin after a sync) lists connected UDP sockets
 *                   steered to an endpoint, and ends those the plugin names (bpf_sock_destroy)
 * The maps' layout is map_layout.h; the plugin writes services and slots, these programs write
 * affinity and reverse. The plugin writes a service's slots before its counts, so a lookup here
 * never finds a count larger than the slots written. */
#include "vmlinux.h"

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "map_layout.h"

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __uint(max_entries, 524288);
  __type(key, struct kproxy_lb_service_key);
  __type(value, struct kproxy_lb_service_value);
} kproxy_services SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __uint(max_entries, 4194304);
  __type(key, struct kproxy_lb_slot_key);
  __type(value, struct kproxy_lb_endpoint);
} kproxy_slots SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 65536);
  __type(key, struct kproxy_lb_affinity_key);
  __type(value, struct kproxy_lb_affinity_value);
} kproxy_affinity SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 131072);
  __type(key, struct kproxy_lb_reverse_key);
  __type(value, struct kproxy_lb_reverse_value);
} kproxy_reverse SEC(".maps");

enum steer_result { NOT_A_SERVICE, STEERED, REFUSED };

static __always_inline int same_endpoint(const struct kproxy_lb_endpoint *a, const struct kproxy_lb_endpoint *b) {
  return __builtin_memcmp(a, b, sizeof(*a)) == 0;
}

/* Chooses the endpoint for `key` into `out`: the client's affinity while it lasts and its slot
 * still holds that endpoint, else a random slot of the pool the service's flags name. */
static __always_inline enum steer_result choose(void *ctx, const struct kproxy_lb_service_key *key,
                                                struct kproxy_lb_endpoint *out) {
  struct kproxy_lb_service_value *svc = bpf_map_lookup_elem(&kproxy_services, key);
  if (!svc) return NOT_A_SERVICE;
  const __u32 local = svc->flags & KPROXY_SERVICE_LOCAL_POOL;
  const __u32 count = local ? svc->local_count : svc->count;
  const __u32 base = local ? KPROXY_LOCAL_SLOT_BASE : 0;
  if (count == 0) return REFUSED;

  struct kproxy_lb_slot_key slot_key = {.service_id = svc->id};
  struct kproxy_lb_affinity_key affinity_key = {};
  const int affinity = (svc->flags & KPROXY_SERVICE_AFFINITY) != 0;
  const __u64 now = bpf_ktime_get_ns();
  if (affinity) {
    affinity_key.netns_cookie = bpf_get_netns_cookie(ctx);
    affinity_key.service_id = svc->id;
    struct kproxy_lb_affinity_value *kept = bpf_map_lookup_elem(&kproxy_affinity, &affinity_key);
    if (kept && now - kept->last_used_ns < (__u64)svc->affinity_timeout * 1000000000ull) {
      slot_key.slot = kept->slot;
      struct kproxy_lb_endpoint *ep = bpf_map_lookup_elem(&kproxy_slots, &slot_key);
      if (ep && same_endpoint(ep, &kept->endpoint) && kept->slot - base < count) {
        kept->last_used_ns = now;
        *out = *ep;
        return STEERED;
      }
    }
  }
  slot_key.slot = base + bpf_get_prandom_u32() % count;
  struct kproxy_lb_endpoint *ep = bpf_map_lookup_elem(&kproxy_slots, &slot_key);
  if (!ep) return REFUSED; /* a slot below the count is always written first */
  *out = *ep;
  if (affinity) {
    struct kproxy_lb_affinity_value value = {.endpoint = *ep, .slot = slot_key.slot, .last_used_ns = now};
    bpf_map_update_elem(&kproxy_affinity, &affinity_key, &value, BPF_ANY);
  }
  return STEERED;
}

/* Remembers that this socket's traffic with `endpoint` stands for `service`. */
static __always_inline void remember(void *ctx, const struct kproxy_lb_endpoint *endpoint,
                                     const struct kproxy_lb_service_key *service) {
  struct kproxy_lb_reverse_key key = {.socket_cookie = bpf_get_socket_cookie(ctx), .endpoint = *endpoint};
  struct kproxy_lb_reverse_value value = {};
  __builtin_memcpy(value.service.address, service->address, sizeof(value.service.address));
  value.service.port = service->port;
  value.service.family = service->family;
  bpf_map_update_elem(&kproxy_reverse, &key, &value, BPF_ANY);
}

static __always_inline int translatable(const struct bpf_sock_addr *ctx) {
  return ctx->protocol == IPPROTO_TCP || ctx->protocol == IPPROTO_UDP;
}

static __always_inline void key4(const struct bpf_sock_addr *ctx, struct kproxy_lb_service_key *key) {
  __u32 ip = ctx->user_ip4;
  __builtin_memcpy(key->address, &ip, 4);
  key->port = (__u16)ctx->user_port;
  key->protocol = (__u8)ctx->protocol;
  key->family = KPROXY_FAMILY_IPV4;
}

static __always_inline void key6(const struct bpf_sock_addr *ctx, struct kproxy_lb_service_key *key) {
  __u32 ip[4] = {ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]};
  __builtin_memcpy(key->address, ip, 16);
  key->port = (__u16)ctx->user_port;
  key->protocol = (__u8)ctx->protocol;
  key->family = KPROXY_FAMILY_IPV6;
}

static __always_inline void write4(struct bpf_sock_addr *ctx, const struct kproxy_lb_endpoint *ep) {
  __u32 ip;
  __builtin_memcpy(&ip, ep->address, 4);
  ctx->user_ip4 = ip;
  ctx->user_port = ep->port;
}

static __always_inline void write6(struct bpf_sock_addr *ctx, const struct kproxy_lb_endpoint *ep) {
  __u32 ip[4];
  __builtin_memcpy(ip, ep->address, 16);
  ctx->user_ip6[0] = ip[0];
  ctx->user_ip6[1] = ip[1];
  ctx->user_ip6[2] = ip[2];
  ctx->user_ip6[3] = ip[3];
  ctx->user_port = ep->port;
}

/* An IPv6 socket reaches IPv4 addresses in their IPv4-mapped form (::ffff:a.b.c.d), as
 * dual-stack clients (Java's, for one) do. The connect6, recvmsg6 and getpeername6 hooks see
 * that form; a datagram sent to it meets sendmsg4 (the kernel sends it as IPv4). The maps and
 * the reverse elements hold the IPv4 form, whichever hook wrote them. Reads an address that
 * key6() copied, not the context (the verifier refuses a context pointer moved to an array's
 * element). */
static __always_inline int v4mapped(const __u8 *address) {
  __u32 w[3];
  __builtin_memcpy(w, address, 12);
  return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0xffff);
}

/* IPv4-mapped to IPv4 in place: the 4 bytes first, the rest zero (the maps' IPv4 form). */
static __always_inline void unmap(__u8 *address, __u8 *family) {
  __builtin_memmove(address, address + 12, 4);
  __builtin_memset(address + 4, 0, 12);
  *family = KPROXY_FAMILY_IPV4;
}

/* IPv4 to IPv4-mapped, into an IPv6 socket's context. */
static __always_inline void write_mapped(struct bpf_sock_addr *ctx, const struct kproxy_lb_endpoint *ep) {
  struct kproxy_lb_endpoint mapped = {.port = ep->port, .family = KPROXY_FAMILY_IPV6};
  __builtin_memcpy(mapped.address + 12, ep->address, 4);
  mapped.address[10] = 0xff;
  mapped.address[11] = 0xff;
  write6(ctx, &mapped);
}

/* connect and sendmsg: steer, or refuse a service without endpoints with ECONNREFUSED (the
 * program's return 0 alone would give EPERM). */
static __always_inline int steer(struct bpf_sock_addr *ctx, int v6) {
  if (!translatable(ctx)) return 1;
  struct kproxy_lb_service_key key = {};
  if (v6)
    key6(ctx, &key);
  else
    key4(ctx, &key);
  const int mapped = v6 && v4mapped(key.address);
  if (mapped) unmap(key.address, &key.family);
  struct kproxy_lb_endpoint ep = {};
  switch (choose(ctx, &key, &ep)) {
    case NOT_A_SERVICE: return 1;
    case REFUSED: bpf_set_retval(-KPROXY_ECONNREFUSED); return 0;
    case STEERED: break;
  }
  if (mapped)
    write_mapped(ctx, &ep);
  else if (v6)
    write6(ctx, &ep);
  else
    write4(ctx, &ep);
  remember(ctx, &ep, &key);
  return 1;
}

/* recvmsg and getpeername: an endpoint this socket was steered to is reported as the service. */
static __always_inline int unsteer(struct bpf_sock_addr *ctx, int v6) {
  struct kproxy_lb_reverse_key key = {.socket_cookie = bpf_get_socket_cookie(ctx)};
  struct kproxy_lb_service_key peer = {};
  if (v6)
    key6(ctx, &peer);
  else
    key4(ctx, &peer);
  const int mapped = v6 && v4mapped(peer.address);
  if (mapped) unmap(peer.address, &peer.family);
  __builtin_memcpy(key.endpoint.address, peer.address, sizeof(key.endpoint.address));
  key.endpoint.port = peer.port;
  key.endpoint.family = peer.family;
  struct kproxy_lb_reverse_value *rev = bpf_map_lookup_elem(&kproxy_reverse, &key);
  if (!rev) return 1;
  if (mapped)
    write_mapped(ctx, &rev->service);
  else if (v6)
    write6(ctx, &rev->service);
  else
    write4(ctx, &rev->service);
  return 1;
}

SEC("cgroup/connect4") int kproxy_connect4(struct bpf_sock_addr *ctx) { return steer(ctx, 0); }
SEC("cgroup/connect6") int kproxy_connect6(struct bpf_sock_addr *ctx) { return steer(ctx, 1); }
SEC("cgroup/sendmsg4") int kproxy_sendmsg4(struct bpf_sock_addr *ctx) { return steer(ctx, 0); }
SEC("cgroup/sendmsg6") int kproxy_sendmsg6(struct bpf_sock_addr *ctx) { return steer(ctx, 1); }
SEC("cgroup/recvmsg4") int kproxy_recvmsg4(struct bpf_sock_addr *ctx) { return unsteer(ctx, 0); }
SEC("cgroup/recvmsg6") int kproxy_recvmsg6(struct bpf_sock_addr *ctx) { return unsteer(ctx, 1); }
SEC("cgroup/getpeername4") int kproxy_getpeername4(struct bpf_sock_addr *ctx) { return unsteer(ctx, 0); }
SEC("cgroup/getpeername6") int kproxy_getpeername6(struct bpf_sock_addr *ctx) { return unsteer(ctx, 1); }

#define KPROXY_AF_INET 2
#define KPROXY_AF_INET6 10

/* A connected socket (TCP, connected UDP) is connected to the endpoint it was steered to, so
 * its reverse element is (its cookie, its peer): deleted when the socket is released, the map
 * holds the sockets that are open, not every socket since the LRU's last eviction. An
 * unconnected UDP socket's elements (one per endpoint it sent to) stay until evicted. */
SEC("cgroup/sock_release") int kproxy_sock_release(struct bpf_sock *sk) {
  if (sk->protocol != IPPROTO_TCP && sk->protocol != IPPROTO_UDP) return 1;
  struct kproxy_lb_reverse_key key = {.socket_cookie = bpf_get_socket_cookie(sk)};
  if (sk->family == KPROXY_AF_INET) {
    __u32 ip = sk->dst_ip4;
    if (ip == 0) return 1;
    __builtin_memcpy(key.endpoint.address, &ip, 4);
    key.endpoint.family = KPROXY_FAMILY_IPV4;
  } else if (sk->family == KPROXY_AF_INET6) {
    __u32 ip[4] = {sk->dst_ip6[0], sk->dst_ip6[1], sk->dst_ip6[2], sk->dst_ip6[3]};
    if ((ip[0] | ip[1] | ip[2] | ip[3]) == 0) return 1;
    __builtin_memcpy(key.endpoint.address, ip, 16);
    key.endpoint.family = KPROXY_FAMILY_IPV6;
    if (v4mapped(key.endpoint.address)) unmap(key.endpoint.address, &key.endpoint.family);
  } else {
    return 1;
  }
  key.endpoint.port = sk->dst_port;
  if (key.endpoint.port == 0) return 1;
  bpf_map_delete_elem(&kproxy_reverse, &key);
  return 1;
}

/* The stale-socket passes. A connected UDP socket keeps the endpoint its connect was steered
 * to for as long as it lives; when the endpoint stops serving, the plugin ends the socket
 * (its pending error is ECONNABORTED, which the application's next receive gets; a send on
 * it fails with EDESTADDRREQ, as it is no longer connected; its next connect is steered
 * anew). The plugin decides which are stale, with the conntrack cleaner's rule: these
 * programs only report and end. Both are loaded only where the kernel has bpf_sock_destroy
 * (Linux 6.5+), and run once per network namespace (an iterator walks its reader's). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, KPROXY_DESTROY_BATCH);
  __type(key, __u64);
  __type(value, struct kproxy_lb_endpoint);
} kproxy_destroy SEC(".maps");

extern int bpf_sock_destroy(struct sock_common *sk) __weak __ksym;

#define KPROXY_TCP_ESTABLISHED 1

/* A connected UDP socket's peer and own address (IPv4-mapped ones in the IPv4 form); 0 for an
 * unconnected one or another family. */
static __always_inline int udp_peer(const struct sock *sk, struct kproxy_lb_endpoint *peer,
                                    struct kproxy_lb_endpoint *local) {
  const struct sock_common *c = &sk->__sk_common;
  if (c->skc_state != KPROXY_TCP_ESTABLISHED) return 0;
  if (c->skc_family == KPROXY_AF_INET) {
    __u32 ip = c->skc_daddr;
    __builtin_memcpy(peer->address, &ip, 4);
    ip = c->skc_rcv_saddr;
    __builtin_memcpy(local->address, &ip, 4);
    peer->family = local->family = KPROXY_FAMILY_IPV4;
  } else if (c->skc_family == KPROXY_AF_INET6) {
    __u32 ip[4] = {c->skc_v6_daddr.in6_u.u6_addr32[0], c->skc_v6_daddr.in6_u.u6_addr32[1],
                   c->skc_v6_daddr.in6_u.u6_addr32[2], c->skc_v6_daddr.in6_u.u6_addr32[3]};
    __builtin_memcpy(peer->address, ip, 16);
    __u32 own[4] = {c->skc_v6_rcv_saddr.in6_u.u6_addr32[0], c->skc_v6_rcv_saddr.in6_u.u6_addr32[1],
                    c->skc_v6_rcv_saddr.in6_u.u6_addr32[2], c->skc_v6_rcv_saddr.in6_u.u6_addr32[3]};
    __builtin_memcpy(local->address, own, 16);
    peer->family = local->family = KPROXY_FAMILY_IPV6;
    /* Connected to an IPv4-mapped address: its reverse element holds the IPv4 form. */
    if (v4mapped(peer->address)) {
      unmap(peer->address, &peer->family);
      unmap(local->address, &local->family);
    }
  } else {
    return 0;
  }
  peer->port = c->skc_dport;
  local->port = bpf_htons(c->skc_num);
  return peer->port != 0;
}

/* Pass one: a record per connected UDP socket whose (cookie, peer) has a reverse element. */
SEC("iter/udp") int kproxy_list_steered_udp(struct bpf_iter__udp *ctx) {
  struct sock *sk = (struct sock *)ctx->udp_sk;
  if (!sk) return 0;
  struct kproxy_lb_socket_record record = {};
  if (!udp_peer(sk, &record.endpoint, &record.local)) return 0;
  struct kproxy_lb_reverse_key key = {.socket_cookie = bpf_get_socket_cookie(sk), .endpoint = record.endpoint};
  struct kproxy_lb_reverse_value *rev = bpf_map_lookup_elem(&kproxy_reverse, &key);
  if (!rev) return 0;
  record.socket_cookie = key.socket_cookie;
  record.service = rev->service;
  bpf_seq_write(ctx->meta->seq, &record, sizeof(record));
  return 0;
}

/* Pass two: ends each socket the destroy map names, if it is still connected to the endpoint
 * the listing saw (a socket may have connected elsewhere since), drops its reverse element
 * (the socket is disconnected now: sock_release would not find it) and writes its cookie. */
SEC("iter/udp") int kproxy_end_stale_udp(struct bpf_iter__udp *ctx) {
  struct sock *sk = (struct sock *)ctx->udp_sk;
  if (!sk) return 0;
  struct kproxy_lb_reverse_key key = {};
  struct kproxy_lb_endpoint local = {};
  if (!udp_peer(sk, &key.endpoint, &local)) return 0;
  key.socket_cookie = bpf_get_socket_cookie(sk);
  struct kproxy_lb_endpoint *expected = bpf_map_lookup_elem(&kproxy_destroy, &key.socket_cookie);
  if (!expected || !same_endpoint(expected, &key.endpoint)) return 0;
  if (bpf_sock_destroy((struct sock_common *)sk) != 0) return 0;
  bpf_map_delete_elem(&kproxy_reverse, &key);
  bpf_seq_write(ctx->meta->seq, &key.socket_cookie, sizeof(key.socket_cookie));
  return 0;
}

char LICENSE[] SEC("license") = "GPL";
