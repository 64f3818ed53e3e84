#!/usr/bin/env bash
# Network programming latency against a real kube-apiserver: from an EndpointSlice write
# returning to the kernel holding the change, p50/p99 over CHANGES changes with SERVICES
# services loaded. kproxy (nftables) and the control plane run in a throw-away node namespace.
#
# usage: sudo bench/api/programming_latency.sh [--kproxy BIN] [--plugin-dir DIR] [SERVICES [CHANGES]]
# env: KPROXY_EXTRA_ARGS (e.g. "-v 2"), LATENCY_RAW=FILE (per-change latencies),
#      KPROXY_LOG_OUT=FILE (keep kproxy's log, to attribute outliers to syncs)
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/netns-lib.sh"
source "$HERE/../../tests/e2e/control-plane.sh"
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SERVICES="${1:-1000}"
CHANGES="${2:-200}"

kp_require_root
kp_init
trap '_rc=$?; cp_stop; (exit $_rc); kp_teardown' EXIT
kp_topology_up 0 0 || exit 1
cp_start ip netns exec "$(kp_ns node)" || exit 1
cp_kproxy_kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" || exit 1
KPROXY="$(kp_kproxy_bin)" || kp_die "kproxy binary not found (--kproxy BIN)"
args=(--proxy-mode=nftables --kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" --hostname-override "$KP_NODE_NAME"
  --cluster-cidr "$KP_CLUSTER_CIDR" --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 -v 1)
[[ -n "${KPROXY_PLUGIN_DIR:-}" ]] && args+=(--plugin-dir "$KPROXY_PLUGIN_DIR")
# shellcheck disable=SC2206
args+=(${KPROXY_EXTRA_ARGS:-})
kp_bg "$KP_WORKDIR/kproxy.log" ip netns exec "$(kp_ns node)" "$KPROXY" "${args[@]}"
KP_KPROXY_PID=$KP_LAST_PID
ip netns exec "$(kp_ns node)" "$KP_PYTHON" "$HERE/latency.py" --port "$CP_API_PORT" --pki "$CP_DIR/pki" \
  --services "$SERVICES" --changes "$CHANGES" ${LATENCY_RAW:+--raw "$LATENCY_RAW"}
rc=$?
((rc == 0)) || { kp_log "kproxy log tail:"; kp_kproxy_log_tail 30 >&2; }
[[ -n "${KPROXY_LOG_OUT:-}" ]] && cp "$KP_WORKDIR/kproxy.log" "$KPROXY_LOG_OUT"
exit $rc
