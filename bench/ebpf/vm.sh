#!/usr/bin/env bash
# bench/ebpf/run.sh inside the test VM (tests/vm/: Debian's cloud kernel under qemu), so that
# IPVS mode, which this host's kernel lacks, is measured beside the other modes: the same
# topology, objects and figures, every mode on the guest's one CPU and kernel. Under TCG (no
# KVM here) every figure is many times slower than on the host: compare the modes within one
# run of this script only, never with the host's tables.
#
# usage: bench/ebpf/vm.sh [--kproxy BIN] [--plugin-dir DIR] [SECONDS [S...]]
#   SECONDS per measurement (default 5), S the Service counts (default 1000). kproxy, its
#   plugins (default BUILD/plugins-out) and the pods' tools are found as run.sh finds them
#   (scripts/netns-lib.sh).
#   KP_BENCH_MODES: the modes (default "ipvs nftables iptables ebpf"; upstream's need an
#   apiserver, which the guest has not). CONNRATE: kproxy-bench-connrate (default the build's).
#   KP_BENCH_REQUESTS: requests on each connection (run.sh's; default 1).
#   KPROXY_VM_MEMORY: the guest's memory in MiB (default 2048).
# The guest runs the tables' command as root; nothing of the host's network or cgroups is
# touched. Needs qemu and the VM's packages (scripts/install-deps.sh, tests/vm/build-vm.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$HERE/../../scripts/netns-lib.sh"
kp_kproxy_options "$@"
set -- "${KP_ARGS[@]}"
SECS=${1:-5}
shift || true
COUNTS=("$@")
[[ ${#COUNTS[@]} -gt 0 ]] || COUNTS=(1000)
KPROXY=$(readlink -f "$(kp_kproxy_bin)") || kp_die "kproxy binary not found (--kproxy BIN)"
BUILD=$(dirname "$(dirname "$KPROXY")")
PLUGINS=$(readlink -f "${KPROXY_PLUGIN_DIR:-$BUILD/plugins-out}")
CONNRATE=$(readlink -f "${CONNRATE:-$BUILD/bench/userspace/kproxy-bench-connrate}")
export KPROXY_BIN=$KPROXY  # kp_tool_bin: the pods' tools of this build
PODSERVER=$(readlink -f "$(kp_tool_bin kproxy-podserver)") || kp_die "kproxy-podserver not built (or set KP_TOOLS_DIR)"
NETPROBE=$(readlink -f "$(kp_tool_bin kproxy-netprobe)") || kp_die "kproxy-netprobe not built (or set KP_TOOLS_DIR)"
MODES=${KP_BENCH_MODES:-ipvs nftables iptables ebpf}
[[ -x $CONNRATE ]] || kp_die "$CONNRATE not built"
[[ -d $PLUGINS ]] || kp_die "no plugin directory $PLUGINS (--plugin-dir)"
# A ceiling that only catches a hang: per mode and size, the first sync under TCG, four
# measurements and the topology's set-up and teardown.
read -ra mode_list <<<"$MODES"
timeout_s=$((600 + ${#mode_list[@]} * ${#COUNTS[@]} * (600 + 4 * SECS)))
exec "$KP_SOURCE_DIR/tests/vm/run-in-vm.sh" --timeout "$timeout_s" --memory "${KPROXY_VM_MEMORY:-2048}" \
  --file "$KPROXY" --file "$PLUGINS" --file "$CONNRATE" --file "$PODSERVER" --file "$NETPROBE" \
  --file "$KP_SOURCE_DIR/bench/ebpf" --file "$KP_SOURCE_DIR/bench/api" --file "$KP_SOURCE_DIR/scripts/netns-lib.sh" \
  --file "$KP_SOURCE_DIR/scripts/ebpf-lib.sh" --file "$KP_SOURCE_DIR/tests/e2e/control-plane.sh" \
  --file "$KP_SOURCE_DIR/tests/vm/datapath_guest.sh:/kproxy-vm/datapath.sh" \
  --file "$HERE/vm_guest.sh:/kproxy-vm/bench.sh" \
  -- env KP_BENCH_MODES="$MODES" CONNRATE="$CONNRATE" KP_PODSERVER="$PODSERVER" KP_NETPROBE="$NETPROBE" \
  KP_BENCH_READY_S=600 KP_BENCH_REQUESTS="${KP_BENCH_REQUESTS:-1}" \
  /kproxy-vm/bench.sh "$KP_SOURCE_DIR/bench/ebpf/run.sh" --kproxy "$KPROXY" --plugin-dir "$PLUGINS" "$SECS" "${COUNTS[@]}"
