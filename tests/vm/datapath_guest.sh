#!/bin/bash
# Runs inside the test VM (tests/vm/run-in-vm.sh): the shared data-path suite
# (tests/datapath/suite.sh) against the guest kernel, so that the modes the host kernel cannot
# run (IPVS) are tested by the same cases as the others. The suite, scripts/netns-lib.sh, kproxy,
# its plugins and the tools of tests/tools are brought in under their host paths (see
# tests/vm/CMakeLists.txt), so the suite finds them as it does on the host.
#
# usage (in the guest): datapath_guest.sh SUITE [SUITE_ARGS...]
# Exits with the suite's status.
set -uo pipefail
suite=${1:?usage: datapath_guest.sh SUITE [SUITE_ARGS...]}
shift

# The guest's /dev is a bare devtmpfs: bash's process substitution (the suite's `< <(...)`)
# needs /dev/fd.
[[ -e /dev/fd ]] || ln -s /proc/self/fd /dev/fd

read -r uptime _ </proc/uptime
memory=$(awk '$1 == "MemTotal:" { printf "%d MiB", $2 / 1024 }' /proc/meminfo)
echo "datapath_guest: kernel $(uname -r), $(nproc) CPU, $memory, up ${uptime} s"
start=$SECONDS
"$suite" "$@"
rc=$?
echo "datapath_guest: the suite took $((SECONDS - start)) s in the guest (status $rc)"
exit "$rc"
