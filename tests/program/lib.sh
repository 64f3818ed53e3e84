# shellcheck shell=bash
# lib.sh — what the program tests (and tests/e2e/api_tls.sh) share: the root check, a re-run
# in an anonymous network namespace, a work directory removed on exit together with the
# processes started into it, and the PASS/FAIL tally with its summary line. Source it after
# `set -uo pipefail`:
#   source "$(dirname "$0")/lib.sh"
#   require_root NAME WHY; enter_own_netns NAME "$@"; make_workdir SLUG
#   ... pass/fail/check ...
#   finish LABEL

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# check NAME CMD...: passes when CMD succeeds, else fails with $DETAIL as the reason.
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "${DETAIL:-}"; fi; }

# require_root NAME WHY: exits 1, as one failed check, when not run as root.
require_root() {
  [[ $(id -u) -eq 0 ]] && return 0
  echo "$1: ERROR: needs root ($2)" >&2
  echo "$1: 0 passed, 1 failed"
  exit 1
}

# enter_own_netns NAME ARGS...: runs the script again with ARGS under `unshare -n` (once:
# ${NAME^^}_IN_NETNS marks the re-run), then brings up the namespace's loopback.
enter_own_netns() {
  local flag="${1^^}_IN_NETNS"
  shift
  if [[ -z "${!flag:-}" ]]; then
    export "$flag=1"
    exec unshare -n "$0" "$@"
  fi
  ip link set lo up
}

# make_workdir SLUG: WORK=/tmp/kproxy-SLUG-XXXXXX; on exit the processes in PIDS are killed
# and waited for, then WORK is removed.
make_workdir() {
  WORK=$(mktemp -d "/tmp/kproxy-$1-XXXXXX")
  PIDS=()
  trap remove_workdir EXIT
}
remove_workdir() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}

# How long a test waits for something it expects (a log line, a metric, the kernel's state, a
# process's exit) before it calls it a hang. Tests wait for the event itself, never for a fixed
# time, so this only ends a wait that would never end: a loaded machine is slow, not failing.
HANG_CEILING=120
# The --max-time of one request to a local server: a hang guard as well.
REQUEST_CEILING=30

# wait_for SECONDS CMD...: polls every 50 ms until CMD succeeds; fails after SECONDS (as a
# ceiling: $HANG_CEILING unless a wait is known to take longer).
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  while ((SECONDS <= deadline)); do "$@" && return 0; sleep 0.05; done
  return 1
}

# code [CURL ARGS...] URL: the HTTP status (000 when nothing answered, or not within
# $REQUEST_CEILING s).
code() { curl -s -o /dev/null -w '%{http_code}' --max-time "$REQUEST_CEILING" "$@"; }
# is_code WANT [CURL ARGS...] URL
is_code() { local want=$1; shift; [[ $(code "$@") == "$want" ]]; }

# --- the HTTP tests' cluster (ops_http, http_limits) -----------------------------------------
# make_lb_fixture: M=$WORK/manifests with the Node node-a (InternalIP 10.0.0.1), and
# $WORK/config.yaml: nftables mode as node-a, metrics on 127.0.0.1:10249, health on
# 0.0.0.0:10256. After make_workdir.
make_lb_fixture() {
  M="$WORK/manifests"; mkdir -p "$M"
  cat >"$M/node.yaml" <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: 10.0.0.1}]
YAML
  cat >"$WORK/config.yaml" <<'YAML'
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: node-a
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 0.0.0.0:10256
nftables: {minSyncPeriod: 100ms, syncPeriod: 30s}
YAML
}

