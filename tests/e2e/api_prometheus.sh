#!/usr/bin/env bash
# A real Prometheus (Debian's prometheus) scrapes kproxy, running against a real kube-apiserver
# + etcd, and answers the queries of the usual kube-proxy dashboards and alerts (kubernetes-mixin's
# kube-proxy dashboard and its KubeProxyDown alert, job="kube-proxy"):
#  - the scrape succeeds (up is 1, the target has no error: the exposition parses);
#  - each family they select has the series with upstream's label sets and the type upstream's
#    registry declares: sync duration and network programming by ip_family, rest_client_requests_total
#    by code, method and host, client_golang's process collector (CPU, memory, fds, start time, network);
#  - those series move with the cluster: a Service created after kproxy started makes the sync
#    count grow, its EndpointSlice's last-change-trigger-time makes a network programming
#    observation appear, and the dashboards' 99th percentiles of both become numbers.
# The backend is the test-plugins' recorder (no kernel rules: this suite is about the API side).
# Prometheus, kproxy and the control plane share an anonymous network namespace (unshare -n),
# every address on its loopback; Prometheus's storage is in the test's work directory. Needs root,
# and kube-apiserver and prometheus (Debian's binary, taken from its package into
# ~/.cache/kproxy/bin) from tests/e2e/build-control-plane.sh; a machine without them fails the test.
#
# usage: sudo tests/e2e/api_prometheus.sh --kproxy BIN --test-plugins DIR
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../program/lib.sh
source "$HERE/../program/lib.sh"
# shellcheck source=control-plane.sh
source "$HERE/control-plane.sh"
cp_recorder_test api_prometheus API_PROMETHEUS_KEEP "$@"

PROMETHEUS=${PROMETHEUS_BIN:-$KPROXY_CACHE/bin/prometheus}
[[ -x $PROMETHEUS ]] || {
  fail "prometheus is there" "no $PROMETHEUS: tests/e2e/build-control-plane.sh prometheus fetches Debian's"
  finish "api_prometheus"
}

# stop_on_failure: ends the test when a check failed, where what follows needs it to pass (the
# later waits would each reach the ceiling).
stop_on_failure() { ((failed == 0)) || finish "api_prometheus"; }

cp_start || exit 1
cp_kproxy_kubeconfig "$WORK/kubeconfig" || exit 1
create_node() { cp_api POST /api/v1/nodes '{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}}' >/dev/null; }
check "Node node-a created" create_node
cp_recorder_kproxy
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy answers /healthz" wait_for "$CEILING" is_code 200 http://127.0.0.1:10256/healthz
stop_on_failure

# Scraped every second, as the job kubernetes-mixin's selectors name.
cat >"$WORK/prometheus.yml" <<'YAML'
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kube-proxy
    static_configs:
      - targets: ['127.0.0.1:10249']
YAML
PROM=127.0.0.1:9090
"$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus" \
  --web.listen-address="$PROM" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
CP_TEST_PIDS+=($!)
DETAIL="$(tail -5 "$WORK/prometheus.log")"
check "Prometheus is ready" wait_for "$CEILING" is_code 200 "http://$PROM/-/ready"
stop_on_failure

# api PATH [CURL ARGS...]: a GET on Prometheus's HTTP API; its data on stdout, fails unless the
# answer is a success.
api() {
  local path=$1
  shift
  curl -sf --max-time "$REQUEST_CEILING" --get "$@" "http://$PROM$path" | jq -ec 'select(.status == "success") | .data'
}
# query EXPR: the result of an instant query, as a JSON array of {metric, value}.
query() { api /api/v1/query --data-urlencode "query=$1" | jq -c .result; }
# value EXPR [LABEL VALUE]: the value of the (first) series of EXPR, or of the one whose LABEL is
# VALUE; nothing when there is none.
value() { query "$1" | jq -r --arg l "${2:-}" --arg v "${3:-}" 'map(select($l == "" or .metric[$l] == $v)) | .[0].value[1] // empty'; }
is_number() { [[ "$1" =~ ^[0-9.e+-]+$ ]]; }
# grows EXPR FROM: the value of EXPR is a number greater than FROM.
grows() { local v; v=$(value "$1"); is_number "$v" && awk -v v="$v" -v n="$2" 'BEGIN { exit !(v > n) }'; }
# label_sets SELECTOR: the label names of the series SELECTOR matches, one sorted set a line.
label_sets() { api /api/v1/series --data-urlencode "match[]=$1" | jq -r 'map(keys | join(",")) | unique | .[]'; }
# label_sets_are SELECTOR NAMES: every series SELECTOR matches has exactly the labels NAMES.
label_sets_are() { DETAIL="$(label_sets "$1")"; [[ "$DETAIL" == "$2" ]]; }
# type_is FAMILY TYPE: the scrape's metadata gives FAMILY the type TYPE.
type_is() {
  DETAIL="$(api /api/v1/metadata --data-urlencode "metric=$1" | jq -c --arg f "$1" '.[$f]')"
  [[ "$(jq -r '.[0].type' <<<"$DETAIL")" == "$2" ]]
}

JOB='job="kube-proxy"'
scraped() { [[ -n "$(value "up{$JOB}")" ]]; }
check "Prometheus has scraped kproxy" wait_for "$CEILING" scraped
stop_on_failure
DETAIL="$(api /api/v1/targets | jq -c '.activeTargets[] | {health, lastError, scrapeUrl}')"
check "the target is healthy, its exposition parsed without error" \
  test "$(jq -r '"\(.health) \(.lastError)"' <<<"$DETAIL")" == "up "
DETAIL="$(query "up{$JOB}")"
check "up{$JOB} is 1" test "$(value "up{$JOB}")" == 1
check "kubernetes-mixin's KubeProxyDown, absent(up{$JOB} == 1), does not fire" \
  test "$(query "absent(up{$JOB} == 1)" | jq length)" == 0

