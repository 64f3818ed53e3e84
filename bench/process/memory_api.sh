#!/usr/bin/env bash
# Memory of the whole kproxy process fed from a real kube-apiserver: SERVICES Services ×
# ENDPOINTS endpoints (the shape of bench/process/memory.sh, loaded over HTTPS by
# bench/api/load_objects.py), then kproxy in nftables mode against the apiserver, in a
# throw-away node namespace. For each run it prints the time from kproxy's start to the first
# full sync in the kernel, the peak (VmHWM) then, the resident set then, and 20 s later.
#
# The objects are loaded once; each `--kproxy BIN` (with the `--plugin-dir DIR` after it) is a
# variant, and the variants run in turn RUNS times against the same apiserver (the namespace's
# nftables ruleset is flushed between runs), so that builds compare under the same load.
#
# --mix loads varied Services (LoadBalancer, NodePort, two ports, ...: see
# bench/api/load_objects.py) instead of memory.sh's single-port ClusterIP ones.
#
# usage: sudo bench/process/memory_api.sh [--runs N] [--mix] [--kproxy BIN [--plugin-dir DIR]]...
#                                         [SERVICES [ENDPOINTS]]
# env: KPROXY_EXTRA_ARGS (words added to every kproxy command line)
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/netns-lib.sh"
source "$HERE/../../tests/e2e/control-plane.sh"

RUNS=1
MIX=()
BINS=()
PLUGIN_DIRS=()
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --mix) MIX=(--mix); shift ;;
    --kproxy) BINS+=("$2"); PLUGIN_DIRS+=(""); shift 2 ;;
    --plugin-dir)
      ((${#BINS[@]} > 0)) || { echo "--plugin-dir comes after its --kproxy" >&2; exit 2; }
      PLUGIN_DIRS[${#BINS[@]} - 1]="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
SERVICES="${1:-10000}"
ENDPOINTS="${2:-2}"
if ((${#BINS[@]} == 0)); then
  BINS=("$(kp_kproxy_bin)") || { echo "kproxy binary not found (--kproxy BIN)" >&2; exit 2; }
  PLUGIN_DIRS=("${KPROXY_PLUGIN_DIR:-}")
fi

kp_require_root
kp_init
trap '_rc=$?; kp_stop_kproxy; cp_stop; (exit $_rc); kp_teardown' EXIT
kp_topology_up 0 0 || exit 1
NODE_NS="$(kp_ns node)"
# A mix of 10,000 services has more NodePorts than the default range holds.
((${#MIX[@]} > 0)) && CP_API_EXTRA=(--service-node-port-range=20000-32767)
cp_start ip netns exec "$NODE_NS" || exit 1
cp_kproxy_kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" || exit 1
ip netns exec "$NODE_NS" "$KP_PYTHON" "$HERE/../api/load_objects.py" --port "$CP_API_PORT" --pki "$CP_DIR/pki" \
  --services "$SERVICES" --endpoints "$ENDPOINTS" --node "$KP_NODE_NAME" --node-ip "$KP_NODE_IP" "${MIX[@]}" ||
  kp_die "loading the objects"

status() { grep -E "^$1:" "/proc/$KP_KPROXY_PID/status" | awk '{printf "%d", $2 / 1024}'; }
synced() { grep -q '"Synced rules".*kind=full.*operations=[1-9]' "$KP_WORKDIR/kproxy.log" && echo yes; }

# measure BIN PLUGIN_DIR — one kproxy start on an empty ruleset; prints one line.
measure() {
  local bin="$1" plugin_dir="$2"
  ip netns exec "$NODE_NS" nft flush ruleset
  : >"$KP_WORKDIR/kproxy.log"
  local args=(--proxy-mode=nftables --kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" --hostname-override "$KP_NODE_NAME"
    --cluster-cidr "$KP_CLUSTER_CIDR" --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 -v 2)
  [[ -n "$plugin_dir" ]] && args+=(--plugin-dir "$plugin_dir")
  # shellcheck disable=SC2206
  args+=(${KPROXY_EXTRA_ARGS:-})
  local started=${EPOCHREALTIME/./}
  kp_bg "$KP_WORKDIR/kproxy.log" ip netns exec "$NODE_NS" "$bin" "${args[@]}"
  KP_KPROXY_PID=$KP_LAST_PID
  kp_wait_for 600 synced >/dev/null || { kp_kproxy_log_tail 20 >&2; kp_die "no full sync within 600 s"; }
  local took=$(((${EPOCHREALTIME/./} - started) / 1000))
  local peak now anon
  peak=$(status VmHWM) now=$(status VmRSS) anon=$(status RssAnon)
  sleep 20
  kp_kproxy_alive || kp_die "kproxy exited"
  printf 'kproxy=%s services=%s endpoints=%s first_sync_in_ms=%s peak_MiB=%s rss_after_sync_MiB=%s anon_after_sync_MiB=%s rss_20s_later_MiB=%s peak_20s_later_MiB=%s\n' \
    "$bin" "$SERVICES" "$ENDPOINTS" "$took" "$peak" "$now" "$anon" "$(status VmRSS)" "$(status VmHWM)"
  kp_stop_kproxy
}

for ((run = 1; run <= RUNS; run++)); do
  for i in "${!BINS[@]}"; do
    measure "${BINS[$i]}" "${PLUGIN_DIRS[$i]}"
  done
done
