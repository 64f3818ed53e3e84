#!/usr/bin/env bash
# `kproxy --init-only`: the privileged node set-up (conntrack sysctls and limits, the mode's
# sysctls), then exit 0 with nothing programmed. Each run is in a network namespace of its own
# (unshare -n), where the per-namespace sysctls (conntrack timeouts, route_localnet) are the
# namespace's, and nf_conntrack_max, a global value, is read-only even for root: kproxy warns and
# leaves it, as at every start-up in a container. The machine's own values are read before and
# after to show they are untouched. The conntrack maximum asked for differs from the machine's,
# so that kproxy tries (and is refused) rather than finding it in place.
# Usage: init_only.sh KPROXY_BIN
set -uo pipefail
KPROXY=$1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
require_root init_only "network namespaces"
make_workdir init-only

CT=/proc/sys/net/netfilter
if ! unshare -n test -e "$CT/nf_conntrack_tcp_timeout_established"; then
  echo "init_only: nf_conntrack is not loaded on this machine; nothing to check"
  exit 77
fi
host_max=$(cat "$CT/nf_conntrack_max")
host_established=$(cat "$CT/nf_conntrack_tcp_timeout_established")
host_localnet=$(cat /proc/sys/net/ipv4/conf/all/route_localnet)
want_min=$((host_max + 4096))

# run_init NAME KPROXY_ARGS...: kproxy --init-only in a fresh namespace, under the hang
# ceiling; then the namespace's values and what it holds. Output in $WORK/NAME.out.
run_init() {
  local name=$1; shift
  # A new namespace may inherit the machine's route_localnet (net.core.devconf_inherit_init_net):
  # start it at 0 so that a 1 afterwards is kproxy's.
  unshare -n bash -c '
    echo 0 >/proc/sys/net/ipv4/conf/all/route_localnet
    timeout "$1" "$2" --init-only "${@:3}" >"$0.log" 2>&1; echo "rc=$?"
    echo "established=$(cat /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established)"
    echo "udp=$(cat /proc/sys/net/netfilter/nf_conntrack_udp_timeout)"
    echo "localnet=$(cat /proc/sys/net/ipv4/conf/all/route_localnet)"
    echo "rules=$( { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -c "KUBE-")"
    echo "tables=$(nft list tables 2>/dev/null | wc -l)"' \
    "$WORK/$name" "$HANG_CEILING" "$KPROXY" "$@" >"$WORK/$name.out"
}
val() { sed -n "s/^$2=//p" "$WORK/$1.out"; }

# Upstream's default mode (iptables), as kubeadm's initContainer pattern runs it.
run_init default --conntrack-tcp-timeout-established=20h --conntrack-udp-timeout=45s \
  --conntrack-max-per-core=1 --conntrack-min="$want_min"
DETAIL="$(cat "$WORK/default.out") $(tail -5 "$WORK/default.log")"
check "--init-only exits 0 (and does not run on)" [ "$(val default rc)" = 0 ]
check "the conntrack timeouts are set in the namespace" \
  [ "$(val default established)" = 72000 -a "$(val default udp)" = 45 ]
check "iptables mode: route_localnet=1 for localhost NodePorts" [ "$(val default localnet)" = 1 ]
check "nothing is programmed" [ "$(val default rules)" = 0 -a "$(val default tables)" = 0 ]
check "it says so" grep -q "System initialized and --init-only specified" "$WORK/default.log"
check "nf_conntrack_max, read-only here, is a warning" \
  grep -q "sysctl is read-only here, leaving it.*nf_conntrack_max.*wanted=\"\?$want_min" "$WORK/default.log"

# nftables mode sets no mode sysctl; localhost NodePorts are iptables mode's only.
run_init nftables --proxy-mode=nftables
DETAIL="$(cat "$WORK/nftables.out") $(tail -5 "$WORK/nftables.log")"
check "nftables mode: exits 0, route_localnet untouched" \
  [ "$(val nftables rc)" = 0 -a "$(val nftables localnet)" = 0 -a "$(val nftables established)" = 86400 ]

# The machine's own values did not move.
DETAIL="max $host_max -> $(cat "$CT/nf_conntrack_max"), established $host_established -> $(cat "$CT/nf_conntrack_tcp_timeout_established")"
check "the machine's own sysctls are untouched" \
  [ "$(cat "$CT/nf_conntrack_max")" = "$host_max" -a "$(cat "$CT/nf_conntrack_tcp_timeout_established")" = "$host_established" \
    -a "$(cat /proc/sys/net/ipv4/conf/all/route_localnet)" = "$host_localnet" ]

finish init_only
