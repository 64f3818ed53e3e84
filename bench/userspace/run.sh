#!/usr/bin/env bash
# The userspace mode against nftables mode's kernel DNAT, in the same run, through a ClusterIP:
# pod2 -> ClusterIP -> pod1, all in throw-away network namespaces (scripts/netns-lib.sh).
#   - iperf3, one TCP stream and eight (-P 8): throughput;
#   - kproxy-bench-connrate: short connections (connect, tiny HTTP/1.0 request, reply, close) by
#     8 clients at once: requests per second;
#   - CPU: the whole machine's busy time (user, system, irq, softirq, from /proc/stat) per GB
#     moved, and kproxy's own (utime + stime of its process) per GB. Both ends of the traffic
#     run on this machine too, so the machine's figure includes iperf3 itself.
#
# usage: sudo bench/userspace/run.sh [--kproxy BIN] [--plugin-dir DIR] [SECONDS]
#   SECONDS per measurement (default 10); the connection tool is looked up beside the build
#   (build/bench/userspace/kproxy-bench-connrate) unless CONNRATE names it.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/netns-lib.sh"
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SECS="${1:-10}"
CONNRATE="${CONNRATE:-$KP_SOURCE_DIR/build/bench/userspace/kproxy-bench-connrate}"
IPERF_IP=10.96.0.100
HTTP_IP=10.96.0.101

kp_require_root
command -v iperf3 >/dev/null || kp_die "iperf3 not installed (scripts/install-deps.sh installs it)"
[[ -x "$CONNRATE" ]] || kp_die "$CONNRATE not built (cmake --build build --target kproxy-bench-connrate)"
kp_init
kp_topology_up 2 0 || exit 1
kp_bg "$KP_WORKDIR/iperf3-server.log" ip netns exec "$(kp_ns pod1)" iperf3 -s -p 5201
kp_bg "$KP_WORKDIR/connrate-server.log" ip netns exec "$(kp_ns pod1)" "$CONNRATE" server 8081 2
# The short connections end in TIME_WAIT on the server side in both paths: pod1 closes first,
# and so does kproxy's relay towards the client once pod1's end has come through (nstat:
# TcpExtTW counts in pod1 and the node, stays 0 in pod2). The client's ports are free again at
# once; tcp_tw_reuse only matters should the client ever close first.
kp_exec pod2 sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="10000 65000"

M="$KP_WORKDIR/manifests"
mkdir -p "$M"
{
  kp_manifest_node "$KP_NODE_NAME" "$KP_NODE_IP"
  echo ---
  kp_manifest_service bench iperf "$IPERF_IP" 5201 5201
  echo ---
  kp_manifest_slice bench iperf iperf-abcde 5201 "$(kp_pod_ip 1)"
  echo ---
  kp_manifest_service bench http "$HTTP_IP" 80 8081
  echo ---
  kp_manifest_slice bench http http-abcde 8081 "$(kp_pod_ip 1)"
} | kp_install_manifest "$M" bench.yaml || exit 1

HZ=$(getconf CLK_TCK)
machine_busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
kproxy_cpu() { awk '{print $14 + $15}' "/proc/$KP_KPROXY_PID/stat"; }
connrate_ok() { kp_exec pod2 timeout 2 "$CONNRATE" client "$HTTP_IP" 80 0.2 1 >/dev/null 2>&1; }

# measure CMD... — runs CMD in pod2 with its output in $KP_WORKDIR/out; prints the machine's and
# kproxy's CPU seconds meanwhile: "MACHINE KPROXY".
measure() {
  local m0 k0 m1 k1
  m0=$(machine_busy)
  k0=$(kproxy_cpu)
  kp_exec pod2 "$@" >"$KP_WORKDIR/out" 2>&1
  m1=$(machine_busy)
  k1=$(kproxy_cpu)
  awk -v a="$m0" -v b="$m1" -v c="$k0" -v d="$k1" -v hz="$HZ" 'BEGIN{printf "%.2f %.2f\n", (b - a) / hz, (d - c) / hz}'
}

# iperf_summary — from iperf3 -J on stdin: "Gbit/s bytes".
iperf_summary() {
  "$KP_PYTHON" -c 'import json,sys; e=json.load(sys.stdin)["end"]["sum_received"]; print("%.2f %d" % (e["bits_per_second"]/1e9, e["bytes"]))'
}

results="$KP_WORKDIR/results"
for mode in nftables userspace; do
  KP_PROXY_MODE=$mode kp_start_kproxy "$M" -v 1 || exit 1
  if ! kp_wait_for_kproxy 15 connrate_ok; then
    kp_kproxy_log_tail 20 >&2
    kp_exec pod2 timeout 3 curl -sSv "http://$HTTP_IP/" >&2
    kp_nft node list ruleset >&2
    kp_die "$mode: the ClusterIP did not answer"
  fi
  kp_log "$mode: measuring ($SECS s each)"
  for streams in 1 8; do
    read -r mcpu kcpu < <(measure iperf3 -c "$IPERF_IP" -p 5201 -t "$SECS" -P "$streams" -J)
    read -r gbps bytes < <(iperf_summary <"$KP_WORKDIR/out") || { cat "$KP_WORKDIR/out" >&2; kp_die "$mode: iperf3 failed"; }
    echo "$mode streams=$streams gbit_s=$gbps bytes=$bytes machine_cpu_s=$mcpu kproxy_cpu_s=$kcpu" | tee -a "$results"
  done
  read -r mcpu kcpu < <(measure "$CONNRATE" client "$HTTP_IP" 80 "$SECS" 8)
  echo "$mode short_connections $(cat "$KP_WORKDIR/out") machine_cpu_s=$mcpu kproxy_cpu_s=$kcpu" | tee -a "$results"
  kp_stop_kproxy TERM
done

# The summary: the userspace mode as a share of the kernel path, CPU per GB.
"$KP_PYTHON" - "$results" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    mode = line.split()[0]
    kind = "conn" if "short_connections" in line else "P" + f["streams"]
    rows[(mode, kind)] = f
print()
print("| measure | nftables (kernel DNAT) | userspace | userspace / kernel |")
print("|---|---|---|---|")
for kind, name in (("P1", "1 stream"), ("P8", "8 streams")):
    k, u = rows[("nftables", kind)], rows[("userspace", kind)]
    print(f"| {name}, Gbit/s | {k['gbit_s']} | {u['gbit_s']} | {100*float(u['gbit_s'])/float(k['gbit_s']):.0f}% |")
    gb_k, gb_u = int(k["bytes"]) / 1e9, int(u["bytes"]) / 1e9
    print(f"| {name}, machine CPU s/GB | {float(k['machine_cpu_s'])/gb_k:.3f} | {float(u['machine_cpu_s'])/gb_u:.3f} | |")
    print(f"| {name}, kproxy CPU s/GB | {float(k['kproxy_cpu_s'])/gb_k:.3f} | {float(u['kproxy_cpu_s'])/gb_u:.3f} | |")
k, u = rows[("nftables", "conn")], rows[("userspace", "conn")]
print(f"| short connections (8 clients), req/s | {k['rate']} | {u['rate']} | {100*float(u['rate'])/float(k['rate']):.0f}% |")
print(f"| short connections, failures | {k['failures']} | {u['failures']} | |")
PY