# mode_args MODE: MODE_ARGS, the flags MODE needs here beside the config file. ebpf: its
# programs go on a cgroup of the test's own (made here, removed on exit after kproxy), never the
# machine's root cgroup, and its pins on the private bpffs that scripts/private-bpffs.sh mounted;
# without that bpffs the test fails rather than use the machine's. Call after make_workdir.
mode_args() {
  MODE_ARGS=()
  [[ $1 == ebpf ]] || return 0
  if [[ -z "${KP_PRIVATE_BPFFS:-}" ]]; then
    echo "ERROR: ebpf mode needs a private bpffs (run through scripts/private-bpffs.sh)" >&2
    exit 1
  fi
  local root
  # shellcheck source=../../scripts/ebpf-lib.sh
  source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/ebpf-lib.sh"
  root=$(kp_cgroup2_root)
  [[ -n $root ]] || { echo "ERROR: no cgroup v2 hierarchy is mounted" >&2; exit 1; }
  TEST_CGROUP="$root/kproxy-program-$$"
  mkdir "$TEST_CGROUP" || { echo "ERROR: cannot make the cgroup $TEST_CGROUP" >&2; exit 1; }
  trap 'remove_workdir; rmdir "$TEST_CGROUP" 2>/dev/null' EXIT
  MODE_ARGS=(--ebpf-cgroup-path "$TEST_CGROUP")
}

# kproxy_alive: the kproxy started as $KP still runs.
kproxy_alive() { kill -0 "$KP" 2>/dev/null; }

# write_lb NAME CLUSTER_IP HC_PORT LOCAL_NODE: into $M, an eTP=Local LoadBalancer (node port
# HC_PORT - 1000) with one endpoint on LOCAL_NODE; written atomically (rename) as editors and
# config tools do.
write_lb() {
  cat >"$WORK/$1.tmp" <<YAML
apiVersion: v1
kind: Service
metadata: {name: $1, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: $2
  externalTrafficPolicy: Local
  healthCheckNodePort: $3
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: $(($3 - 1000)), protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $1-1
  namespace: default
  labels: {kubernetes.io/service-name: $1}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: true}
  nodeName: $4
YAML
  mv "$WORK/$1.tmp" "$M/$1.yaml"
}

# --- building against an installed kproxy (install, example_*) --------------------------------
# install_kproxy BUILD_DIR: `cmake --install` into PREFIX=$WORK/prefix; one check. After
# make_workdir.
install_kproxy() {
  PREFIX="$WORK/prefix"
  if cmake --install "$1" --prefix "$PREFIX" >"$WORK/install.log" 2>&1; then
    pass "cmake --install"
  else
    fail "cmake --install" "$(tail -5 "$WORK/install.log")"
  fi
}

# cache_value CMAKECACHE NAME: a variable of a CMakeCache.txt.
cache_value() { sed -n "s/^$2:[A-Z]*=//p" "$1"; }

# build_example BUILD_DIR SOURCE_DIR NAME: configures and builds SOURCE_DIR out of tree in
# $WORK/NAME with find_package(kproxy) finding the kproxy in $PREFIX (searched before the
# system's), with the main build's compiler, generator and build type, through ccache
# (CCACHE_DIR as the main build's, by default ~/.cache/kproxy/ccache). Paths are hashed relative
# to the build directory, so the random $WORK does not defeat the cache. Log in $WORK/NAME.log;
# returns whether it built.
build_example() {
  local cache="$1/CMakeCache.txt" launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  (
    export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kproxy/ccache} CCACHE_BASEDIR=/ CCACHE_NOHASHDIR=1
    cmake -S "$2" -B "$WORK/$3" -G "$(cache_value "$cache" CMAKE_GENERATOR)" \
          -DCMAKE_CXX_COMPILER="$(cache_value "$cache" CMAKE_CXX_COMPILER)" \
          -DCMAKE_BUILD_TYPE="$(cache_value "$cache" CMAKE_BUILD_TYPE)" "${launcher[@]}" \
          -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
          >"$WORK/$3.log" 2>&1 &&
      cmake --build "$WORK/$3" -j2 >>"$WORK/$3.log" 2>&1
  )
}

# finish LABEL: the summary line; exits 0 when nothing failed, else 1.
finish() {
  echo "$1: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit
}
