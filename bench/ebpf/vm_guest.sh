#!/bin/bash
# Runs inside the test VM (tests/vm/run-in-vm.sh, started by bench/ebpf/vm.sh): bench/ebpf/run.sh
# against the guest kernel, so that IPVS mode, which the host kernel lacks, is measured beside
# the other modes on the same kernel. The VM's own cgroup v2 hierarchy is mounted first (the
# guest's /init mounts none); run.sh makes its cgroups below it, as on a host.
#
# usage (in the guest): vm_guest.sh RUN_SH [RUN_SH_ARGS...]
set -uo pipefail
run=${1:?usage: vm_guest.sh RUN_SH [ARGS...]}
shift
# bash's process substitution needs /dev/fd; the guest's /dev is a bare devtmpfs.
[[ -e /dev/fd ]] || ln -s /proc/self/fd /dev/fd
if ! awk '$0 ~ / - cgroup2 / { found = 1 } END { exit !found }' /proc/self/mountinfo; then
  mount -t cgroup2 none /sys/fs/cgroup || { echo "vm_guest: mounting cgroup2 failed" >&2; exit 1; }
fi
echo "vm_guest: kernel $(uname -r), $(nproc) CPU, $(awk '$1 == "MemTotal:" { printf "%d MiB", $2 / 1024 }' /proc/meminfo)"
exec "$run" "$@"