# Upstream's label sets; ip_family takes the values of a node's families only.
SYNC=kubeproxy_sync_proxy_rules_duration_seconds
NETPROG=kubeproxy_network_programming_duration_seconds
check "${SYNC}_bucket by ip_family and le" label_sets_are "${SYNC}_bucket{$JOB}" __name__,instance,ip_family,job,le
check "${NETPROG}_bucket by ip_family and le" label_sets_are "${NETPROG}_bucket{$JOB}" __name__,instance,ip_family,job,le
families() { api /api/v1/label/ip_family/values --data-urlencode "match[]=${SYNC}_count{$JOB}" | jq -r 'join(",")'; }
DETAIL="$(families)"
check "ip_family is IPv4 (and IPv6 on a dual-stack node)" grep -qx 'IPv4\|IPv4,IPv6' <<<"$DETAIL"
check "rest_client_requests_total by code, host and method" \
  label_sets_are "rest_client_requests_total{$JOB}" __name__,code,host,instance,job,method
for family in process_cpu_seconds_total process_resident_memory_bytes; do
  check "$family has no labels of its own" label_sets_are "$family{$JOB}" __name__,instance,job
done

# The types upstream's registry declares; client_golang's process collector's families.
check "$SYNC is a histogram" type_is "$SYNC" histogram
check "$NETPROG is a histogram" type_is "$NETPROG" histogram
check "rest_client_requests_total is a counter" type_is rest_client_requests_total counter
for family in process_cpu_seconds_total process_network_receive_bytes_total process_network_transmit_bytes_total; do
  check "$family is a counter" type_is "$family" counter
done
for family in process_resident_memory_bytes process_virtual_memory_bytes process_virtual_memory_max_bytes \
  process_open_fds process_max_fds process_start_time_seconds; do
  check "$family is a gauge" type_is "$family" gauge
done

# The dashboard's API panel: kproxy's own requests to this apiserver, by code, method and host.
API_REQUESTS="sum by (code, method, host) (rest_client_requests_total{$JOB,code=~\"2..\"})"
# api_gets: one series, {code="200", host=this apiserver, method="GET"}, above 0.
api_gets() {
  DETAIL="$(query "$API_REQUESTS")"
  jq -e --arg h "127.0.0.1:$CP_API_PORT" \
    'map(select(.metric == {code: "200", host: $h, method: "GET"} and (.value[1] | tonumber) > 0)) | length == 1' \
    <<<"$DETAIL" >/dev/null
}
check "$API_REQUESTS has kproxy's GETs answered 200 by 127.0.0.1:$CP_API_PORT" api_gets
DETAIL="$(query "process_resident_memory_bytes{$JOB}")"
check "the memory panel: process_resident_memory_bytes is above 1 MiB" grows "process_resident_memory_bytes{$JOB}" $((1 << 20))
DETAIL="$(query "process_start_time_seconds{$JOB}")"
check "process_start_time_seconds is within this test's run" \
  awk -v v="$(value "process_start_time_seconds{$JOB}")" -v now="$(date +%s)" -v s="$SECONDS" \
  'BEGIN { exit !(v > now - s - 5 && v <= now + 1) }'

# A change in the cluster moves the series. Before it: the sync count Prometheus holds, and no
# network programming observation (kproxy observes only changes triggered after its start).
SYNC_COUNT="${SYNC}_count{$JOB,ip_family=\"IPv4\"}"
NETPROG_COUNT="${NETPROG}_count{$JOB,ip_family=\"IPv4\"}"
syncs_before=$(value "$SYNC_COUNT")
DETAIL="$(query "$SYNC_COUNT")"
check "$SYNC_COUNT is a number before the change" is_number "$syncs_before"
DETAIL="$(query "$NETPROG_COUNT")"
check "$NETPROG_COUNT is 0 before the change" test "$(value "$NETPROG_COUNT")" == 0

check "Service web and its EndpointSlice created with a trigger time" cp_service web 10.96.0.71 "$(cp_next_second)"
DETAIL="$(grep -i 'sync' "$WORK/kproxy.log" | tail -3)"
check "the sync count Prometheus scrapes grows (was $syncs_before)" wait_for "$CEILING" grows "$SYNC_COUNT" "$syncs_before"
check "a network programming observation appears" wait_for "$CEILING" grows "$NETPROG_COUNT" 0

# The dashboards' 99th percentiles by ip_family: a number once a sync or an observation fell in
# the window (NaN while nothing did).
is_quantile() { local v; v=$(value "$1" ip_family IPv4); DETAIL="$(query "$1")"; is_number "$v"; }
SYNC_P99="histogram_quantile(0.99, sum by (ip_family, le) (rate(${SYNC}_bucket{$JOB}[5m])))"
NETPROG_P99="histogram_quantile(0.99, sum by (ip_family, le) (rate(${NETPROG}_bucket{$JOB}[5m])))"
check "$SYNC_P99 is a number for IPv4" wait_for "$CEILING" is_quantile "$SYNC_P99"
check "$NETPROG_P99 is a number for IPv4" wait_for "$CEILING" is_quantile "$NETPROG_P99"
CPU_RATE="rate(process_cpu_seconds_total{$JOB}[5m])"
cpu_rate() { DETAIL="$(query "$CPU_RATE")"; is_number "$(value "$CPU_RATE")"; }
check "the CPU panel: $CPU_RATE is a number" wait_for "$CEILING" cpu_rate

DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy still runs" kill -0 "$KP"
DETAIL="$(tail -5 "$WORK/prometheus.log")"
check "Prometheus still runs" kill -0 "${CP_TEST_PIDS[0]}"
finish "api_prometheus"
