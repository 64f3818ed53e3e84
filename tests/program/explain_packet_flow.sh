#!/usr/bin/env bash
# Rows of upstream kube-proxy's packet-flow tables through the `kproxy explain` program: the
# inputs of TestOverallNFTablesRules and TestLoadBalancer (pkg/proxy/nftables/proxier_test.go)
# written as manifests, a plugin (nftables, or the MODE given) in dry-run (no kernel, no root), one row per kind of
# answer, each compared as JSON (verdict, endpoints, masquerade) with upstream's answer. The
# whole table runs through the same plugin entry point in tests/unit/packet_flow/packet_flow_test.cpp;
# this proves the CLI path (manifest source, flags, loader, --json) gives the same answers.
# Usage: explain_packet_flow.sh KPROXY_BIN [MODE]  (nftables by default; every mode must answer alike,
# except that the userspace mode relays everything from the node: always masqueraded; and ebpf
# mode, whose socket hooks NAT nothing (traffic from other hosts meets its nftables part, which
# answers as nftables mode): its answers that differ are its known differences, each with its
# reason, counted at the end)
set -uo pipefail
KPROXY=$1
MODE=${2:-nftables}

WORK=$(mktemp -d /tmp/kproxy-explain-flow-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
declare -A differences=()

M="$WORK/manifests"; mkdir -p "$M"
# Upstream's NewFakeProxier: node "test-node" with 192.168.0.2 (and 192.168.1.2, and the
# external IP 192.168.99.11 as one of its addresses), ServiceCIDR 172.30.0.0/16.
cat >"$M/node.yaml" <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: test-node}
status:
  addresses:
  - {type: InternalIP, address: 192.168.0.2}
  - {type: InternalIP, address: 192.168.1.2}
  - {type: InternalIP, address: 192.168.99.11}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [172.30.0.0/16]}
