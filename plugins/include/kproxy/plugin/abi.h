/* kproxy backend plugin ABI, version 1.4.
 *   1.0  the descriptor, the snapshot accessors, logging
 *   1.1  the optional explain entry point (descriptor)
 *   1.2  the endpoint stride (service port), error categories and plugin metrics (host API)
 *   1.3  log lines with their source file and line (host API: log_at)
 *   1.4  histogram plugin metrics (metric spec: buckets; host API: metric_observe)
 *
 * A backend plugin is a shared object exporting one C symbol:
 *
 *     const kproxy_plugin_descriptor* kproxy_plugin_entry(void);
 *
 * The descriptor is static data owned by the plugin. The host checks `abi_version` first and
 * refuses a plugin whose major version differs from KPROXY_PLUGIN_ABI_VERSION.
 *
 * Rules: only C types cross this boundary; no C++ exception may escape a plugin function;
 * strings are NUL-terminated UTF-8; everything the host passes in is borrowed and valid only
 * for the duration of the call. All calls on one kproxy_backend come from one thread at a time.
 *
 * Growth rules (how minor versions extend the ABI without breaking a built plugin or host):
 *  1. Nothing is removed, reordered, resized or given a new meaning; the major version stays 1.
 *     A minor version only appends, and every appended field or entry point is optional.
 *  2. A struct that carries `struct_size` grows by appending fields at its end, after a comment
 *     "appended in ABI 1.N". Whoever allocates the struct sets `struct_size` to the size it
 *     knows; whoever reads it reads a field only when `struct_size` covers the whole field
 *     (offsetof(field) + sizeof(field) <= struct_size) and otherwise uses the documented
 *     default. A `struct_size` smaller than the struct's 1.0 size (KPROXY_*_V1_0_SIZE) is an
 *     error, reported as one, never read past.
 *  3. Arrays of structs are walked with a stride the allocator announces, never with the
 *     reader's sizeof: `kproxy_endpoint` has no size of its own, so `kproxy_service_port`
 *     carries `endpoint_size` (1.2); without it the stride is KPROXY_ENDPOINT_V1_0_SIZE. An
 *     endpoint field appended later is read only when `endpoint_size` covers it. Plugins
 *     built before 1.2 walk endpoints with their own sizeof: a host that appends an endpoint
 *     field hands them (their descriptor does not cover `abi_minor`) arrays in the 1.0 layout.
 *  4. Structs without `struct_size` that a plugin writes into (kproxy_error) grow only behind
 *     an announcement: the writer writes an appended field only when the allocator said it
 *     has it (for kproxy_error: KPROXY_HOST_ERROR_CATEGORY in kproxy_host_api.features).
 *     kproxy_changed_key and kproxy_option never grow; new data comes through a new struct
 *     or entry point.
 *  5. A plugin calls a host function appended to kproxy_host_api only when the table's
 *     `struct_size` covers it and the pointer is not NULL; the host calls a descriptor entry
 *     point only under the same condition. New host functions go after the last appended one.
 */
#ifndef KPROXY_PLUGIN_ABI_H
#define KPROXY_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KPROXY_PLUGIN_ABI_VERSION 1u /* the major version: must match exactly */
#define KPROXY_PLUGIN_ABI_MINOR 4u   /* the minor version this header describes */
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
  /* Fields appended in later versions go here; read them only when the port's
   * `endpoint_size` covers them (growth rule 3). */
} kproxy_endpoint;

/* The size of an ABI 1.0 endpoint: the stride when a service port has no `endpoint_size`. */
#define KPROXY_ENDPOINT_V1_0_SIZE (offsetof(kproxy_endpoint, zone) + sizeof(const char*))

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

  /* ---- appended in ABI 1.2; read only when struct_size covers the field ---- */

  /* The size of one element of the four endpoint arrays above (the host's
   * sizeof(kproxy_endpoint)). Not covered, or 0: KPROXY_ENDPOINT_V1_0_SIZE. Smaller than
   * KPROXY_ENDPOINT_V1_0_SIZE: malformed. */
  uint32_t endpoint_size;
} kproxy_service_port;

#define KPROXY_SERVICE_PORT_V1_0_SIZE offsetof(kproxy_service_port, endpoint_size)

