#!/usr/bin/env bash
# `kproxy explain` end to end: manifests in a directory, the nftables plugin in dry-run (no
# kernel, no root), the answer checked for the cases of upstream's packet-flow tables that a
# user asks most: a ClusterIP from a pod, an eTP=Local LoadBalancer from outside and from a
# pod, a Service without endpoints; JSON; errors; plugins that cannot explain.
# Usage: explain.sh KPROXY_BIN TEST_PLUGIN_DIR
set -uo pipefail
KPROXY=$1
TEST_PLUGINS=$2

WORK=$(mktemp -d /tmp/kproxy-explain-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# check NAME OUTPUT PATTERN...: every fixed string must be in OUTPUT.
check() {
  local name=$1 out=$2; shift 2
  for want in "$@"; do
    if ! grep -qF -- "$want" <<<"$out"; then fail "$name" "missing \"$want\" in: $out"; return; fi
  done
  pass "$name"
}

M="$WORK/manifests"; mkdir -p "$M"
cat >"$M/cluster.yaml" <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: 192.168.1.10}]
---
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
  nodeName: node-a
- addresses: [10.244.2.3]
  conditions: {ready: true}
  nodeName: node-b
- addresses: [10.244.2.4]
  conditions: {ready: false}
  nodeName: node-b
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.30
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.7}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: default
  labels: {kubernetes.io/service-name: lb}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.2.9]
  conditions: {ready: true}
  nodeName: node-b
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.40
  ports: [{name: dns, port: 53, targetPort: 53, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: default}
spec:
  clusterIP: fd00:10:96::20
  clusterIPs: [fd00:10:96::20]
  ipFamilies: [IPv6]
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web6-1
  namespace: default
  labels: {kubernetes.io/service-name: web6}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [fd00:10:244::5]
  conditions: {ready: true}
  nodeName: node-a
YAML

FLAGS=(--manifests "$M" --hostname-override node-a --proxy-mode nftables --cluster-cidr 10.244.0.0/16,fd00:10:244::/64)
explain() { "$KPROXY" explain "$@" "${FLAGS[@]}" 2>&1; }

# --- the answers ---------------------------------------------------------------------------
out=$(explain 10.244.1.5 10.96.0.20:80); rc=$?
[[ $rc -eq 0 ]] || fail "ClusterIP exit status" "rc=$rc"
check "ClusterIP from a pod: DNAT to both ready endpoints, not masqueraded" "$out" \
  "service:   default/web:http (ClusterIP), via its cluster IP 10.96.0.20:80/tcp" \
  "outcome:   DNAT to 10.244.1.2:8080, 10.244.2.3:8080, not masqueraded" \
  "in   10.244.1.2:8080          ready" "in   10.244.2.3:8080          ready" \
  "out  10.244.2.4:8080          not ready" \
  "@service-ips hit: 10.96.0.20 . tcp . 80"

out=$(explain 192.168.1.10 10.96.0.20:80 --from-node)
check "ClusterIP from the node itself is masqueraded" "$out" "(from the node)" \
  "DNAT to 10.244.1.2:8080, 10.244.2.3:8080, masqueraded"

out=$(explain 198.51.100.1 203.0.113.7:80)
check "eTP=Local LoadBalancer IP from outside, no local endpoint: dropped" "$out" \
  "via its load balancer IP 203.0.113.7:80/tcp" "outcome:   dropped by chain external-" \
  "out  10.244.2.9:8080          not local (eTP=Local)"
[[ "$out" != *"DNAT to"* ]] && pass "the dropped packet is not DNATed" || fail "dropped not DNATed" "$out"

out=$(explain 198.51.100.1 192.168.1.10:30080)
check "eTP=Local NodePort from outside: dropped" "$out" "via its node port" "dropped by chain"

out=$(explain 10.244.1.5 203.0.113.7:80)
check "eTP=Local LoadBalancer IP from a pod: short-circuit to the remote endpoint" "$out" \
  "outcome:   DNAT to 10.244.2.9:8080, not masqueraded" "short-circuited to the cluster-wide endpoints"

out=$(explain 10.244.1.5 10.96.0.40:53/udp)
check "Service without endpoints: rejected" "$out" "default/empty:dns" "outcome:   rejected by chain"

out=$(explain 10.244.1.5 10.96.0.40:53/tcp)
check "a ClusterIP on a port it does not serve: no service port, rejected" "$out" \
  "service:   none of kproxy's matches" "rejected by chain cluster-ips-check"

out=$(explain 10.244.1.5 10.244.2.3:8080)
check "a pod's own address is not a service: accepted untouched" "$out" \
  "service:   none of kproxy's matches" "accepted untouched"

out=$(explain fd00:10:244::7 '[fd00:10:96::20]:80')
check "IPv6 ClusterIP" "$out" "default/web6:http" "DNAT to [fd00:10:244::5]:8080, not masqueraded"

# --- JSON ----------------------------------------------------------------------------------
json_get() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
out=$("$KPROXY" explain 10.244.1.5 10.96.0.20:80 --json "${FLAGS[@]}" 2>/dev/null)
got=$(json_get 'd["verdict"], d["masqueraded"], d["service"]["key"], d["outcome"]["endpoints"], [(e["endpoint"], e["selected"], e["reason"]) for e in d["endpoints"]], len(d["paths"])' <<<"$out" 2>&1)
want="dnat False default/web:http ['10.244.1.2:8080', '10.244.2.3:8080'] [('10.244.1.2:8080', True, 'ready'), ('10.244.2.3:8080', True, 'ready'), ('10.244.2.4:8080', False, 'not ready')] 2"
[[ "$got" == "$want" ]] && pass "--json: one object with the outcome and endpoints" || fail "--json" "got: $got"
out=$("$KPROXY" explain 198.51.100.1 203.0.113.7:80 --json "${FLAGS[@]}" 2>/dev/null)
got=$(json_get 'd["verdict"], d["outcome"]["chain"].startswith("external-"), d["endpoints"][0]["reason"]' <<<"$out" 2>&1)
[[ "$got" == "drop True not local (eTP=Local)" ]] && pass "--json: drop" || fail "--json drop" "got: $got"
out=$("$KPROXY" explain 10.244.1.5 10.96.0.40:53/udp --json "${FLAGS[@]}" 2>/dev/null)
got=$(json_get 'd["verdict"]' <<<"$out" 2>&1)
[[ "$got" == "reject" ]] && pass "--json: reject" || fail "--json reject" "got: $got"

# --- an unallocated ClusterIP inside a ServiceCIDR (issue 10 item 4) ---------------------------
out=$("$KPROXY" explain 10.244.1.5 10.96.0.99:80 "${FLAGS[@]}" 2>/dev/null)
check "no ServiceCIDR: an unknown address is not a service's" "$out" "accepted untouched"
cat >"$M/servicecidr.yaml" <<'YAML'
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16, "fd00:10:96::/112"]}
YAML
out=$("$KPROXY" explain 10.244.1.5 10.96.0.99:80 "${FLAGS[@]}" 2>/dev/null)
check "unallocated ClusterIP dropped, naming the ServiceCIDR" "$out" \
  "dropped by chain cluster-ips-check: ip daddr 10.96.0.0/16 drop" \
  "reason:    dropped: unallocated ClusterIP in ServiceCIDR kubernetes (10.96.0.0/16)"
