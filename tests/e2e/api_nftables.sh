#!/usr/bin/env bash
# End to end against a real kube-apiserver + etcd: kproxy (nftables mode) in a node network
# namespace watches the API server with the ServiceAccount token and RBAC from deploy/, and
# real curl traffic goes through the rules it programs.
#
# The control plane runs inside the node namespace on its loopback (a process in another
# namespace cannot reach the host's loopback), so nothing listens or changes in the host's
# network namespace. Needs root, and kube-apiserver built by tests/e2e/build-control-plane.sh.
#
# A check this machine cannot make (no IPv6 in the kernel) is named on a SKIP line; then, if
# nothing failed, the exit status is 77, which ctest reports as skipped, never as passed.
#
# usage: sudo tests/e2e/api_nftables.sh [--kproxy BIN] [--plugin-dir DIR]
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$HERE/../../scripts/netns-lib.sh"
# shellcheck source=control-plane.sh
source "$HERE/control-plane.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --kproxy) export KPROXY_BIN="$2"; shift 2 ;;
    --plugin-dir) export KPROXY_PLUGIN_DIR="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

kp_require_root
cp_apiserver_bin >/dev/null || exit 1
kp_cleanup_stale
kp_init
trap '_rc=$?; cp_stop; (exit $_rc); kp_teardown' EXIT

