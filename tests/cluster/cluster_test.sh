#!/usr/bin/env bash
# The cluster suite: N nodes (3 by default) in network namespaces on a bridge, one kproxy per
# node in nftables mode (or cluster.py's --mode) on one real kube-apiserver, 1,000 background
# Services under light churn, and the scenarios of cluster.py (rolling update, scale to zero
# and back, node drain behind a load-balancer simulator, kproxy restart on every node, every
# node to an older commit's kproxy and back, apiserver restart and etcd compaction, mode switch
# on a live node) under constant request load. Fails on any failed TCP request (outside a scale-to-zero window)
# or any answer from a pod that should no longer receive traffic.
#
# Where a cgroup v2 hierarchy is mounted it runs in a mount namespace of its own (it
# re-executes itself there), where lib.sh's kc_ebpf_up mounts a bpffs and makes cgroups of the
# run, one per node for ebpf mode: nothing is attached to the host's root cgroup or pinned in
# the host's /sys/fs/bpf.
#
# usage: sudo tests/cluster/cluster_test.sh --kproxy BIN --plugin-dir DIR [--load BIN]
#                                           [--old-kproxy-dir DIR] [cluster.py options...]
#   --old-kproxy-dir: scenario kproxy-upgrade's older kproxy (DIR/kproxy, DIR/plugins); by default
#   old-kproxy.sh's, built once into ~/.cache/kproxy/cluster-old/<commit> (old-kproxy.commit).
#   KC_NODES (3), KC_SLOTS (pod slots per node, 5), KC_SERVICES (background Services, 1000),
#   KC_KEEP_WORKDIR=1 keeps the logs,
#   KC_BREAK_TERMINATION=ready|early breaks the rolling update on purpose (cluster.py says how):
#   the suite must then fail. KC_BREAK_MODE_SWITCH=cleanup breaks the mode switch likewise.
# Needs root, kube-apiserver built by tests/e2e/build-control-plane.sh, and etcd.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$HERE/../../scripts/netns-lib.sh"
# shellcheck source=../e2e/control-plane.sh
source "$HERE/../e2e/control-plane.sh"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

kp_require_root
[[ -n "$(kp_cgroup2_root)" ]] && kp_ebpf_reexec "$0" "$@"

LOAD=""
OLD_DIR=""
PASS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kproxy) export KPROXY_BIN="$2"; shift 2 ;;
    --plugin-dir) export KPROXY_PLUGIN_DIR="$2"; shift 2 ;;
    --load) LOAD="$2"; shift 2 ;;
    --old-kproxy-dir) OLD_DIR="$2"; shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done

kp_require_root
cp_apiserver_bin >/dev/null || exit 1
KPROXY="$(kp_kproxy_bin)" || kp_die "kproxy binary not found (--kproxy BIN)"
[[ -n "$LOAD" ]] || LOAD="$(dirname "$(dirname "$KPROXY")")/tests/cluster/kproxy-cluster-load"
[[ -x "$LOAD" ]] || kp_die "kproxy-cluster-load not found (--load BIN): build it"

# driver_option NAME ARGS...: the value of the driver's option --NAME among ARGS (empty when
# not given).
driver_option() {
  local name="$1" value=""
  shift
  while (($#)); do
    case "$1" in
      "--$name") value="${2:-}"; shift ;;
      "--$name="*) value="${1#--"$name"=}" ;;
    esac
    shift
  done
  echo "$value"
}

# wants_upgrade ARGS...: whether the driver's arguments select scenario kproxy-upgrade (its
# default list does).
wants_upgrade() {
  local list
  list="$(driver_option scenarios "$@")"
  [[ -z "$list" || ",$list," == *,kproxy-upgrade,* ]]
}

# old_kproxy_args: the driver's arguments for scenario kproxy-upgrade's older kproxy, built (or
# found in the cache) before any namespace exists; the time it took is in the log.
old_kproxy_args() {
  local started=$SECONDS
  if [[ -z "$OLD_DIR" ]]; then
    # The older build's plugin of the run's mode too (nftables is always built).
    OLD_DIR="$(KC_OLD_PLUGINS="$(driver_option mode "${PASS[@]}")" "$HERE/old-kproxy.sh")" || kp_die "scenario kproxy-upgrade: no older kproxy (old-kproxy.sh, above)"
  fi
  [[ -x "$OLD_DIR/kproxy" && -d "$OLD_DIR/plugins" ]] || kp_die "$OLD_DIR: no kproxy or plugins/ in it"
  kp_log "older kproxy for kproxy-upgrade, ready in $((SECONDS - started)) s: $OLD_DIR"
  [[ -f "$OLD_DIR/build-info" ]] && sed 's/^/  /' "$OLD_DIR/build-info" >&2
  OLD_ARGS=(--old-kproxy "$OLD_DIR/kproxy" --old-plugin-dir "$OLD_DIR/plugins")
}
OLD_ARGS=()
if wants_upgrade "${PASS[@]}"; then old_kproxy_args; fi

[[ -n "${KC_KEEP_WORKDIR:-}" ]] && export KP_KEEP_WORKDIR=1
kc_init
kc_fabric_up "${KC_NODES:-3}" "${KC_SLOTS:-5}" || kp_die "building the fabric"
kc_ebpf_up || kp_log "ebpf mode cannot run here (scenario mode-switch fails if it needs it): $KC_EBPF_ERROR"
kc_control_plane_up || kp_die "starting the control plane"
kc_node_credentials || kp_die "node credentials"
kc_describe "$KP_WORKDIR/cluster.json"
# In the background: this shell serves the driver's requests to stop and start the apiserver
# (its child) while the driver runs, then waits for it. A signal to this script ends it within
# a second, and its EXIT trap stops the driver with everything else in the namespaces.
kc_driver --desc "$KP_WORKDIR/cluster.json" --kproxy "$KPROXY" --plugin-dir "${KPROXY_PLUGIN_DIR:-}" \
  --podserver "$KP_PODSERVER" --load "$LOAD" --services "${KC_SERVICES:-1000}" \
  --control "$KP_WORKDIR" "${OLD_ARGS[@]}" "${PASS[@]}" &
driver=$!
kc_serve_control "$KP_WORKDIR" "$driver" || kp_die "the control channel"
wait "$driver"
rc=$?
if ((rc != 0)); then
  for f in "$KP_WORKDIR"/kproxy-node-*.log; do
    kp_log "last lines of $f:"
    tail -15 "$f" >&2
  done
fi
exit "$rc"
