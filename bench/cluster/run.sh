#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The cluster benchmark: the cluster suite's harness (tests/cluster: three nodes in network
# namespaces on one real kube-apiserver, constant request load, the scenarios rolling update,
# scale to zero, node drain behind a load-balancer simulator, kproxy restart, apiserver restart
# with etcd compaction) with 10,000 background Services, side by side: kproxy and upstream
# kube-proxy v1.34 (built from the Go module proxy by tests/e2e/build-control-plane.sh into
# ~/.cache/kproxy/bin) on every node, each in nftables and iptables mode. Every run is a fresh
# cluster. Each scenario's figures go to OUT/results.jsonl; report.py turns them into the tables
# of BENCHMARKS.md and, with gnuplot, a plot of failed requests over time per scenario.
#
# usage: bench/cluster/run.sh [--kproxy BIN] [--plugin-dir DIR] [SERVICES [RUN...]]
#   SERVICES: background Services (default 10000); RUN: PROGRAM:MODE (default kproxy:nftables
#   kproxy:iptables upstream:nftables upstream:iptables). OUT: KP_BENCH_OUT (default
#   bench/results/cluster-<date>). KP_BENCH_DRIVER_ARGS: more words for the driver (cluster.py),
#   e.g. "--kproxy-arg=--iptables-min-sync-period=0"; they go in meta.txt, and the results of such
#   a variant belong in a directory of their own. Run as root. A run that fails (a failed
#   request, or a wait that reached its ceiling) is reported as failed and the next one goes on.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$ROOT/scripts/netns-lib.sh"
kp_require_root
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SERVICES="${1:-10000}"
shift || true
RUNS=("$@")
[[ ${#RUNS[@]} -gt 0 ]] || RUNS=(kproxy:nftables kproxy:iptables upstream:nftables upstream:iptables)
read -ra DRIVER_ARGS <<<"${KP_BENCH_DRIVER_ARGS:-}"
OUT="${KP_BENCH_OUT:-$ROOT/bench/results/cluster-$(date +%Y-%m-%d)}"

"$ROOT/scripts/install-deps.sh" || kp_die "installing the build and test packages"
if ! command -v gnuplot >/dev/null; then  # for report.py's plots; the benchmark alone needs none
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null ||
    kp_log "WARNING: gnuplot-nox not installed: report.py will write tables without plots"
fi
GOMAXPROCS=${GOMAXPROCS:-2} "$ROOT/tests/e2e/build-control-plane.sh" all || kp_die "building kube-apiserver"
if [[ " ${RUNS[*]} " == *" upstream:"* ]]; then
  GOMAXPROCS=${GOMAXPROCS:-2} "$ROOT/tests/e2e/build-control-plane.sh" kube-proxy || kp_die "building kube-proxy"
fi
UPSTREAM="${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/kube-proxy"
KPROXY="$(kp_kproxy_bin)" || kp_die "kproxy not built (cmake --build build) and no --kproxy BIN"
BUILD="$(dirname "$(dirname "$KPROXY")")"
PLUGINS="${KPROXY_PLUGIN_DIR:-$BUILD/plugins-out}"
LOAD="$BUILD/tests/cluster/kproxy-cluster-load"
[[ -x "$LOAD" ]] || kp_die "$LOAD not built (cmake --build build --target kproxy-cluster-load)"
export KP_TOOLS_DIR="${KP_TOOLS_DIR:-$BUILD/tests/tools}"

mkdir -p "$OUT/logs" || kp_die "creating $OUT"
{
  echo "date $(date -u +%FT%TZ)"
  echo "kproxy $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD || echo +changes)"
  echo "upstream $("$UPSTREAM" --version 2>/dev/null)"
  echo "machine $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r)"
  echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "services $SERVICES"
  ((${#DRIVER_ARGS[@]} == 0)) || echo "driver arguments ${DRIVER_ARGS[*]}"
} >"$OUT/meta.txt"
status=0
for run in "${RUNS[@]}"; do
  program="${run%%:*}" mode="${run#*:}"
  kp_log "cluster run $program $mode with $SERVICES background Services"
  start=$SECONDS
  # The waits' ceiling is raised: upstream's first sync of 10,000 Services in iptables mode takes
  # more than a minute here, and a ceiling only catches hangs.
  KC_SERVICES="$SERVICES" "$ROOT/tests/cluster/cluster_test.sh" --kproxy "$KPROXY" --plugin-dir "$PLUGINS" \
    --load "$LOAD" --program "$program" --upstream "$UPSTREAM" --mode "$mode" --ceiling 900 \
    --results "$OUT/results.jsonl" "${DRIVER_ARGS[@]}" >"$OUT/logs/$program-$mode.txt" 2>&1
  rc=$?
  echo "run $program $mode: status $rc, $((SECONDS - start)) s" | tee -a "$OUT/meta.txt"
  ((rc == 0)) || status=1
done
"$KP_PYTHON" "$HERE/report.py" "$OUT" || status=1
exit "$status"
