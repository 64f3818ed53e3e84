/* kproxy backend plugin ABI, version 1 (minor 1.1: the optional explain entry point).
 *
 * A backend plugin is a shared object exporting one C symbol:
 *
 *     const kproxy_plugin_descriptor* kproxy_plugin_entry(void);
 *
 * The descriptor is static data owned by the plugin. The host checks `abi_version` first and
 * refuses a plugin whose version differs from KPROXY_PLUGIN_ABI_VERSION. Structs carry their
 * size so that later minor versions can append fields: read a field only when
 * `struct_size` covers it.
 *
 * Rules: only C types cross this boundary; no C++ exception may escape a plugin function;
 * strings are NUL-terminated UTF-8; everything the host passes in is borrowed and valid only
 * for the duration of the call. All calls on one kproxy_backend come from one thread at a time.
 */
#ifndef KPROXY_PLUGIN_ABI_H
#define KPROXY_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KPROXY_PLUGIN_ABI_VERSION 1u
#define KPROXY_PLUGIN_ENTRY_SYMBOL "kproxy_plugin_entry"

/* Families and protocols, numerically stable. */
#define KPROXY_FAMILY_IPV4 4
#define KPROXY_FAMILY_IPV6 6
#define KPROXY_PROTO_TCP 0
#define KPROXY_PROTO_UDP 1
#define KPROXY_PROTO_SCTP 2
#define KPROXY_SVC_CLUSTER_IP 0
#define KPROXY_SVC_NODE_PORT 1
#define KPROXY_SVC_LOAD_BALANCER 2

/* Log levels for kproxy_host_api.log: 0..9 are info verbosities (-v), then these. */
#define KPROXY_LOG_WARNING (-1)
#define KPROXY_LOG_ERROR (-2)

/* Return codes. */
#define KPROXY_OK 0
#define KPROXY_ERR (-1)

/* Sync flags. */
#define KPROXY_SYNC_FULL 0x1u /* re-read the kernel and reconcile everything */

typedef struct kproxy_snapshot kproxy_snapshot; /* opaque, owned by the host */
typedef struct kproxy_backend kproxy_backend;   /* opaque, owned by the plugin */

typedef struct kproxy_endpoint {
  const char* ip;
  int32_t port;
  uint8_t is_local;
  uint8_t ready;
  uint8_t serving;
  uint8_t terminating;
  const char* node_name; /* "" when unknown */
  const char* zone;      /* "" when unknown */
} kproxy_endpoint;

/* The resolved, node-local state of one service port in one family. */
typedef struct kproxy_service_port {
  uint32_t struct_size;
  uint8_t family;   /* KPROXY_FAMILY_* */
  uint8_t protocol; /* KPROXY_PROTO_* */
  uint8_t type;     /* KPROXY_SVC_* */
  uint8_t session_affinity_client_ip;
  const char* key; /* "namespace/service:port" */
  const char* ns;
  const char* service_name;
  const char* port_name;
  const char* cluster_ip; /* "" when none in this family */
  int32_t port;
  int32_t node_port; /* 0 when none */
  int32_t health_check_node_port;
  int32_t sticky_max_age_seconds;
  uint8_t external_policy_local;
  uint8_t internal_policy_local;
  uint8_t has_any_endpoints;
  uint8_t reserved_flags;
  const char* const* external_ips;
  size_t external_ips_count;
  const char* const* load_balancer_ips;
  size_t load_balancer_ips_count;
  const char* const* load_balancer_source_ranges;
  size_t load_balancer_source_ranges_count;
  const kproxy_endpoint* cluster_endpoints;
  size_t cluster_endpoints_count;
  const kproxy_endpoint* local_endpoints;
  size_t local_endpoints_count;
  const kproxy_endpoint* all_reachable_endpoints;
  size_t all_reachable_endpoints_count;
  const kproxy_endpoint* all_endpoints;
  size_t all_endpoints_count;
} kproxy_service_port;

typedef struct kproxy_node_info {
  uint32_t struct_size;
  const char* name;
  const char* zone;
  const char* const* addresses; /* InternalIP/ExternalIP, in the node's order */
  size_t addresses_count;
  const char* const* pod_cidrs;
  size_t pod_cidrs_count;
} kproxy_node_info;

typedef struct kproxy_changed_key {
  uint8_t family;
  const char* key;
} kproxy_changed_key;

typedef struct kproxy_option {
  const char* key;
  const char* value;
} kproxy_option;

/* Filled by a plugin when a call fails. `message` is one line naming the object or call. */
typedef struct kproxy_error {
  int32_t errnum; /* errno, 0 when none applies */
  char message[1024];
} kproxy_error;

typedef struct kproxy_sync_result {
  uint32_t struct_size;
  uint64_t operations; /* kernel objects added, changed or removed */
  char summary[256];   /* one line for the log */
} kproxy_sync_result;

/* Flags of kproxy_explain_request. */
#define KPROXY_EXPLAIN_FROM_NODE 0x1u /* sent by a process on the node (else: arriving) */
#define KPROXY_EXPLAIN_JSON 0x2u      /* write one JSON object instead of text */

