#!/usr/bin/env bash
# `kproxy --cleanup` on a node that ran kube-proxy in iptables or IPVS mode: kube-proxy's
# iptables chains and jumps (IPv4 and IPv6, on the legacy and the nft back end), its IPVS
# virtual servers and KUBE-* ipsets, and the kube-ipvs0 dummy interface are removed; another
# program's rule, chain and ipset, and kubelet's KUBE-FIREWALL, are kept; a second run removes
# nothing and also exits 0.
# Everything runs in an anonymous network namespace (unshare -n), never in the machine's own.
# What this machine cannot check (an iptables variant not installed, no IPv6, no dummy link
# type) is named on a SKIP line; then, if nothing failed, the exit status is 77, which ctest
# reports as skipped (SKIP_RETURN_CODE), never as passed.
# PART limits the run to the iptables leftovers or to the IPVS ones (virtual servers, ipsets,
# kube-ipvs0), so that ctest can report each as passed or skipped on its own; both by default.
# The IPVS part needs a kernel with IPVS and dummy links: ctest runs it in the test VM
# (vm_cleanup_leftovers_ipvs, tests/vm/), where a SKIP fails the test.
# Usage: cleanup_leftovers.sh KPROXY_BIN [iptables|ipvs]
set -uo pipefail
KPROXY=${1:?usage: cleanup_leftovers.sh KPROXY_BIN [iptables|ipvs]}
PART=${2:-all}
case $PART in
  all | iptables | ipvs) ;;
  *) echo "cleanup_leftovers: unknown part '$PART' (iptables or ipvs)" >&2; exit 2 ;;
esac

# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root cleanup_leftovers "own network namespace, iptables"
enter_own_netns cleanup_leftovers "$@"
make_workdir cleanup-leftovers

skipped=0
SKIP_STATUS=77
skip() { echo "SKIP $1: $2"; skipped=$((skipped + 1)); }
# part NAME: whether this run checks NAME (iptables or ipvs).
part() { [[ $PART == all || $PART == "$1" ]]; }

tool() { command -v "$1" >/dev/null 2>&1; }
# saved_has VARIANT PATTERN: whether VARIANT-save's output matches. The output is read whole
# first: `save | grep -q` under pipefail fails when grep stops early and save gets SIGPIPE.
saved_has() { local out; out=$("$1-save" 2>/dev/null); grep -q -- "$2" <<<"$out"; }

# What kube-proxy 1.29 (iptables mode) leaves: three services, one with two endpoints, a
# NodePort with Local traffic policy, a LoadBalancer with source ranges. $1 is the family:
# 4 or 6 (addresses change, chains do not).
ruleset() {
  local a b c
  if [[ $1 == 4 ]]; then a=10.96.0.10 b=10.244.1.5 c=198.51.100.0/24; else a=fd00::10 b=fd00:244::5 c=2001:db8::/64; fi
  cat <<RULES
*mangle
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
:SITE-INPUT - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A INPUT -j SITE-INPUT
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-PROXY-FIREWALL -d ${a} -p tcp -m comment --comment "default/lb:http traffic not accepted by KUBE-FW-LB" -m tcp --dport 80 -j DROP
-A SITE-INPUT -p tcp -m tcp --dport 22 -m comment --comment "site ssh" -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-EXT-LB - [0:0]
:KUBE-FW-LB - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-DNS0000000000000 - [0:0]
:KUBE-SVC-WEB0000000000000 - [0:0]
:KUBE-SVL-NP00000000000000 - [0:0]
:SITE-NAT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j SITE-NAT
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-EXT-LB -j KUBE-MARK-MASQ
-A KUBE-EXT-LB -j KUBE-SVC-WEB0000000000000
-A KUBE-FW-LB -s ${c} -j KUBE-EXT-LB
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/np:http" -m tcp --dport 30080 -j KUBE-SVL-NP00000000000000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-AAAAAAAAAAAAAAAA -s ${b} -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p udp -m udp -j DNAT --to-destination [${b}]:53
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination [${b}]:8080
-A KUBE-SERVICES -d ${a} -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-DNS0000000000000
-A KUBE-SERVICES -d ${a} -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB0000000000000
-A KUBE-SERVICES -d ${a} -p tcp -m comment --comment "default/lb:http loadbalancer IP" -m tcp --dport 81 -j KUBE-FW-LB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-DNS0000000000000 -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SVC-WEB0000000000000 -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SVL-NP00000000000000 -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A SITE-NAT -p tcp --dport 2222 -m comment --comment "site redirect" -j REDIRECT --to-ports 22
COMMIT
RULES
}

