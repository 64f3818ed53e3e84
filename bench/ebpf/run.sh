#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# ebpf mode's socket-level load balancing against the netfilter modes' DNAT (nftables, iptables),
# in the same run, pod -> ClusterIP -> 2 endpoints, with S Services loaded (one measured, the
# rest filler Services with an endpoint each, from a --manifests directory), all in throw-away
# network namespaces (scripts/netns-lib.sh). For each mode and each S:
#   - kproxy-bench-connrate (bench/userspace): short connections by 8 clients at once for
#     SECONDS: requests per second, and connect-to-first-byte p50/p99; with KP_BENCH_REQUESTS=R
#     (default 1), R requests on each connection instead (the last R - 1 kept-alive, so that
#     the figures weigh a packet's path through an established connection more than its set-up):
#     requests per second, and each request's time to its reply's first byte;
#   - CPU per connection: the machine's busy CPU time over the measurement (/proc/stat: user,
#     nice, system, irq and softirq of every CPU, which is where the data path's per-packet
#     work lands), divided by the requests answered (one per connection by default); on a
#     machine that runs nothing else, the cost of a connection (or a request) through that
#     mode, client and server included;
#   - the conntrack entries whose original destination is the ClusterIP, after the run, in the
#     client pod's network namespace and in the node's (where the netfilter modes DNAT), and all
#     of the node's entries (ct_node_all in the result lines);
#   - the proxy's peak resident set (VmHWM) at the end of the run;
#   - the same pod's connections to the first endpoint's own address, on a second server of its
#     pod (DIRECT_PORT; poddirect, in the result lines only): what the ClusterIP costs above it
#     is the mode's service path alone (bench/ebpf/repeat.sh sets them side by side over rounds).
# The modes upstream-nftables and upstream-iptables run upstream kube-proxy (v1.34, built by
# tests/e2e/build-control-plane.sh kube-proxy into ~/.cache/kproxy/bin) instead, in the same
# topology with the same objects: a real kube-apiserver + etcd (tests/e2e/control-plane.sh),
# started once in a network namespace of its own when the first upstream run comes, is made to
# hold the very manifest files kproxy is given (bench/api/sync_manifests.py: only the difference
# to what it holds, so the objects of one S serve both upstream modes), and kube-proxy, in the
# node namespace joined to the control plane's by a veth, reads them from it, with kproxy's
# settings (kp_kproxy_args: hostname, --cluster-cidr, bind addresses) and a kubeconfig instead of
# --manifests. Its readiness is timed from its start, as kproxy's, the objects already loaded;
# how long the loads took is printed after the tables.
# The client pod's process runs in a cgroup of the benchmark's, the one ebpf mode's programs go
# on (--ebpf-cgroup-path); the pins go on a bpffs mounted in the benchmark's own mount namespace
# (scripts/ebpf-lib.sh). Every mode runs on a fresh topology, torn down after it, as are the
# cgroups and the bpffs when the script exits, also on failure.
#
# A mode that does not answer within KP_BENCH_READY_S seconds (default 120) is reported as not
# ready, with the time waited, and the script goes on. Every network namespace, the control
# plane included, goes when the script exits, also on failure.
#
# usage: bench/ebpf/run.sh [--kproxy BIN] [--plugin-dir DIR] [SECONDS [S...]]
#   SECONDS per measurement (default 10); S, the Service counts (default 1000). Run as root.
#   KP_BENCH_MODES: the modes (default "ebpf nftables iptables userspace upstream-nftables
#   upstream-iptables"; the upstream modes are left out of the default, with a warning, when
#   kube-proxy, kube-apiserver or etcd is not there). KUBE_PROXY_BIN: upstream's kube-proxy.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$HERE/../../scripts/netns-lib.sh"
# shellcheck source=../../scripts/ebpf-lib.sh
source "$HERE/../../scripts/ebpf-lib.sh"
# shellcheck source=../../tests/e2e/control-plane.sh
source "$HERE/../../tests/e2e/control-plane.sh"
kp_require_root
kp_ebpf_reexec "$0" "$@"
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SECS="${1:-10}"
shift || true
COUNTS=("$@")
[[ ${#COUNTS[@]} -gt 0 ]] || COUNTS=(1000)
read -ra MODES <<<"${KP_BENCH_MODES:-ebpf nftables iptables userspace upstream-nftables upstream-iptables}"
CONNRATE="${CONNRATE:-$KP_SOURCE_DIR/build/bench/userspace/kproxy-bench-connrate}"
HTTP_IP=10.96.0.101
HTTP_NODE_PORT=30080
# pod1's port for the client pod's direct connections (no Service names it).
DIRECT_PORT=8082
CLIENTS=8
REQUESTS="${KP_BENCH_REQUESTS:-1}"
[[ $REQUESTS =~ ^[1-9][0-9]*$ ]] || kp_die "KP_BENCH_REQUESTS must be a whole number of 1 or more"
# Each server thread serves one connection at a time: with kept-alive connections every client
# needs one of its own (each pod may get all of them), or its requests wait in the backlog.
SERVER_THREADS=2
((REQUESTS > 1)) && SERVER_THREADS=$CLIENTS
READY_S="${KP_BENCH_READY_S:-120}"
UPSTREAM="${KUBE_PROXY_BIN:-$KPROXY_CACHE/bin/kube-proxy}"
# The control plane's end of its veth to the node, and the node's.
CP_IP=10.255.0.1
CP_NODE_IP=10.255.0.2

command -v conntrack >/dev/null || kp_die "conntrack not installed"
[[ -x "$CONNRATE" ]] || kp_die "$CONNRATE not built (cmake --build build --target kproxy-bench-connrate)"
kp_kproxy_bin >/dev/null || kp_die "kproxy binary not found (--kproxy BIN)"
if [[ " ${MODES[*]} " == *" upstream-"* ]]; then
  missing=""
  [[ -x "$UPSTREAM" ]] || missing="kube-proxy ($UPSTREAM)"
  cp_apiserver_bin >/dev/null 2>&1 || missing+="${missing:+, }kube-apiserver"
  cp_etcd_bin >/dev/null 2>&1 || missing+="${missing:+, }etcd"
  if [[ -n "$missing" ]]; then
    msg="not found: $missing (tests/e2e/build-control-plane.sh all; tests/e2e/build-control-plane.sh kube-proxy)"
    [[ -n "${KP_BENCH_MODES:-}" ]] && kp_die "$msg"
    kp_log "WARNING: $msg: the upstream modes are left out"
    read -ra MODES <<<"${MODES[*]//upstream-*/}"
  fi
fi
# Userspace mode holds a socket for each Service port: at 30,000 Services it needs more
# descriptors than a login shell's limit allows (20,000 on some machines), as a node's container
# runtime gives its pods (LimitNOFILE). The benchmark's processes get the system's ceiling.
nr_open=$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)
ulimit -Hn "$nr_open" 2>/dev/null && ulimit -Sn "$nr_open" 2>/dev/null ||
  kp_log "WARNING: the open-file limit stays at $(ulimit -Sn): userspace mode may not serve many Services"
kp_ebpf_mount "kproxy-bench-$$" || { kp_ebpf_unmount; kp_die "$KP_EBPF_ERROR"; }
BENCH_DIR="$(mktemp -d "${TMPDIR:-/tmp}/kproxy-bench-ebpf.XXXXXX")"
RESULTS="$BENCH_DIR/results"
API_LOADS="$BENCH_DIR/api-loads"
touch "$RESULTS" "$API_LOADS"
CP_NS=""
CP_STATE=""  # "", up or failed
API_S=""     # the S whose objects the apiserver holds
# The control plane goes first: its namespace, then the cgroups, then the files.
bench_cleanup() {
  local pid
  cp_stop
  if [[ -n "$CP_NS" ]]; then
    for pid in $(ip netns pids "$CP_NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$CP_NS" 2>/dev/null
  fi
  kp_ebpf_unmount
  rm -rf "$BENCH_DIR"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The pods: pod1 and pod2 are the measured Service's endpoints, pod3 the client. The client's
# processes run in the cgroup `client`, all others in `rest` (no programs there).
bench_cgroup_of() {
  case "$1" in
    pod3) echo "$KP_EBPF_TOP_CGROUP/$KP_BENCH_RUN/client" ;;
    *) echo "$KP_EBPF_TOP_CGROUP/$KP_BENCH_RUN/rest" ;;
  esac
}
KP_CGROUP_OF=bench_cgroup_of

# filler_manifest S — S - 1 Services 10.100.x.y:80 -> 8081 (64,000 to a second octet, then
# 10.101.x.y, ...), each with pod1 as its endpoint.
filler_manifest() {
  awk -v n="$(($1 - 1))" -v ep="$(kp_pod_ip 1)" -v node="$KP_NODE_NAME" 'BEGIN {
    for (i = 0; i < n; i++) {
      ip = sprintf("10.%d.%d.%d", 100 + int(i / 64000), int(i / 250) % 256, i % 250 + 1)
      printf "---\napiVersion: v1\nkind: Service\nmetadata:\n  namespace: filler\n  name: s%d\nspec:\n  type: ClusterIP\n  clusterIP: %s\n  clusterIPs: [%s]\n  ipFamilies: [IPv4]\n  ports:\n  - name: http\n    protocol: TCP\n    port: 80\n    targetPort: 8081\n", i, ip, ip
      printf "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: filler\n  name: s%d-abcde\n  labels:\n    kubernetes.io/service-name: s%d\naddressType: IPv4\nports:\n- name: http\n  protocol: TCP\n  port: 8081\nendpoints:\n- addresses: [%s]\n  nodeName: %s\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n", i, i, ep, node
    }
  }'
}

# busy_jiffies — the busy time of every CPU so far (user, nice, system, irq, softirq), in jiffies.
busy_jiffies() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }

