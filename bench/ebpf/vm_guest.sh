#!/bin/bash
# Runs inside the test VM (tests/vm/run-in-vm.sh, started by bench/ebpf/vm.sh): mounts the VM's
# own cgroup v2 hierarchy (the guest's /init mounts none; run.sh makes its cgroups below it, as
# on a host), then hands over to tests/vm/datapath_guest.sh (brought in as
# /kproxy-vm/datapath.sh), which prepares the guest's /dev and runs bench/ebpf/run.sh.
#
# usage (in the guest): vm_guest.sh RUN_SH [RUN_SH_ARGS...]
set -uo pipefail
run=${1:?usage: vm_guest.sh RUN_SH [ARGS...]}
# run.sh's library, under its host path as run.sh is (bench/ebpf/run.sh -> scripts/ebpf-lib.sh).
# shellcheck source=../../scripts/ebpf-lib.sh
source "$(dirname "$run")/../../scripts/ebpf-lib.sh" || { echo "vm_guest: scripts/ebpf-lib.sh not found" >&2; exit 1; }
if [[ -z "$(kp_cgroup2_root)" ]]; then
  mount -t cgroup2 none /sys/fs/cgroup || { echo "vm_guest: mounting cgroup2 failed" >&2; exit 1; }
fi
exec /kproxy-vm/datapath.sh "$@"
