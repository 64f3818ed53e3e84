#!/usr/bin/env bash
# Per-service status of the real kproxy in MODE (nftables, iptables, userspace, ebpf: what it reports
# comes from the shared plan and the sync loop, so it must read the same in every mode):
# /debug/services on the metrics server and `kproxy status` (table, json, one service, errors).
# Runs in its own network namespace (unshare -n): nothing touches the machine's own.
# Usage: debug_services.sh KPROXY_BIN [MODE]
set -uo pipefail
KPROXY=${1:?usage: debug_services.sh KPROXY_BIN [MODE]}
MODE=${2:-nftables}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root debug_services "own network namespace, $MODE"
enter_own_netns debug_services "$@"
make_workdir debug-services

make_lb_fixture
sed -i "s/^mode: nftables/mode: $MODE/" "$WORK/config.yaml"
echo "iptables: {minSyncPeriod: 100ms, syncPeriod: 30s}" >>"$WORK/config.yaml"

# slice NAME ENDPOINT-LINES... : the EndpointSlice of NAME (port http 8080), one endpoint per
# "ADDRESS READY SERVING TERMINATING NODE".
slice() {
  local name=$1
  shift
  printf 'apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-1\n  namespace: default\n' "$name"
  printf '  labels: {kubernetes.io/service-name: %s}\naddressType: IPv4\n' "$name"
  printf 'ports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n'
  local e a r s t n
  for e in "$@"; do
    read -r a r s t n <<<"$e"
    printf -- '- addresses: [%s]\n  conditions: {ready: %s, serving: %s, terminating: %s}\n  nodeName: %s\n' \
      "$a" "$r" "$s" "$t" "$n"
  done
}
service() {  # NAME CLUSTER_IP TYPE EXTRA-SPEC-LINE
  printf 'apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\nspec:\n' "$1"
  printf '  type: %s\n  clusterIP: %s\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP%s}]\n' \
    "$3" "$2" "$([[ $3 == NodePort ]] && echo ", nodePort: 30500")"
  [[ -n "${4:-}" ]] && printf '  %s\n' "$4"
  echo ---
}
write_mixed() {  # the state of the fourth endpoint
  { service mixed 10.96.0.40 ClusterIP
    slice mixed "10.1.0.1 true true false node-a" "10.1.0.2 true true false node-b" \
      "10.1.0.3 false true true node-a" "10.1.0.4 $1 node-b"; } >"$WORK/mixed.tmp"
  mv "$WORK/mixed.tmp" "$M/mixed.yaml"
}
write_mixed "false false false"
{ service local-only 10.96.0.41 NodePort "externalTrafficPolicy: Local"
  slice local-only "10.1.0.5 true true false node-b"; } >"$M/local-only.yaml"
service empty 10.96.0.42 ClusterIP "" >"$M/empty.yaml"

mode_args "$MODE"
"$KPROXY" --config "$WORK/config.yaml" --manifests "$M" -v 2 "${MODE_ARGS[@]}" >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")
URL=http://127.0.0.1:10249/debug/services

doc() { curl -s --max-time "$REQUEST_CEILING" "$URL"; }
programmed() { [[ $(doc | jq -r '.programmed') == true ]]; }
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "/debug/services answers once the first sync is done ($MODE)" wait_for "$HANG_CEILING" programmed

# q JQ-FILTER: the filter's raw output over the current document.
q() { doc | jq -r "$1"; }
svc() { printf '.services[] | select(.service == "default/%s")' "$1"; }
expect() {  # NAME WANT JQ-FILTER
  local got
  got=$(q "$3")
  DETAIL="want '$2', got '$got'"
  check "$1" test "$got" == "$2"
}

expect "mode is reported" "$MODE" '.mode'
expect "three services, one port each" "default/empty default/local-only default/mixed" '[.services[].service] | join(" ")'
expect "mixed: 2 of 4 endpoints used" "2/4" "$(svc mixed) | \"\(.endpointCounts.used)/\(.endpointCounts.total)\""
expect "mixed: a ready endpoint is used for cluster traffic" "cluster ready" \
  "$(svc mixed) | .endpoints[] | select(.address == \"10.1.0.1:8080\") | \"\(.usedFor | join(\",\")) \(.reason)\""
expect "mixed: a terminating endpoint is not used while ready ones exist" "terminating (ready endpoints exist)" \
  "$(svc mixed) | .endpoints[] | select(.address == \"10.1.0.3:8080\") | .reason"
