#!/usr/bin/env bash
# private-bpffs.sh CMD [ARGS...] — runs CMD in a mount namespace of its own, where /sys/fs/bpf is
# a fresh, empty bpffs that goes away with the namespace.
#
# Tests that run kproxy under `unshare -n` stay in the machine's mount namespace, so a kproxy
# started there (--cleanup, or any mode's removal of ebpf mode's leftovers after its first sync)
# would look for pins under the machine's /sys/fs/bpf/kproxy and remove them. Run through this,
# it finds an empty bpffs instead. (`ip netns exec` already gives its command a /sys without the
# machine's bpffs.)
set -euo pipefail
if [[ -z "${KP_PRIVATE_BPFFS:-}" ]]; then
  exec unshare --mount --propagation private env KP_PRIVATE_BPFFS=1 "$0" "$@"
fi
if ! mount -t bpf bpf /sys/fs/bpf; then
  echo "private-bpffs.sh: ERROR: cannot mount a private bpffs on /sys/fs/bpf (needs root)" >&2
  exit 1
fi
exec "$@"