typedef struct kproxy_node_info {
  uint32_t struct_size;
  const char* name;
  const char* zone;
  const char* const* addresses; /* InternalIP/ExternalIP, in the node's order */
  size_t addresses_count;
  const char* const* pod_cidrs;
  size_t pod_cidrs_count;

  /* ---- appended in ABI 1.2; read only when struct_size covers the field ---- */

  /* Where NodePorts answer, as the host decided --nodeport-addresses (upstream's meaning)
   * against the node's interface addresses, or, where it cannot read them (`kproxy explain`),
   * the Node object's. Only with KPROXY_NODEPORT_RESOLVED in `nodeport_flags`, which every
   * host of ABI 1.2 or newer sets; without it (an older host) a backend decides from
   * `addresses` with the same rules. `nodeport_addresses` lists the interface
   * addresses of both families that NodePorts answer on (loopback ones included when a CIDR
   * holds them; a backend may refuse those). With KPROXY_NODEPORT_ALL_LOCAL_IPV4 (_IPV6)
   * NodePorts of that family answer on every local address, including ones added later
   * (upstream's 0.0.0.0/0, or no CIDR of that family); the list then holds those known now. */
  const char* const* nodeport_addresses;
  size_t nodeport_addresses_count;
  uint32_t nodeport_flags; /* KPROXY_NODEPORT_* */
} kproxy_node_info;

/* Flags of kproxy_node_info.nodeport_flags. */
#define KPROXY_NODEPORT_RESOLVED 0x1u
#define KPROXY_NODEPORT_ALL_LOCAL_IPV4 0x2u
#define KPROXY_NODEPORT_ALL_LOCAL_IPV6 0x4u
#define KPROXY_NODE_INFO_V1_0_SIZE (offsetof(kproxy_node_info, pod_cidrs_count) + sizeof(size_t))

typedef struct kproxy_changed_key {
  uint8_t family;
  const char* key;
} kproxy_changed_key;

typedef struct kproxy_option {
  const char* key;
  const char* value;
} kproxy_option;

/* Error categories (kproxy_error.category, ABI 1.2). */
#define KPROXY_ERROR_UNKNOWN 0        /* not said (and what a 1.0/1.1 plugin leaves) */
#define KPROXY_ERROR_KERNEL_REFUSED 1 /* the kernel refused the change (netlink error, ...) */
#define KPROXY_ERROR_INVALID_INPUT 2  /* bad options or data; retrying alone will not help */
#define KPROXY_ERROR_TRANSIENT 3      /* busy, interrupted, out of buffers: worth retrying */

/* Filled by a plugin when a call fails. `message` is one line naming the object or call.
 * Allocated (and zeroed) by the caller, and it has no size field: a plugin writes `category`
 * only when the host announced it (KPROXY_HOST_ERROR_CATEGORY in kproxy_host_api.features,
 * covered by the table's struct_size); on an older host the struct ends after `message`. */
typedef struct kproxy_error {
  int32_t errnum; /* errno, 0 when none applies */
  char message[1024];
  /* ---- appended in ABI 1.2; written only when the host announced it ---- */
  int32_t category; /* KPROXY_ERROR_* */
} kproxy_error;

#define KPROXY_ERROR_V1_0_SIZE offsetof(kproxy_error, category)

typedef struct kproxy_sync_result {
  uint32_t struct_size;
  uint64_t operations; /* kernel objects added, changed or removed */
  char summary[256];   /* one line for the log */
} kproxy_sync_result;

#define KPROXY_SYNC_RESULT_V1_0_SIZE (offsetof(kproxy_sync_result, summary) + 256)

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

/* The size of the explain request as ABI 1.1 introduced it: the smallest a plugin accepts. */
#define KPROXY_EXPLAIN_REQUEST_V1_1_SIZE \
  (offsetof(kproxy_explain_request, input_interface) + sizeof(const char*))

/* Receives the explanation in pieces; the host copies `text[0..len)` before returning. */
typedef void (*kproxy_text_writer)(void* user, const char* text, size_t len);

/* Visitor: return 0 to continue, non-zero to stop. */
typedef int (*kproxy_service_port_visitor)(void* user, const kproxy_service_port* port);

/* Bits of kproxy_host_api.features (ABI 1.2). */
#define KPROXY_HOST_ERROR_CATEGORY 0x1u /* the host allocates and reads kproxy_error.category */

/* Plugin metric types (kproxy_metric_spec.type, ABI 1.2). */
#define KPROXY_METRIC_COUNTER 1
#define KPROXY_METRIC_GAUGE 2
/* ABI 1.4: observed with metric_observe into the spec's buckets. Register one only when the
 * host table covers metric_observe (an older host refuses the type). */
#define KPROXY_METRIC_HISTOGRAM 3

/* A metric a plugin registers with the host (ABI 1.2), served on the host's /metrics. */
typedef struct kproxy_metric_spec {
  uint32_t struct_size; /* sizeof(kproxy_metric_spec), set by the plugin */
  uint32_t type;        /* KPROXY_METRIC_COUNTER or KPROXY_METRIC_GAUGE */
  /* Prometheus metric name: [a-zA-Z_:][a-zA-Z0-9_:]*, not starting with "__" nor with a
   * prefix the host serves itself ("kubeproxy_", "process_", "kproxy_sync_", ...; see
   * plugins/README.md). Name it after the plugin, e.g. "kproxy_nftables_objects". */
  const char* name;
  const char* help;                /* one line */
  const char* const* label_names;  /* each [a-zA-Z_][a-zA-Z0-9_]*, not "__*", no duplicates */
  size_t label_names_count;

  /* ---- appended in ABI 1.4; read only when struct_size covers the field ---- */

  /* KPROXY_METRIC_HISTOGRAM only: the buckets' upper bounds, finite and strictly ascending
   * (+Inf is implied; none: +Inf only). Copied. The host refuses a histogram whose spec does
   * not cover both fields. */
  const double* buckets;
  size_t buckets_count;
} kproxy_metric_spec;

