#!/usr/bin/env bash
# Runs one command as root inside the IPVS test VM (tests/vm/build-vm.sh) and exits with its
# status.
#
#   tests/vm/run-in-vm.sh [--timeout S] [--memory MiB] [--keep-log FILE] [--verbose]
#                         [--nic SPEC] [--file HOST_PATH[:GUEST_PATH]]... -- COMMAND [ARG]...
#
# The guest boots a Debian cloud kernel under qemu (KVM when /dev/kvm works, else TCG), mounts
# proc, sys, devtmpfs, loads ip_vs, its rr/wrr/sh schedulers, conntrack, nftables, iptables,
# dummy and veth, brings `lo` up and runs COMMAND with /bin/sh semantics (`exec "$@"`). Its
# stdout and stderr (merged) come out on this script's stdout; the status comes back through the
# serial console as a marker line. --file copies a file or directory into the guest (GUEST_PATH
# defaults to the absolute host path) with the shared libraries of every ELF file in it.
# The guest has no network card unless --nic gives qemu's -nic SPEC (bench/compare's IPVS node:
# user networking, from inside the control plane's network namespace); its driver is
# virtio_net (load it with virtio_pci).
#
# Exit status: COMMAND's; 125 when the VM cannot be built or booted, or COMMAND never reported
# (the last console lines are printed to stderr); 124 on timeout (default 300 s).
# The accelerator is KVM where a probe boot (once per host, cached) shows it works, else TCG;
# KPROXY_VM_ACCEL=tcg|kvm forces one.
set -euo pipefail

HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
TIMEOUT=300
MEMORY=1024
KEEP_LOG=""
NIC=none
VERBOSE=0
FILES=()

die() { echo "run-in-vm: ERROR: $*" >&2; exit 125; }

while (($#)); do
  case $1 in
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    --memory) MEMORY=${2:?--memory needs MiB}; shift 2 ;;
    --file) FILES+=("${2:?--file needs HOST_PATH[:GUEST_PATH]}"); shift 2 ;;
    --nic) NIC=${2:?--nic needs a qemu -nic spec}; shift 2 ;;
    --keep-log) KEEP_LOG=${2:?--keep-log needs a file}; shift 2 ;;
    --verbose) VERBOSE=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$(readlink -f "${BASH_SOURCE[0]}")"; exit 0 ;;
    --) shift; break ;;
    *) die "unexpected '$1' (the command goes after --)" ;;
  esac
done
(($#)) || die "no command; usage: run-in-vm.sh [options] -- COMMAND [ARG]..."
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout takes whole seconds"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing; run scripts/install-deps.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kproxy-vm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The command, its nonce (so that no output of the command can forge the status marker) and the
# files go into a second archive behind the base initramfs.
NONCE=$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
mkdir -p "$WORK/guest"
{
  echo '#!/bin/sh'
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$WORK/guest/command"
chmod 755 "$WORK/guest/command"
echo "$NONCE" >"$WORK/guest/nonce"

start=$(date +%s.%N)
paths=$("$HERE/build-vm.sh" --out "$WORK" "${FILES[@]}" "$WORK/guest:/kproxy-vm") ||
  die "building the VM failed (see above)"
KERNEL=$(sed -n 's/^kernel=//p' <<<"$paths")
INITRD=$(sed -n 's/^initrd=//p' <<<"$paths")
built=$(date +%s.%N)

CACHE=${KPROXY_VM_CACHE:-$HOME/.cache/kproxy/vm}
QEMU_COMMON=(-cpu max -smp 1 -m "$MEMORY" -nographic -no-reboot -nodefaults -serial stdio
             -display none -kernel "$KERNEL")

# kvm_works: whether a stock guest boots under KVM here. An openable /dev/kvm is not enough: in
# some nested setups qemu aborts on a model-specific register or the guest hangs before its
# first line. One probe boot per host kernel and qemu version; the answer is cached.
kvm_works() {
  [[ -r /dev/kvm && -w /dev/kvm ]] || return 1
  local stamp
  stamp="$CACHE/kvm-probe-$(uname -r)-$(qemu-system-x86_64 --version | awk 'NR == 1 { print $4 }')"
  if [[ ! -f $stamp ]]; then
    echo "run-in-vm: probing KVM (once for this host kernel and qemu)" >&2
    local base
    base=$("$HERE/build-vm.sh" | sed -n 's/^initrd=//p')
    if timeout -k 5 20 qemu-system-x86_64 -accel kvm "${QEMU_COMMON[@]}" -initrd "$base" \
         -append "console=ttyS0 panic=-1 loglevel=4 no_timer_check" </dev/null 2>&1 | grep -q "KPROXY-VM-EXIT-=127"; then
      echo ok >"$stamp"
    else
      echo "no: a stock guest does not boot under KVM here" >"$stamp"
    fi
  fi
  [[ $(cat "$stamp") == ok ]]
}

case ${KPROXY_VM_ACCEL:-auto} in
  tcg) ACCEL=tcg ;;
  kvm) ACCEL=kvm ;;
  auto) if kvm_works; then ACCEL=kvm; else ACCEL=tcg; fi ;;
  *) die "KPROXY_VM_ACCEL must be tcg, kvm or auto" ;;
