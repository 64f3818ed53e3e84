#!/usr/bin/env bash
# demo.sh — kproxy in nftables mode on a throw-away node made of network namespaces.
#
# Builds kproxy and the pods' server (./build, unless KPROXY_BIN is set), creates a node
# namespace with three pod namespaces and an outside client, loads examples/demo-manifests, starts
# `kproxy --proxy-mode=nftables` inside the node namespace, and shows traffic to the ClusterIP
# spreading over the pods and a NodePort reached from outside. Everything is removed on exit.
# Needs root. Exits non-zero when fewer than two distinct pods answered the ClusterIP or none
# answered the NodePort.
#
# Environment: KPROXY_BIN (skip the build; kproxy-podserver is then looked for in the same build
# or in KP_TOOLS_DIR), KPROXY_PLUGIN_DIR, KPROXY_BUILD_DIR (default ./build), KP_KEEP_WORKDIR=1
# (keep the kproxy log).

set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/netns-lib.sh"
# The test command's compiler cache (scripts/test.sh), so a demo after the tests builds quickly.
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kproxy/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

CLUSTER_IP=10.96.0.10
NODEPORT=30080
CURLS=12

kp_require_root_only
# A fresh machine: install the build and run-time dependencies first (idempotent, quick when
# present), and only then (after the build below, which makes the pods' server) look for the
# tools they bring.
"$ROOT/scripts/install-deps.sh"

if [[ -z "${KPROXY_BIN:-}" ]]; then
  BUILD_DIR="${KPROXY_BUILD_DIR:-$ROOT/build}"
  if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
    echo "==> configuring $BUILD_DIR"
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    # The build type the test command builds and tests (scripts/test.sh), so a build the
    # tests passed is the build the demo runs.
    cmake -S "$ROOT" -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
  fi
  echo "==> building kproxy"
  cmake --build "$BUILD_DIR" -j2 --target kproxy kproxy-backend-nftables kproxy-podserver kproxy-netprobe
  KPROXY_BIN="$BUILD_DIR/cli/kproxy"
  : "${KPROXY_PLUGIN_DIR:=$BUILD_DIR/plugins-out}"
fi
[[ -x "$KPROXY_BIN" ]] || kp_die "kproxy binary not found at $KPROXY_BIN"
export KPROXY_BIN KPROXY_PLUGIN_DIR
# With KPROXY_BIN given, the pods' server is the one built beside it (or KP_TOOLS_DIR's).
kp_require_tools

kp_init
MANIFESTS="$KP_WORKDIR/manifests"
mkdir -p "$MANIFESTS"

echo "==> creating the topology (node, 3 pods, outside client; prefix $KP_PREFIX)"
kp_topology_up 3
kp_start_pods
cp "$ROOT"/examples/demo-manifests/*.yaml "$MANIFESTS/"

echo "==> starting kproxy --proxy-mode=nftables in namespace $(kp_ns node)"
kp_start_kproxy "$MANIFESTS"

echo "==> waiting for the rules"
if ! kp_wait_served "$KP_CEILING" "http://$CLUSTER_IP/"; then
  echo "kproxy did not make $CLUSTER_IP reachable within $KP_CEILING s (or exited); its log:" >&2
  kp_kproxy_log_tail 40 >&2
  exit 1
fi

echo "==> $CURLS requests to the ClusterIP $CLUSTER_IP:80 from the node"
declare -A hits=()
for ((i = 1; i <= CURLS; i++)); do
  body="$(kp_curl node "http://$CLUSTER_IP/" 2>&1)" || body="(failed: $body)"
  printf '  %2d  %s\n' "$i" "$body"
  if [[ "$body" =~ ^pod=([^ ]+) ]]; then hits[${BASH_REMATCH[1]}]=$((${hits[${BASH_REMATCH[1]}]:-0} + 1)); fi
done
printf '  answered by:'
for pod in $(printf '%s\n' "${!hits[@]}" | sort); do printf ' %s×%d' "$pod" "${hits[$pod]}"; done
echo

echo "==> from the outside client ($KP_CLIENT_IP) to NodePort $KP_NODE_IP:$NODEPORT"
nodeport_ok=1
body="$(kp_curl client "http://$KP_NODE_IP:$NODEPORT/" 2>&1)" || { body="(failed: $body)"; nodeport_ok=0; }
[[ "$body" =~ ^pod= ]] || nodeport_ok=0
echo "  $body"

echo "==> nft list table ip kube-proxy (first 25 lines, in the node namespace)"
kp_nft node list table ip kube-proxy 2>&1 | head -n 25 || true

if ((${#hits[@]} < 2)); then
  echo "FAILED: only ${#hits[@]} distinct pod(s) answered; expected the ClusterIP to spread over at least 2" >&2
  kp_kproxy_log_tail 20 >&2
  exit 1
fi
if ((!nodeport_ok)); then
  echo "FAILED: no pod answered on NodePort $KP_NODE_IP:$NODEPORT from the outside client" >&2
  kp_kproxy_log_tail 20 >&2
  exit 1
fi
echo "==> OK: ${#hits[@]} distinct pods answered the ClusterIP, and a pod the NodePort; tearing down"
