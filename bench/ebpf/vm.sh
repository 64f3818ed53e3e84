#!/usr/bin/env bash
# bench/ebpf/run.sh inside the test VM (tests/vm/: Debian's cloud kernel under qemu), so that
# IPVS mode, which this host's kernel lacks, is measured beside the other modes: the same
# topology, objects and figures, every mode on the guest's one CPU and kernel. Under TCG (no
# KVM here) every figure is many times slower than on the host: compare the modes within one
# run of this script only, never with the host's tables.
#
# usage: bench/ebpf/vm.sh [--kproxy BIN] [--plugin-dir DIR] [SECONDS [S...]]
#   SECONDS per measurement (default 5), S the Service counts (default 1000).
#   KP_BENCH_MODES: the modes (default "ipvs nftables iptables ebpf"; upstream's need an
#   apiserver, which the guest has not). CONNRATE: kproxy-bench-connrate (default the build's).
#   KPROXY_VM_MEMORY: the guest's memory in MiB (default 2048).
# The guest runs the tables' command as root; nothing of the host's network or cgroups is
# touched. Needs qemu and the VM's packages (scripts/install-deps.sh, tests/vm/build-vm.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
KPROXY="$ROOT/build/cli/kproxy" PLUGINS=""
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --kproxy) KPROXY=$(readlink -f "${2:?}") ;;
    --plugin-dir) PLUGINS=$(readlink -f "${2:?}") ;;
    *) echo "vm.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
SECS=${1:-5}
shift || true
COUNTS=("$@")
[[ ${#COUNTS[@]} -gt 0 ]] || COUNTS=(1000)
[[ -n $PLUGINS ]] || PLUGINS="$(dirname "$KPROXY")/../plugins-out"
PLUGINS=$(readlink -f "$PLUGINS")
CONNRATE=$(readlink -f "${CONNRATE:-$(dirname "$KPROXY")/../bench/userspace/kproxy-bench-connrate}")
# The pods' server and probe, which scripts/netns-lib.sh requires (run.sh's pods serve with
# kproxy-bench-connrate).
TOOLS=$(readlink -f "${KP_TOOLS_DIR:-$(dirname "$KPROXY")/../tests/tools}")
MODES=${KP_BENCH_MODES:-ipvs nftables iptables ebpf}
for f in "$KPROXY" "$CONNRATE" "$TOOLS/kproxy-podserver" "$TOOLS/kproxy-netprobe"; do [[ -x $f ]] || { echo "vm.sh: $f not built" >&2; exit 1; }; done
[[ -d $PLUGINS ]] || { echo "vm.sh: no plugin directory $PLUGINS (--plugin-dir)" >&2; exit 1; }
# A ceiling that only catches a hang: per mode and size, the first sync under TCG, four
# measurements and the topology's set-up and teardown.
read -ra mode_list <<<"$MODES"
timeout_s=$((600 + ${#mode_list[@]} * ${#COUNTS[@]} * (600 + 4 * SECS)))
exec "$ROOT/tests/vm/run-in-vm.sh" --timeout "$timeout_s" --memory "${KPROXY_VM_MEMORY:-2048}" \
  --file "$KPROXY" --file "$PLUGINS" --file "$CONNRATE" \
  --file "$TOOLS/kproxy-podserver" --file "$TOOLS/kproxy-netprobe" \
  --file "$ROOT/bench/ebpf" --file "$ROOT/bench/api" --file "$ROOT/scripts/netns-lib.sh" \
  --file "$ROOT/scripts/ebpf-lib.sh" --file "$ROOT/tests/e2e/control-plane.sh" \
  --file "$HERE/vm_guest.sh:/kproxy-vm/bench.sh" \
  -- env KP_BENCH_MODES="$MODES" CONNRATE="$CONNRATE" KP_TOOLS_DIR="$TOOLS" KP_BENCH_READY_S=600 \
  /kproxy-vm/bench.sh "$ROOT/bench/ebpf/run.sh" --kproxy "$KPROXY" --plugin-dir "$PLUGINS" "$SECS" "${COUNTS[@]}"
