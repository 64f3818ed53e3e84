#!/usr/bin/env bash
# Program-level tests of the kproxy binary: flags and errors, --dry-run, the manifest directory
# followed live, a malformed document, signals, --cleanup, and the plugin ABI end to end through
# the recorder test plugin. Kernel-touching cases run in an anonymous network namespace
# (unshare -n), never in the machine's own.
# Usage: kproxy_program.sh KPROXY_BIN TEST_PLUGIN_DIR SOURCE_DIR
set -uo pipefail
KPROXY=$1
TEST_PLUGINS=$2
SRC=$3
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root kproxy_program "network namespaces for --dry-run/--cleanup cases"
make_workdir program

# --- flags and errors -----------------------------------------------------------------------
out=$("$KPROXY" --no-such-flag 2>&1); rc=$?
if [[ $rc -eq 1 && "$out" == "kproxy: unknown flag: --no-such-flag" ]]; then pass "unknown flag"; else fail "unknown flag" "rc=$rc out=$out"; fi

out=$("$KPROXY" --iptables-sync-period=3x --manifests "$WORK" 2>&1); rc=$?
if [[ $rc -eq 1 && $(wc -l <<<"$out") -eq 1 && "$out" == *"--iptables-sync-period"* ]]; then pass "bad value"; else fail "bad value" "rc=$rc out=$out"; fi

out=$("$KPROXY" --proxy-mode=foo --plugin-dir "$TEST_PLUGINS" --manifests "$WORK" 2>&1 | grep -v '^[IW][0-9]'); rc=${PIPESTATUS[0]}
if [[ $rc -eq 1 && "$out" == 'kproxy: unknown proxy mode "foo"; available: ebpf, iptables, ipvs, nftables, recorder, userspace' ]]; then pass "unknown mode lists the loaded modes"; else fail "unknown mode" "rc=$rc out=$out"; fi

out=$("$KPROXY" --plugin-dir "$WORK/missing-dir" --help 2>&1); rc=$?
if [[ $rc -eq 0 && "$out" == *"--proxy-mode"* && "$out" == *"--manifests"* ]]; then pass "help"; else fail "help" "rc=$rc"; fi

# --- dry run: prints nft syntax and changes nothing -----------------------------------------
out=$(unshare -n bash -c "'$KPROXY' --proxy-mode=nftables --manifests '$SRC/examples/demo-manifests' --hostname-override demo-node --dry-run 2>/dev/null; echo TABLES:; nft list tables")
if [[ "$out" == *"add table ip kube-proxy"* && "$out" == *"add rule ip kube-proxy"* && "$out" == *"TABLES:" && "$out" != *"TABLES:"*"kube-proxy"* ]]; then
  pass "dry-run prints the batch and changes nothing"
else
  fail "dry-run" "$(tail -5 <<<"$out")"
fi

