#!/usr/bin/env bash
# `kproxy explain --proxy-mode=ipvs` and `--dry-run` over the demo manifests: the IPVS plugin
# loads by its mode name, explains through its planned virtual servers, and prints its planned
# changes in ipvsadm notation (no kernel, no root).
# Usage: ipvs_explain.sh KPROXY_BIN SOURCE_DIR
set -uo pipefail
KPROXY=$1
M=$2/examples/demo-manifests

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
check() {
  local name=$1 out=$2; shift 2
  for want in "$@"; do
    if ! grep -qF -- "$want" <<<"$out"; then fail "$name" "missing \"$want\" in: $out"; return; fi
  done
  pass "$name"
}
FLAGS=(--proxy-mode=ipvs --manifests "$M" --hostname-override demo-node --cluster-cidr 10.244.0.0/16)
explain() { "$KPROXY" explain "$@" "${FLAGS[@]}" 2>&1; }

out=$(explain 10.244.1.5 10.96.0.10:80)
check clusterip_from_pod "$out" "service:   demo/web:http (ClusterIP)" \
  "DNAT to 10.244.1.11:8080, 10.244.1.12:8080, 10.244.1.13:8080, not masqueraded" "ipvsadm -A -t 10.96.0.10:80 -s rr"
out=$(explain 198.51.100.1 192.168.50.1:30080)
check nodeport_from_outside "$out" "(NodePort), via its node port 192.168.50.1:30080/tcp" ", masqueraded"
out=$(explain 10.244.1.5 10.96.0.99:80)
check not_a_service "$out" "accepted untouched"
out=$("$KPROXY" explain 10.244.1.5 10.96.0.10:80 --json "${FLAGS[@]}" 2>/dev/null)
check json "$out" '"verdict":"dnat"'

# --dry-run: the first sync's plan; it exits after it (the timeout only ends a hang).
out=$(timeout 120 "$KPROXY" --dry-run "${FLAGS[@]}" 2>/dev/null)
check dry_run "$out" "ip link add kube-ipvs0 type dummy" "ipvsadm -A -t 10.96.0.10:80 -s rr" \
  "ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.11:8080 -m -w 1" "ip addr add 10.96.0.10/32 dev kube-ipvs0" \
  "# ipset restore -exist" "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80" "# iptables-restore --noflush" \
  "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN" "sysctl -w net.ipv4.vs.conntrack=1"

echo "$passed passed, $failed failed"
((failed == 0 && passed == 5))