#define KPROXY_METRIC_SPEC_V1_2_SIZE \
  (offsetof(kproxy_metric_spec, label_names_count) + sizeof(size_t))

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

  /* ---- appended in ABI 1.2; use only when struct_size covers the field ---- */

  /* KPROXY_HOST_* bits: what this host supports beyond its struct_size. */
  uint64_t features;

  /* Plugin metrics. The three functions may be called from any thread at any time between a
   * backend's create and destroy (from create on, typically); the host serialises them and
   * reads the values from its HTTP server thread when /metrics is scraped. Values are kept
   * for the life of the process, across backends of the same plugin.
   *
   * Registers a metric and returns its handle (never 0). Registering again with the same
   * name, type, help and label names returns the same handle (a plugin's second backend).
   * Returns 0 and fills `err` (errnum EINVAL) for a bad name or label name, a name the host
   * serves itself, or a name registered with another type, help or labels. */
  uint64_t (*metric_register)(void* host_ctx, const kproxy_metric_spec* spec, kproxy_error* err);
  /* Counter: adds `delta` (>= 0). Gauge: adds `delta` (any sign). `label_values` has one
   * value per label name, in order (copied). KPROXY_ERR for an unknown handle, a wrong count
   * of values, or a negative delta on a counter. */
  int (*metric_add)(void* host_ctx, uint64_t handle, const char* const* label_values,
                    size_t label_values_count, double delta);
  /* Gauge only: sets the value. KPROXY_ERR for a counter and as metric_add. */
  int (*metric_set)(void* host_ctx, uint64_t handle, const char* const* label_values,
                    size_t label_values_count, double value);

  /* Visits every CIDR of every ServiceCIDR object in the cluster (both families, sorted by
   * object name, then CIDR; none when the API server has no ServiceCIDRs or kproxy may not
   * read them). Cluster-wide, not per service port: a change comes as a sync whose `previous`
   * and `next` differ here (possibly with no changed keys). The pointer is valid during the
   * visit. */
  void (*snapshot_service_cidrs)(const kproxy_snapshot* snapshot, kproxy_service_cidr_visitor visit,
                                 void* user);

  /* ---- appended in ABI 1.3; use only when struct_size covers the field ---- */

  /* As `log`, from the plugin's source `file` (as compiled, e.g. __FILE__; borrowed) at
   * `line`: the host writes them in the line's header and matches --vmodule against the file.
   * Any thread. */
  void (*log_at)(void* host_ctx, int level, const char* file, int line, const char* message);

  /* ---- appended in ABI 1.4; use only when struct_size covers the field ---- */

  /* Histogram only (KPROXY_METRIC_HISTOGRAM): counts `value` in its bucket, adds it to the
   * sum. KPROXY_ERR for another type, an unknown handle or a wrong count of values. Any
   * thread, as metric_add. */
  int (*metric_observe)(void* host_ctx, uint64_t handle, const char* const* label_values,
                        size_t label_values_count, double value);
} kproxy_host_api;

/* The size of an ABI 1.0 (and 1.1) host table: the smallest a plugin accepts. */
#define KPROXY_HOST_API_V1_0_SIZE offsetof(kproxy_host_api, features)

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
   * Atomic where the kernel offers transactions (nftables, iptables-restore per table): on
   * KPROXY_ERR the kernel keeps the rules it had. Where it does not (IPVS), every step is
   * idempotent and a failure may leave some steps applied; the host's next sync is then a full
   * one (KPROXY_SYNC_FULL), which must finish or repair them. */
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

  /* ---- appended in ABI 1.2; read only when struct_size covers the field ---- */

  /* KPROXY_PLUGIN_ABI_MINOR of the header the plugin was built against. Not covered: 0 or 1
   * (1 when `explain` is covered). Lets a host keep the layouts an older plugin knows. */
  uint32_t abi_minor;
} kproxy_plugin_descriptor;

/* The size of an ABI 1.0 descriptor (up to `reserved`): the smallest the host accepts. */
#define KPROXY_PLUGIN_DESCRIPTOR_V1_0_SIZE offsetof(kproxy_plugin_descriptor, explain)

typedef const kproxy_plugin_descriptor* (*kproxy_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KPROXY_PLUGIN_ABI_H */