# --- an IPv6 Service on a node without IPv6: skipped with a log line, IPv4 unaffected --------
V6="$WORK/v6"; mkdir -p "$V6"
cp "$SRC"/examples/demo-manifests/*.yaml "$V6/"
cat >"$V6/v6.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: demo}
spec:
  clusterIP: fd00:10:96::10
  clusterIPs: [fd00:10:96::10]
  ipFamilies: [IPv6]
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
out=$(unshare -n bash -c "sysctl -qw net.ipv6.conf.all.disable_ipv6=1; '$KPROXY' --proxy-mode=nftables --manifests '$V6' --hostname-override demo-node --dry-run 2>&1")
if [[ "$out" == *"IPv6 is not available"* && "$out" == *"IP family disabled on this node"* && "$out" != *"add table ip6"* && "$out" == *"add rule ip kube-proxy"* ]]; then
  pass "IPv6 Service skipped with a log on an IPv4-only node; IPv4 programmed"
else
  fail "IPv6 on IPv4-only node" "$(grep -E 'IPv6|family|ip6' <<<"$out" | head -5)"
fi
out=$(unshare -n bash -c "'$KPROXY' --proxy-mode=nftables --manifests '$V6' --hostname-override demo-node --dry-run 2>/dev/null")
if [[ "$out" == *"add table ip6 kube-proxy"* && "$out" == *"fd00:10:96::10"* ]]; then
  pass "the same IPv6 Service is programmed where IPv6 is available"
else
  fail "IPv6 programmed" "$(grep -c ip6 <<<"$out") ip6 lines"
fi

# --- the recorder plugin through the real program: manifests followed live ----------------
M="$WORK/manifests"; mkdir -p "$M"
REC="$WORK/record.txt"
cat >"$M/web.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.20
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
- addresses: [10.244.1.2]
  conditions: {ready: true}
- addresses: [10.244.1.3]
  conditions: {ready: true}
YAML
cat >"$WORK/config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: recorder
hostnameOverride: node-a
nftables: {minSyncPeriod: 100ms, syncPeriod: 30s}
iptables: {minSyncPeriod: 250ms, syncPeriod: 45s}
ipvs: {tcpTimeout: 15m, tcpFinTimeout: 30s, udpTimeout: 1500ms}
YAML
# In its own network namespace: kproxy opens its metrics and health listeners there.
KPROXY_RECORD_FILE="$REC" unshare -n "$KPROXY" --config "$WORK/config.yaml" --plugin-dir "$TEST_PLUGINS" \
  --manifests "$M" -v 2 >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")

has() { grep -qF -- "$2" "$1" 2>/dev/null; }
# sync_with FILE FROM TEXT: the first sync record (its "sync ..." line and the lines the recorder
# wrote with it) after line FROM of FILE that holds the line TEXT; fails when there is none.
sync_with() {
  awk -v from="$2" -v want="$3" '
    NR <= from { next }
    /^sync / { if (found) exit; rec = $0 "\n"; insync = 1; next }
    /^(option|cleanup)/ { if (found) exit; insync = 0; next }
    insync { rec = rec $0 "\n"; if ($0 == want) found = 1 }
    END { if (!found) exit 1; printf "%s", rec }' "$1" 2>/dev/null
}
lines() { wc -l <"$1"; }
if wait_for "$HANG_CEILING" has "$REC" "state v4:default/web:http tcp 10.96.0.20:80 endpoints=10.244.1.2:8080,10.244.1.3:8080"; then
  pass "first sync reaches the plugin through the ABI"
else
  fail "first sync" "$(tail -5 "$WORK/kproxy.log")"
fi
if [[ $(grep -m1 '^sync ' "$REC") == "sync full=1 previous=0 size=1 node=node-a" ]]; then pass "first sync is full"; else fail "first sync is full" "$(grep -m1 '^sync ' "$REC")"; fi
# The options every backend gets (plugins/README.md), durations in seconds: the IPVS timeouts
# and the sync periods of the mode's section (a plugin mode uses the iptables one, as upstream).
missing=""
for opt in node-name=node-a ipvs-tcp-timeout=900 ipvs-tcpfin-timeout=30 ipvs-udp-timeout=1.5 \
    sync-period=45 min-sync-period=0.25 conntrack-udp-timeout=0 dry-run=false masquerade-all=false; do
  has "$REC" "option $opt" || missing+=" $opt"
done
if [[ -z "$missing" ]]; then pass "the plugin receives the documented options"; else fail "options" "missing:$missing; got: $(grep '^option' "$REC" | tr '\n' ' ')"; fi

# Remove one endpoint with an atomic rename, as editors and config tools do. What follows looks
# only at the sync that carried the change, not at the earlier ones in the same file.
from=$(lines "$REC")
sed '/10.244.1.2/,+1d' "$M/web.yaml" >"$WORK/web.yaml.new" && mv "$WORK/web.yaml.new" "$M/web.yaml"
removed="changed v4:default/web:http v4:default/web:http tcp 10.96.0.20:80 endpoints=10.244.1.3:8080"
if wait_for "$HANG_CEILING" sync_with "$REC" "$from" "$removed"; then
  pass "the endpoint removal reaches the plugin"
else
  fail "endpoint removal" "$(tail -5 "$REC")"
fi
record=$(sync_with "$REC" "$from" "$removed")
if [[ $(head -1 <<<"$record") == "sync full=0 previous=1 "* ]]; then pass "the change is a partial sync"; else fail "partial sync" "$record"; fi

# A malformed document is skipped with a log line naming its file; the rest keeps working.
from=$(lines "$REC")
printf 'apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: default}\nspec:\n  ports: [{port: notanumber}]\n' >"$M/bad.yaml"
sed 's/name: web, /name: api, /; s/10.96.0.20/10.96.0.21/; s/service-name: web/service-name: api/; s/name: web-1/name: api-1/' "$M/web.yaml" >"$M/api.yaml"
api="state v4:default/api:http tcp 10.96.0.21:80 endpoints=10.244.1.3:8080"
if wait_for "$HANG_CEILING" sync_with "$REC" "$from" "$api"; then pass "a good file next to a bad one is applied"; else fail "good next to bad" "$(tail -3 "$WORK/kproxy.log")"; fi
if grep -q 'bad.yaml' "$WORK/kproxy.log"; then pass "the malformed file is named in the log"; else fail "malformed logged" "$(grep -i warn "$WORK/kproxy.log" | tail -3)"; fi
# The sync that added api still holds web.
record=$(sync_with "$REC" "$from" "$api")
if grep -qxF "state v4:default/web:http tcp 10.96.0.20:80 endpoints=10.244.1.3:8080" <<<"$record"; then
  pass "other services are kept"
else
  fail "other services kept" "$record"
fi

# SIGTERM: a clean stop with exit status 0.
kill -TERM "$KP"
if wait_for "$HANG_CEILING" bash -c "! kill -0 $KP 2>/dev/null"; then
  wait "$KP"; rc=$?
  if [[ $rc -eq 0 ]]; then pass "SIGTERM stops cleanly with status 0"; else fail "SIGTERM" "exit status $rc"; fi
else
  fail "SIGTERM" "still running after $HANG_CEILING s"
fi

# --cleanup removes kproxy's tables, leaves others, and is safe twice (own namespace).
out=$(unshare -n bash -c "
  nft add table ip foreign || exit 1
  '$KPROXY' --proxy-mode=nftables --manifests '$SRC/examples/demo-manifests' --hostname-override demo-node --iptables-min-sync-period=0s >$WORK/cleanup-run.log 2>&1 &
  pid=\$!
  for ((i = 0; i < $HANG_CEILING * 20; i++)); do nft list tables | grep -q kube-proxy && break; sleep 0.05; done
  kill -TERM \$pid; wait \$pid; echo status=\$?
  echo BEFORE: \$(nft list tables)
  '$KPROXY' --cleanup >/dev/null 2>&1; echo first=\$?
  '$KPROXY' --cleanup >/dev/null 2>&1; echo second=\$?
  echo AFTER: \$(nft list tables)")
if [[ "$out" == *"status=0"* && "$out" == *"BEFORE: "*"table ip kube-proxy"* && "$out" == *"first=0"* && "$out" == *"second=0"* && "$out" == *"AFTER: table ip foreign" ]]; then
  pass "rules stay after SIGTERM; --cleanup removes them, twice, foreign table untouched"
else
  fail "cleanup" "$out $(tail -5 $WORK/cleanup-run.log)"
fi

finish program