expect "mixed: a not-ready, not-serving endpoint is not used" "not ready" \
  "$(svc mixed) | .endpoints[] | select(.address == \"10.1.0.4:8080\") | .reason"
expect "mixed: internal traffic meets the 2 ready endpoints" "2 endpoints (cluster pool)" "$(svc mixed) | .internalTraffic.meets"
expect "empty: internal traffic is rejected" "rejected: the service has no usable endpoint" "$(svc empty) | .internalTraffic.meets"
expect "local-only: eTP=Local with no local endpoint drops external traffic" "dropped: no local endpoint" \
  "$(svc local-only) | .externalTraffic.meets"
expect "local-only: NodePort reported" "30500" "$(svc local-only) | .addresses.nodePort"
# Where NodePorts answer, as every backend decides it: the namespace has loopback only, and
# the Node's IP 10.0.0.1 is on no interface. nftables' default "primary" selects no IPv4
# address; the other modes' default is every local address (127.0.0.1 listed, for the
# backend to judge).
[[ $MODE == nftables ]] && want_np="false 0" || want_np="true 1"
expect "NodePort addresses: this mode's default, decided" "$want_np" \
  '.nodePortAddresses | "\(.allLocalIPv4) \([.addresses[] | select(contains(":") | not)] | length)"' 
expect "local-only: its remote endpoint serves internal traffic" "cluster" \
  "$(svc local-only) | .endpoints[0].usedFor | join(\",\")"
expect "every port was programmed by the first full sync" "full full full" '[.services[].lastProgrammed.kind] | join(" ")'
full=$(q '.lastFullSync.sync')
DETAIL="$(q '.lastFullSync')"
# The comparisons below need it: in jq, `x > null` holds for any x, and null == null.
check "the last full sync is reported with its number" grep -Eqx '[1-9][0-9]*' <<<"$full"
check "the full sync's kernel operations are reported (> 0)" test "$(q '.lastFullSync.operations')" -gt 0
# Present and null: a port without the field would read as null too.
expect "no errors" "null null null" \
  '[.services[] | if has("lastError") then .lastError | tostring else "missing" end] | join(" ")'

# A change to one service: only that port is programmed by the new (partial) sync.
write_mixed "true true false"
changed() { [[ $(q "$(svc mixed) | .endpointCounts.used") == 3 ]]; }
check "mixed: the endpoint made ready is used after the next sync" wait_for "$HANG_CEILING" changed
expect "mixed: programmed by a partial sync after the full one" "partial true" \
  "$(svc mixed) | \"\(.lastProgrammed.kind) \(.lastProgrammed.sync > $full)\""
expect "empty: still last programmed by the full sync" "$full" "$(svc empty) | .lastProgrammed.sync"

# kproxy status
table=$("$KPROXY" status 2>&1)
DETAIL="$table"
check "kproxy status prints a table with a header" grep -q '^SERVICE  *PORT  *TYPE  *ADDRESSES  *ENDPOINTS' <<<"$table"
check "kproxy status: mixed uses 3 of 4 endpoints" grep -Eq '^default/mixed +http/TCP +ClusterIP +10\.96\.0\.40:80 +3/4 ' <<<"$table"
check "kproxy status: the unused endpoint is listed with its reason" \
  grep -Eq '^default/mixed +http +10\.1\.0\.3:8080 +node-a +- +terminating \(ready endpoints exist\)' <<<"$table"
check "kproxy status: the NodePort is shown" grep -q 'default/local-only .*10\.96\.0\.41:80,node:30500' <<<"$table"
one=$("$KPROXY" status default/mixed -o json 2>&1)
DETAIL="$one"
check "kproxy status NAMESPACE/NAME -o json shows that service only" \
  test "$(jq -r '[.services[].service] | unique | join(" ")' <<<"$one")" == default/mixed
out=$("$KPROXY" status default/nope 2>&1); rc=$?
DETAIL="rc=$rc $out"
check "kproxy status for an unknown service fails clearly" test $rc -eq 1 -a -n "$(grep 'no service default/nope' <<<"$out")"
out=$("$KPROXY" status --server 127.0.0.1:1 2>&1); rc=$?
DETAIL="rc=$rc $out"
check "kproxy status without a server fails clearly" test $rc -eq 1 -a -n "$(grep 'connecting to 127.0.0.1:1' <<<"$out")"
out=$("$KPROXY" status -o yaml 2>&1); rc=$?
DETAIL="rc=$rc $out"
check "kproxy status refuses an unknown output format" test $rc -eq 2

DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy still runs" kproxy_alive
finish "debug_services ($MODE)"
