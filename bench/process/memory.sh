#!/usr/bin/env bash
# Memory of the whole kproxy process (core, manifest source, nftables plugin) at scale:
# SERVICES Services × ENDPOINTS endpoints from a manifest directory, kproxy in a throw-away
# node namespace. Prints the peak (VmHWM) once the first full sync is in the kernel, the
# resident set then, and the resident set 20 s later (steady state).
#
# usage: sudo bench/process/memory.sh [--kproxy BIN] [--plugin-dir DIR] [SERVICES [ENDPOINTS]]
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/netns-lib.sh"
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SERVICES="${1:-30000}"
ENDPOINTS="${2:-10}"

kp_require_root
kp_init
trap 'kp_teardown' EXIT
kp_topology_up 0 0 || exit 1
"$KP_PYTHON" "$HERE/manifests.py" "$KP_WORKDIR/manifests" "$SERVICES" "$ENDPOINTS" "$KP_NODE_NAME" "$KP_NODE_IP" ||
  kp_die "writing the manifests"
# -v 2: "Synced rules" is logged for every sync; at -v 1 only a sync slower than 1 s is.
KP_VERBOSITY=2 kp_start_kproxy "$KP_WORKDIR/manifests" || exit 1
status() { grep -E "^$1:" "/proc/$KP_KPROXY_PID/status" | awk '{printf "%d", $2 / 1024}'; }
synced() { grep -q 'kind=full.*operations=[1-9]' "$KP_WORKDIR/kproxy.log" && echo yes; }
started=${EPOCHREALTIME/./}
kp_wait_for 600 synced >/dev/null || { kp_kproxy_log_tail 20 >&2; kp_die "no full sync within 600 s"; }
took=$(((${EPOCHREALTIME/./} - started) / 1000))
peak=$(status VmHWM) now=$(status VmRSS)
sleep 20
kp_kproxy_alive || kp_die "kproxy exited"
printf 'services=%s endpoints=%s first_sync_in_ms=%s peak_MiB=%s rss_after_sync_MiB=%s rss_20s_later_MiB=%s peak_20s_later_MiB=%s\n' \
  "$SERVICES" "$ENDPOINTS" "$took" "$peak" "$now" "$(status VmRSS)" "$(status VmHWM)"
kp_stop_kproxy
