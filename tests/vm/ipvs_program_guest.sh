#!/bin/bash
# Runs inside the test VM: the kproxy program in IPVS mode, as a user runs it, in a network
# namespace of its own: the plugin loads by --proxy-mode=ipvs, the --ipvs-* flags reach it, it
# programs the demo manifests, /metrics and /proxyMode answer, a restart writes nothing, and
# self-verification finds nothing in a clean kernel and repairs a real server deleted behind its
# back, and --cleanup leaves no IPVS, kube-ipvs0, ipset or iptables object behind.
# Usage: ipvs_program_guest.sh KPROXY_BIN MANIFEST_DIR
set -uo pipefail
KPROXY=$1
MANIFESTS=$2
NS=kp-prog-$$
LOG=/tmp/kproxy-$NS.log
pid=

cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  ip netns del "$NS" 2>/dev/null
}
trap cleanup EXIT

in_ns() { ip netns exec "$NS" "$@"; }
fail() {
  echo "FAIL $1"
  echo "--- kproxy log"; tail -30 "$LOG"
  echo "--- ipvsadm -Ln"; in_ns ipvsadm -Ln
  exit 1
}
# has PATTERN COMMAND...: COMMAND's output holds PATTERN (grep -q on a pipe would end the
# command early, and pipefail would report its SIGPIPE).
has() {
  local pattern=$1 out; shift
  out=$("$@" 2>&1)
  grep -q -- "$pattern" <<<"$out"
}
# until_ok TRIES COMMAND...: retries COMMAND every 0.2 s, up to TRIES * 5 times (with the
# command's own time, longer than TRIES seconds). Every wait is for an event, under a ceiling
# that only ends a hang: TCG is slow, and a verification there can take most of a second,
# which puts the next one 100 times that away (ProxierOptions::verifyCostFactor).
HANG=300
until_ok() {
  local limit=$1; shift
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
# Not through in_ns: $! must be kproxy's own pid (ip netns exec execs it).
start_kproxy() {
  ip netns exec "$NS" "$KPROXY" "$@" --proxy-mode=ipvs --manifests "$MANIFESTS" --hostname-override demo-node \
    --cluster-cidr 10.244.0.0/16 --ipvs-scheduler wlc --ipvs-strict-arp --ipvs-tcp-timeout 1h \
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 -v=2 >"$LOG" 2>&1 &
  pid=$!
}
stop_kproxy() {
  kill "$pid"
  wait "$pid" 2>/dev/null
  pid=
}

ip netns add "$NS"
in_ns ip link set lo up
in_ns ip link add eth0 type dummy
in_ns ip addr add 192.168.50.1/24 dev eth0
in_ns ip link set eth0 up

start_kproxy
until_ok $HANG has '10.96.0.10:80 wlc' in_ns ipvsadm -Ln || fail "no virtual server 10.96.0.10:80 wlc"
until_ok $HANG grep -q "Synced rules" "$LOG" || fail "no sync logged"
listing=$(in_ns ipvsadm -Ln)
echo "$listing"
for want in "TCP  10.96.0.10:80 wlc" "TCP  192.168.50.1:30080 wlc" "-> 10.244.1.11:8080" "-> 10.244.1.13:8080"; do
  grep -qF -- "$want" <<<"$listing" || fail "ipvsadm -Ln lacks \"$want\""
done
has "10.96.0.10/32" in_ns ip -o addr show dev kube-ipvs0 || fail "10.96.0.10 not on kube-ipvs0"
[[ $(in_ns cat /proc/sys/net/ipv4/conf/all/arp_ignore) == 1 ]] || fail "arp_ignore is not 1 (--ipvs-strict-arp)"
has "Timeout (tcp tcpfin udp): 3600 " in_ns ipvsadm -L --timeout || fail "the IPVS TCP timeout is not 3600 s (--ipvs-tcp-timeout 1h)"
has "^10.96.0.10,tcp:80$" in_ns ipset list KUBE-CLUSTER-IP || fail "KUBE-CLUSTER-IP lacks 10.96.0.10,tcp:80"
has "-A KUBE-SERVICES" in_ns iptables-save -t nat || fail "no KUBE-SERVICES in nat"
[[ $(in_ns curl -sS --max-time 30 http://127.0.0.1:10249/proxyMode) == ipvs ]] || fail "/proxyMode is not ipvs"
has '^kproxy_ipvs_objects{kind="virtual_server"} 3$' in_ns curl -sS --max-time 30 http://127.0.0.1:10249/metrics ||
  fail "/metrics: kproxy_ipvs_objects{kind=\"virtual_server\"} is not 3"
# Per-service status, the same in every mode: /debug/services and kproxy status.
has '"service":"demo/web"' in_ns curl -sS --max-time 30 http://127.0.0.1:10249/debug/services ||
  fail "/debug/services does not list demo/web"
has '"mode":"ipvs"' in_ns curl -sS --max-time 30 http://127.0.0.1:10249/debug/services || fail "/debug/services: mode is not ipvs"
has '^demo/web .* 10.96.0.10:80' in_ns "$KPROXY" status || fail "kproxy status does not show demo/web"
echo "PASS programs the demo manifests"

# A restart over what it programmed writes nothing.
stop_kproxy
start_kproxy
until_ok $HANG grep -q "Synced rules" "$LOG" || fail "no sync after the restart"
grep -m1 "Synced rules" "$LOG"
grep -m1 "Synced rules" "$LOG" | grep -q 'operations=0 ' || fail "the first sync after a restart wrote something"
echo "PASS a restart writes nothing"
stop_kproxy

# Self-verification: a clean kernel verifies clean; a real server deleted behind kproxy's back
# is reported (log, metric) and put back.
start_kproxy --verify-period 2s
until_ok $HANG grep -q "Verified the kernel against the plan" "$LOG" || fail "no self-verification logged"
! grep -q "differed from the plan" "$LOG" || fail "a clean kernel did not verify clean"
in_ns ipvsadm -d -t 10.96.0.10:80 -r 10.244.1.11:8080 || fail "cannot delete the real server"
until_ok $HANG grep -q "The kernel differed from the plan; repaired" "$LOG" || fail "the deleted real server was not reported"
grep "differed from the plan" "$LOG" | grep -q -- "-r 10.244.1.11:8080" || fail "the log does not name the real server"
grep -m1 "differed from the plan" "$LOG"
until_ok $HANG has "-> 10.244.1.11:8080" in_ns ipvsadm -Ln -t 10.96.0.10:80 || fail "the real server was not put back"
has '^kproxy_sync_verify_mismatch_total{mode="ipvs"} [1-9]' in_ns curl -sS --max-time 30 http://127.0.0.1:10249/metrics ||
  fail "/metrics: kproxy_sync_verify_mismatch_total{mode=\"ipvs\"} is not > 0"
echo "PASS self-verification repairs a real server deleted behind kproxy's back"
stop_kproxy

in_ns "$KPROXY" --cleanup --hostname-override demo-node >"$LOG" 2>&1 || fail "--cleanup failed"
[[ -z $(in_ns ipvsadm -Sn) ]] || fail "virtual servers left after --cleanup"
! in_ns ip link show kube-ipvs0 >/dev/null 2>&1 || fail "kube-ipvs0 left after --cleanup"
! has '^KUBE-' in_ns ipset list -n || fail "ipsets left after --cleanup"
! has 'KUBE-' in_ns iptables-save || fail "iptables chains left after --cleanup"
echo "PASS --cleanup leaves nothing"
