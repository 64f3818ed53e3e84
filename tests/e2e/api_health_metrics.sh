#!/usr/bin/env bash
# /healthz and /metrics against a real kube-apiserver + etcd.
#  - /healthz fails (503, upstream's body: "nodeEligible":false) before the node's Node exists and once it gets the
#    cluster autoscaler's ToBeDeletedByClusterAutoscaler taint (KEP-3836), while /livez stays
#    200; it passes again when the taint goes.
#  - The series the usual kube-proxy dashboards and alerts select are on /metrics with
#    upstream's labels: sync duration by ip_family, network programming latency (an
#    EndpointSlice change with a trigger time, after kproxy started), rest_client_requests_total
#    by code, method and host (kproxy's own requests to this apiserver), the healthz counter,
#    kubernetes_build_info, the process metrics.
# The backend is the test-plugins' recorder (no kernel rules: this suite is about the API side).
# Everything lives in an anonymous network namespace (unshare -n). Needs root and kube-apiserver
# built by tests/e2e/build-control-plane.sh.
#
# usage: sudo tests/e2e/api_health_metrics.sh --kproxy BIN --test-plugins DIR
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../program/lib.sh
source "$HERE/../program/lib.sh"
# shellcheck source=control-plane.sh
source "$HERE/control-plane.sh"
cp_recorder_test api_health_metrics API_HEALTH_KEEP "$@"

cp_start || exit 1
cp_kproxy_kubeconfig "$WORK/kubeconfig" || exit 1

cp_recorder_kproxy

# healthz: the status code; body: the last answer's body.
healthz() { curl -s --max-time 5 -o "$WORK/healthz.body" -w '%{http_code}' http://127.0.0.1:10256/healthz; }
livez() { curl -s --max-time 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:10256/livez; }
healthz_is() { [[ "$(healthz)" == "$1" ]]; }
metrics() { curl -s --max-time 5 http://127.0.0.1:10249/metrics; }
# value SERIES: the value of the sample whose name and labels are exactly SERIES.
value() { metrics | awk -v s="$1" 'index($0, s " ") == 1 { print $NF; exit }'; }
at_least() { local v; v=$(value "$1"); [[ -n "$v" ]] && awk -v v="$v" -v n="$2" 'BEGIN { exit !(v >= n) }'; }

# Upstream's NodeManager has no Node until the object exists, and a node it cannot see is not
# eligible: /healthz is 503 (while /livez is 200) until the Node is created.
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "/healthz is 503 before the Node exists" wait_for "$CEILING" healthz_is 503
check "... with nodeEligible false" grep -q '"nodeEligible":false' "$WORK/healthz.body"
check "... while /livez is 200" test "$(livez)" = 200
check "Node node-a created" cp_api POST /api/v1/nodes \
  '{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"},"spec":{"taints":[{"key":"example.com/other","effect":"NoSchedule"}]}}'

DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "/healthz is 200 with an unrelated taint" wait_for "$CEILING" healthz_is 200

# A Service whose EndpointSlice change was triggered after kproxy started (it answered /healthz):
# its latency is observed, as upstream observes those after its start.
check "Service web and its EndpointSlice created with a trigger time" cp_service web 10.96.0.71 "$(cp_next_second)"
DETAIL="$(grep -i 'network programming\|sync' "$WORK/kproxy.log" | tail -5)"
check "network programming latency is observed under ip_family=IPv4" wait_for "$CEILING" \
  at_least 'kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}' 1

M=$(metrics)
echo "$M" >"$WORK/metrics.txt"
series() { grep -q "^$1" <<<"$M"; }
DETAIL="$(grep '^kubeproxy_sync_proxy_rules_duration_seconds_count' <<<"$M")"
check "sync duration by ip_family" series 'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} '
check "the last sync's timestamp by ip_family" series 'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} '
DETAIL="$(grep '^rest_client' <<<"$M" | grep -v _bucket)"
check "rest_client_requests_total: kproxy's GETs answered 200 by this apiserver" \
  series "rest_client_requests_total{code=\"200\",host=\"127.0.0.1:$CP_API_PORT\",method=\"GET\"} "
check "rest_client_request_duration_seconds by verb and host" \
  series "rest_client_request_duration_seconds_count{host=\"127.0.0.1:$CP_API_PORT\",verb=\"GET\"} "
check "rest_client_rate_limiter_duration_seconds by verb and host" \
  series "rest_client_rate_limiter_duration_seconds_count{host=\"127.0.0.1:$CP_API_PORT\",verb=\"GET\"} "
DETAIL="$(grep '^kubernetes_build_info' <<<"$M")"
check "kubernetes_build_info" series 'kubernetes_build_info{build_date="[^"]*",compiler="gcc",git_commit="[^"]*",git_tree_state="[a-z]*",git_version="v1\.[0-9]*\.[0-9]*",go_version="",major="1",minor="[0-9]*",platform="linux/[a-z0-9]*"} 1'
DETAIL=""
check "process CPU and memory" series 'process_cpu_seconds_total '
check "process resident memory" series 'process_resident_memory_bytes '
check "the healthz counter" series 'kubeproxy_proxy_healthz_total{code="200"} '

# KEP-3836: the cluster autoscaler taints the node before it deletes it.
check "the ToBeDeletedByClusterAutoscaler taint is added" cp_api PATCH /api/v1/nodes/node-a \
  '{"spec":{"taints":[{"key":"example.com/other","effect":"NoSchedule"},{"key":"ToBeDeletedByClusterAutoscaler","value":"1718000000","effect":"NoSchedule"}]}}'
DETAIL="$(cat "$WORK/healthz.body" 2>/dev/null); $(grep -i 'node' "$WORK/kproxy.log" | tail -3)"
check "/healthz fails with 503" wait_for "$CEILING" healthz_is 503
body=$(cat "$WORK/healthz.body")
DETAIL="$body"
check "its body says the node is not eligible" test "$(jq -r .nodeEligible <<<"$body")" == false
check "its body has upstream's fields" test "$(jq -c 'keys_unsorted' <<<"$body")" == \
  '["lastUpdated","currentTime","nodeEligible","healthy","status"]'
check "the proxier itself is still healthy" test "$(jq -r .healthy <<<"$body")" == true
check "/livez stays 200" test "$(livez)" == 200
check "the 503 is counted" at_least 'kubeproxy_proxy_healthz_total{code="503"}' 1

check "the taint is removed" cp_api PATCH /api/v1/nodes/node-a \
  '{"spec":{"taints":[{"key":"example.com/other","effect":"NoSchedule"}]}}'
DETAIL="$(cat "$WORK/healthz.body" 2>/dev/null)"
check "/healthz is 200 again" wait_for "$CEILING" healthz_is 200
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy still runs" kill -0 "$KP"
finish "api_health_metrics"
