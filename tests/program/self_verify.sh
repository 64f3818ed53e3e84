#!/usr/bin/env bash
# Self-verification of the real kproxy in MODE (nftables, iptables or ebpf): with nothing changed, its
# periodic check of the kernel against the plan finds no difference; after a rule is changed
# behind its back, the next check reports it (log naming the object, the
# kproxy_sync_verify_mismatch_total metric, /debug/services, kproxy status) and repairs it.
# Runs in its own network namespace (unshare -n): nothing touches the machine's own. In ebpf
# mode, the programs go on a cgroup of the test's own (never the root) and the pins on the
# private bpffs that scripts/private-bpffs.sh mounted (the test refuses to run without it).
# Usage: self_verify.sh KPROXY_BIN [MODE]
set -uo pipefail
KPROXY=${1:?usage: self_verify.sh KPROXY_BIN [MODE]}
MODE=${2:-nftables}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root self_verify "own network namespace, $MODE"
enter_own_netns self_verify "$@"
make_workdir self-verify

make_lb_fixture
sed -i "s/^mode: nftables/mode: $MODE/" "$WORK/config.yaml"
echo "iptables: {minSyncPeriod: 100ms, syncPeriod: 30s}" >>"$WORK/config.yaml"
cat >"$M/web.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.50
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.1.0.1]
  conditions: {ready: true}
  nodeName: node-a
YAML

mode_args "$MODE"
"$KPROXY" --config "$WORK/config.yaml" --manifests "$M" --verify-period 2s -v 2 "${MODE_ARGS[@]}" >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")
MET=http://127.0.0.1:10249

metric() { curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | awk -v n="$1{mode=\"$MODE\"}" '$1 == n {print int($2)}'; }
verified() { (($(metric kproxy_sync_verify_total) >= ${1:-1})); }

# What the check must find and repair: the ClusterIP's dispatch.
if [[ $MODE == nftables ]]; then
  present() { nft list map ip kube-proxy service-ips 2>/dev/null | grep -q '10\.96\.0\.50 \. tcp \. 80'; }
  tamper() { nft delete element ip kube-proxy service-ips '{ 10.96.0.50 . tcp . 80 }'; }
  names_object='service-ips'
  REPAIRS=1  # the element added back
elif [[ $MODE == ebpf ]]; then
  # The services map's key of tcp 10.96.0.50:80: the address (16 bytes), the port in network
  # order, the protocol and the family (bpf/map_layout.h).
  KEY="0a 60 00 32 00 00 00 00 00 00 00 00 00 00 00 00 00 50 06 04"
  # shellcheck disable=SC2086  # the key's bytes, as words
  present() { bpftool map lookup pinned /sys/fs/bpf/kproxy/kproxy_services key hex $KEY >/dev/null 2>&1; }
  # shellcheck disable=SC2086
  tamper() { bpftool map delete pinned /sys/fs/bpf/kproxy/kproxy_services key hex $KEY; }
  names_object='services tcp 10.96.0.50:80'
  REPAIRS=1  # the element written back
else
  svc_rule() { iptables-save -t nat 2>/dev/null | grep -- '-A KUBE-SERVICES .*-d 10.96.0.50/32' | head -1; }
  present() { [[ -n "$(svc_rule)" ]]; }
  tamper() {
    local rule
    rule=$(svc_rule)
    # shellcheck disable=SC2086  # the rule's words, as iptables-save printed them
    eval "iptables -t nat ${rule/-A /-D }"
  }
  names_object='KUBE-SERVICES'
  REPAIRS=1  # KUBE-SERVICES written again: one chain change
fi

DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "the service is programmed ($MODE)" wait_for "$HANG_CEILING" present
# Verifications are at least 100 times their cost apart (ProxierOptions::verifyCostFactor, which
# no flag sets): a full sync or verification of 50 ms puts the next one 5 s away, one of 713 ms
# (an emulated machine) 71 s. Each wait for the next one allows for that, and more.
VERIFY_CEILING=$((3 * HANG_CEILING))
DETAIL="$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | grep kproxy_sync_verify; tail -5 "$WORK/kproxy.log")"
check "a verification runs after the first full sync" wait_for "$VERIFY_CEILING" verified 1
DETAIL="$(grep -i 'differed' "$WORK/kproxy.log")"
check "an untouched kernel verifies clean (no mismatch counted)" test "$(metric kproxy_sync_verify_mismatch_total)" -eq 0
check "an untouched kernel verifies clean (nothing logged)" test -z "$(grep 'differed from the plan' "$WORK/kproxy.log")"
if [[ $MODE == iptables ]]; then
  # Upstream's iptables-mode families: the rule counts under upstream's names, and the packet
  # counters of the nfacct objects the rules count into (this namespace's, read at the scrape).
  upstream() { curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | awk -v n="$1" '$1 == n {print int($2)}'; }
  DETAIL="$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | grep -E 'iptables_(total|last)|nfacct|packets_total')"
  check "/metrics: kubeproxy_sync_proxy_rules_iptables_total of nat" \
    test "$(upstream 'kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}')" -gt 0
  check "/metrics: the INVALID drop's nfacct counter" \
    test -n "$(upstream kubeproxy_iptables_ct_state_invalid_dropped_packets_total)"
  check "/metrics: the localhost NodePorts' nfacct counter" \
    test -n "$(upstream kubeproxy_iptables_localhost_nodeports_accepted_packets_total)"
  check "the INVALID drop counts into its nfacct object" \
    grep -q -- '--ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP' <<<"$(iptables-save -t filter)"
fi

before=$(metric kproxy_sync_verify_total)
DETAIL="tamper failed"
check "the rule is removed behind kproxy's back" tamper
mismatch() { (($(metric kproxy_sync_verify_mismatch_total) > 0)); }
DETAIL="$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | grep kproxy_sync_verify; tail -5 "$WORK/kproxy.log")"
check "the next verification counts the difference" wait_for "$VERIFY_CEILING" mismatch
check "a verification ran after the change" verified $((before + 1))
line=$(grep 'The kernel differed from the plan; repaired' "$WORK/kproxy.log" | head -1)
DETAIL="$line"
check "the difference is logged" test -n "$line"
check "the log names the object ($names_object)" grep -q -- "$names_object" <<<"$line"
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "the rule is repaired" wait_for "$HANG_CEILING" present
# What the removal caused, one object to put back: the same count everywhere it is reported.
DETAIL="$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | grep kproxy_sync_verify)"
check "the metric counts the $REPAIRS kernel operation(s) the removal caused" \
  test "$(metric kproxy_sync_verify_mismatch_total)" -eq "$REPAIRS"
doc=$(curl -s --max-time "$REQUEST_CEILING" "$MET/debug/services")
DETAIL="$(jq -c .verification <<<"$doc")"
check "/debug/services shows the mismatch ($REPAIRS operation(s))" \
  test "$(jq -r '.verification.lastMismatch.operations' <<<"$doc")" == "$REPAIRS"
check "/debug/services counts the mismatched objects ($REPAIRS)" \
  test "$(jq -r '.verification.mismatchedObjects' <<<"$doc")" == "$REPAIRS"
status=$("$KPROXY" status 2>&1 | head -3)
DETAIL="$status"
# "verified N times, K differences repaired": N counts the verifications so far (at least the one
# after the removal), K what they repaired, which is what the removal caused.
times=$(sed -n 's/^verified \([0-9]*\) times, [0-9]* differences repaired.*/\1/p' <<<"$status")
repaired=$(sed -n 's/^verified [0-9]* times, \([0-9]*\) differences repaired.*/\1/p' <<<"$status")
check "kproxy status counts the verifications (at least $((before + 1)))" test "${times:-0}" -ge $((before + 1))
check "kproxy status reports the $REPAIRS repaired difference(s)" test "${repaired:-x}" == "$REPAIRS"

# Repaired means the next check is clean again.
after=$(metric kproxy_sync_verify_mismatch_total)
n=$(metric kproxy_sync_verify_total)
DETAIL="$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | grep kproxy_sync_verify)"
check "the next verification after the repair runs" wait_for "$VERIFY_CEILING" verified $((n + 1))
check "... and finds nothing more" test "$(metric kproxy_sync_verify_mismatch_total)" -eq "$after"

DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy still runs" kproxy_alive
finish "self_verify ($MODE)"
