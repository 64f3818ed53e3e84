#!/usr/bin/env bash
# The operator-facing HTTP endpoints of the real kproxy (nftables mode, --manifests), over real
# HTTP with curl: /metrics, /proxyMode, /configz and /healthz on the metrics server; /healthz and
# /livez on the health server; a health-check node port that follows the local endpoints and
# closes with its Service; a taken port that is reported, not fatal. Runs in its own network
# namespace (unshare -n): nothing touches the machine's own.
# Usage: ops_http.sh KPROXY_BIN
set -uo pipefail
KPROXY=${1:?usage: ops_http.sh KPROXY_BIN}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root ops_http "own network namespace, nftables"
enter_own_netns ops_http "$@"
make_workdir ops-http

# connect_result PORT — how one TCP connect to 127.0.0.1:PORT ends: OK or the errno's name.
connect_result() {
  python3 -c '
import errno, socket, sys
s = socket.socket(); s.settimeout(float(sys.argv[2]))
try:
    s.connect(("127.0.0.1", int(sys.argv[1]))); print("OK")
except socket.timeout:
    print("ETIMEDOUT")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))' "$1" "$REQUEST_CEILING"
}
# refused PORT — nothing listens on 127.0.0.1:PORT any more: the connection is refused (any
# other failure, a timeout for instance, is not what is checked).
refused() { [[ $(connect_result "$1") == ECONNREFUSED ]]; }

make_lb_fixture
write_lb web 10.96.0.30 32000 node-a
started=$(date +%s)

# A port someone else holds, for a second service's health check.
python3 -c '
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 32100)); s.listen(1); time.sleep(600)' &
PIDS+=($!)

"$KPROXY" --config "$WORK/config.yaml" --manifests "$M" -v 2 >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")

MET=http://127.0.0.1:10249
HZ=http://127.0.0.1:10256
HC=http://127.0.0.1:32000

DETAIL="$(tail -5 "$WORK/kproxy.log" 2>/dev/null)"
check "health server answers /livez 200" wait_for "$HANG_CEILING" is_code 200 "$HZ/livez"
check "first sync opens the health-check port" wait_for "$HANG_CEILING" is_code 200 "$HC/"

# --- metrics server -----------------------------------------------------------------------
metrics=$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics")
missing=""
for name in kubeproxy_sync_proxy_rules_duration_seconds_bucket kubeproxy_sync_full_proxy_rules_duration_seconds_count \
    kubeproxy_sync_partial_proxy_rules_duration_seconds_count kubeproxy_sync_proxy_rules_last_timestamp_seconds \
    kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds kubeproxy_sync_proxy_rules_endpoint_changes_pending \
    kubeproxy_sync_proxy_rules_endpoint_changes_total kubeproxy_sync_proxy_rules_service_changes_pending \
    kubeproxy_sync_proxy_rules_service_changes_total kubeproxy_network_programming_duration_seconds_count \
    'kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}' \
    'kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}' \
    'kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}' \
    'kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}' \
    'kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv4"}' \
    'kubernetes_build_info{' '# TYPE rest_client_requests_total counter' kubeproxy_proxy_livez_total \
    process_resident_memory_bytes process_cpu_seconds_total process_open_fds process_start_time_seconds; do
  grep -qF -- "$name" <<<"$metrics" || missing+=" $name"