# measure ROLE IP PORT PREFIX — kproxy-bench-connrate from ROLE's namespace to IP:PORT for SECS
# seconds: "PREFIX_rate=… PREFIX_failures=… PREFIX_p50_us=… PREFIX_p99_us=… PREFIX_cpu_us=…".
measure() {
  local role="$1" ip="$2" port="$3" prefix="$4" out busy0 busy1 kv
  busy0=$(busy_jiffies)
  out="$(kp_exec "$role" "$CONNRATE" client "$ip" "$port" "$SECS" "$CLIENTS" "$REQUESTS" 2>&1)"
  busy1=$(busy_jiffies)
  local -A got=()
  for kv in $out; do [[ $kv == *=* ]] && got[${kv%%=*}]=${kv#*=}; done
  local cpu
  # USER_HZ, 100 on Linux: the test VM's busybox has no getconf.
  cpu=$(awk -v j=$((busy1 - busy0)) -v hz="$(getconf CLK_TCK 2>/dev/null || echo 100)" -v n="${got[requests]:-0}" \
    'BEGIN { if (n > 0) printf "%.0f", j / hz * 1e6 / n; else print "?" }')
  echo "${prefix}_rate=${got[rate]:-?} ${prefix}_failures=${got[failures]:-?} ${prefix}_p50_us=${got[p50_us]:-?} ${prefix}_p99_us=${got[p99_us]:-?} ${prefix}_cpu_us=$cpu"
}

# connrate_ok — the ClusterIP answers from the client pod: a connection made and none failed.
# The count is checked too: a kproxy-bench-connrate built before its status required a success
# exits 0 when its thread started after the 0.2 s were over (a loaded machine) and tried nothing.
connrate_ok() {
  local out
  out="$(kp_exec pod3 timeout 2 "$CONNRATE" client "$HTTP_IP" 80 0.2 1 2>/dev/null)" || return 1
  [[ $out == requests=[1-9]* ]]
}
ct_count() { kp_exec "$1" conntrack -L -d "$HTTP_IP" 2>/dev/null | grep -c .; }

# make_manifests S — the manifest directory of S Services ($BENCH_DIR/manifests-S): the Node, the
# measured NodePort Service with its 2 endpoints (bench.yaml) and S - 1 filler Services
# (filler.yaml). kproxy reads it with --manifests; for upstream the apiserver is made to hold it.
make_manifests() {
  local m="$BENCH_DIR/manifests-$1"
  mkdir -p "$m" || return 1
  {
    kp_manifest_node "$KP_NODE_NAME" "$KP_NODE_IP"
    echo ---
    kp_manifest_service bench http "$HTTP_IP" 80 8081 type=NodePort nodePort="$HTTP_NODE_PORT"
    echo ---
    kp_manifest_slice bench http http-abcde 8081 "$(kp_pod_ip 1)" "$(kp_pod_ip 2)"
  } | kp_install_manifest "$m" bench.yaml || return 1
  filler_manifest "$1" | kp_install_manifest "$m" filler.yaml
}

# start_control_plane — once per script run: etcd + kube-apiserver in the namespace CP_NS of their
# own, serving on $CP_IP too (the nodes' veth), with a Service CIDR that holds every ClusterIP of
# the manifests (10.96.0.0/12: the measured 10.96.0.101, the filler 10.100.0.0 and up); the
# kubeconfig of kproxy's ServiceAccount (deploy/rbac.yaml, the same rights as kube-proxy's) in
# $BENCH_DIR/node.kubeconfig.
start_control_plane() {
  [[ $CP_STATE == up ]] && return 0
  [[ $CP_STATE == failed ]] && return 1
  CP_STATE=failed
  CP_NS="kp$$-cp"
  ip netns add "$CP_NS" || { CP_NS=""; return 1; }
  ip -n "$CP_NS" link set lo up || return 1
  export CP_API_SANS="IP:$CP_IP" CP_API_HOST=$CP_IP CP_SERVICE_CIDRS=10.96.0.0/12
  CP_API_EXTRA=(--bind-address 0.0.0.0 --max-requests-inflight 800 --max-mutating-requests-inflight 400)
  cp_start ip netns exec "$CP_NS" || return 1
  cp_kproxy_kubeconfig "$BENCH_DIR/node.kubeconfig" || return 1
  kp_log "control plane up in $CP_NS; upstream: $UPSTREAM ($("$UPSTREAM" --version 2>&1))"
  CP_STATE=up
}

# api_sync S — makes the apiserver hold the manifests of S (only the difference to what it holds);
# logs and records how long that took.
api_sync() {
  local services="$1" out
  [[ $API_S == "$services" ]] && return 0
  API_S=""
  kp_log "loading the objects of S=$services through the API"
  out="$(ip netns exec "$CP_NS" "$KP_PYTHON" "$HERE/../api/sync_manifests.py" --port "$CP_API_PORT" \
    --pki "$CP_DIR/pki" --prune bench,filler "$BENCH_DIR/manifests-$services"/*.yaml)" || return 1
  kp_log "S=$services through the API: $out"
  echo "services=$services $out" >>"$API_LOADS"
  API_S=$services
}

# join_control_plane — a veth from the node namespace ($CP_NODE_IP) to the control plane's ($CP_IP),
# the previous run's first removed (a namespace's links go with it, but not at once); and a fresh
# token in the kubeconfig (a TokenRequest token lasts an hour; a run at large S takes longer).
join_control_plane() {
  local node_ns i token
  node_ns="$(kp_ns node)"
  for ((i = 0; i < 100; i++)); do
    ip -n "$CP_NS" link show nodelink >/dev/null 2>&1 || break
    ip -n "$CP_NS" link del nodelink 2>/dev/null
    sleep 0.1
  done
  ip -n "$CP_NS" link add nodelink type veth peer name cp0 netns "$node_ns" || return 1
  ip -n "$CP_NS" addr add "$CP_IP/30" dev nodelink || return 1
  ip -n "$CP_NS" link set nodelink up || return 1
  ip -n "$node_ns" addr add "$CP_NODE_IP/30" dev cp0 || return 1
  ip -n "$node_ns" link set cp0 up || return 1
  token="$(cp_api POST /api/v1/namespaces/kube-system/serviceaccounts/kproxy/token \
    '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}' |
    "$KP_PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["status"]["token"])')" || return 1
  printf '%s' "$token" >"$CP_DIR/kproxy.token.new" && mv -f "$CP_DIR/kproxy.token.new" "$CP_DIR/kproxy.token"
}

# start_upstream iptables|nftables — upstream kube-proxy in the node namespace, with the arguments
# kproxy gets (kp_kproxy_args: hostname, --cluster-cidr, the metrics and healthz addresses), its
# kubeconfig instead of --manifests, and nf_conntrack_max (not per namespace) left alone. As
# kproxy, its pid in KP_KPROXY_PID and its log in $KP_WORKDIR/kproxy.log.
start_upstream() {
  local args i
  mapfile -t args < <(KP_PROXY_MODE=$1 KP_KPROXY_MODE_ARGS="" KPROXY_PLUGIN_DIR="" \
    kp_kproxy_args "$BENCH_DIR/node.kubeconfig")
  for i in "${!args[@]}"; do [[ ${args[i]} == --manifests ]] && args[i]=--kubeconfig; done
  args+=(--conntrack-max-per-core=0 -v 1)
  echo "===== upstream start: $UPSTREAM ${args[*]} =====" >>"$KP_WORKDIR/kproxy.log"
  kp_in_ns node || return 1
  kp_bg "$KP_WORKDIR/kproxy.log" "${KP_IN_NS[@]}" "$UPSTREAM" "${args[@]}"
  KP_KPROXY_PID=$KP_LAST_PID
  kp_log "kube-proxy started pid=$KP_KPROXY_PID log=$KP_WORKDIR/kproxy.log"
}

# run_one MODE S — one measurement on a fresh topology; appends a line to $RESULTS. Runs in a
# subshell: its exit tears the topology down (kp_init's trap).
run_one() {
  local mode="$1" services="$2"
  KP_BENCH_RUN="$mode-$services"
  mkdir -p "$KP_EBPF_TOP_CGROUP/$KP_BENCH_RUN/client" "$KP_EBPF_TOP_CGROUP/$KP_BENCH_RUN/rest" || return 1
  KP_PROXY_MODE=$mode
  case "$mode" in
    ebpf) KP_KPROXY_MODE_ARGS="--ebpf-cgroup-path=$KP_EBPF_TOP_CGROUP/$KP_BENCH_RUN/client --ebpf-pin-path=$KP_EBPF_DIR/bpffs/$KP_BENCH_RUN" ;;
    iptables) KP_KPROXY_MODE_ARGS="--iptables-variant=nft" ;;
    *) KP_KPROXY_MODE_ARGS="" ;;
  esac
  kp_init ""  # the prefix kp<pid>-
  kp_topology_up 3 0 || return 1
  local i
  for i in 1 2; do
    kp_in_ns "pod$i" || return 1
    kp_bg "$KP_WORKDIR/server$i.log" "${KP_IN_NS[@]}" "$CONNRATE" server 8081 "$SERVER_THREADS"
  done
  # pod1's second server, which only the client pod's direct connections reach (below).
  kp_in_ns pod1 || return 1
  kp_bg "$KP_WORKDIR/server1-direct.log" "${KP_IN_NS[@]}" "$CONNRATE" server "$DIRECT_PORT" "$SERVER_THREADS"
  # Server side closes first (TIME_WAIT there); the client's ports are free again at once.
  kp_exec pod3 sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="10000 65000"
  kp_exec client sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="10000 65000"
  local m="$BENCH_DIR/manifests-$services"
  if [[ $mode == upstream-* ]]; then
    join_control_plane || return 1
  fi

  local t0=${EPOCHREALTIME/./} rc=0
  if [[ $mode == upstream-* ]]; then
    start_upstream "${mode#upstream-}" || return 1
  else
    kp_start_kproxy "$m" -v 1 || return 1
  fi
  kp_wait_for_kproxy "$READY_S" connrate_ok || rc=$?
  local ready_s
  ready_s=$(awk -v a="$t0" -v b="${EPOCHREALTIME/./}" 'BEGIN{printf "%.1f", (b - a) / 1e6}')
  if ((rc != 0)); then
    kp_kproxy_log_tail 20 >&2
    local status=not-ready
    ((rc == 2)) && status=exited
    kp_log "$mode S=$services: the ClusterIP did not answer ($status after ${ready_s}s)"
    echo "$mode services=$services status=$status ready_s=$ready_s" | tee -a "$RESULTS"
    return 0
  fi
  # The figures start from empty conntrack tables (the readiness probe's entries go).
  kp_exec node conntrack -F >/dev/null 2>&1
  kp_exec pod3 conntrack -F >/dev/null 2>&1
  kp_log "$mode S=$services: serving after ${ready_s}s; measuring $SECS s"
  local in_pod external direct hwm
  in_pod="$(measure pod3 "$HTTP_IP" 80 pod)"
  local ct_client ct_node ct_node_all pod_direct
  ct_client=$(ct_count pod3) ct_node=$(ct_count node)
  # Every entry of the node's table, whatever its destination: ebpf mode's nftables part keeps
  # conntrack on in the node, so the pod-to-pod flow a steered connection makes is tracked
  # there too, only not NATed.
  ct_node_all=$(kp_exec node conntrack -C 2>/dev/null)
  # The same pod to the first endpoint's own address, no service in the way (but the same
  # hooks, rules and conntrack the mode leaves on the path): the ClusterIP's cost above it is
  # what the mode's service path costs a connection (repeat.sh's summary sets them side by side).
  # It goes to pod1's second server, from empty conntrack tables: the client reuses its ports,
  # and in the netfilter modes pod1 holds the run above's connections in TIME_WAIT under the
  # very tuples a direct connection to 8081 would make (about 1,300 connections/s there
  # against 45,000).
  kp_exec node conntrack -F >/dev/null 2>&1
  kp_exec pod3 conntrack -F >/dev/null 2>&1
  pod_direct="$(measure pod3 "$(kp_pod_ip 1)" "$DIRECT_PORT" poddirect)"
  # Traffic from another host, which no socket hook sees: the outside client to the NodePort
  # (ebpf mode: its nftables part), and to the first pod directly, without any service: the
  # bound on what a faster path for external traffic (tc-BPF) could save.
  external="$(measure client "$KP_NODE_IP" "$HTTP_NODE_PORT" ext)"
  direct="$(measure client "$(kp_pod_ip 1)" 8081 direct)"
  hwm=$(awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$KP_KPROXY_PID/status" 2>/dev/null)
  # kproxy's slow and failed syncs, with their times, beside the log's lines above: whether a
  # sync was still being written after the ClusterIP first answered, or during the measurements.
  if [[ $mode != upstream-* ]]; then
    grep -E '"(Slow sync|Sync failed)' "$KP_WORKDIR/kproxy.log" 2>/dev/null | head -n 20 | sed "s/^/[$mode S=$services] /" >&2
  fi
  echo "$mode services=$services status=ready requests_per_connection=$REQUESTS ready_s=$ready_s $in_pod ct_client=$ct_client ct_node=$ct_node ct_node_all=${ct_node_all:-?} $pod_direct $external $direct hwm_mib=${hwm:-?}" | tee -a "$RESULTS"
  kp_stop_kproxy TERM
}