FAILED=0
PASSED=0
SKIPPED=0
pass() { PASSED=$((PASSED + 1)); kp_log "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); kp_log "FAIL: $*"; kp_log "kproxy log tail:"; kp_kproxy_log_tail 30 >&2; }
skip() { SKIPPED=$((SKIPPED + 1)); kp_log "SKIP: $*"; }

VIP=10.96.100.10
VIP2=10.96.100.20
now_us() { echo "${EPOCHREALTIME/./}"; }

service_json() { # NAME CLUSTER-IP
  cat <<EOF
{"apiVersion":"v1","kind":"Service","metadata":{"name":"$1","namespace":"default"},
 "spec":{"clusterIP":"$2","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}}
EOF
}

slice_json() { # NAME SERVICE POD-INDEX...
  local name="$1" svc="$2" eps="" i
  shift 2
  for i in "$@"; do
    eps+="${eps:+,}{\"addresses\":[\"$(kp_pod_ip "$i")\"],\"conditions\":{\"ready\":true},\"nodeName\":\"$KP_NODE_NAME\"}"
  done
  cat <<EOF
{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
 "metadata":{"name":"$name","namespace":"default","labels":{"kubernetes.io/service-name":"$svc"}},
 "addressType":"IPv4","endpoints":[$eps],"ports":[{"name":"http","port":8080,"protocol":"TCP"}]}
EOF
}

set_slice() { # NAME SERVICE POD-INDEX... — replace the endpoints (merge patch on a full list)
  local name="$1"
  cp_api PATCH "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/$name" "$(slice_json "$@")" >/dev/null
}

# who_all URL N — the set of pods answering N requests (sorted, unique, space separated);
# "none" for a request nobody answered (each waits up to the ceiling; the first ends the round).
who_all() {
  local i out=()
  for ((i = 0; i < $2; i++)); do
    out+=("$(kp_who node "$1" || echo none)")
    [[ "${out[-1]}" == none ]] && break
  done
  printf '%s\n' "${out[@]}" | sort -u | tr '\n' ' ' | sed 's/ $//'
}

count_log() { grep -c -- "$1" "$KP_WORKDIR/kproxy.log" 2>/dev/null || true; }
# log_count_above PATTERN N — kproxy's log has more than N lines matching PATTERN.
log_count_above() { (($(count_log "$1") > $2)); }
nft_handles() { kp_nft node -a list table ip kube-proxy 2>/dev/null; }
# rule_handles — the chains, sets, maps and rules of table ip kube-proxy with their handles
# (set and map elements carry none, and change with endpoints).
rule_handles() { local t; t="$(nft_handles)" && grep '# handle' <<<"$t"; }
# table_lacks WORD — table ip kube-proxy can be listed and does not mention WORD.
table_lacks() {
  local t
  t="$(kp_nft node list table ip kube-proxy)" || return 1
  ! grep -qwF -- "$1" <<<"$t"
}
# table_has FAMILY WORD — table FAMILY kube-proxy mentions WORD.
table_has() {
  local t
  t="$(kp_nft node list table "$1" kube-proxy 2>/dev/null)" && grep -qwF -- "$2" <<<"$t"
}
# served_by URL POD — one request to URL from the node is answered by POD. A predicate for the
# waits: the request is one attempt of the poll (KP_POLL_TIMEOUT).
served_by() { [[ "$(KP_CURL_TIMEOUT=$KP_POLL_TIMEOUT kp_who node "$1")" == "$2" ]]; }

# --- set-up -----------------------------------------------------------------------------------
kp_topology_up 3 0 || exit 1
kp_start_pods || exit 1
cp_start ip netns exec "$(kp_ns node)" || exit 1
kp_log "control plane: $CP_DIR"
cp_kproxy_kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" || exit 1
cp_api POST /api/v1/nodes "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$KP_NODE_NAME\"}}" >/dev/null || exit 1
cp_api POST /api/v1/namespaces/default/services "$(service_json web $VIP)" >/dev/null || exit 1
cp_api POST /apis/discovery.k8s.io/v1/namespaces/default/endpointslices "$(slice_json web-1 web 1 2)" >/dev/null || exit 1
cp_api POST /api/v1/namespaces/default/services "$(service_json web2 $VIP2)" >/dev/null || exit 1
cp_api POST /apis/discovery.k8s.io/v1/namespaces/default/endpointslices "$(slice_json web2-1 web2 3)" >/dev/null || exit 1

KPROXY="$(kp_kproxy_bin)" || kp_die "kproxy binary not found (--kproxy BIN)"
KARGS=(--proxy-mode=nftables --kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" --hostname-override "$KP_NODE_NAME"
  --cluster-cidr "$KP_CLUSTER_CIDR" --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 -v 2)
[[ -n "${KPROXY_PLUGIN_DIR:-}" ]] && KARGS+=(--plugin-dir "$KPROXY_PLUGIN_DIR")
start_kproxy() {
  echo "===== kproxy start: $KPROXY ${KARGS[*]} =====" >>"$KP_WORKDIR/kproxy.log"
  kp_bg "$KP_WORKDIR/kproxy.log" ip netns exec "$(kp_ns node)" "$KPROXY" "${KARGS[@]}"
  KP_KPROXY_PID=$KP_LAST_PID
}
start_kproxy

# --- 1. Service + EndpointSlice created through the API → the ClusterIP answers -----------------
if kp_wait_served "$KP_CEILING" "http://$VIP/" && [[ "$(who_all "http://$VIP/" 12)" == "pod1 pod2" ]] &&
  [[ "$(who_all "http://$VIP2/" 4)" == "pod3" ]]; then
  pass "ClusterIPs created through the API answer from their endpoints"
else
  fail "ClusterIP not served as expected: web=$(who_all "http://$VIP/" 6) web2=$(who_all "http://$VIP2/" 2)"
fi
grep -q 'API server connection established' "$KP_WORKDIR/kproxy.log" && pass "kproxy logged the connection" ||
  fail "no connection log line"

# --- 1b. ServiceCIDRs: the apiserver's default one (from --service-cluster-ip-range) and one made
# through the API → cluster-ips-check drops unallocated ClusterIPs inside them (issue 10 item 4)
service_cidr="${CP_SERVICE_CIDRS:-10.96.0.0/16,fd00:10:96::/112}"
service_cidr="${service_cidr%%,*}"
cluster_ips_check() { kp_nft node list chain ip kube-proxy cluster-ips-check; }
drops() { cluster_ips_check 2>/dev/null | grep -qF "ip daddr $1 drop"; }
if kp_wait_for "$KP_CEILING" drops "$service_cidr"; then
  pass "the default ServiceCIDR $service_cidr is dropped for unallocated ClusterIPs"
else
  fail "no drop of $service_cidr in cluster-ips-check: $(cluster_ips_check 2>&1 | tr '\n' ' ')"
fi
cp_api POST /apis/networking.k8s.io/v1/servicecidrs \
  '{"apiVersion":"networking.k8s.io/v1","kind":"ServiceCIDR","metadata":{"name":"e2e-extra"},"spec":{"cidrs":["10.97.0.0/24"]}}' \
  >/dev/null || fail "create ServiceCIDR e2e-extra"
if kp_wait_for "$KP_CEILING" drops 10.97.0.0/24; then
  pass "a ServiceCIDR created through the API is watched: 10.97.0.0/24 is dropped too"
else
  fail "ServiceCIDR e2e-extra not programmed: $(cluster_ips_check 2>&1 | tr '\n' ' ')"
fi

# --- the ServiceAccount token is what kproxy uses, and the RBAC from deploy/ is enough ---------
# (Checked on the start-up log: right after an apiserver restart its RBAC cache answers 403 for
# a moment, which kproxy rides out with backoff.)
if ! grep -q 'forbidden\|Forbidden\| 403' "$KP_WORKDIR/kproxy.log"; then
  pass "no authorization failure with the RBAC from deploy/rbac.yaml"
else
  fail "authorization failures: $(grep -m3 -i 'forbidden\| 403' "$KP_WORKDIR/kproxy.log")"
fi

# --- 2. an endpoint change through the API reaches the kernel -----------------------------------
# Waited for (the ceiling only catches a change that never comes); how long it took is printed,
# not checked: bench/ measures it.
start=$(now_us)
set_slice web-1 web 3 || fail "PATCH endpoint slice"
written=$(now_us)
if kp_wait_for_kproxy "$KP_CEILING" served_by "http://$VIP/" pod3; then
  took_ms=$((($(now_us) - written) / 1000))
  if [[ "$(who_all "http://$VIP/" 8)" == "pod3" ]]; then
    pass "endpoint change in effect (seen ${took_ms} ms after the API write returned; the write took $(((written - start) / 1000)) ms)"
  else
    fail "endpoint change only partly in effect: answered by $(who_all "http://$VIP/" 8), want pod3 alone"
  fi
else
  fail "endpoint change not in effect after $KP_CEILING s (or kproxy exited): answered by $(who_all "http://$VIP/" 6)"
fi

# --- 3. apiserver restart → kproxy reconnects, no rule churn ------------------------------------
before="$(rule_handles)" || fail "cannot list table ip kube-proxy"
connects=$(count_log 'API server connection established')
interrupts=$(count_log 'API server watch interrupted')
cp_stop_apiserver
# Checked once kproxy has noticed that the apiserver is gone.
if ! kp_wait_for_kproxy "$KP_CEILING" log_count_above 'API server watch interrupted' "$interrupts"; then
  fail "kproxy did not notice the apiserver going away within $KP_CEILING s (or exited)"
elif [[ "$(who_all "http://$VIP/" 3)" == pod3 ]] && kp_kproxy_alive; then
  pass "service keeps working while the apiserver is down"
else
  fail "service broke while the apiserver was down (answered by: $(who_all "http://$VIP/" 3))"
fi
cp_start_apiserver || exit 1
if kp_wait_for_kproxy "$KP_CEILING" log_count_above 'API server connection established' "$connects"; then
  # Still live after the reconnect: a change goes through. Once it is in effect, kproxy has
  # synced everything it learnt from its relist too, so any rule churn would show by then.
  if set_slice web-1 web 1 && kp_wait_for_kproxy "$KP_CEILING" served_by "http://$VIP/" pod1; then
    pass "watch works again after the reconnect"
  else
    fail "change after reconnect not applied"
  fi
  after="$(rule_handles)" || fail "cannot list table ip kube-proxy"
  if [[ -n "$before" && "$before" == "$after" ]]; then
    pass "kproxy reconnected after the apiserver restart; the kernel table is unchanged (same rule handles)"
  else
    fail "rules churned across the apiserver restart: $(diff <(echo "$before") <(echo "$after") | head -20)"
  fi
else
  fail "kproxy did not reconnect within $KP_CEILING s (or exited)"
fi

# --- 4. 410 Expired → relist reconciles changes missed while disconnected ---------------------
relists=$(count_log '"relisted" resource="Service" ')
expired=$(count_log 'expired; relisting')
# kproxy is frozen while the first apiserver goes away, so none of the changes below can sit in
# its socket buffers as watch events: it can only learn them from a relist.
kill -STOP "$KP_KPROXY_PID"
cp_stop_apiserver
cp_start_apiserver || exit 1
cp_api DELETE /api/v1/namespaces/default/services/web2 >/dev/null || fail "DELETE web2"
cp_api DELETE /apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web2-1 >/dev/null || fail "DELETE web2-1"
set_slice web-1 web 2 || fail "PATCH web-1"
cp_stop_apiserver
cp_etcd_compact || fail "etcd compaction"
cp_start_apiserver || exit 1
kill -CONT "$KP_KPROXY_PID"
if kp_wait_for "$KP_CEILING" bash -c "(( \$(grep -c 'expired; relisting' '$KP_WORKDIR/kproxy.log') > $expired && \$(grep -c '\"relisted\" resource=\"Service\" ' '$KP_WORKDIR/kproxy.log') > $relists ))"; then
  pass "watch from a compacted resourceVersion got 410 and kproxy relisted"
else
  fail "no 410 → relist seen"
fi
# Each resource relists when its own backoff ends (up to the 30 s cap).
if kp_wait_for_kproxy "$KP_CEILING" table_lacks "$VIP2" && kp_wait_for_kproxy "$KP_CEILING" served_by "http://$VIP/" pod2 &&
  [[ "$(who_all "http://$VIP/" 6)" == "pod2" ]] &&
  [[ "$(grep '"relisted" resource="Service" ' "$KP_WORKDIR/kproxy.log" | tail -1)" == *deleted=1* ]]; then
  pass "relist reconciled: the Service deleted while disconnected is gone, the missed endpoint change applied"
else
  fail "relist did not reconcile (web=$(who_all "http://$VIP/" 4); web2 in table: $(nft_handles | grep -cwF -- "$VIP2"); $(grep '"relisted" resource="Service" ' "$KP_WORKDIR/kproxy.log" | tail -1))"
fi

# --- 5. deleting a Service removes its rules -------------------------------------------------
cp_api DELETE /api/v1/namespaces/default/services/web >/dev/null || fail "DELETE web"
if kp_wait_for_kproxy "$KP_CEILING" table_lacks "$VIP"; then
  pass "deleted Service's rules are gone from table ip kube-proxy"
else
  fail "rules of the deleted Service remain"
fi

# --- 7. an IPv6 Service (accepted by the dual-stack apiserver) is programmed -----------------
# The node gets an IPv6 link to the client with a default route over it, so a connection to
# the Service's IPv6 ClusterIP reaches kproxy's rules. The Service has no endpoints: it must be
# refused (kproxy's reject), not time out (no rule: routed to the client, which drops it). The
# IPv4 Service keeps working next to it.
cp_api POST /api/v1/namespaces/default/services "$(service_json web $VIP)" >/dev/null || fail "re-create web"
set_slice web-1 web 1 2 >/dev/null 2>&1 ||
  cp_api POST /apis/discovery.k8s.io/v1/namespaces/default/endpointslices "$(slice_json web-1 web 1 2)" >/dev/null ||
  fail "re-create web-1"
if [[ ! -e /proc/net/if_inet6 ]]; then
  skip "IPv6 Service programming: this kernel has no IPv6"
elif ! { ip -n "$(kp_ns node)" addr add fd00:50::1/64 dev eth0 nodad &&
  ip -n "$(kp_ns client)" addr add fd00:50::2/64 dev eth0 nodad &&
  ip -n "$(kp_ns node)" -6 route add default via fd00:50::2; }; then
  fail "IPv6 addresses and route in the node and client namespaces"
elif ! cp_api POST /api/v1/namespaces/default/services \
  '{"apiVersion":"v1","kind":"Service","metadata":{"name":"v6only","namespace":"default"},"spec":{"ipFamilies":["IPv6"],"ipFamilyPolicy":"SingleStack","ports":[{"port":80,"targetPort":8080}]}}' \
  >/dev/null; then
  fail "create IPv6 Service"
else
  v6ip="$(cp_api GET /api/v1/namespaces/default/services/v6only | python3 -c 'import json,sys; print(json.load(sys.stdin)["spec"]["clusterIP"])')"
  if kp_wait_for_kproxy "$KP_CEILING" table_has ip6 "$v6ip"; then
    pass "IPv6 Service $v6ip programmed in table ip6 kube-proxy"
  else
    fail "IPv6 Service $v6ip not in table ip6 kube-proxy within $KP_CEILING s"
    kp_nft node list table ip6 kube-proxy >&2
  fi
  how="$(kp_connect_errno node "$v6ip" 80 "$KP_CEILING")"
  [[ "$how" == ECONNREFUSED ]] && pass "a connection to [$v6ip]:80 (no endpoints) is refused by kproxy's rules" ||
    fail "a connection to [$v6ip]:80 ended $how, want ECONNREFUSED (kproxy's reject for no endpoints)"
fi
if ! kp_kproxy_alive; then
  fail "kproxy exited after an IPv6 Service was created"
elif kp_wait_for_kproxy "$KP_CEILING" served_by "http://$VIP/" pod1 && [[ "$(who_all "http://$VIP/" 12)" == "pod1 pod2" ]]; then
  pass "IPv4 Service served next to an IPv6 one"
else
  fail "IPv4 Service not served next to an IPv6 one: $(who_all "http://$VIP/" 6)"
fi

# After the apiserver restarts above, a watch may still be in its backoff (up to 1.5 × 30 s
# with jitter); kproxy logs "established" once every watch is open again.
last_state() { grep 'API server connection established\|API server watch interrupted' "$KP_WORKDIR/kproxy.log" | tail -1; }
ends_connected() { [[ "$(last_state)" == *established* ]]; }
kp_wait_for_kproxy "$KP_CEILING" ends_connected && pass "kproxy ends connected" ||
  fail "kproxy not connected at the end: $(last_state)"
kp_kproxy_alive || fail "kproxy exited"
kp_stop_kproxy
kp_log "passed=$PASSED failed=$FAILED skipped=$SKIPPED"
((FAILED == 0)) || exit 1
# Nothing failed, but not everything named was checked: ctest reports the test as skipped.
((SKIPPED == 0)) || exit 77