done
DETAIL="missing:$missing"; check "/metrics has kube-proxy's metric names" test -z "$missing"
syncs=$(awk '$1 == "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}" {print $2}' <<<"$metrics")
DETAIL="count=$syncs"; check "/metrics counts the syncs (> 0)" test "${syncs:-0}" -gt 0
last=$(awk '$1 == "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}" {print int($2)}' <<<"$metrics")
now=$(date +%s)
DETAIL="last=$last started=$started now=$now"
check "last sync timestamp is of this run" test "${last:-0}" -ge "$started" -a "${last:-0}" -le "$now"
# kproxy's own: failed syncs by category, and the metrics the nftables plugin registers through
# the plugin ABI (1.2), which must agree with what the kernel holds.
DETAIL="$(grep kproxy_sync_proxy_rules_failures_total <<<"$metrics")"
check "/metrics counts failed syncs by category" grep -qx 'kproxy_sync_proxy_rules_failures_total{category="kernel_refused"} 0' <<<"$metrics"
for line in '# TYPE kproxy_nftables_objects gauge' '# TYPE kproxy_nftables_kernel_operations_total counter' \
    '# HELP kproxy_nftables_objects Chains, sets and set elements in kproxy'"'"'s nftables tables'; do
  DETAIL="$(grep kproxy_nftables <<<"$metrics" | head -12)"; check "/metrics has the plugin's '$line'" grep -qxF -- "$line" <<<"$metrics"
done
ops=$(awk '$1 == "kproxy_nftables_kernel_operations_total" {print $2}' <<<"$metrics")
DETAIL="ops=$ops"; check "the plugin counts its kernel operations (> 0)" test "${ops:-0}" -gt 0
metric_chains=$(awk '$1 == "kproxy_nftables_objects{family=\"ipv4\",kind=\"chain\"}" {print $2}' <<<"$metrics")
kernel_chains=$(nft list table ip kube-proxy 2>/dev/null | grep -c '^\s*chain ')
DETAIL="metric=$metric_chains kernel=$kernel_chains"
check "the plugin's chain gauge matches the kernel's table" test "${metric_chains:-x}" = "$kernel_chains"
# A malformed manifest is skipped and counted in kproxy's source metric.
printf 'apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: default}\nspec: {ports: [{port: -1}]}\n' >"$M/broken.yaml"
decode_failures() { curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | awk '$1 == "kproxy_source_decode_failures_total" {print $2}'; }
decode_failed_once() { [[ "$(decode_failures)" == 1 ]]; }
DETAIL="value=$(decode_failures)"; check "a malformed manifest is counted in kproxy_source_decode_failures_total" wait_for "$HANG_CEILING" decode_failed_once
rm -f "$M/broken.yaml"
ctype=$(curl -s --max-time "$REQUEST_CEILING" -o /dev/null -w '%{content_type}' "$MET/metrics")
DETAIL="$ctype"; check "/metrics content type is Prometheus text" test "$ctype" = "text/plain; version=0.0.4; charset=utf-8"

mode=$(curl -s --max-time "$REQUEST_CEILING" "$MET/proxyMode")
DETAIL="got '$mode'"; check "/proxyMode says nftables" test "$mode" = nftables

configz=$(curl -s --max-time "$REQUEST_CEILING" "$MET/configz")
DETAIL="${configz:0:200}"
check "/configz is JSON with kubeproxy.config.k8s.io" python3 -c '
import json, sys
c = json.loads(sys.argv[1])["kubeproxy.config.k8s.io"]
assert c["kind"] == "KubeProxyConfiguration" and c["mode"] == "nftables", c' "$configz"

DETAIL=$(curl -s --max-time "$REQUEST_CEILING" "$MET/healthz")
check "metrics server /healthz says ok" test "$DETAIL" = ok
check "unknown path is 404" is_code 404 "$MET/nope"

# --- health server ------------------------------------------------------------------------
hz=$(curl -s -D "$WORK/hz.headers" --max-time "$REQUEST_CEILING" -w '\n%{http_code}' "$HZ/healthz")
DETAIL="$hz"
check "/healthz 200 with upstream's JSON" python3 -c '
import json, sys
body, code = sys.argv[1].rsplit("\n", 1)
j = json.loads(body)
assert code == "200", code
assert j["healthy"] is True and j["nodeEligible"] is True, j
assert j["lastUpdated"].endswith("Z") and j["currentTime"].endswith("Z"), j
assert j["status"]["IPv4"]["healthy"] is True, j' "$hz"
DETAIL=$(cat "$WORK/hz.headers"); check "/healthz sends nosniff" grep -qi '^X-Content-Type-Options: nosniff' "$WORK/hz.headers"
lz=$(curl -s --max-time "$REQUEST_CEILING" -w '\n%{http_code}' "$HZ/livez")
DETAIL="$lz"
check "/livez 200 with JSON" python3 -c '
import json, sys
body, code = sys.argv[1].rsplit("\n", 1)
j = json.loads(body)
assert code == "200" and j["healthy"] is True and "nodeEligible" not in j, (code, j)' "$lz"
counted=$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | awk '$1 == "kubeproxy_proxy_healthz_total{code=\"200\"}" {print $2}')
DETAIL="count=$counted"; check "probes are counted in kubeproxy_proxy_healthz_total" test "${counted:-0}" -ge 1