for services in "${COUNTS[@]}"; do
  make_manifests "$services" || kp_die "writing the manifests of S=$services"
  for mode in "${MODES[@]}"; do
    if [[ $mode == upstream-* ]]; then
      start_control_plane || { kp_log "$mode S=$services: no control plane (see above)"; continue; }
      api_sync "$services" || { kp_log "$mode S=$services: loading the objects failed (see above)"; continue; }
    fi
    (run_one "$mode" "$services") || kp_log "$mode S=$services: failed (see above)"
    # What the run's processes left in its cgroups goes with them; then its pins.
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP/$mode-$services/client"
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP/$mode-$services/rest"
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP/$mode-$services"
    rm -rf "${KP_EBPF_DIR:?}/bpffs/$mode-$services"
  done
  rm -rf "${BENCH_DIR:?}/manifests-$services"
done

# ready_cell — the "ready after" cell of the record in f: the seconds, or why it was not measured.
ready_cell() {
  case "${f[status]:-ready}" in
    ready) echo "${f[ready_s]}" ;;
    exited) echo "exited after ${f[ready_s]} s, not measured" ;;
    *) echo "not ready after ${f[ready_s]} s, not measured" ;;
  esac
}

# each_record FILE FN — FN for every line of FILE ("MODE key=value…"), with the line's fields in
# the associative array f and its first word in $mode.
each_record() {
  local line kv mode
  while read -r line; do
    declare -gA f=()
    for kv in $line; do [[ $kv == *=* ]] && f[${kv%%=*}]=${kv#*=}; done
    mode=${line%% *}
    "$2"
  done <"$1"
}
pod_row() {
  if [[ ${f[status]} != ready ]]; then
    echo "| $mode | ${f[services]} | – | – | – | – | – | $(ready_cell) | – |"
  else
    echo "| $mode | ${f[services]} | ${f[pod_rate]:-?} | ${f[pod_failures]:-?} | ${f[pod_p50_us]:-?} / ${f[pod_p99_us]:-?} | ${f[pod_cpu_us]:-?} | ${f[ct_client]:-?} / ${f[ct_node]:-?} | ${f[ready_s]} | ${f[hwm_mib]:-?} |"
  fi
}
external_row() {
  if [[ ${f[status]} != ready ]]; then
    echo "| $mode | ${f[services]} | $(ready_cell) | – | – | – | – | – | – |"
  else
    echo "| $mode | ${f[services]} | ${f[ext_rate]:-?} | ${f[ext_failures]:-?} | ${f[ext_p50_us]:-?} / ${f[ext_p99_us]:-?} | ${f[ext_cpu_us]:-?} | ${f[direct_rate]:-?} | ${f[direct_p50_us]:-?} / ${f[direct_p99_us]:-?} | ${f[direct_cpu_us]:-?} |"
  fi
}
load_row() {
  echo "| ${f[services]} | ${f[created]} | ${f[deleted]} | ${f[kept]} | ${f[seconds]} | ${f[client_cpu_s]} |"
}

echo
UNIT="connection"
WHAT="short connections/s"
if ((REQUESTS > 1)); then
  UNIT="request"
  WHAT="requests/s ($REQUESTS on each connection)"
fi
echo "From a pod on the node to the ClusterIP:"
echo
echo "| mode | Services | $WHAT ($CLIENTS clients, ${SECS} s) | failed connections | to the reply's first byte p50 / p99 (µs) | CPU per $UNIT (µs, whole machine) | conntrack entries to the ClusterIP after the run: client netns / node netns | ready after (s) | peak RSS of the proxy (MiB) |"
echo "|---|---|---|---|---|---|---|---|---|"
each_record "$RESULTS" pod_row
echo
echo "From another host: to the NodePort, and to the pod directly (no service: what no NAT costs)"
echo
echo "| mode | Services | NodePort: ${WHAT%% (*} | failed connections | p50 / p99 (µs) | CPU per $UNIT (µs) | pod directly: ${WHAT%% (*} | p50 / p99 (µs) | CPU per $UNIT (µs) |"
echo "|---|---|---|---|---|---|---|---|---|"
each_record "$RESULTS" external_row
if [[ -s "$API_LOADS" ]]; then
  echo
  echo "The objects made to be held by the apiserver for the upstream modes (only the difference to what it held):"
  echo
  echo "| Services | objects created | deleted | kept | seconds | of which the loader's own CPU (s) |"
  echo "|---|---|---|---|---|---|"
  each_record "$API_LOADS" load_row
fi