YAML
# service NS NAME CLUSTER_IP SPEC_EXTRA STATUS_EXTRA: a Service with one TCP port p80 (80).
service() {
  cat <<YAML
---
apiVersion: v1
kind: Service
metadata: {name: $2, namespace: $1}
spec:
  clusterIP: $3
  ports: [{name: p80, port: 80, targetPort: 80, protocol: TCP$6}]
$4
$5
YAML
}
# slice NS SERVICE ENDPOINT[@NODE]...: an EndpointSlice with ready endpoints on port p80 (80).
slice() {
  local ns=$1 svc=$2; shift 2
  cat <<YAML
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $svc-1
  namespace: $ns
  labels: {kubernetes.io/service-name: $svc}
addressType: IPv4
ports: [{name: p80, port: 80, protocol: TCP}]
endpoints:
YAML
  for ep in "$@"; do
    echo "- addresses: [${ep%@*}]"
    echo "  conditions: {ready: true}"
    [[ $ep == *@* ]] && echo "  nodeName: ${ep#*@}"
  done
}
{
  # TestOverallNFTablesRules.
  service ns1 svc1 172.30.0.41 "" "" ""
  slice ns1 svc1 10.180.0.1
  service ns2 svc2 172.30.0.42 "  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 30000
  externalIPs: [192.168.99.22]" "status: {loadBalancer: {ingress: [{ip: 1.2.3.4}]}}" ", nodePort: 3001"
  slice ns2 svc2 10.180.0.2
  service ns3 svc3 172.30.0.43 "  type: NodePort" "" ", nodePort: 3003"
  slice ns3 svc3 10.180.0.3
  service ns4 svc4 172.30.0.44 "  type: NodePort
  externalIPs: [192.168.99.33]" "" ""
  slice ns4 svc4 10.180.0.4 10.180.0.5@test-node
  service ns5 svc5 172.30.0.45 "  type: LoadBalancer
  healthCheckNodePort: 30000
  loadBalancerSourceRanges: [\" 203.0.113.0/25\"]
  sessionAffinity: ClientIP" "status: {loadBalancer: {ingress: [{ip: 5.6.7.8}]}}" ", nodePort: 3002"
  slice ns5 svc5 10.180.0.3
  service ns6 svc6 172.30.0.46 "" "" ""
} >"$M/services.yaml"

BASE_FLAGS=(--manifests "$M" --hostname-override test-node --proxy-mode "$MODE" --cluster-cidr 10.0.0.0/8)
FLAGS=("${BASE_FLAGS[@]}" --nodeport-addresses 192.168.0.2/32)

# ebpf mode's reasons (tests/unit/packet_flow has the same, over the whole table).
EBPF_NO_NAT="nothing is NATed: a steered socket keeps its own source address"

# Whether `kproxy explain ARGS` asks for a socket of this node, which the hooks steer: sent by
# the node, or from a pod (in --cluster-cidr 10.0.0.0/8). Any other client is from another host.
socket_of_node() {
  [[ $1 == 10.* ]] && return 0
  local a
  for a in "$@"; do [[ $a == --from-node ]] && return 0; done
  return 1
}

# row NAME WANT ARGS...: `kproxy explain ARGS --json` answers WANT, which is
# "VERDICT ENDPOINT,ENDPOINT MASQUERADED" (verdict dnat / drop / reject / accept; "-" for no
# endpoints; the endpoints sorted; masqueraded true / false).
row() {
  local name=$1 want=$2; shift 2
  local out got why=""
  # The userspace proxy relays from the node: what it relays is always masqueraded.
  [[ $MODE == userspace && $want == dnat* ]] && want="${want% *} true"
  if [[ $MODE == ebpf ]]; then
    if [[ $want == dnat*true ]] && socket_of_node "$@"; then
      want="${want% *} false" why=$EBPF_NO_NAT
    fi
    [[ -n $why ]] && differences[$why]=$((${differences[$why]:-0} + 1))
  fi
  out=$("$KPROXY" explain "$@" --json "${FLAGS[@]}" 2>"$WORK/stderr")
  got=$(python3 -c '
import json, sys
d = json.load(sys.stdin)
eps = sorted(d["outcome"]["endpoints"])
selected = sorted(e["endpoint"] for e in d["endpoints"] if e["selected"])
assert selected == eps, "selected endpoints %s differ from the outcome %s" % (selected, eps)
assert not d["warnings"], d["warnings"]
print(d["verdict"], ",".join(eps) or "-", str(d["masqueraded"]).lower())
' <<<"$out" 2>&1)
  if [[ "$got" == "$want" ]]; then
    echo "PASS $name"; passed=$((passed + 1))
  else
    echo "FAIL $name: want \"$want\", got \"$got\" ($(head -c 300 "$WORK/stderr"))"; failed=$((failed + 1))
  fi
}

row "ClusterIP, single endpoint" "dnat 10.180.0.1:80 false" 10.0.0.2 172.30.0.41:80
row "ClusterIP, multiple endpoints" "dnat 10.180.0.4:80,10.180.0.5:80 false" 10.0.0.2 172.30.0.44:80
row "no match: untouched" "accept - false" 10.0.0.2 10.0.0.3:80
row "NodePort from outside: masqueraded" "dnat 10.180.0.3:80 true" 203.0.113.2 192.168.0.2:3003
row "node to ClusterIP: masqueraded" "dnat 10.180.0.1:80 true" 192.168.0.2 172.30.0.41:80 --from-node
row "LB source ranges: blocked external client dropped" "drop - false" 203.0.113.130 5.6.7.8:80
row "LB source ranges: allowed external client" "dnat 10.180.0.3:80 true" 203.0.113.2 5.6.7.8:80
row "eTP=Local without local endpoints: external dropped" "drop - false" 203.0.113.2 192.168.99.22:80
row "eTP=Local short-circuit: pod to NodePort" "dnat 10.180.0.2:80 false" 10.0.0.2 192.168.0.2:3001
row "eTP=Local short-circuit: node to external IP, masqueraded" "dnat 10.180.0.2:80 true" \
  192.168.0.2 192.168.99.22:80 --from-node
# kproxy's deliberate difference (README): upstream's nftables code drops this one.
row "eTP=Local short-circuit: node to LB IP (kproxy's answer)" "dnat 10.180.0.2:80 true" \
  192.168.0.2 1.2.3.4:80 --from-node
row "no endpoints: rejected" "reject - false" 10.0.0.2 172.30.0.46:80
row "unallocated ClusterIP in the ServiceCIDR: dropped" "drop - false" 10.0.0.2 172.30.0.50:80
row "--masquerade-all: pod to ClusterIP masqueraded" "dnat 10.180.0.1:80 true" \
  10.0.0.2 172.30.0.41:80 --masquerade-all
# TestInternalExternalMasquerade, masqueradeAll: the eTP=Local short-circuit stays unmasqueraded.
row "--masquerade-all: eTP=Local short-circuit not masqueraded" "dnat 10.180.0.2:80 false" \
  10.0.0.2 192.168.0.2:3001 --masquerade-all

# Where NodePorts answer, decided as the daemon decides from the Node object's addresses
# (tests/unit/packet_flow has the daemon's side): svc3's NodePort 3003 on the node IP
# 192.168.0.2 and on the secondary address 192.168.1.2, for each --nodeport-addresses.
# nodeports NAME PRIMARY SECONDARY FLAGS...: PRIMARY / SECONDARY are "yes" where NodePorts answer.
# In ebpf mode the client from another host meets the nftables part, as in nftables mode.
nodeports() {
  local name=$1 primary=$2 secondary=$3; shift 3
  local yes="dnat 10.180.0.3:80 true" no="accept - false" client=(203.0.113.2)
  FLAGS=("${BASE_FLAGS[@]}" "$@")
  row "NodePorts, $name: node IP" "$([[ $primary == yes ]] && echo "$yes" || echo "$no")" "${client[0]}" \
    192.168.0.2:3003 "${client[@]:1}"
  row "NodePorts, $name: secondary address" "$([[ $secondary == yes ]] && echo "$yes" || echo "$no")" \
    "${client[0]}" 192.168.1.2:3003 "${client[@]:1}"
}
# No flag: nftables' default is "primary"; the other modes' every local address.
if [[ $MODE == nftables ]]; then nodeports "no flag" yes no; else nodeports "no flag" yes yes; fi
nodeports "primary" yes no --nodeport-addresses primary
nodeports "primary with --bind-address" no yes --nodeport-addresses primary --bind-address 192.168.1.2
nodeports "a CIDR of the secondary address" no yes --nodeport-addresses 192.168.1.0/24
nodeports "0.0.0.0/0" yes yes --nodeport-addresses 0.0.0.0/0

if [[ $MODE == ebpf ]]; then
  total=0
  for why in "${!differences[@]}"; do total=$((total + differences[$why])); done
  echo "ebpf's known differences: $total of $((passed + failed)) rows"
  for why in "${!differences[@]}"; do printf '  %3d  %s\n' "${differences[$why]}" "$why"; done
fi
echo "explain packet flow: $passed passed, $failed failed"
[[ $failed -eq 0 && $passed -gt 0 ]]
