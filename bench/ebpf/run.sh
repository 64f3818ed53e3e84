#!/usr/bin/env bash
# ebpf mode's socket-level load balancing against the netfilter modes' DNAT (nftables, iptables),
# in the same run, pod -> ClusterIP -> 2 endpoints, with S Services loaded (one measured, the
# rest filler Services with an endpoint each, from a --manifests directory), all in throw-away
# network namespaces (scripts/netns-lib.sh). For each mode and each S:
#   - kproxy-bench-connrate (bench/userspace): short connections by 8 clients at once for
#     SECONDS: requests per second, and connect-to-first-byte p50/p99;
#   - CPU per connection: the machine's busy CPU time over the measurement (/proc/stat: user,
#     nice, system, irq and softirq of every CPU, which is where the data path's per-packet
#     work lands), divided by the connections made; on a machine that runs nothing else, the
#     cost of a connection through that mode, client and server included;
#   - the conntrack entries whose original destination is the ClusterIP, after the run, in the
#     client pod's network namespace and in the node's (where the netfilter modes DNAT);
#   - kproxy's peak resident set (VmHWM) at the end of the run.
# The client pod's process runs in a cgroup of the benchmark's, the one ebpf mode's programs go
# on (--ebpf-cgroup-path); the pins go on a bpffs mounted in the benchmark's own mount namespace
# (scripts/ebpf-lib.sh). Every mode runs on a fresh topology, torn down after it, as are the
# cgroups and the bpffs when the script exits, also on failure.
#
# usage: bench/ebpf/run.sh [--kproxy BIN] [--plugin-dir DIR] [SECONDS [S...]]
#   SECONDS per measurement (default 10); S, the Service counts (default 1000). Run as root.
#   KP_BENCH_MODES: the modes (default "ebpf nftables iptables userspace").
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/netns-lib.sh"
source "$HERE/../../scripts/ebpf-lib.sh"
kp_require_root
kp_ebpf_reexec "$0" "$@"
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SECS="${1:-10}"
shift || true
COUNTS=("$@")
[[ ${#COUNTS[@]} -gt 0 ]] || COUNTS=(1000)
MODES=(${KP_BENCH_MODES:-ebpf nftables iptables userspace})
CONNRATE="${CONNRATE:-$KP_SOURCE_DIR/build/bench/userspace/kproxy-bench-connrate}"
HTTP_IP=10.96.0.101
HTTP_NODE_PORT=30080
CLIENTS=8

command -v conntrack >/dev/null || kp_die "conntrack not installed"
[[ -x "$CONNRATE" ]] || kp_die "$CONNRATE not built (cmake --build build --target kproxy-bench-connrate)"
kp_kproxy_bin >/dev/null || kp_die "kproxy binary not found (--kproxy BIN)"
kp_ebpf_mount "kproxy-bench-$$" || { kp_ebpf_unmount; kp_die "$KP_EBPF_ERROR"; }
RESULTS="$(mktemp "${TMPDIR:-/tmp}/kproxy-bench-ebpf.XXXXXX")"
trap 'kp_ebpf_unmount; rm -f "$RESULTS"' EXIT
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
  out="$(kp_exec "$role" "$CONNRATE" client "$ip" "$port" "$SECS" "$CLIENTS" 2>&1)"
  busy1=$(busy_jiffies)
  local -A got=()
  for kv in $out; do [[ $kv == *=* ]] && got[${kv%%=*}]=${kv#*=}; done
  local cpu
  cpu=$(awk -v j=$((busy1 - busy0)) -v hz="$(getconf CLK_TCK)" -v n="${got[requests]:-0}" \
    'BEGIN { if (n > 0) printf "%.0f", j / hz * 1e6 / n; else print "?" }')
  echo "${prefix}_rate=${got[rate]:-?} ${prefix}_failures=${got[failures]:-?} ${prefix}_p50_us=${got[p50_us]:-?} ${prefix}_p99_us=${got[p99_us]:-?} ${prefix}_cpu_us=$cpu"
}

connrate_ok() { kp_exec pod3 timeout 2 "$CONNRATE" client "$HTTP_IP" 80 0.2 1 >/dev/null 2>&1; }
ct_count() { kp_exec "$1" conntrack -L -d "$HTTP_IP" 2>/dev/null | grep -c .; }

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
  kp_init
  kp_topology_up 3 0 || return 1
  local i
  for i in 1 2; do
    kp_in_ns "pod$i" || return 1
    kp_bg "$KP_WORKDIR/server$i.log" "${KP_IN_NS[@]}" "$CONNRATE" server 8081 2
  done
  # Server side closes first (TIME_WAIT there); the client's ports are free again at once.
  kp_exec pod3 sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="10000 65000"
  kp_exec client sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="10000 65000"
  local m="$KP_WORKDIR/manifests"
  mkdir -p "$m"
  {
    kp_manifest_node "$KP_NODE_NAME" "$KP_NODE_IP"
    echo ---
    kp_manifest_service bench http "$HTTP_IP" 80 8081 type=NodePort nodePort="$HTTP_NODE_PORT"
    echo ---
    kp_manifest_slice bench http http-abcde 8081 "$(kp_pod_ip 1)" "$(kp_pod_ip 2)"
  } | kp_install_manifest "$m" bench.yaml || return 1
  filler_manifest "$services" | kp_install_manifest "$m" filler.yaml || return 1

  local t0=${EPOCHREALTIME/./}
  kp_start_kproxy "$m" -v 1 || return 1
  if ! kp_wait_for_kproxy 120 connrate_ok; then
    kp_kproxy_log_tail 20 >&2
    kp_log "$mode S=$services: the ClusterIP did not answer"
    return 1
  fi
  local ready_s
  ready_s=$(awk -v a="$t0" -v b="${EPOCHREALTIME/./}" 'BEGIN{printf "%.1f", (b - a) / 1e6}')
  # The figures start from empty conntrack tables (the readiness probe's entries go).
  kp_exec node conntrack -F >/dev/null 2>&1
  kp_exec pod3 conntrack -F >/dev/null 2>&1
  kp_log "$mode S=$services: serving after ${ready_s}s; measuring $SECS s"
  local in_pod external direct hwm
  in_pod="$(measure pod3 "$HTTP_IP" 80 pod)"
  local ct_client ct_node
  ct_client=$(ct_count pod3) ct_node=$(ct_count node)
  # Traffic from another host, which no socket hook sees: the outside client to the NodePort
  # (ebpf mode: its nftables part), and to the first pod directly, without any service: the
  # bound on what a faster path for external traffic (tc-BPF) could save.
  external="$(measure client "$KP_NODE_IP" "$HTTP_NODE_PORT" ext)"
  direct="$(measure client "$(kp_pod_ip 1)" 8081 direct)"
  hwm=$(awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$KP_KPROXY_PID/status" 2>/dev/null)
  echo "$mode services=$services ready_s=$ready_s $in_pod ct_client=$ct_client ct_node=$ct_node $external $direct hwm_mib=${hwm:-?}" | tee -a "$RESULTS"
  kp_stop_kproxy TERM
}

for services in "${COUNTS[@]}"; do
  for mode in "${MODES[@]}"; do
    (run_one "$mode" "$services") || kp_log "$mode S=$services: failed (see above)"
    # What the run's processes left in its cgroups goes with them; then its pins.
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP/$mode-$services/client"
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP/$mode-$services/rest"
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP/$mode-$services"
    rm -rf "${KP_EBPF_DIR:?}/bpffs/$mode-$services"
  done
done

echo
echo "From a pod on the node to the ClusterIP:"
echo
echo "| mode | Services | short connections/s ($CLIENTS clients, ${SECS} s) | failures | connect→first byte p50 / p99 (µs) | CPU per connection (µs, whole machine) | conntrack entries to the ClusterIP after the run: client netns / node netns | kproxy ready after (s) | kproxy peak RSS (MiB) |"
echo "|---|---|---|---|---|---|---|---|---|"
while read -r line; do
  declare -A f=()
  for kv in $line; do [[ $kv == *=* ]] && f[${kv%%=*}]=${kv#*=}; done
  echo "| ${line%% *} | ${f[services]} | ${f[pod_rate]:-?} | ${f[pod_failures]:-?} | ${f[pod_p50_us]:-?} / ${f[pod_p99_us]:-?} | ${f[pod_cpu_us]:-?} | ${f[ct_client]:-?} / ${f[ct_node]:-?} | ${f[ready_s]} | ${f[hwm_mib]:-?} |"
  unset f
done <"$RESULTS"
echo
echo "From another host: to the NodePort, and to the pod directly (no service: what no NAT costs)"
echo
echo "| mode | Services | NodePort: connections/s | failures | p50 / p99 (µs) | CPU per connection (µs) | pod directly: connections/s | p50 / p99 (µs) | CPU per connection (µs) |"
echo "|---|---|---|---|---|---|---|---|---|"
while read -r line; do
  declare -A f=()
  for kv in $line; do [[ $kv == *=* ]] && f[${kv%%=*}]=${kv#*=}; done
  echo "| ${line%% *} | ${f[services]} | ${f[ext_rate]:-?} | ${f[ext_failures]:-?} | ${f[ext_p50_us]:-?} / ${f[ext_p99_us]:-?} | ${f[ext_cpu_us]:-?} | ${f[direct_rate]:-?} | ${f[direct_p50_us]:-?} / ${f[direct_p99_us]:-?} | ${f[direct_cpu_us]:-?} |"
  unset f
done <"$RESULTS"
