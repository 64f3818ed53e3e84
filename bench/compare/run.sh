#!/usr/bin/env bash
# kproxy against upstream kube-proxy, side by side on one real kube-apiserver (see compare.py
# for what is measured). Builds upstream's kube-proxy at the apiserver's version into the same
# cache as the apiserver (tests/e2e/build-control-plane.sh), runs the control plane in a network
# namespace of its own and each program, one at a time, in a fresh node namespace joined to it
# by a veth. IPVS mode (--modes ipvs) runs each program in the test VM instead (tests/vm/, as the
# host's kernel has no IPVS), reaching the apiserver through qemu's user networking from the
# control plane's namespace. ebpf mode (--modes ebpf, kproxy alone) attaches to a cgroup of the
# run's and pins on a bpffs of its own, in a mount namespace of its own (scripts/ebpf-lib.sh).
# Nothing touches the host's own network namespace, root cgroup or /sys/fs/bpf.
#
# usage: bench/compare/run.sh [--kproxy BIN] [--plugin-dir DIR] [--out DIR] [compare.py options]
#   e.g. bench/compare/run.sh --scales 1000x2,10000x2 --modes nftables,iptables --runs 3
# Results: DIR/results.jsonl (appended), the programs' logs in DIR/logs; then
# bench/compare/report.py DIR writes the tables (DIR/report.md) and the plots (DIR/*.png).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
source "$ROOT/scripts/netns-lib.sh"
source "$ROOT/tests/e2e/control-plane.sh"
source "$ROOT/scripts/ebpf-lib.sh"
# ebpf mode's ground (a bpffs and a cgroup of the run's) lives in a mount namespace of its own.
kp_require_root
[[ -n "$(kp_cgroup2_root)" ]] && kp_ebpf_reexec "$0" "$@"

OUT="$ROOT/bench/compare/out"
PASS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kproxy) export KPROXY_BIN="$2"; shift 2 ;;
    --plugin-dir) export KPROXY_PLUGIN_DIR="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done

kp_require_root
"$ROOT/scripts/install-deps.sh" || kp_die "installing the build and test packages"
if ! command -v gnuplot >/dev/null; then  # for report.py's plots; the benchmark alone needs none
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null ||
    kp_log "WARNING: gnuplot-nox not installed: report.py will write tables without plots"
fi
GOMAXPROCS=${GOMAXPROCS:-2} "$ROOT/tests/e2e/build-control-plane.sh" all || kp_die "building kube-apiserver"
GOMAXPROCS=${GOMAXPROCS:-2} "$ROOT/tests/e2e/build-control-plane.sh" kube-proxy || kp_die "building kube-proxy"
UPSTREAM="${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/kube-proxy"
KPROXY="$(kp_kproxy_bin)" || kp_die "kproxy not built (cmake --build build) and no --kproxy BIN"
PLUGINS="${KPROXY_PLUGIN_DIR:-$(dirname "$(dirname "$KPROXY")")/plugins-out}"
[[ -f "$PLUGINS/kproxy-backend-nftables.so" ]] || kp_die "no backend plugins in $PLUGINS (--plugin-dir DIR)"
# --modes ipvs: the change detector on the VM node, built beside kproxy.
IPVS_WAIT="${KPROXY_IPVS_WAIT:-$(dirname "$(dirname "$KPROXY")")/bench/compare/kproxy-bench-ipvswait}"
[[ -x "$IPVS_WAIT" ]] && PASS+=(--ipvs-wait "$IPVS_WAIT")
# --modes ebpf: its counter and change detector, built beside kproxy too.
EBPF_WAIT="$(dirname "$(dirname "$KPROXY")")/bench/compare/kproxy-bench-ebpfwait"
[[ -x "$EBPF_WAIT" ]] && PASS+=(--ebpf-wait "$EBPF_WAIT")

kp_init
mkdir -p "$OUT/logs"
if kp_ebpf_mount "kproxy-compare-$$"; then
  PASS+=(--ebpf-ground "$KP_EBPF_TOP_CGROUP:$KP_EBPF_DIR/bpffs")
else
  kp_log "ebpf mode cannot run here (--modes ebpf fails): $KP_EBPF_ERROR"
fi
cleanup() {
  local rc=$?
  cp_stop
  # compare.py removes its node namespaces; these are the ones a kill left behind.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$KP_PREFIX"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  kp_ebpf_unmount
  (exit $rc)
  kp_teardown
}
trap cleanup EXIT
_kp_add_ns cp || kp_die "creating the control plane's namespace"
CP_NS="$(kp_ns cp)"
# The nodes reach the apiserver at 10.255.0.1 (compare.py's CP_IP); NodePorts from a wider range,
# since a 30k-service cluster has more NodePort and LoadBalancer services than 30000-32767 holds.
export CP_API_SANS="IP:10.255.0.1" CP_API_HOST=10.255.0.1
CP_API_EXTRA=(--bind-address 0.0.0.0 --service-node-port-range 20000-60000
  --max-requests-inflight 800 --max-mutating-requests-inflight 400)
cp_start ip netns exec "$CP_NS" || kp_die "starting the control plane"
cp_kproxy_kubeconfig "$KP_WORKDIR/node.kubeconfig" || kp_die "writing the node's kubeconfig"

kp_log "kproxy: $KPROXY (plugins $PLUGINS); upstream: $UPSTREAM ($("$UPSTREAM" --version))"
BENCH_KPROXY_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo +changes)" \
  "$KP_PYTHON" "$HERE/compare.py" --port "$CP_API_PORT" --pki "$CP_DIR/pki" \
  --kubeconfig "$KP_WORKDIR/node.kubeconfig" --cp-ns "$CP_NS" --prefix "${KP_PREFIX}n" --workdir "$OUT/logs" \
  --kproxy "$KPROXY --plugin-dir $PLUGINS" --upstream "$UPSTREAM" --out "$OUT/results.jsonl" "${PASS[@]}"