esac

LOG="$WORK/console.log"
# no_timer_check: under TCG on a busy host the guest's check of its IO-APIC timer can miss its
# ticks and panic at boot ("IO-APIC + timer doesn't work!", seen in a CI run beside stress-ng);
# the emulated timer is sound, so the check is skipped, as cloud images do for their guests.
APPEND="console=ttyS0 panic=-1 oops=panic rdinit=/init no_timer_check"
((VERBOSE)) || APPEND+=" loglevel=4"

# The console is read line by line: the command's output (between the markers) goes to stdout
# as it comes, the rest (the kernel's boot messages) only into the log. `sed -u` strips the
# console's carriage returns line by line (tr would hold them back in 4 KiB blocks).
set +e
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -accel "$ACCEL" "${QEMU_COMMON[@]}" -nic "$NIC" \
    -initrd "$INITRD" -append "$APPEND" </dev/null 2>&1 |
  sed -u 's/\r//g' | tee "$LOG" |
  awk -v begin="KPROXY-VM-BEGIN-$NONCE" -v exit_marker="KPROXY-VM-EXIT-$NONCE=" -v verbose="$VERBOSE" '
    index($0, exit_marker) { pre = substr($0, 1, index($0, exit_marker) - 1); if (pre != "") print pre; inside = 0; fflush(); next }
    inside { print; fflush(); next }
    index($0, begin) { inside = 1; next }
    verbose { print > "/dev/stderr" }'
statuses=("${PIPESTATUS[@]}")
set -e
end=$(date +%s.%N)
[[ -n $KEEP_LOG ]] && cp "$LOG" "$KEEP_LOG"

qemu_status=${statuses[0]}
rc=$(sed -n "s/.*KPROXY-VM-EXIT-$NONCE=\([0-9]*\)\$/\1/p" "$LOG" | tail -1)
begun=$(grep -c "KPROXY-VM-BEGIN-$NONCE" "$LOG" || true)
timing=$(awk -v s="$start" -v b="$built" -v e="$end" 'BEGIN { printf "build %.1f s, boot+run %.1f s", b - s, e - b }')
echo "run-in-vm: $timing (accel $ACCEL)" >&2

if [[ -n $rc ]]; then
  exit "$rc"
fi
if ((qemu_status == 124 || qemu_status == 137)); then
  echo "run-in-vm: ERROR: timed out after ${TIMEOUT} s ($([[ $begun -gt 0 ]] && echo "the command was running" || echo "the guest had not finished booting")); last console lines:" >&2
  tail -n 30 "$LOG" | sed 's/^/  | /' >&2
  exit 124
fi
echo "run-in-vm: ERROR: the guest $([[ $begun -gt 0 ]] && echo "stopped before the command reported its status" || echo "failed to boot") (qemu status $qemu_status); last console lines:" >&2
tail -n 30 "$LOG" | sed 's/^/  | /' >&2
exit 125