# --- health-check node port ---------------------------------------------------------------
hc=$(curl -s -D "$WORK/hc.headers" --max-time "$REQUEST_CEILING" -w '\n%{http_code}' "$HC/")
DETAIL="$hc"
check "health-check port: 200, localEndpoints=1" python3 -c '
import json, sys
body, code = sys.argv[1].rsplit("\n", 1)
j = json.loads(body)
assert code == "200", code
assert j == {"service": {"namespace": "default", "name": "web"}, "localEndpoints": 1, "serviceProxyHealthy": True}, j' "$hc"
DETAIL=$(cat "$WORK/hc.headers")
check "health-check port sends X-Load-Balancing-Endpoint-Weight: 1" grep -qi '^X-Load-Balancing-Endpoint-Weight: 1' "$WORK/hc.headers"

write_lb web 10.96.0.30 32000 node-b  # the endpoint moves to another node
if wait_for "$HANG_CEILING" is_code 503 "$HC/"; then
  pass "health-check port turns 503 after losing the local endpoint"
else
  fail "health-check port turns 503" "$(curl -s --max-time "$REQUEST_CEILING" "$HC/")"
fi
DETAIL=$(curl -s --max-time "$REQUEST_CEILING" "$HC/"); check "503 body says localEndpoints=0" grep -q '"localEndpoints": 0' <<<"$DETAIL"
nolocal=$(curl -s --max-time "$REQUEST_CEILING" "$MET/metrics" | awk '$1 == "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"}" {print $2}')
DETAIL="got $nolocal"; check "no_local_endpoints_total{external} is 1" test "${nolocal:-x}" = 1

# A service whose health-check port is taken: reported in the log, kproxy keeps serving.
listening() { [[ $(connect_result "$1") == OK ]]; }
DETAIL="connect: $(connect_result 32100)"; check "another program holds port 32100" wait_for "$HANG_CEILING" listening 32100
write_lb other 10.96.0.31 32100 node-a
DETAIL=$(tail -5 "$WORK/kproxy.log")
check "a taken health-check port is logged" wait_for "$HANG_CEILING" grep -q 'Failed to start healthcheck.*32100' "$WORK/kproxy.log"
check "kproxy keeps running after it" kproxy_alive
check "kproxy stays healthy after it" is_code 200 "$HZ/livez"

rm "$M/web.yaml"
if wait_for "$HANG_CEILING" refused 32000; then
  pass "health-check listener closes when the service is deleted"
else
  fail "health-check listener closes" "connect to :32000 gives $(connect_result 32000), HTTP $(code "$HC/")"
fi

if ! kill -TERM "$KP" 2>/dev/null; then
  fail "SIGTERM" "kproxy had already exited: $(tail -3 "$WORK/kproxy.log")"
elif wait_for "$HANG_CEILING" bash -c "! kill -0 $KP 2>/dev/null"; then
  wait "$KP"; rc=$?
  DETAIL="exit status $rc"; check "SIGTERM with servers running: exit 0" test "$rc" -eq 0
else
  fail "SIGTERM" "still running after $HANG_CEILING s"
fi
DETAIL=$(grep -E '^E' "$WORK/kproxy.log" | grep -v 'healthcheck' | head -3)
check "no other errors in the log" test -z "$DETAIL"

finish ops_http