out=$("$KPROXY" explain 10.244.1.5 10.96.0.20:81 "${FLAGS[@]}" 2>/dev/null)
check "a ClusterIP's unused port is still rejected" "$out" "rejected by chain cluster-ips-check"
rm -f "$M/servicecidr.yaml"

# --- errors --------------------------------------------------------------------------------
# expect_error NAME MESSAGE ARGS...: kproxy explain ARGS exits with status 1 (an error, not a
# crash) and says MESSAGE.
expect_error() {
  local name=$1 want=$2; shift 2
  local out rc
  "$KPROXY" explain "$@" >/dev/null 2>"$WORK/error.out"; rc=$?
  out=$(grep -v '^[IW][0-9]' "$WORK/error.out")
  if [[ $rc -eq 1 && "$out" == *"$want"* ]]; then pass "$name"; else fail "$name" "rc=$rc out=$out"; fi
}
expect_error "bad source address" 'bad source "10.0.0.300"' 10.0.0.300 10.96.0.20:80 "${FLAGS[@]}"
expect_error "destination without a port" 'bad destination "10.96.0.20": no port' 10.0.0.1 10.96.0.20 "${FLAGS[@]}"
expect_error "unknown protocol" 'unknown protocol "icmp"' 10.0.0.1 10.96.0.20:80/icmp "${FLAGS[@]}"
expect_error "unbracketed IPv6 destination" 'write an IPv6 address in brackets' fd00::1 fd00::2:80 "${FLAGS[@]}"
expect_error "mixed families" 'different IP families' fd00::1 10.96.0.20:80 "${FLAGS[@]}"
expect_error "missing destination" 'want a source address and a destination' 10.0.0.1 "${FLAGS[@]}"
expect_error "unknown mode" 'unknown proxy mode "nosuch"' 10.0.0.1 10.96.0.20:80 "${FLAGS[@]}" --proxy-mode nosuch
expect_error "a plugin built against ABI 1.0 cannot explain" 'backend old cannot explain' \
  10.0.0.1 10.96.0.20:80 "${FLAGS[@]}" --plugin-dir "$TEST_PLUGINS/old" --proxy-mode old
KPROXY_RECORD_FILE="$WORK/rec" expect_error "an SDK plugin without explain says so" \
  'backend plain: this backend cannot explain packets' \
  10.0.0.1 10.96.0.20:80 "${FLAGS[@]}" --plugin-dir "$TEST_PLUGINS/plain" --proxy-mode plain

echo "explain: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