/* The first packet of a new connection, for `explain`. Addresses are numeric, of one family. */
typedef struct kproxy_explain_request {
  uint32_t struct_size;
  uint8_t family;   /* KPROXY_FAMILY_* of both addresses */
  uint8_t protocol; /* KPROXY_PROTO_* */
  uint16_t destination_port;
  uint32_t flags; /* KPROXY_EXPLAIN_* */
  const char* source_ip;
  const char* destination_ip;
  const char* input_interface; /* "" when none (always "" with KPROXY_EXPLAIN_FROM_NODE) */
} kproxy_explain_request;

/* Receives the explanation in pieces; the host copies `text[0..len)` before returning. */
typedef void (*kproxy_text_writer)(void* user, const char* text, size_t len);

/* Visitor: return 0 to continue, non-zero to stop. */
typedef int (*kproxy_service_port_visitor)(void* user, const kproxy_service_port* port);

/* One CIDR of a networking.k8s.io/v1 ServiceCIDR object (ABI 1.2). */
typedef struct kproxy_service_cidr {
  uint32_t struct_size;
  const char* name; /* the ServiceCIDR object's name */
  const char* cidr; /* one of its spec.cidrs, e.g. "10.96.0.0/12" or "fd00:10:96::/112" */
} kproxy_service_cidr;

/* Visitor: return 0 to continue, non-zero to stop. */
typedef int (*kproxy_service_cidr_visitor)(void* user, const kproxy_service_cidr* cidr);

/* Services the host offers to plugins. */
typedef struct kproxy_host_api {
  uint32_t struct_size;
  uint32_t abi_version;
  void* host_ctx;
  /* Writes one log line; level is a -v verbosity (0..9) or KPROXY_LOG_WARNING/ERROR. */
  void (*log)(void* host_ctx, int level, const char* message);
  size_t (*snapshot_size)(const kproxy_snapshot* snapshot);
  const kproxy_node_info* (*snapshot_node)(const kproxy_snapshot* snapshot);
  /* Visits every service port (order unspecified). The pointer is valid during the visit. */
  void (*snapshot_foreach)(const kproxy_snapshot* snapshot, kproxy_service_port_visitor visit,
                           void* user);
  /* Visits the one service port with this key, if present. Returns 1 if found, else 0. */
  int (*snapshot_find)(const kproxy_snapshot* snapshot, uint8_t family, const char* key,
                       kproxy_service_port_visitor visit, void* user);
  void* reserved[8];

  /* ---- appended in ABI 1.2; read only when struct_size covers the field ---- */

  /* Visits every CIDR of every ServiceCIDR object in the cluster (both families, sorted by
   * object name, then CIDR; none when the API server has no ServiceCIDRs or kproxy may not
   * read them). Cluster-wide, not per service port: a change comes as a sync whose `previous`
   * and `next` differ here (possibly with no changed keys). The pointer is valid during the
   * visit. */
  void (*snapshot_service_cidrs)(const kproxy_snapshot* snapshot, kproxy_service_cidr_visitor visit,
                                 void* user);
} kproxy_host_api;

typedef struct kproxy_plugin_descriptor {
  uint32_t abi_version; /* KPROXY_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(kproxy_plugin_descriptor) */
  const char* name;     /* the --proxy-mode value, e.g. "nftables" */
  const char* version;  /* the plugin's own version */
  const char* description;

  /* Creates a backend. `options` are kproxy's effective settings as strings (see
   * docs in plugins/README.md: "node-name", "cluster-cidr", "masquerade-all", "dry-run", ...);
   * unknown keys must be ignored. Returns NULL and fills `err` on failure. */
  kproxy_backend* (*create)(const kproxy_host_api* host, const kproxy_option* options,
                            size_t options_count, kproxy_error* err);
  /* Makes the kernel match `next`. `previous` is the last snapshot this backend applied
   * successfully (NULL on the first call); `changed` lists the keys that differ between them.
   * With KPROXY_SYNC_FULL the plugin must reconcile everything against the kernel.
   * Atomic: on KPROXY_ERR the kernel keeps the rules it had. */
  int (*sync)(kproxy_backend* backend, const kproxy_snapshot* previous,
              const kproxy_snapshot* next, const kproxy_changed_key* changed,
              size_t changed_count, uint32_t flags, kproxy_sync_result* result,
              kproxy_error* err);
  /* Removes every kernel object this backend creates. Safe to call twice. */
  int (*cleanup)(kproxy_backend* backend, kproxy_error* err);
  void (*destroy)(kproxy_backend* backend);

  void* reserved[8];

  /* ---- appended in ABI 1.1; read only when struct_size covers the field ---- */

  /* Optional (NULL: the backend cannot explain). Says where `request`'s packet would go under
   * what this backend would program for `snapshot`, writing text (or JSON) through `write`.
   * Never touches the kernel. Returns KPROXY_ERR and fills `err` when it cannot answer (a bad
   * request, no support); what was written before the error is to be ignored. */
  int (*explain)(kproxy_backend* backend, const kproxy_snapshot* snapshot,
                 const kproxy_explain_request* request, kproxy_text_writer write,
                 void* write_user, kproxy_error* err);
} kproxy_plugin_descriptor;

/* The size of an ABI 1.0 descriptor (up to `reserved`): the smallest the host accepts. */
#define KPROXY_PLUGIN_DESCRIPTOR_V1_0_SIZE offsetof(kproxy_plugin_descriptor, explain)

typedef const kproxy_plugin_descriptor* (*kproxy_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KPROXY_PLUGIN_ABI_H */
