# shellcheck shell=bash
# What ebpf mode's scripts (tests/datapath/suite.sh in ebpf mode, bench/ebpf/run.sh) share: a
# mount namespace of their own, with the cgroup v2 hierarchy bound and a bpffs mounted under a
# directory of theirs, and the removal of their cgroups.
#
# `ip netns exec` mounts a fresh /sys, which hides /sys/fs/cgroup and /sys/fs/bpf: hence the
# bind mount. The bpffs is a new instance, private to the mount namespace, so no pin lands on
# the host's /sys/fs/bpf. Programs go only on cgroups the script makes under its own, never on
# the root cgroup.

# kp_cgroup2_root — where the cgroup v2 hierarchy's root is mounted (/proc/self/mountinfo);
# nothing when none is.
kp_cgroup2_root() { awk '$0 ~ / - cgroup2 / && $4 == "/" { print $5; exit }' /proc/self/mountinfo; }

# kp_ebpf_reexec SCRIPT ARGS... — unless already done, re-runs SCRIPT with ARGS in a private
# mount namespace (exec: the caller does not return).
kp_ebpf_reexec() {
  [[ -n "${KP_EBPF_PRIVATE_MOUNTS:-}" ]] && return 0
  exec unshare --mount --propagation private env KP_EBPF_PRIVATE_MOUNTS=1 "$@"
}

# kp_ebpf_mount NAME — in the private mount namespace: makes KP_EBPF_DIR (a temporary
# directory), binds the cgroup v2 hierarchy (from /proc/self/mountinfo) on $KP_EBPF_DIR/cgroup2,
# mounts a bpffs on $KP_EBPF_DIR/bpffs and makes the cgroup KP_EBPF_TOP_CGROUP
# ($KP_EBPF_DIR/cgroup2/NAME). On failure, KP_EBPF_ERROR says why.
kp_ebpf_mount() {
  [[ -n "${KP_EBPF_PRIVATE_MOUNTS:-}" ]] || { KP_EBPF_ERROR="not in a private mount namespace (kp_ebpf_reexec)"; return 1; }
  local root
  KP_EBPF_ERROR=""
  root="$(kp_cgroup2_root)"
  [[ -n "$root" ]] || { KP_EBPF_ERROR="no cgroup v2 hierarchy is mounted"; return 1; }
  KP_EBPF_DIR="$(mktemp -d "${TMPDIR:-/tmp}/kpebpf$$.XXXXXX")" || { KP_EBPF_ERROR="mktemp failed"; return 1; }
  mkdir -p "$KP_EBPF_DIR/cgroup2" "$KP_EBPF_DIR/bpffs"
  mount --bind "$root" "$KP_EBPF_DIR/cgroup2" && mount -t bpf bpf "$KP_EBPF_DIR/bpffs" ||
    { KP_EBPF_ERROR="mounting the cgroup2 bind and the bpffs failed"; return 1; }
  mkdir "$KP_EBPF_DIR/cgroup2/$1" || { KP_EBPF_ERROR="cannot make cgroup $1"; return 1; }
  KP_EBPF_TOP_CGROUP="$KP_EBPF_DIR/cgroup2/$1"
}

# kp_ebpf_rmdir_cgroup DIR — removes a cgroup of ours, ending what still runs in it.
kp_ebpf_rmdir_cgroup() {
  local i pid
  [[ -d "$1" ]] || return 0
  for ((i = 0; i < 50; i++)); do
    rmdir "$1" 2>/dev/null && return 0
    for pid in $(cat "$1/cgroup.procs" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    sleep 0.1
  done
  echo "WARNING: cgroup $1 could not be removed" >&2
}

# kp_ebpf_unmount — removes KP_EBPF_TOP_CGROUP with the cgroups under it (two levels), unmounts
# and removes KP_EBPF_DIR.
kp_ebpf_unmount() {
  local d e
  [[ -n "${KP_EBPF_DIR:-}" ]] || return 0
  if [[ -n "${KP_EBPF_TOP_CGROUP:-}" ]]; then
    for d in "$KP_EBPF_TOP_CGROUP"/*/; do
      [[ -d "$d" ]] || continue
      for e in "$d"*/; do [[ -d "$e" ]] && kp_ebpf_rmdir_cgroup "${e%/}"; done
      kp_ebpf_rmdir_cgroup "${d%/}"
    done
    kp_ebpf_rmdir_cgroup "$KP_EBPF_TOP_CGROUP"
  fi
  umount "$KP_EBPF_DIR/bpffs" "$KP_EBPF_DIR/cgroup2" 2>/dev/null
  # rmdir, not rm -r: should an unmount have failed, nothing under a mount is removed.
  rmdir "$KP_EBPF_DIR/bpffs" "$KP_EBPF_DIR/cgroup2" "$KP_EBPF_DIR" 2>/dev/null
  KP_EBPF_DIR=""
}