VARIANTS=()
if part iptables; then
  # The iptables programs to load: both back ends (legacy and nft), both families. One that
  # cannot run here is a SKIP, not silently left out.
  for fam in iptables ip6tables; do
    if [[ $fam == ip6tables && ! -e /proc/net/if_inet6 ]]; then
      skip "ip6tables-legacy, ip6tables-nft" "no IPv6 in this kernel"
      continue
    fi
    for v in legacy nft; do
      if tool "$fam-$v-restore" && tool "$fam-$v-save"; then
        VARIANTS+=("$fam-$v")
      else
        skip "$fam-$v" "$fam-$v-restore or $fam-$v-save not installed (Debian: package iptables)"
      fi
    done
  done
  if [[ ${#VARIANTS[@]} -eq 0 ]]; then
    echo "cleanup_leftovers: ERROR: no iptables-restore installed" >&2
    echo "cleanup_leftovers: 0 passed, 1 failed"
    exit 1
  fi

  for v in "${VARIANTS[@]}"; do
    fam=4; [[ $v == ip6tables* ]] && fam=6
    # IPv6 DNAT targets are written [addr]:port, IPv4 ones addr:port.
    if [[ $fam == 4 ]]; then rules=$(ruleset 4 | sed 's/\[\([0-9.]*\)\]/\1/'); else rules=$(ruleset 6); fi
    if out=$("$v-restore" <<<"$rules" 2>&1); then
      pass "$v: kube-proxy ruleset loaded"
    else
      fail "$v: kube-proxy ruleset loaded" "$out"
    fi
  done
  # A start-up guard: the loaded rules really hold kube-proxy's chains (else the checks below
  # would pass on an empty table).
  for v in "${VARIANTS[@]}"; do
    n=$("$v-save" 2>/dev/null | grep -c '^:KUBE-SVC-')
    [[ $n -eq 2 ]] && pass "$v: KUBE-SVC chains present before cleanup" || fail "$v: KUBE-SVC chains present before cleanup" "count=$n"
  done
fi
HAVE_DUMMY=0
HAVE_IPVS=0
if part ipvs; then
  # The dummy link type is a module some kernels lack; then the removal case is skipped (and
  # said so), and the not-a-dummy case below still runs.
  if ip link add kube-ipvs0 type dummy 2>/dev/null; then
    HAVE_DUMMY=1
    pass "kube-ipvs0 dummy created"
  else
    skip "kube-ipvs0 removal" "this kernel has no dummy link type"
  fi
  # What kube-proxy's IPVS mode leaves besides kube-ipvs0: virtual servers with a real server,
  # and its ipsets; next to them another program's ipset, which must stay.
  if [[ ! -e /proc/net/ip_vs ]]; then
    skip "IPVS virtual servers and ipsets removal" "this kernel has no IPVS (the test VM's has)"
  elif ! tool ipvsadm || ! tool ipset; then
    skip "IPVS virtual servers and ipsets removal" "ipvsadm or ipset not installed"
  elif out=$({ ipvsadm -A -t 10.96.0.10:80 -s rr && ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m &&
               ipvsadm -A -u 10.96.0.10:53 -s rr && ipset create KUBE-CLUSTER-IP hash:ip,port &&
               ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:80 && ipset create KUBE-LOOP-BACK hash:ip,port,ip &&
               ipset create SITE-ALLOW hash:net; } 2>&1); then
    HAVE_IPVS=1
    pass "kube-proxy's IPVS virtual servers and ipsets created"
  else
    fail "kube-proxy's IPVS virtual servers and ipsets created" "$out"
  fi
fi

# --cleanup --dry-run first: it prints what it would remove and changes nothing.
snapshot() {
  local v
  for v in "${VARIANTS[@]}"; do "$v-save" 2>/dev/null | grep -v '^#'; done
  ip -o link show dev kube-ipvs0 2>/dev/null | cut -d' ' -f2
  if [[ $HAVE_IPVS -eq 1 ]]; then ipvsadm -S -n; ipset list -n | sort; fi
}
before=$(snapshot)
"$KPROXY" --cleanup --dry-run -v=2 >"$WORK/dry.out" 2>"$WORK/dry.log"; rc=$?
[[ $rc -eq 0 ]] && pass "--cleanup --dry-run exits 0" || fail "--cleanup --dry-run exits 0" "rc=$rc $(grep '^E' "$WORK/dry.log" | head -5)"
after=$(snapshot)
[[ -n "$before" && "$before" == "$after" ]] && pass "--cleanup --dry-run changes nothing" ||
  fail "--cleanup --dry-run changes nothing" "$(diff <(echo "$before") <(echo "$after") | head -5)"
if part iptables && [[ ${#VARIANTS[@]} -gt 0 ]]; then
  grep -q -- '-restore --noflush$' "$WORK/dry.out" && grep -q '^-X KUBE-' "$WORK/dry.out" &&
    pass "--cleanup --dry-run prints the iptables-restore it would run" ||
    fail "--cleanup --dry-run prints the iptables-restore it would run" "$(head -5 "$WORK/dry.out")"
fi
if [[ $HAVE_DUMMY -eq 1 ]]; then
  grep -q 'link del dev kube-ipvs0$' "$WORK/dry.out" && pass "--cleanup --dry-run prints the kube-ipvs0 removal" ||
    fail "--cleanup --dry-run prints the kube-ipvs0 removal" "$(head -5 "$WORK/dry.out")"
fi

"$KPROXY" --cleanup -v=2 >"$WORK/first.log" 2>&1; rc=$?
[[ $rc -eq 0 ]] && pass "first --cleanup exits 0" || fail "first --cleanup exits 0" "rc=$rc $(grep '^E' "$WORK/first.log" | head -5)"

for v in "${VARIANTS[@]}"; do
  saved=$("$v-save" 2>/dev/null)
  # Left: kubelet's chains only (KUBE-FIREWALL and KUBE-KUBELET-CANARY).
  left=$(grep -E '^:KUBE-|-j KUBE-' <<<"$saved" | grep -vE 'KUBE-FIREWALL|KUBE-KUBELET-CANARY')
  [[ -z "$left" ]] && pass "$v: kube-proxy chains and jumps gone" || fail "$v: kube-proxy chains and jumps gone" "$(head -5 <<<"$left")"
  if grep -q '^:KUBE-FIREWALL' <<<"$saved" && grep -q '^-A INPUT -j KUBE-FIREWALL' <<<"$saved" &&
     grep -q '^-A OUTPUT -j KUBE-FIREWALL' <<<"$saved" && grep -q '^:KUBE-KUBELET-CANARY' <<<"$saved"; then
    pass "$v: kubelet's KUBE-FIREWALL and canary kept"
  else
    fail "$v: kubelet's KUBE-FIREWALL and canary kept" "missing"
  fi
  if grep -q '^:SITE-INPUT' <<<"$saved" && grep -q '^-A INPUT -j SITE-INPUT' <<<"$saved" &&
     grep -q 'site ssh' <<<"$saved" && grep -q '^:SITE-NAT' <<<"$saved" &&
     grep -q '^-A PREROUTING -j SITE-NAT' <<<"$saved" && grep -q 'site redirect' <<<"$saved"; then
    pass "$v: foreign chains and rules kept"
  else
    fail "$v: foreign chains and rules kept" "$(grep SITE <<<"$saved")"
  fi
done
if part ipvs && [[ $HAVE_DUMMY == 1 ]]; then
  if ip link show kube-ipvs0 >/dev/null 2>&1; then fail "kube-ipvs0 removed" "still there"; else pass "kube-ipvs0 removed"; fi
  grep -q 'removed interface.*kube-ipvs0' "$WORK/first.log" && pass "removal of kube-ipvs0 logged" || fail "removal of kube-ipvs0 logged" "$(grep kube-ipvs0 "$WORK/first.log")"
fi
if part ipvs && [[ $HAVE_IPVS == 1 ]]; then
  left=$(ipvsadm -S -n 2>&1)
  [[ -z "$left" ]] && pass "IPVS virtual servers removed" || fail "IPVS virtual servers removed" "$(head -3 <<<"$left")"
  grep -q 'removed IPVS virtual servers.*count=2' "$WORK/first.log" && pass "removal of the virtual servers logged" ||
    fail "removal of the virtual servers logged" "$(grep -i ipvs "$WORK/first.log")"
  sets=$(ipset list -n 2>&1)
  grep -q '^KUBE-' <<<"$sets" && fail "KUBE-* ipsets removed" "$(grep '^KUBE-' <<<"$sets")" || pass "KUBE-* ipsets removed"
  grep -qx SITE-ALLOW <<<"$sets" && pass "foreign ipset kept" || fail "foreign ipset kept" "$sets"
  grep -q 'removed ipsets.*count=2' "$WORK/first.log" && pass "removal of the ipsets logged" ||
    fail "removal of the ipsets logged" "$(grep -i ipset "$WORK/first.log")"
fi
part iptables && { grep -q 'removed kube-proxy iptables leftovers.*table="nat"' "$WORK/first.log" && pass "iptables removal logged" || fail "iptables removal logged" "$(head -5 "$WORK/first.log")"; }
if part ipvs && [[ ! -e /proc/net/ip_vs ]]; then
  grep -q 'no IPVS in this kernel' "$WORK/first.log" && pass "no IPVS: no-op, logged at v=2" || fail "no IPVS: no-op, logged at v=2" "$(head -5 "$WORK/first.log")"
fi

"$KPROXY" --cleanup -v=2 >"$WORK/second.log" 2>&1; rc=$?
[[ $rc -eq 0 ]] && pass "second --cleanup exits 0" || fail "second --cleanup exits 0" "rc=$rc $(grep '^E' "$WORK/second.log" | head -5)"
if grep -qE 'removed (kube-proxy iptables|interface|IPVS|ipsets)' "$WORK/second.log"; then
  fail "second --cleanup removes nothing" "$(grep removed "$WORK/second.log")"
else
  pass "second --cleanup removes nothing"
fi
for v in "${VARIANTS[@]}"; do
  saved_has "$v" 'site redirect' && pass "$v: foreign rule still kept after second run" || fail "$v: foreign rule still kept after second run" "gone"
done

if part iptables; then
  # Start-up in nftables mode removes iptables leftovers too (upstream's platformCleanup for a
  # mode that is not iptables-based): a node switching from kube-proxy's iptables mode. They go
  # right after kproxy's first sync (the data-path case mode_switch_leaves_nothing checks the
  # order); this waits for that (up to $HANG_CEILING s, a hang).
  v=${VARIANTS[0]}
  if [[ $v == ip6tables* ]]; then rules=$(ruleset 6); else rules=$(ruleset 4 | sed 's/\[\([0-9.]*\)\]/\1/'); fi
  out=$("$v-restore" <<<"$rules" 2>&1) || fail "$v: kube-proxy ruleset loaded again" "$out"
  mkdir -p "$WORK/manifests"
  "$KPROXY" --proxy-mode=nftables --manifests "$WORK/manifests" --hostname-override node-a >"$WORK/startup.log" 2>&1 &
  KPID=$!
  gone=0
  leftovers_gone() { ! saved_has "$v" '^:KUBE-SVC-'; }
  wait_for "$HANG_CEILING" leftovers_gone && gone=1
  kill "$KPID" 2>/dev/null; wait "$KPID" 2>/dev/null
  if [[ $gone == 1 ]] && saved_has "$v" 'site redirect'; then
    pass "$v: nftables start-up removes kube-proxy leftovers, keeps foreign rules"
  else
    fail "$v: nftables start-up removes kube-proxy leftovers, keeps foreign rules" "$(grep -E '^[EW]' "$WORK/startup.log" | head -3)"
  fi
  "$KPROXY" --cleanup >/dev/null 2>&1  # kproxy's own nftables table
fi

if part iptables; then
  # ebpf mode's pins: under the default pin path of the private bpffs that
  # scripts/private-bpffs.sh mounted on /sys/fs/bpf (ctest runs this test through it). Without
  # it, this case would plant pins in the machine's own bpffs: it refuses to.
  if [[ -z "${KP_PRIVATE_BPFFS:-}" ]]; then
    fail "ebpf pins: --cleanup removes them" "not in a private bpffs: run through scripts/private-bpffs.sh"
  elif ! tool bpftool; then
    skip "ebpf pins" "bpftool not installed"
  else
    mkdir -p /sys/fs/bpf/kproxy
    bpftool map create /sys/fs/bpf/kproxy/kproxy_services type hash key 4 value 4 entries 1 name kproxy_services
    "$KPROXY" --cleanup -v=2 >"$WORK/ebpf.log" 2>&1; rc=$?
    if [[ $rc -eq 0 && ! -e /sys/fs/bpf/kproxy ]]; then
      pass "ebpf pins: --cleanup removes them"
    else
      fail "ebpf pins: --cleanup removes them" "rc=$rc $(ls /sys/fs/bpf/kproxy 2>&1) $(grep -E '^[EW]' "$WORK/ebpf.log" | head -3)"
    fi
  fi
fi

if part ipvs; then
  # A kube-ipvs0 that is not a dummy device is not kube-proxy's (upstream's DeleteDummyDevice
  # refuses it): kept, reported as an error, exit 1.
  if ip link add kube-ipvs0 type veth peer name kipvs-peer; then
    "$KPROXY" --cleanup >"$WORK/veth.log" 2>&1; rc=$?
    [[ $rc -eq 1 ]] && pass "non-dummy kube-ipvs0: --cleanup exits 1" || fail "non-dummy kube-ipvs0: --cleanup exits 1" "rc=$rc"
    grep -q '^E.*not a dummy device.*interface="kube-ipvs0"' "$WORK/veth.log" && pass "non-dummy kube-ipvs0: error logged" || fail "non-dummy kube-ipvs0: error logged" "$(cat "$WORK/veth.log")"
    ip link show kube-ipvs0 >/dev/null 2>&1 && pass "non-dummy kube-ipvs0: kept" || fail "non-dummy kube-ipvs0: kept" "deleted"
  else
    fail "veth kube-ipvs0 created" "ip link add failed"
  fi
fi

echo "cleanup_leftovers ($PART): $passed passed, $failed failed, $skipped not checked"
((failed == 0)) || exit 1
if ((skipped > 0)); then
  echo "cleanup_leftovers: not everything named was checked on this machine (SKIP lines above)"
  exit "$SKIP_STATUS"
fi
