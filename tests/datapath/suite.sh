#!/usr/bin/env bash
# Data-path tests for kproxy, one suite for every kernel backend: real packets, real kernel,
# real curl.
#
# Every case builds its own topology (scripts/netns-lib.sh: a node namespace running kproxy,
# pod namespaces running kproxy-podserver (tests/tools), an outside client, sometimes a remote
# node)
# and removes it afterwards, even on failure. Needs root; refuses to run (exit 1) otherwise.
#
# Every case checks the same behaviour in every mode; only the helpers under "Mode-specific
# inspection" look at kernel objects (nft in nftables mode, iptables-VARIANT-save in iptables
# mode; ipvsadm, ipset, kube-ipvs0 and iptables-VARIANT-save in IPVS mode, which only the test
# VM's kernel has: tests/vm/). A few cases exist for one mode only and are reported as SKIP in
# the others.
#
# usage: tests/datapath/suite.sh [--proxy-mode nftables|iptables|ipvs] [--iptables-variant nft|legacy]
#                                [--kproxy PATH] [--plugin-dir DIR] [CASE...]
#   --proxy-mode defaults to $KP_PROXY_MODE, else nftables; --iptables-variant (iptables and
#   IPVS modes) defaults to nft. KPROXY_BIN / KPROXY_PLUGIN_DIR may replace --kproxy / --plugin-dir;
#   KP_VERBOSE=1 shows passing cases' output.

set -u
source "$(dirname "$0")/testlib.sh"

PROXY_MODE=${KP_PROXY_MODE:-nftables}
IPTABLES_VARIANT=nft
WEB_IP=10.96.0.10
# The nftables table (ip family) kproxy programs in the nftables-based modes: nftables mode's
# kube-proxy, the userspace mode's kproxy-userspace, ebpf mode's nftables part's kproxy-ebpf.
NFT_TABLE=kube-proxy
# WEB_IP in an extended regular expression, matching that address only (not 10.96.0.100).
WEB_IP_RE="(^|[^0-9.])${WEB_IP//./\\.}([^0-9]|\$)"
MANIFESTS=""

# ---------------------------------------------------------------------------------------------
# Helpers shared by the cases.

# setup NLOCAL [NREMOTE] — topology, pods, and a manifest dir holding the Node object(s).
setup() {
  kp_topology_up "$1" "${2:-0}" || return 1
  kp_start_pods || return 1
  MANIFESTS="$KP_WORKDIR/manifests"
  mkdir -p "$MANIFESTS"
  {
    kp_manifest_node "$KP_NODE_NAME" "$KP_NODE_IP"
    if (("${2:-0}" > 0)); then
      echo ---
      kp_manifest_node "$KP_REMOTE_NODE_NAME" "$KP_REMOTE_NODE_IP"
    fi
  } | kp_install_manifest "$MANIFESTS" nodes.yaml
}

# pod_ips N — "IP IP ..." of local pods 1..N, as endpoint specs.
pod_eps() {
  local i
  for ((i = 1; i <= $1; i++)); do printf '%s ' "$(kp_pod_ip "$i")"; done
}

# add_service FILE NAME CLUSTER_IP "ENDPOINTS" [SERVICE_OPTIONS...] — a Service (port 80 ->
# 8080, namespace "test") and its EndpointSlice in one file, installed atomically.
add_service() {
  local file="$1" name="$2" cip="$3" eps="$4"
  shift 4
  {
    kp_manifest_service test "$name" "$cip" 80 8080 "$@" || return 1
    echo ---
    # shellcheck disable=SC2086 # eps is a list of endpoint specs
    kp_manifest_slice test "$name" "$name-abcde" 8080 $eps || return 1
  } | kp_install_manifest "$MANIFESTS" "$file"
}

# start_kproxy_and_wait URL [KPROXY_ARGS...] — start kproxy; wait until URL answers from the
# node namespace.
start_kproxy_and_wait() {
  local url="$1"
  shift
  kp_start_kproxy "$MANIFESTS" "$@" || return 1
  if ! kp_wait_served "$KP_CEILING" "$url"; then
    kp_kproxy_alive || kp_fail "kproxy exited" || return 1
    kp_fail "$url not answered within $KP_CEILING s of starting kproxy" || return 1
  fi
}

# answers ROLE URL N — N requests; one line each: the answering pod, or FAIL (after which no
# more requests are made: a request that fails may have waited for the ceiling).
answers() {
  local i who
  for ((i = 0; i < $3; i++)); do
    who="$(kp_who "$1" "$2")" || { echo FAIL; return 0; }
    echo "$who"
  done
}

# summarize — "pod1=4 pod2=6" from answers' output on stdin.
summarize() { sort | uniq -c | awk '{printf "%s%s=%s", (NR>1?" ":""), $2, $1} END {print ""}'; }

# expect_spread ROLE URL N MIN_DISTINCT — N requests all succeed and reach >= MIN_DISTINCT pods.
# With two pods chosen at random, N requests all reach one pod with probability 2^(1-N): 20
# requests keep that below one in 500,000 (10 made it one in 512, and the suite has dozens).
expect_spread() {
  local out summary distinct
  out="$(answers "$1" "$2" "$3")"
  summary="$(summarize <<<"$out")"
  kp_note "$1 -> $2: $summary"
  grep -q FAIL <<<"$out" && { kp_fail "some requests from $1 to $2 failed: $summary"; return 1; }
  distinct="$(sort -u <<<"$out" | wc -l)"
  ((distinct >= $4)) || { kp_fail "$1 -> $2 reached $distinct pod(s), want >= $4: $summary"; return 1; }
}

# expect_only ROLE URL N POD... — N requests all succeed and only the given pods answer.
expect_only() {
  local role="$1" url="$2" n="$3"
  shift 3
  local out summary who ok p
  out="$(answers "$role" "$url" "$n")"
  summary="$(summarize <<<"$out")"
  kp_note "$role -> $url: $summary"
  while read -r who; do
    ok=0
    for p in "$@"; do [[ "$who" == "$p" ]] && ok=1; done
    ((ok)) || { kp_fail "$role -> $url: '$who' answered, allowed: $* ($summary)"; return 1; }
  done <<<"$out"
}

# expect_refused ROLE URL — the connection is refused (curl exit 7, and a plain connect() fails
# with ECONNREFUSED), not left to time out: a dropped connection ends in a timeout (curl exit
# 28, connect() ETIMEDOUT) however long it is waited for, so both wait up to the ceiling and
# how long the refusal took is only noted.
expect_refused() {
  local start ms rc err hostport how
  start=${EPOCHREALTIME/./}
  err="$(KP_CURL_TIMEOUT=$KP_CEILING kp_curl "$1" "$2" 2>&1 >/dev/null)"
  rc=$?
  ms=$(((${EPOCHREALTIME/./} - start) / 1000))
  kp_note "$1 -> $2: curl exit $rc after ${ms} ms ($err)"
  [[ $rc -eq 7 ]] || { kp_fail "$1 -> $2: curl exit $rc, want 7 (connection refused)"; return 1; }
  hostport="${2#http://}"
  hostport="${hostport%%/*}"
  [[ "$hostport" == *:* ]] || hostport="$hostport:80"
  how="$(kp_connect_errno "$1" "${hostport%:*}" "${hostport#*:}" "$KP_CEILING")"
  kp_note "$1 -> $2: connect(): $how"
  [[ "$how" == ECONNREFUSED ]] || { kp_fail "$1 -> $2: connect() gave $how, want ECONNREFUSED"; return 1; }
}

# expect_dropped ROLE URL — no answer at all: curl times out (exit 28). A window with no answer
# proves no more than its length: an answer later than 2 s would be missed (a false pass, never
# a false failure).
expect_dropped() {
  local rc err
  err="$(KP_CURL_TIMEOUT=2 kp_curl "$1" "$2" 2>&1 >/dev/null)"
  rc=$?
  kp_note "$1 -> $2: curl exit $rc: $err"
  [[ $rc -eq 28 ]] || { kp_fail "$1 -> $2: curl exit $rc, want 28 (timeout: packets dropped)"; return 1; }
}

expect_kproxy_alive() { kp_kproxy_alive || kp_fail "kproxy is no longer running"; }

# answered_by ROLE URL N MIN_DISTINCT POD... — N requests all succeed, only the given pods
# answer, at least MIN_DISTINCT of them. A predicate for kp_wait_for_kproxy: it only returns a
# status (kp_fail would fail the case on the first poll), and its requests are attempts of the
# poll (KP_POLL_TIMEOUT).
answered_by() {
  local role="$1" url="$2" n="$3" min="$4"
  shift 4
  local out who p ok
  out="$(KP_CURL_TIMEOUT=$KP_POLL_TIMEOUT answers "$role" "$url" "$n")"
  while read -r who; do
    ok=0
    for p in "$@"; do [[ "$who" == "$p" ]] && ok=1; done
    ((ok)) || return 1
  done <<<"$out"
  (($(sort -u <<<"$out" | wc -l) >= min))
}

# ---------------------------------------------------------------------------------------------
# Mode-specific inspection: the only places that look at kernel objects rather than traffic.

is_iptables() { [[ $PROXY_MODE == iptables ]]; }
is_ipvs() { [[ $PROXY_MODE == ipvs ]]; }
# uses_iptables — the mode's filter and NAT rules are iptables rules (IPVS mode's are too).
uses_iptables() { is_iptables || is_ipvs; }

# node_has_ipv6 — the node namespace has IPv6 (so kproxy programs ip6tables / ip6 too).
node_has_ipv6() { [[ "$(kp_exec node cat /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null)" == 0 ]]; }

# ipt_save FAMILY VARIANT [ARGS...] — FAMILY-VARIANT-save (FAMILY: iptables or ip6tables) in the
# node namespace.
ipt_save() {
  local family="$1" variant="$2"
  shift 2
  kp_exec node "$family-$variant-save" "$@"
}

# ipt FAMILY ARGS... — FAMILY-VARIANT (the suite's variant) in the node namespace.
ipt() {
  local family="$1"
  shift
  kp_exec node "$family-$IPTABLES_VARIANT" -w 5 "$@"
}

# kproxy_iptables_lines VARIANT FAMILY — the lines of FAMILY-VARIANT-save that declare, fill or
# jump to a KUBE-* chain other than kubelet's (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
# KUBE-MARK-DROP), i.e. kproxy's (or kube-proxy's). Fails when the save fails.
kproxy_iptables_lines() {
  local out
  out="$(ipt_save "$2" "$1")" || return 1
  awk '{ l = $0 " "; gsub(/KUBE-(FIREWALL|KUBELET-CANARY|MARK-DROP)[^A-Za-z0-9-]/, "", l); if (l ~ /KUBE-/) print }' <<<"$out"
}

# kproxy_ruleset — what kproxy programmed for IPv4: table ip $NFT_TABLE, or every table of
# iptables-VARIANT-save; in IPVS mode also the virtual servers, the ipsets and kube-ipvs0's
# addresses. Fails when it cannot be read or kproxy's dispatch chain is missing.
kproxy_ruleset() {
  if is_ipvs; then
    local out
    out="$(ipt_save iptables "$IPTABLES_VARIANT")" || return 1
    grep -q '^:KUBE-SERVICES ' <<<"$out" || return 1
    printf '%s\n' "$out"
    kp_exec node ipvsadm -S -n || return 1
    kp_exec node ipset list || return 1
    kp_exec node ip -o addr show dev kube-ipvs0 || return 1
  elif is_iptables; then
    local out
    out="$(ipt_save iptables "$IPTABLES_VARIANT")" || return 1
    grep -q '^:KUBE-SERVICES ' <<<"$out" || return 1
    printf '%s\n' "$out"
  else
    kp_nft node list table ip "$NFT_TABLE"
  fi
}

# kproxy_ruleset_lacks WORD — kproxy's rules can be read and none mentions WORD (an address).
kproxy_ruleset_lacks() {
  local rules
  rules="$(kproxy_ruleset)" || return 1
  ! grep -qwF -- "$1" <<<"$rules"
}

# kproxy_leftovers — prints whatever kproxy (or kube-proxy) left in the node namespace, in any
# mode: nftables tables named kube-proxy, and KUBE-* chains or jumps (not kubelet's) of either
# iptables variant and either family; in IPVS mode (where the tools and the kernel have IPVS)
# also virtual servers, KUBE-* ipsets and kube-ipvs0. No output: nothing is left.
kproxy_leftovers() {
  nftables_leftovers
  iptables_leftovers
  if is_ipvs; then ipvs_leftovers; fi
  return 0
}

# ipvs_leftovers — prints the IPVS virtual servers, the KUBE-* ipsets and kube-ipvs0 of the node
# namespace, each line prefixed with what it is.
ipvs_leftovers() {
  local out
  out="$(kp_exec node ipvsadm -S -n)" || { echo "ipvsadm -S -n failed"; return 0; }
  [[ -n "$out" ]] && sed 's/^/ipvs: /' <<<"$out"
  out="$(kp_exec node ipset list -n)" || { echo "ipset list -n failed"; return 0; }
  grep '^KUBE-' <<<"$out" | sed 's/^/ipset: /'
  kp_exec node ip -o link show dev kube-ipvs0 2>/dev/null | sed 's/^/link: /'
  return 0
}

# nftables_leftovers — prints the nftables tables named kube-proxy or $NFT_TABLE (any family).
nftables_leftovers() {
  local tables
  tables="$(kp_nft node list tables)" || { echo "nft list tables failed"; return 0; }
  grep -w -e 'kube-proxy' -e "$NFT_TABLE" <<<"$tables"
  return 0
}
no_nftables_leftovers() { [[ -z "$(nftables_leftovers)" ]]; }

# iptables_leftovers — prints the KUBE-* chains and jumps (not kubelet's) of either iptables
# variant and either family, each line prefixed with where it is.
iptables_leftovers() {
  local variant family lines
  for variant in nft legacy; do
    for family in iptables ip6tables; do
      [[ $family == ip6tables ]] && ! node_has_ipv6 && continue
      lines="$(kproxy_iptables_lines "$variant" "$family")" || { echo "$family-$variant-save failed"; continue; }
      [[ -n "$lines" ]] && sed "s/^/$family-$variant: /" <<<"$lines"
    done
  done
  return 0
}
no_iptables_leftovers() { [[ -z "$(iptables_leftovers)" ]]; }

# no_kproxy_leftovers — kproxy_leftovers prints nothing.
no_kproxy_leftovers() { [[ -z "$(kproxy_leftovers)" ]]; }

# kernel_ruleset_empty — nothing at all in the node namespace's netfilter: no nftables table
# (which also covers iptables-nft) and no iptables-legacy table in either family; in IPVS mode
# neither a virtual server, nor an ipset, nor kube-ipvs0.
kernel_ruleset_empty() {
  local out family
  out="$(kp_nft node list ruleset)" || { echo "nft list ruleset failed"; return 1; }
  [[ -z "$out" ]] || { echo "nft: $(head -3 <<<"$out" | tr '\n' ' ')"; return 1; }
  for family in iptables ip6tables; do
    out="$(ipt_save "$family" legacy)" || { echo "$family-legacy-save failed"; return 1; }
    out="$(grep -v '^#' <<<"$out")"
    [[ -z "$out" ]] || { echo "$family-legacy: $(head -3 <<<"$out" | tr '\n' ' ')"; return 1; }
  done
  if is_ipvs; then
    out="$(kp_exec node ipvsadm -S -n)" || { echo "ipvsadm -S -n failed"; return 1; }
    [[ -z "$out" ]] || { echo "ipvs: $(head -3 <<<"$out" | tr '\n' ' ')"; return 1; }
    out="$(kp_exec node ipset list -n)" || { echo "ipset list -n failed"; return 1; }
    [[ -z "$out" ]] || { echo "ipset: $(head -3 <<<"$out" | tr '\n' ' ')"; return 1; }
    ! kp_exec node ip link show dev kube-ipvs0 >/dev/null 2>&1 || { echo "kube-ipvs0 exists"; return 1; }
  fi
  return 0
}

# add_foreign_object — something another program owns, which kproxy must never remove: a table
# of its own (nftables), or a chain with a rule and a jump from INPUT (iptables and IPVS), and
# in IPVS mode an ipset not named KUBE-*.
add_foreign_object() {
  if uses_iptables; then
    ipt iptables -N BYSTANDER && ipt iptables -A BYSTANDER -s 198.51.100.0/24 -j DROP &&
      ipt iptables -A INPUT -j BYSTANDER || return 1
    if is_ipvs; then kp_exec node ipset create bystander hash:ip; fi
  else
    kp_nft node add table ip bystander && kp_nft node add chain ip bystander keep
  fi
}

# foreign_object_present — add_foreign_object's object is still there, whole.
foreign_object_present() {
  if uses_iptables; then
    local out
    out="$(ipt_save iptables "$IPTABLES_VARIANT" -t filter)" || return 1
    grep -qxF -- '-A BYSTANDER -s 198.51.100.0/24 -j DROP' <<<"$out" && grep -qxF -- '-A INPUT -j BYSTANDER' <<<"$out" ||
      return 1
    if is_ipvs; then kp_exec node ipset list -n | grep -qx bystander; fi
  else
    kp_nft node list tables | grep -q 'table ip bystander'
  fi
}

# servicecidr_drop_present CIDR — kproxy drops new connections to CIDR's unallocated addresses.
servicecidr_drop_present() {
  if is_ipvs; then
    # Pods' packets (FORWARD) and the node's (OUTPUT) to addresses not bound to kube-ipvs0.
    local out
    out="$(ipt_save iptables "$IPTABLES_VARIANT" -t filter)" || return 1
    grep -qE -- "^-A KUBE-PROXY-FIREWALL -d ${1//./\\.} .*-j DROP\$" <<<"$out" &&
      grep -qE -- "^-A KUBE-IPVS-OUT-FILTER -d ${1//./\\.} .*-j DROP\$" <<<"$out"
  elif uses_iptables; then
    local out
    out="$(ipt_save iptables "$IPTABLES_VARIANT" -t filter)" || return 1
    grep -qE -- "^-A KUBE-SERVICES -d ${1//./\\.} .*-j DROP\$" <<<"$out"
  else
    kp_nft node list chain ip "$NFT_TABLE" cluster-ips-check | grep -qF "ip daddr $1 drop"
  fi
}

# servicecidr_drop_gone — no such drop is left (and kproxy's rules can be read).
servicecidr_drop_gone() {
  if is_ipvs; then
    local out
    out="$(kproxy_ruleset)" || return 1
    ! grep -E -- '^-A KUBE-(PROXY-FIREWALL|IPVS-OUT-FILTER) .*unallocated ClusterIPs.*-j DROP$' <<<"$out" | grep -q .
  elif uses_iptables; then
    local out
    out="$(kproxy_ruleset)" || return 1
    ! grep -E -- '^-A KUBE-SERVICES .*-j DROP$' <<<"$out" | grep -q .
  else
    local chain
    chain="$(kp_nft node list chain ip "$NFT_TABLE" cluster-ips-check)" || return 1
    ! grep -q drop <<<"$chain"
  fi
}

# nodeport_dispatch — for notes: how kproxy sends traffic to KUBE-NODEPORTS / @nodeport-ips.
nodeport_dispatch() {
  if uses_iptables; then
    ipt_save iptables "$IPTABLES_VARIANT" -t nat | grep -- '-j KUBE-NODEPORTS' | tr -s ' \n' ' '
  else
    kp_nft node list set ip "$NFT_TABLE" nodeport-ips | tr -s ' \n' ' '
    kp_nft node list chain ip "$NFT_TABLE" services | grep -F nodeports | tr -s ' ' ' '
  fi
}

# ---------------------------------------------------------------------------------------------
# Cases.

case_clusterip_from_node() {
  setup 3 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 3)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_only node "http://$WEB_IP/" 5 pod1 pod2 pod3 || return 1
  expect_kproxy_alive
}

case_clusterip_from_pod() {
  setup 3 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 2)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  # pod3 is not an endpoint: plain pod -> service -> other pod, source kept (the userspace
  # mode relays the connection, so there the endpoint sees the node).
  expect_spread pod3 "http://$WEB_IP/" 20 2 || return 1
  expect_only pod3 "http://$WEB_IP/" 5 pod1 pod2 || return 1
  local seen want="$(kp_pod_ip 3)" why="its pod IP (no SNAT inside the cluster)"
  if is_userspace; then want=$KP_NODE_IP why="the node (the userspace proxy does not keep the source)"; fi
  seen="$(kp_client_seen pod3 "http://$WEB_IP/")" || kp_fail "request from pod3 failed" || return 1
  [[ "$seen" == "$want" ]] || kp_fail "endpoint saw pod3 as $seen, want $why" || return 1
  expect_kproxy_alive
}

case_hairpin() {
  setup 2 || return 1
  add_service hairpin.yaml hairpin 10.96.0.20 "$(kp_pod_ip 1)" || return 1
  start_kproxy_and_wait "http://10.96.0.20/" || return 1
  # pod1 reaches itself through its own Service; this only works when the hairpin is
  # masqueraded (otherwise pod1 answers itself from its own IP and the connection never forms).
  expect_only pod1 http://10.96.0.20/ 5 pod1 || return 1
  local seen want
  seen="$(kp_client_seen pod1 http://10.96.0.20/)" || kp_fail "hairpin request failed" || return 1
  kp_note "hairpin client seen as $seen"
  want="$(hairpin_source 1)"
  [[ "$seen" == "$want" ]] || kp_fail "hairpin traffic seen from $seen, want $want" || return 1
  expect_kproxy_alive
}

case_nodeport_from_client() {
  setup 3 || return 1
  add_service web-np.yaml web-np 10.96.0.11 "$(pod_eps 3)" type=NodePort nodePort=30080 || return 1
  start_kproxy_and_wait "http://10.96.0.11/" || return 1
  local url="http://$KP_NODE_IP:30080/"
  kp_wait_for "$KP_CEILING" kp_poll_curl client "$url" >/dev/null || kp_fail "NodePort $url not answered from the client" || return 1
  expect_spread client "$url" 20 2 || return 1
  local i seen
  for i in 1 2 3; do
    seen="$(kp_client_seen client "$url")" || kp_fail "NodePort request failed" || return 1
    [[ "$seen" == "$KP_NODE_IP" ]] || kp_fail "NodePort traffic seen from $seen, want masqueraded to $KP_NODE_IP" || return 1
  done
  expect_kproxy_alive
}

case_etp_local() {
  setup 2 1 || return 1
  # One local and one remote endpoint.
  add_service local.yaml local-np 10.96.0.30 "$(kp_pod_ip 1) $(kp_remote_pod_ip 1)@$KP_REMOTE_NODE_NAME" \
    type=NodePort nodePort=30081 etp=Local || return 1
  # Only a remote endpoint: this node has none.
  add_service remote.yaml remote-np 10.96.0.31 "$(kp_remote_pod_ip 1)@$KP_REMOTE_NODE_NAME" \
    type=NodePort nodePort=30082 etp=Local || return 1
  start_kproxy_and_wait "http://10.96.0.30/" || return 1
  local url="http://$KP_NODE_IP:30081/"
  kp_wait_for "$KP_CEILING" kp_poll_curl client "$url" >/dev/null || kp_fail "NodePort $url not answered" || return 1
  # External traffic: only the local endpoint, and the client's own address is preserved.
  expect_only client "$url" 10 pod1 || return 1
  local seen
  seen="$(kp_client_seen client "$url")" || kp_fail "eTP=Local request failed" || return 1
  [[ "$seen" == "$KP_CLIENT_IP" ]] || kp_fail "eTP=Local: pod saw $seen, want the real client $KP_CLIENT_IP" || return 1
  # Internal traffic (ClusterIP, internalTrafficPolicy Cluster) still uses both endpoints.
  expect_spread node http://10.96.0.30/ 20 2 || return 1
  # No local endpoint: the node drops external traffic, while the ClusterIP still works.
  expect_dropped client "http://$KP_NODE_IP:30082/" || return 1
  expect_only node http://10.96.0.31/ 3 rpod1 || return 1
  expect_kproxy_alive
}

# eTP=Local on a node without a local endpoint (issue 10, items 1 and 6): the node and its
# pods still reach the service's LoadBalancer IP and NodePort through the cluster-wide
# endpoints, pods keeping their source (also with --masquerade-all, which masquerades only
# ClusterIP traffic); outside clients are dropped.
etp_local_short_circuit() {
  setup 2 1 || return 1
  local lb=203.0.113.50
  add_service lb.yaml lb-local 10.96.0.32 "$(kp_remote_pod_ip 1)@$KP_REMOTE_NODE_NAME" \
    type=LoadBalancer nodePort=30083 etp=Local lbIP=$lb || return 1
  start_kproxy_and_wait "http://10.96.0.32/" "$@" || return 1
  expect_only node "http://$lb/" 3 rpod1 || return 1
  expect_only node "http://$KP_NODE_IP:30083/" 3 rpod1 || return 1
  expect_only pod1 "http://$lb/" 3 rpod1 || return 1
  expect_only pod1 "http://$KP_NODE_IP:30083/" 3 rpod1 || return 1
  local seen
  seen="$(kp_client_seen pod1 "http://$lb/")" || kp_fail "pod1 -> $lb failed" || return 1
  [[ "$seen" == "$(kp_pod_ip 1)" ]] || kp_fail "short-circuited pod traffic seen from $seen, want pod1's own IP" || return 1
  expect_dropped client "http://$lb/" || return 1
  expect_dropped client "http://$KP_NODE_IP:30083/" || return 1
  expect_kproxy_alive
}
case_etp_local_short_circuit() { etp_local_short_circuit; }
case_etp_local_short_circuit_masquerade_all() { etp_local_short_circuit --masquerade-all; }

# loadBalancerSourceRanges (issue 10, item 5): a range that holds the node's IP admits the
# node's own connections to the LoadBalancer IP. The VIP is held by the node (as VIP-style load
# balancers do), so the node connects from the VIP itself, which no range holds: upstream admits
# it anyway. A client outside every range is dropped.
case_source_ranges_admit_node() {
  setup 1 || return 1
  local lb=203.0.113.51
  kp_exec node ip addr add "$lb/32" dev lo || return 1
  add_service lb.yaml lb-fw 10.96.0.33 "$(kp_pod_ip 1)" \
    type=LoadBalancer nodePort=30084 lbIP=$lb "sourceRanges=$KP_NODE_IP/32" || return 1
  start_kproxy_and_wait "http://10.96.0.33/" || return 1
  expect_only node "http://$lb/" 3 pod1 || return 1
  expect_dropped client "http://$lb/" || return 1
  # NodePorts are never filtered by source ranges (upstream).
  expect_only client "http://$KP_NODE_IP:30084/" 3 pod1 || return 1
  expect_kproxy_alive
}

# --detect-local-mode (issue 10, item 2): pods are told apart by the Node's podCIDRs
# (NodeCIDR, here without any --cluster-cidr) or by their interfaces' name prefix; their
# ClusterIP traffic keeps its source, an outside client's is masqueraded.
detect_local() {
  setup 3 || return 1
  kp_manifest_node "$KP_NODE_NAME" "$KP_NODE_IP" "$KP_POD_NET.0/24" | kp_install_manifest "$MANIFESTS" nodes.yaml || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 2)" || return 1
  KP_CLUSTER_CIDR="" start_kproxy_and_wait "http://$WEB_IP/" "$@" || return 1
  local seen why
  seen="$(kp_client_seen pod3 "http://$WEB_IP/")" || kp_fail "pod3 -> $WEB_IP failed" || return 1
  [[ "$seen" == "$(kp_pod_ip 3)" ]] || kp_fail "pod traffic seen from $seen, want pod3's own IP" || return 1
  if why="$(ebpf_reason outside_clusterip)"; then
    kp_note "ebpf: $why"
    expect_not_served client "http://$WEB_IP/" || return 1
  else
    seen="$(kp_client_seen client "http://$WEB_IP/")" || kp_fail "client -> $WEB_IP failed" || return 1
    [[ "$seen" == "$KP_NODE_IP" ]] || kp_fail "outside traffic seen from $seen, want masqueraded to $KP_NODE_IP" || return 1
  fi
  expect_kproxy_alive
}
case_detect_local_node_cidr() { detect_local --detect-local-mode NodeCIDR; }
case_detect_local_interface_prefix() {
  detect_local --detect-local-mode InterfaceNamePrefix --pod-interface-name-prefix vp
}

case_session_affinity() {
  setup 4 || return 1
  # pod4 is not an endpoint, so no request here is a hairpin (see hairpin_with_affinity).
  add_service sticky.yaml sticky 10.96.0.40 "$(pod_eps 3)" affinity=ClientIP type=NodePort nodePort=30084 || return 1
  start_kproxy_and_wait "http://10.96.0.40/" || return 1
  local role url out
  for role in node pod4 client; do
    url=http://10.96.0.40/
    [[ $role == client ]] && url="http://$KP_NODE_IP:30084/"
    out="$(answers "$role" "$url" 10)"
    kp_note "$role -> $url: $(summarize <<<"$out")"
    grep -q FAIL <<<"$out" && { kp_fail "requests from $role failed"; return 1; }
    [[ "$(sort -u <<<"$out" | wc -l)" -eq 1 ]] || kp_fail "ClientIP affinity: $role reached several pods" || return 1
  done
  expect_kproxy_alive
}

case_hairpin_with_affinity() {
  setup 2 || return 1
  add_service sticky.yaml sticky 10.96.0.41 "$(kp_pod_ip 1)" affinity=ClientIP || return 1
  start_kproxy_and_wait "http://10.96.0.41/" || return 1
  # The first request creates pod1's affinity entry; the later ones follow it and must still
  # be masqueraded like any hairpin.
  expect_only pod1 http://10.96.0.41/ 5 pod1 || return 1
  local seen want
  seen="$(kp_client_seen pod1 http://10.96.0.41/)" || kp_fail "hairpin request failed" || return 1
  want="$(hairpin_source 1)"
  [[ "$seen" == "$want" ]] || kp_fail "hairpin traffic seen from $seen, want $want" || return 1
  expect_kproxy_alive
}

case_affinity_follows_endpoint_removal() {
  setup 3 || return 1
  add_service sticky.yaml sticky 10.96.0.42 "$(pod_eps 3)" affinity=ClientIP || return 1
  start_kproxy_and_wait "http://10.96.0.42/" || return 1
  local first out others other_pods=() p
  first="$(kp_who node http://10.96.0.42/)" || kp_fail "request to the sticky service failed" || return 1
  expect_only node http://10.96.0.42/ 5 "$first" || return 1
  # The sticky endpoint leaves the service (its pod still answers if anyone sends to it): the
  # node must be sent elsewhere, and stick there.
  others=""
  for p in 1 2 3; do [[ "pod$p" == "$first" ]] || { others+="$(kp_pod_ip "$p") "; other_pods+=("pod$p"); }; done
  add_service sticky.yaml sticky 10.96.0.42 "$others" affinity=ClientIP || return 1
  kp_wait_for_kproxy "$KP_CEILING" answered_by node http://10.96.0.42/ 1 1 "${other_pods[@]}" ||
    kp_fail "still sent to $first (or failed) $KP_CEILING s after its removal" || return 1
  out="$(answers node http://10.96.0.42/ 10)"
  kp_note "after removing $first: $(summarize <<<"$out")"
  grep -q -e FAIL -e "^$first\$" <<<"$out" && { kp_fail "still sent to $first (or failed) after its removal"; return 1; }
  [[ "$(sort -u <<<"$out" | wc -l)" -eq 1 ]] || kp_fail "ClientIP affinity lost after the removal" || return 1
  expect_kproxy_alive
}

case_no_endpoints_rejected() {
  setup 1 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  add_service empty.yaml empty 10.96.0.50 "" || return 1
  add_service empty-np.yaml empty-np 10.96.0.52 "" type=NodePort nodePort=30083 || return 1
  # A Service with no EndpointSlice at all.
  kp_manifest_service test noslice 10.96.0.51 80 8080 | kp_install_manifest "$MANIFESTS" noslice.yaml
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_refused node http://10.96.0.50/ || return 1
  expect_refused pod1 http://10.96.0.50/ || return 1
  expect_refused node http://10.96.0.51/ || return 1
  expect_refused client "http://$KP_NODE_IP:30083/" || return 1
  expect_kproxy_alive
}

case_wrong_port_rejected() {
  setup 1 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_refused node "http://$WEB_IP:81/" || return 1
  expect_refused pod1 "http://$WEB_IP:8080/" || return 1
  # The right port still works.
  expect_only node "http://$WEB_IP/" 3 pod1 || return 1
  expect_kproxy_alive
}

# Endpoint changes of a running kproxy take effect: each is waited for (the ceiling only catches
# a change that never comes; how soon it came is noted, not checked).
case_endpoint_changes_applied() {
  setup 3 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 3)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  local changed_at

  # Removal: only pod1 remains.
  add_service web.yaml web "$WEB_IP" "$(kp_pod_ip 1)" || return 1
  changed_at=${EPOCHREALTIME/./}
  kp_wait_for_kproxy "$KP_CEILING" answered_by node "http://$WEB_IP/" 12 1 pod1 ||
    kp_fail "endpoint removal not in effect after $KP_CEILING s" || return 1
  kp_note "removal in effect after $(((${EPOCHREALTIME/./} - changed_at) / 1000)) ms"
  expect_only node "http://$WEB_IP/" 12 pod1 || return 1

  # Addition and not-ready: pod1 and pod3 ready, pod2 listed but not ready.
  add_service web.yaml web "$WEB_IP" "$(kp_pod_ip 1) $(kp_pod_ip 2):notready $(kp_pod_ip 3)" || return 1
  changed_at=${EPOCHREALTIME/./}
  kp_wait_for_kproxy "$KP_CEILING" answered_by node "http://$WEB_IP/" 20 2 pod1 pod3 ||
    kp_fail "after $KP_CEILING s, the added endpoint is not used or the not-ready one still is" || return 1
  kp_note "addition in effect after $(((${EPOCHREALTIME/./} - changed_at) / 1000)) ms"
  expect_only node "http://$WEB_IP/" 20 pod1 pod3 || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1

  # Deleting the Service's file removes the Service: its rules go, and its IP is routed away
  # like any address without rules (to the client, which drops it), not answered or refused.
  rm -f "$MANIFESTS/web.yaml"
  kp_wait_for_kproxy "$KP_CEILING" kproxy_ruleset_lacks "$WEB_IP" ||
    kp_fail "$WEB_IP still in kproxy's rules $KP_CEILING s after its Service was deleted" || return 1
  expect_dropped node "http://$WEB_IP/" || return 1
  expect_kproxy_alive
}

case_malformed_manifest_ignored() {
  setup 2 || return 1
  add_service web.yaml web "$WEB_IP" "$(kp_pod_ip 1)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  # Broken files arrive together with a good new Service.
  printf 'kind: Service\nmetadata: [unclosed\n  name: x\n' >"$MANIFESTS/broken.yaml"
  printf '{"kind": "Service", "apiVersion": "v1", "metadata": {' >"$MANIFESTS/broken.json"
  cat >"$MANIFESTS/bad-objects.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {namespace: test, name: bad-port}
spec:
  clusterIP: 10.96.0.61
  ports: [{name: http, protocol: TCP, port: "eighty", targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {namespace: test, name: bad-ip}
spec:
  clusterIP: 10.96.0.999
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: test, name: bad-slice, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["not-an-ip"], conditions: {ready: true}}]
---
this is: [not, a, kubernetes, object
EOF
  add_service good.yaml good 10.96.0.60 "$(kp_pod_ip 2)" || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl node http://10.96.0.60/ >/dev/null || kp_fail "good Service next to broken files not served" || return 1
  expect_only node http://10.96.0.60/ 5 pod2 || return 1
  expect_only node "http://$WEB_IP/" 10 pod1 || return 1
  expect_kproxy_alive || return 1
  # Later changes still take effect with the broken files present.
  add_service good.yaml good 10.96.0.60 "$(kp_pod_ip 1)" || return 1
  kp_wait_for_kproxy "$KP_CEILING" answered_by node http://10.96.0.60/ 5 1 pod1 ||
    kp_fail "a change next to the broken files not in effect after $KP_CEILING s" || return 1
  expect_only node http://10.96.0.60/ 5 pod1 || return 1
  expect_kproxy_alive
}

_lines_at_least() { (($(wc -l <"$1") >= $2)); }
_stream_lines_at_least() { (($(grep -c '^pod=' "$1") >= $2)); }

# stream_start ROLE URL LOG — a long-lived connection from ROLE: a /stream of URL (one line
# every 0.2 s) that lasts longer than the case's waits together, so that only stream_stop or a
# broken connection ends it. Its curl's pid is in KP_LAST_PID (`ip netns exec` execs curl).
stream_start() {
  local span=$((8 * KP_CEILING))
  kp_in_ns "$1" || return 1
  kp_bg "$3" "${KP_IN_NS[@]}" curl -sS --no-buffer --max-time $((span + 10)) \
    "$2stream?seconds=$span&interval=0.2"
}

# stream_goes_on LOG PID — the connection still carries data now: more lines arrive than there
# were (waited for), and its curl still runs.
stream_goes_on() {
  local now
  now="$(grep -c '^pod=' "$1")"
  kp_wait_for "$KP_CEILING" _stream_lines_at_least "$1" $((now + 3)) ||
    { tail -n 3 "$1" >&2; kp_fail "no data on the long-lived connection for $KP_CEILING s (after line $now)"; return 1; }
  kill -0 "$2" 2>/dev/null || { tail -n 3 "$1" >&2; kp_fail "the long-lived connection ended"; return 1; }
}

# stream_stop PID — end a stream_start's curl.
stream_stop() {
  kill "$1" 2>/dev/null
  wait "$1" 2>/dev/null
  return 0
}

# syn_retransmits ROLE — how many SYNs the kernel of ROLE's namespace has sent again (TcpExt
# TCPSynRetrans): a connection whose first SYN met no rule was dropped, however soon it then
# succeeded.
syn_retransmits() {
  kp_exec "$1" awk '/^TcpExt:/ { if (!h) { for (i = 1; i <= NF; i++) n[$i] = i; h = 1 } else print $n["TCPSynRetrans"] }' \
    /proc/net/netstat
}

# Connections keep working across a SIGTERM and a SIGKILL restart of kproxy: a long-lived one
# still carries data after both, and none of a loop of new ones made all along fails or even
# loses a SYN (a new connection waits up to the ceiling, so a moment without rules would only
# delay it: the retransmitted SYN shows that moment).
case_restart_keeps_traffic() {
  setup 3 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 3)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  local loop_log="$KP_WORKDIR/loop.log" stream_log="$KP_WORKDIR/stream.log" stop="$KP_WORKDIR/loop.stop"
  # A long-lived connection through the ClusterIP, and a loop of new connections until the
  # stop file exists. Both go on until the restarted kproxy's rules have carried them.
  stream_start pod3 "http://$WEB_IP/" "$stream_log"
  local stream_pid=$KP_LAST_PID
  (
    while [[ ! -e "$stop" ]]; do
      if who="$(kp_who node "http://$WEB_IP/")"; then echo "ok $who"; else echo "FAIL $(kp_now)"; fi
      sleep 0.05
    done
  ) >"$loop_log" 2>&1 &
  local loop_pid=$!
  KP_PIDS+=("$loop_pid")
  # The loop and the stream are under way before the first restart.
  kp_wait_for "$KP_CEILING" _lines_at_least "$loop_log" 5 || kp_fail "the request loop did not start" || return 1
  kp_wait_for "$KP_CEILING" _stream_lines_at_least "$stream_log" 1 ||
    kp_fail "the long-lived connection did not start" || return 1
  local retransmits
  retransmits="$(syn_retransmits node)"
  kp_note "restart 1: SIGTERM"
  kp_stop_kproxy TERM
  local syncs
  syncs="$(kp_kproxy_syncs)"
  kp_start_kproxy "$MANIFESTS" || return 1
  # Killed only once the restarted kproxy has synced the rules over its predecessor's.
  kp_wait_for_kproxy "$KP_CEILING" kp_kproxy_synced_after "$syncs" || kp_fail "the restarted kproxy did not sync" || return 1
  kp_note "restart 2: SIGKILL"
  kp_stop_kproxy KILL
  syncs="$(kp_kproxy_syncs)"
  kp_start_kproxy "$MANIFESTS" || return 1
  kp_wait_for_kproxy "$KP_CEILING" kp_kproxy_synced_after "$syncs" || kp_fail "the restarted kproxy did not sync" || return 1
  # After the second restart's sync: the stream still carries data, the loop makes requests.
  local after
  after="$(wc -l <"$loop_log")"
  stream_goes_on "$stream_log" "$stream_pid"
  local stream_ok=$?
  kp_wait_for "$KP_CEILING" _lines_at_least "$loop_log" $((after + 5))
  touch "$stop"
  wait "$loop_pid"
  stream_stop "$stream_pid"
  local total failed
  total="$(wc -l <"$loop_log")"
  failed="$(grep -c '^FAIL' "$loop_log")"
  retransmits=$(($(syn_retransmits node) - retransmits))
  kp_note "loop: $total requests ($((total - after)) after the second restart's sync), $failed failed," \
    "$retransmits SYNs sent again; stream: $(grep -c '^pod=' "$stream_log") lines"
  ((failed == 0)) || { grep '^FAIL' "$loop_log" | head -5 >&2; kp_fail "$failed requests failed across restarts"; return 1; }
  ((retransmits == 0)) || kp_fail "$retransmits SYNs of the loop's connections were dropped across the restarts" || return 1
  ((total >= after + 5)) || kp_fail "the request loop made $((total - after)) requests after the second restart" || return 1
  ((stream_ok == 0)) || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_kproxy_alive
}

# run_kproxy_cleanup — `kproxy --cleanup` (with this mode's standard arguments) in the node
# namespace, to completion; its output goes to the kproxy log.
run_kproxy_cleanup() {
  local bin args rc
  bin="$(kp_kproxy_bin)" || return 1
  mapfile -t args < <(kp_kproxy_args "$MANIFESTS")
  echo "===== kproxy --cleanup: $bin ${args[*]} =====" >>"$KP_WORKDIR/kproxy.log"
  kp_exec node timeout "$KP_CEILING" "$bin" "${args[@]}" --cleanup >>"$KP_WORKDIR/kproxy.log" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || kp_fail "kproxy --cleanup exited $rc"
}

case_cleanup_removes_table() {
  setup 1 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  # Something kproxy does not own must survive --cleanup.
  add_foreign_object || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  # The service answering does not mean every rule is in: IPVS mode answers through its virtual
  # server before its iptables part is committed, so the rules are waited for.
  kp_wait_for_kproxy "$KP_CEILING" kproxy_ruleset >/dev/null ||
    kp_fail "kproxy's rules ($PROXY_MODE mode) cannot be read while it runs" || return 1
  kp_stop_kproxy TERM
  run_kproxy_cleanup || return 1
  local left
  left="$(kproxy_leftovers)"
  [[ -z "$left" ]] || { kp_fail "left after --cleanup: $(head -5 <<<"$left" | tr '\n' ';')"; return 1; }
  foreign_object_present || kp_fail "--cleanup removed an object it does not own" || return 1
  # Without rules the ClusterIP is routed away (to the client, which drops it).
  expect_dropped node "http://$WEB_IP/" || return 1
  # Safe to run twice.
  run_kproxy_cleanup || return 1
  foreign_object_present || kp_fail "a second --cleanup removed an object it does not own" || return 1
}

_kproxy_exited() { ! kp_kproxy_alive; }

case_dry_run_changes_nothing() {
  setup 1 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  # Another mode's table, which a real run removes once its first sync is in: a dry run keeps it.
  local other=kproxy-userspace
  [[ $PROXY_MODE == userspace ]] && other=kube-proxy
  kp_nft node add table ip "$other" || return 1
  kp_start_kproxy "$MANIFESTS" --dry-run || return 1
  # A dry run syncs once, prints the batch and exits. Checked after it has exited, so "nothing
  # changed" is not merely "not yet".
  kp_wait_for "$KP_CEILING" _kproxy_exited || kp_fail "kproxy --dry-run still runs after $KP_CEILING s" || return 1
  local rc
  wait "$KP_KPROXY_PID"
  rc=$?
  KP_KPROXY_PID=""
  [[ $rc -eq 0 ]] || kp_fail "kproxy --dry-run exited $rc" || return 1
  kp_kproxy_synced_after 0 || kp_fail "kproxy --dry-run logged no sync" || return 1
  grep -qwF -- "$WEB_IP" "$KP_WORKDIR/kproxy.log" || kp_fail "--dry-run printed no planned operation for $WEB_IP" || return 1
  kp_nft node list table ip "$other" >/dev/null 2>&1 || kp_fail "--dry-run removed the table ip $other" || return 1
  kp_nft node delete table ip "$other" || return 1
  local changed
  changed="$(kernel_ruleset_empty)" || kp_fail "--dry-run changed the ruleset: $changed" || return 1
  expect_dropped node "http://$WEB_IP/" || return 1
}

case_affinity_across_addresses() {
  setup 4 || return 1
  # One service port reachable at its ClusterIP, a NodePort, an externalIP and a LoadBalancer
  # IP; pod4 is not an endpoint. Stickiness belongs to the service port, not to the address a
  # client used (upstream keeps one affinity set per endpoint, shared by every address).
  local ext=192.0.2.50 lb=192.0.2.51
  add_service sticky.yaml sticky 10.96.0.43 "$(pod_eps 3)" affinity=ClientIP type=LoadBalancer \
    nodePort=30085 externalIP=$ext lbIP=$lb || return 1
  start_kproxy_and_wait "http://10.96.0.43/" || return 1
  local role url out round urls body why
  urls=("http://10.96.0.43/" "http://$KP_NODE_IP:30085/" "http://$ext/" "http://$lb/")
  # IPVS mode binds the service addresses to kube-ipvs0, so a connection of the node's to one
  # of them leaves from that address itself (the kernel's source for a local destination):
  # each address is another client IP, for ClientIP affinity as for everything else (as in
  # upstream's IPVS mode). The node is one client when it connects from its node address.
  local -a node_source=()
  is_ipvs && node_source=(--interface "$KP_NODE_IP")
  local -a role_urls
  for role in pod4 client node; do
    out=""
    role_urls=("${urls[@]}")
    if [[ $role == client ]] && why="$(ebpf_reason outside_clusterip)"; then
      kp_note "ebpf: $why"
      expect_not_served client "${urls[0]}" || return 1
      role_urls=("${urls[@]:1}")
    fi
    for round in 1 2 3; do
      for url in "${role_urls[@]}"; do
        if [[ $role == node ]]; then
          body="$(kp_curl node "$url" "${node_source[@]}" 2>/dev/null)" && [[ "$body" =~ ^pod=([^ $'\n']+) ]] &&
            out+="${BASH_REMATCH[1]}"$'\n' || out+=FAIL$'\n'
        else
          out+="$(kp_who "$role" "$url" || echo FAIL)"$'\n'
        fi
      done
    done
    out="${out%$'\n'}"
    kp_note "$role -> ClusterIP, NodePort, externalIP, LB IP (3 rounds): $(summarize <<<"$out")"
    grep -q FAIL <<<"$out" && { kp_fail "requests from $role failed: $(summarize <<<"$out")"; return 1; }
    [[ "$(sort -u <<<"$out" | wc -l)" -eq 1 ]] ||
      kp_fail "$role reached several pods through the service's addresses: $(summarize <<<"$out")" || return 1
  done
  expect_kproxy_alive
}

# With eTP=Local the external chain balances the local endpoints only: a client's entry for a
# remote endpoint (made through the ClusterIP) must not send its NodePort connections there,
# nor may the NodePort's choice change where its ClusterIP connections stick. Pods and the node
# reach the NodePort through the cluster pool (the short-circuit) and stick across both.
case_affinity_etp_local() {
  setup 2 1 || return 1
  local remote np="http://$KP_NODE_IP:30086/"
  remote="$(kp_remote_pod_ip 1)@$KP_REMOTE_NODE_NAME"
  # First the remote endpoint alone, so that the client's ClusterIP entry points at it.
  add_service sticky.yaml sticky 10.96.0.44 "$remote" affinity=ClientIP type=NodePort nodePort=30086 \
    etp=Local || return 1
  start_kproxy_and_wait "http://10.96.0.44/" || return 1
  local outside=1 why
  if why="$(ebpf_reason outside_clusterip)"; then
    kp_note "ebpf: $why"
    outside=0
    expect_not_served client http://10.96.0.44/ || return 1
  fi
  ((outside == 0)) || expect_only client http://10.96.0.44/ 2 rpod1 || return 1
  add_service sticky.yaml sticky 10.96.0.44 "$(kp_pod_ip 1) $remote" affinity=ClientIP type=NodePort \
    nodePort=30086 etp=Local || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl client "$np" >/dev/null || kp_fail "NodePort $np not answered" || return 1
  local round
  for round in 1 2 3; do
    expect_only client "$np" 2 pod1 || return 1
    ((outside == 0)) || expect_only client http://10.96.0.44/ 2 rpod1 || return 1
  done
  local out
  out="$(for round in 1 2 3 4; do
    kp_who pod2 http://10.96.0.44/ || echo FAIL
    echo
    kp_who pod2 "$np" || echo FAIL
    echo
  done)"
  out="$(grep -v '^$' <<<"$out")"
  kp_note "pod2 -> ClusterIP, NodePort (4 rounds): $(summarize <<<"$out")"
  grep -q FAIL <<<"$out" && { kp_fail "requests from pod2 failed"; return 1; }
  [[ "$(sort -u <<<"$out" | wc -l)" -eq 1 ]] || kp_fail "pod2 reached several pods: $(summarize <<<"$out")" || return 1
  expect_kproxy_alive
}

# --nodeport-addresses selects the node's interface addresses (read over rtnetlink, and
# followed), not the Node object's: a secondary address inside the CIDR answers, one outside
# it and the Node object's address do not, and an address added while kproxy runs answers.
case_nodeport_addresses_secondary() {
  setup 2 || return 1
  local node_ns
  node_ns="$(kp_ns node)"
  # The client's default route goes through the node, so it reaches every node address.
  ip -n "$node_ns" addr add 192.168.70.1/32 dev eth0 || return 1
  ip -n "$node_ns" addr add 192.168.71.1/32 dev eth0 || return 1
  add_service web-np.yaml web-np 10.96.0.11 "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  start_kproxy_and_wait "http://10.96.0.11/" --nodeport-addresses=192.168.70.0/24 || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl client http://192.168.70.1:30080/ >/dev/null ||
    kp_fail "NodePort on the secondary address 192.168.70.1 (in the CIDR, not in the Node object) not answered" || return 1
  expect_spread client http://192.168.70.1:30080/ 20 2 || return 1
  kp_note "nodeport dispatch: $(nodeport_dispatch)"
  KP_CURL_TIMEOUT=1 kp_curl client http://192.168.71.1:30080/ >/dev/null 2>&1 &&
    { kp_fail "NodePort answered on 192.168.71.1, outside --nodeport-addresses"; return 1; }
  KP_CURL_TIMEOUT=1 kp_curl client "http://$KP_NODE_IP:30080/" >/dev/null 2>&1 &&
    { kp_fail "NodePort answered on the Node object's $KP_NODE_IP, outside --nodeport-addresses"; return 1; }
  # Added after kproxy started: followed without a restart.
  ip -n "$node_ns" addr add 192.168.70.2/32 dev eth0 || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl client http://192.168.70.2:30080/ >/dev/null ||
    kp_fail "NodePort on 192.168.70.2, added while kproxy runs, not answered" || return 1
  expect_spread client http://192.168.70.2:30080/ 20 2 || return 1
  expect_kproxy_alive
}

# --nodeport-addresses=0.0.0.0/0: every local address (upstream's MatchAll, `fib daddr type
# local` / `addrtype --dst-type LOCAL`), including one added while kproxy runs. Loopback
# answers in iptables mode only, unless --iptables-localhost-nodeports=false (upstream: the
# nftables mode has no localhost NodePorts; see also case localhost_nodeports).
case_nodeport_addresses_all_local() {
  setup 2 || return 1
  local node_ns
  node_ns="$(kp_ns node)"
  ip -n "$node_ns" addr add 192.168.71.1/32 dev eth0 || return 1
  add_service web-np.yaml web-np 10.96.0.11 "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  start_kproxy_and_wait "http://10.96.0.11/" --nodeport-addresses=0.0.0.0/0 || return 1
  local url
  for url in "http://$KP_NODE_IP:30080/" http://192.168.71.1:30080/; do
    kp_wait_for "$KP_CEILING" kp_poll_curl client "$url" >/dev/null || kp_fail "NodePort $url not answered" || return 1
    expect_spread client "$url" 20 2 || return 1
  done
  kp_note "nodeport dispatch: $(nodeport_dispatch)"
  ip -n "$node_ns" addr add 192.168.72.1/32 dev eth0 || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl client http://192.168.72.1:30080/ >/dev/null ||
    kp_fail "NodePort on 192.168.72.1, added while kproxy runs, not answered" || return 1
  if ! is_iptables; then
    KP_CURL_TIMEOUT=1 kp_curl node http://127.0.0.1:30080/ >/dev/null 2>&1 &&
      { kp_fail "NodePort answered on 127.0.0.1 (no localhost NodePorts in nftables mode)"; return 1; }
    expect_kproxy_alive
    return
  fi
  expect_spread node http://127.0.0.1:30080/ 20 2 || return 1
  expect_kproxy_alive || return 1
  # The same with --iptables-localhost-nodeports=false: loopback is refused (nothing listens
  # there), the other addresses still answer.
  kp_stop_kproxy TERM
  local syncs
  syncs="$(kp_kproxy_syncs)"
  kp_start_kproxy "$MANIFESTS" --nodeport-addresses=0.0.0.0/0 --iptables-localhost-nodeports=false || return 1
  kp_wait_for_kproxy "$KP_CEILING" kp_kproxy_synced_after "$syncs" || kp_fail "the restarted kproxy did not sync" || return 1
  expect_refused node http://127.0.0.1:30080/ || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_kproxy_alive
}

# issue 10 item 4: new connections to an address inside a ServiceCIDR that no Service holds are
# dropped (they time out), while a Service's unused port is refused and the Service answers.
# The outside client owns the unallocated address, so without the drop the node would route
# the connection there and the client would refuse it at once.
case_unallocated_clusterip_dropped() {
  setup 2 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  printf '%s\n' "apiVersion: networking.k8s.io/v1" "kind: ServiceCIDR" "metadata: {name: kubernetes}" \
    "spec: {cidrs: [10.96.0.0/16]}" | kp_install_manifest "$MANIFESTS" servicecidr.yaml || return 1
  local unallocated=10.96.0.99
  kp_exec client ip addr add "$unallocated/32" dev lo || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  # Waited for, as above: in IPVS mode the service answers before the iptables part is in.
  kp_wait_for_kproxy "$KP_CEILING" servicecidr_drop_present 10.96.0.0/16 ||
    kp_fail "no drop of 10.96.0.0/16 in kproxy's rules: $(kproxy_ruleset | grep -F 10.96.0.0/16)" || return 1
  expect_dropped pod2 "http://$unallocated/" || return 1
  expect_dropped node "http://$unallocated/" || return 1
  expect_refused pod2 "http://$WEB_IP:81/" || return 1
  expect_only pod2 "http://$WEB_IP/" 3 pod1 || return 1
  # The ServiceCIDR goes: so does the drop, and the client's refusal comes through again.
  rm -f "$MANIFESTS/servicecidr.yaml"
  kp_wait_for "$KP_CEILING" servicecidr_drop_gone || kp_fail "the drop stayed after the ServiceCIDR was removed" || return 1
  expect_refused pod2 "http://$unallocated/" || return 1
  expect_kproxy_alive
}

# ---------------------------------------------------------------------------------------------
# iptables mode only.

# restart_kproxy [KPROXY_ARGS...] — stop kproxy (SIGTERM), start it again with these arguments
# and wait until the new one has synced.
restart_kproxy() {
  local syncs
  kp_stop_kproxy TERM
  syncs="$(kp_kproxy_syncs)"
  kp_start_kproxy "$MANIFESTS" "$@" || return 1
  kp_wait_for_kproxy "$KP_CEILING" kp_kproxy_synced_after "$syncs" ||
    kp_fail "the restarted kproxy did not sync within $KP_CEILING s"
}

# Upstream's --iptables-localhost-nodeports (default true): with the default NodePort
# addresses the node reaches a NodePort at 127.0.0.1 (route_localnet is set, and the
# connection is masqueraded to a routable source); with the flag off, 127.0.0.1 is refused
# (nothing listens there) while the node's own address still answers.
case_localhost_nodeports() {
  setup 2 || return 1
  add_service web-np.yaml web-np 10.96.0.11 "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  start_kproxy_and_wait "http://10.96.0.11/" || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl node http://127.0.0.1:30080/ >/dev/null ||
    kp_fail "NodePort not answered at 127.0.0.1 (localhost NodePorts are on by default)" || return 1
  expect_spread node http://127.0.0.1:30080/ 20 2 || return 1
  local localnet seen
  localnet="$(kp_exec node cat /proc/sys/net/ipv4/conf/all/route_localnet)"
  [[ $localnet == 1 ]] || kp_fail "route_localnet=$localnet with localhost NodePorts, want 1" || return 1
  seen="$(kp_client_seen node http://127.0.0.1:30080/)" || kp_fail "request to 127.0.0.1:30080 failed" || return 1
  [[ "$seen" == "$KP_NODE_IP" ]] || kp_fail "localhost NodePort traffic seen from $seen, want masqueraded to $KP_NODE_IP" || return 1
  kp_note "nodeport dispatch (default): $(nodeport_dispatch)"

  restart_kproxy --iptables-localhost-nodeports=false || return 1
  kp_note "nodeport dispatch (--iptables-localhost-nodeports=false): $(nodeport_dispatch)"
  expect_refused node http://127.0.0.1:30080/ || return 1
  expect_spread node "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_kproxy_alive
}

# flush_tables FAMILY TABLE... — `-F` then `-X` each table, as an administrator's or a firewall
# manager's reload would: every rule and every user chain is gone.
flush_tables() {
  local family="$1" table
  shift
  for table in "$@"; do
    ipt "$family" -t "$table" -F || return 1
    ipt "$family" -t "$table" -X || return 1
  done
}

# kproxy's rules flushed behind its back are repaired by the next periodic check (the canary
# chain in mangle, as upstream's iptables monitor): first the nat table flushed and the canary
# deleted, then every table of both families flushed and emptied. Nothing else makes kproxy sync
# here, so the service answering again is the repair; how long it took is noted (the check comes
# every sync period, 2 s).
case_flush_repaired() {
  setup 2 || return 1
  add_service web-np.yaml web-np "$WEB_IP" "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  start_kproxy_and_wait "http://$WEB_IP/" --iptables-sync-period=2s || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  local family flushed_at ms
  ipt iptables -t nat -F || return 1
  ipt iptables -t mangle -X KUBE-PROXY-CANARY || return 1
  flushed_at=${EPOCHREALTIME/./}
  kp_wait_for_kproxy "$KP_CEILING" answered_by node "http://$WEB_IP/" 3 1 pod1 pod2 ||
    kp_fail "not answered within $KP_CEILING s of flushing nat and deleting the canary" || return 1
  ms=$(((${EPOCHREALTIME/./} - flushed_at) / 1000))
  kp_note "nat flushed, canary deleted: answered again after ${ms} ms"
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1

  for family in iptables ip6tables; do
    [[ $family == ip6tables ]] && ! node_has_ipv6 && continue
    flush_tables "$family" nat filter mangle || kp_fail "flushing $family failed" || return 1
  done
  flushed_at=${EPOCHREALTIME/./}
  kp_wait_for_kproxy "$KP_CEILING" answered_by node "http://$WEB_IP/" 3 1 pod1 pod2 ||
    kp_fail "not answered within $KP_CEILING s of flushing every table" || return 1
  ms=$(((${EPOCHREALTIME/./} - flushed_at) / 1000))
  kp_note "every table flushed: answered again after ${ms} ms"
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  if node_has_ipv6; then
    _ip6_repaired() { ipt_save ip6tables "$IPTABLES_VARIANT" -t nat | grep -q '^:KUBE-SERVICES '; }
    kp_wait_for "$KP_CEILING" _ip6_repaired || kp_fail "ip6tables nat has no KUBE-SERVICES after the flush" || return 1
  fi
  expect_kproxy_alive
}

# add_foreign_rules — what kubelet and another program put into iptables before kproxy starts:
# kubelet's KUBE-KUBELET-CANARY chains and KUBE-FIREWALL (with its rule and jumps), a user
# chain with a rule and a jump from INPUT, and a rule in nat POSTROUTING, where kproxy adds its
# own jump.
add_foreign_rules() {
  local family net
  for family in iptables ip6tables; do
    [[ $family == ip6tables ]] && ! node_has_ipv6 && continue
    net=10.250.0.0/16
    [[ $family == ip6tables ]] && net=fd00:250::/64
    ipt "$family" -t mangle -N KUBE-KUBELET-CANARY &&
      ipt "$family" -t nat -N KUBE-KUBELET-CANARY &&
      ipt "$family" -t filter -N KUBE-KUBELET-CANARY &&
      ipt "$family" -t filter -N KUBE-FIREWALL &&
      ipt "$family" -t filter -A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" \
        -m mark --mark 0x8000/0x8000 -j DROP &&
      ipt "$family" -t filter -A INPUT -j KUBE-FIREWALL &&
      ipt "$family" -t filter -A OUTPUT -j KUBE-FIREWALL &&
      ipt "$family" -t filter -N USER-INPUT &&
      ipt "$family" -t filter -A USER-INPUT -p tcp --dport 2222 -j DROP &&
      ipt "$family" -t filter -A INPUT -j USER-INPUT &&
      ipt "$family" -t nat -A POSTROUTING -s "$net" ! -d "$net" -j MASQUERADE || return 1
  done
}

# foreign_rules — add_foreign_rules' lines as iptables-save prints them, per family, in order.
foreign_rules() {
  local family out
  for family in iptables ip6tables; do
    [[ $family == ip6tables ]] && ! node_has_ipv6 && continue
    out="$(ipt_save "$family" "$IPTABLES_VARIANT")" || return 1
    grep -E 'KUBE-FIREWALL|KUBE-KUBELET-CANARY|USER-INPUT|10\.250\.0\.0/16|fd00:250::/64' <<<"$out" | sed "s/^/$family: /"
  done
}

# expect_foreign_rules BEFORE WHEN — foreign_rules prints exactly BEFORE.
expect_foreign_rules() {
  local now
  now="$(foreign_rules)" || kp_fail "iptables-save failed $2" || return 1
  [[ "$now" == "$1" ]] && return 0
  diff <(printf '%s\n' "$1") <(printf '%s\n' "$now") | sed 's/^/    /' >&2
  kp_fail "other programs' iptables rules changed $2"
}

# kproxy never changes what it does not own: kubelet's chains and another program's rules are
# byte for byte the same while it runs, after a restart and after --cleanup.
case_foreign_rules_untouched() {
  setup 2 || return 1
  add_service web-np.yaml web-np "$WEB_IP" "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  add_foreign_rules || kp_fail "could not create the foreign rules" || return 1
  local before
  before="$(foreign_rules)" || return 1
  kp_note "foreign rules: $(wc -l <<<"$before") lines"
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_foreign_rules "$before" "while kproxy runs" || return 1
  restart_kproxy || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_foreign_rules "$before" "after a restart" || return 1
  kp_stop_kproxy TERM
  run_kproxy_cleanup || return 1
  expect_foreign_rules "$before" "after --cleanup" || return 1
  local left
  left="$(kproxy_leftovers)"
  [[ -z "$left" ]] || { kp_fail "left after --cleanup: $(head -5 <<<"$left" | tr '\n' ';')"; return 1; }
}

# start_monitor LOG — `nft monitor` of the node into LOG, subscribed once it returns (it has
# seen a throw-away table come and go); its pid in monitor_pid (the caller's local).
start_monitor() {
  kp_in_ns node || return 1
  kp_bg "$1" "${KP_IN_NS[@]}" stdbuf -oL nft monitor
  monitor_pid=$KP_LAST_PID
  kp_wait_for "$KP_CEILING" monitor_saw "$1" || kp_fail "nft monitor did not start" || return 1
}
monitor_saw() {
  kp_nft node add table ip kp-monitor-ready && kp_nft node delete table ip kp-monitor-ready
  grep -q "add table ip kp-monitor-ready" "$1"
}

# served_before_removal LOG NEW_RULE REMOVAL WHAT — in the monitor's LOG, the first event
# matching NEW_RULE (the new mode serving WEB_IP) comes before the first matching REMOVAL (the
# old mode's rules going; WHAT names them). A moment with no rule at all for the ClusterIP
# leaves a connection opened then with a conntrack entry without NAT, which blackholes its
# 4-tuple for 120 s after each SYN that reuses it.
served_before_removal() {
  local served removed
  served="$(grep -n -m1 -E "$2" "$1" | cut -d: -f1)"
  removed="$(grep -n -m1 -E "$3" "$1" | cut -d: -f1)"
  kp_note "nft monitor: first rule for $WEB_IP at event ${served:-none}, $4 removed at ${removed:-none}"
  [[ -n "$served" && -n "$removed" ]] || { kp_fail "nft monitor saw no rule for $WEB_IP or no removal of $4"; return 1; }
  ((served < removed)) || kp_fail "$4 removed before the new mode's rule for $WEB_IP: a gap with no rule"
}

# Switching modes (as upstream's platformCleanup): nftables -> iptables leaves no nftables
# kube-proxy table, iptables -> nftables leaves no KUBE-* chain of either iptables variant.
case_mode_switch_leaves_nothing() {
  setup 2 || return 1
  add_service web-np.yaml web-np "$WEB_IP" "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  KP_PROXY_MODE=nftables KP_KPROXY_MODE_ARGS="" start_kproxy_and_wait "http://$WEB_IP/" || return 1
  [[ -n "$(nftables_leftovers)" ]] || kp_fail "nftables mode made no kube-proxy table" || return 1
  kp_stop_kproxy TERM
  kp_note "after nftables mode stopped: $(nftables_leftovers | tr '\n' ';')"

  restart_kproxy || return 1
  local left
  # The table goes right after the first sync (make before break), after its log line.
  kp_wait_for "$KP_CEILING" no_nftables_leftovers
  left="$(nftables_leftovers)"
  [[ -z "$left" ]] || { kp_fail "nftables tables left after starting in iptables mode: $(tr '\n' ';' <<<"$left")"; return 1; }
  kproxy_ruleset >/dev/null || kp_fail "iptables mode programmed no KUBE-SERVICES" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1

  # The iptables rules, too, go only after nftables mode's first sync. iptables-nft's changes
  # are nftables transactions the monitor shows (in table ip nat); iptables-legacy's are not.
  local monitor="$KP_WORKDIR/monitor-nftables.log" monitor_pid
  start_monitor "$monitor" || return 1
  KP_PROXY_MODE=nftables KP_KPROXY_MODE_ARGS="" restart_kproxy || return 1
  kp_wait_for "$KP_CEILING" no_iptables_leftovers
  kill "$monitor_pid" 2>/dev/null
  left="$(iptables_leftovers)"
  [[ -z "$left" ]] || { kp_fail "iptables chains left after starting in nftables mode: $(head -5 <<<"$left" | tr '\n' ';')"; return 1; }
  if [[ $IPTABLES_VARIANT == nft ]]; then
    served_before_removal "$monitor" "add (element|rule) ip kube-proxy .*$WEB_IP_RE" "delete (rule|chain) ip nat " \
      "iptables mode's nat rules" || return 1
  else
    kp_note "iptables-legacy: its removal is not an nftables event; the order is checked with iptables-nft"
  fi
  [[ -n "$(nftables_leftovers)" ]] || kp_fail "nftables mode made no kube-proxy table" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_kproxy_alive
}

# ---------------------------------------------------------------------------------------------
# userspace mode (kproxy-backend-userspace). Connections go through kproxy's own process: table
# kproxy-userspace redirects the services' addresses to its listeners, which connect to an
# endpoint (the next one when it refuses or does not answer) and relay. Everything for this mode
# is in this block and in the one after the options: what replaces a kernel-object helper, which
# shared cases do not apply and why, and the cases of this mode only.

is_userspace() { [[ $PROXY_MODE == userspace ]]; }

# userspace_skip_reason NAME — prints why the shared case NAME does not apply to the userspace
# mode; status 1 when it applies.
userspace_skip_reason() {
  case "$1" in
    etp_local | etp_local_short_circuit | etp_local_short_circuit_masquerade_all | \
      detect_local_node_cidr | detect_local_interface_prefix)
      echo "checks the client's source IP, which the userspace proxy does not preserve (userspace_etp_local checks the rest)" ;;
    restart_keeps_traffic) echo "relayed connections live in kproxy's process and end with it" ;;
    *) return 1 ;;
  esac
}

# userspace_metric NAME_AND_LABELS — the value of one kproxy_userspace_* series on /metrics
# (0 when absent), e.g. userspace_metric 'kproxy_userspace_connection_retries_total{service="test/web:http"}'.
userspace_metric() {
  local v
  v="$(kp_exec node curl -sS --max-time "$KP_CEILING" http://127.0.0.1:10249/metrics | grep -F -- "$1 " | awk '{print $2}' | head -1)"
  printf '%s' "${v:-0}"
}

# externalTrafficPolicy=Local decides the endpoints (the source is the node's, as in clusterip_from_pod).
case_userspace_etp_local() {
  setup 2 1 || return 1
  add_service local.yaml local-np 10.96.0.30 "$(kp_pod_ip 1) $(kp_remote_pod_ip 1)@$KP_REMOTE_NODE_NAME" \
    type=NodePort nodePort=30081 etp=Local || return 1
  add_service remote.yaml remote-np 10.96.0.31 "$(kp_remote_pod_ip 1)@$KP_REMOTE_NODE_NAME" \
    type=NodePort nodePort=30082 etp=Local || return 1
  start_kproxy_and_wait "http://10.96.0.30/" || return 1
  local url="http://$KP_NODE_IP:30081/"
  kp_wait_for "$KP_CEILING" kp_poll_curl client "$url" >/dev/null || kp_fail "NodePort $url not answered" || return 1
  expect_only client "$url" 10 pod1 || return 1
  expect_spread node http://10.96.0.30/ 20 2 || return 1
  expect_dropped client "http://$KP_NODE_IP:30082/" || return 1
  expect_only node http://10.96.0.31/ 3 rpod1 || return 1
  # The node and its pods take the short-circuit to the cluster-wide endpoints.
  expect_only node "http://$KP_NODE_IP:30082/" 3 rpod1 || return 1
  expect_only pod2 "http://$KP_NODE_IP:30082/" 3 rpod1 || return 1
  expect_kproxy_alive
}

# The retry: pod2 refuses (a TCP reset from its own firewall) and pod3 drops the SYN (a connect
# timeout), yet every connection succeeds through pod1, and the retries are counted.
case_userspace_retry() {
  setup 3 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 3)" || return 1
  kp_nft pod2 add table ip refuse && kp_nft pod2 add chain ip refuse in '{ type filter hook input priority 0 ; }' &&
    kp_nft pod2 add rule ip refuse in tcp dport 8080 reject with tcp reset || return 1
  kp_nft pod3 add table ip silent && kp_nft pod3 add chain ip silent in '{ type filter hook input priority 0 ; }' &&
    kp_nft pod3 add rule ip silent in tcp dport 8080 drop || return 1
  kp_connect_errno node "$(kp_pod_ip 2)" 8080 "$KP_CEILING" | grep -qx ECONNREFUSED || kp_fail "pod2 does not refuse" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_only node "http://$WEB_IP/" 20 pod1 || return 1
  expect_only pod2 "http://$WEB_IP/" 5 pod1 || return 1
  local retries refused
  retries="$(userspace_metric 'kproxy_userspace_connection_retries_total{service="test/web:http"}')"
  refused="$(userspace_metric 'kproxy_userspace_refused_connections_total{service="test/web:http",protocol="tcp",reason="endpoints_failed"}')"
  kp_note "retries=$retries endpoints_failed=$refused"
  ((${retries%.*} >= 10)) || kp_fail "only $retries retries counted for 25 connections over 3 endpoints, 2 of them failing" || return 1
  ((${refused%.*} == 0)) || kp_fail "$refused connections found no endpoint" || return 1
  expect_kproxy_alive
}

# A long transfer through the ClusterIP keeps going while the service's other endpoints change.
case_userspace_long_transfer_survives_change() {
  setup 3 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 2)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  local stream_log="$KP_WORKDIR/stream.log" serving other
  stream_start node "http://$WEB_IP/" "$stream_log"
  local stream_pid=$KP_LAST_PID
  kp_wait_for "$KP_CEILING" _stream_lines_at_least "$stream_log" 1 || kp_fail "the stream did not start" || return 1
  serving="$(head -1 "$stream_log" | sed -E 's/^pod=([^ ]+).*/\1/')"
  other=pod1
  [[ $serving == pod1 ]] && other=pod2
  kp_note "stream served by $serving; replacing $other by pod3"
  add_service web.yaml web "$WEB_IP" "$(kp_pod_ip "${serving#pod}") $(kp_pod_ip 3)" || return 1
  kp_wait_for_kproxy "$KP_CEILING" answered_by node "http://$WEB_IP/" 10 2 "$serving" pod3 ||
    kp_fail "the endpoint change is not in effect after $KP_CEILING s" || return 1
  # Once the change is in effect, the transfer still goes on.
  stream_goes_on "$stream_log" "$stream_pid" || return 1
  stream_stop "$stream_pid"
  kp_note "stream: $(grep -c '^pod=' "$stream_log") lines"
  expect_kproxy_alive
}

# A connection to an endpoint that left the service is closed after the grace period.
case_userspace_removed_endpoint_closed() {
  setup 2 || return 1
  add_service web.yaml web "$WEB_IP" "$(kp_pod_ip 1)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" --userspace-endpoint-grace=1s || return 1
  local stream_log="$KP_WORKDIR/stream.log"
  # The stream lasts far longer than the ceiling: only kproxy's close ends it before.
  stream_start node "http://$WEB_IP/" "$stream_log"
  local stream_pid=$KP_LAST_PID start
  kp_wait_for "$KP_CEILING" grep -q '^pod=pod1' "$stream_log" || kp_fail "the stream did not start" || return 1
  start=${EPOCHREALTIME/./}
  add_service web.yaml web "$WEB_IP" "$(kp_pod_ip 2)" || return 1
  _stream_ended() { ! kill -0 "$1" 2>/dev/null; }
  if ! kp_wait_for "$KP_CEILING" _stream_ended "$stream_pid"; then
    stream_stop "$stream_pid"
    kp_fail "the connection to the removed endpoint was not closed within $KP_CEILING s" || return 1
  fi
  wait "$stream_pid" 2>/dev/null
  local ms=$(((${EPOCHREALTIME/./} - start) / 1000))
  kp_note "stream to the removed pod1 ended ${ms} ms after the change: $(tail -n 1 "$stream_log")"
  grep -q ' done=' "$stream_log" && { kp_fail "the stream to the removed endpoint ran to its end"; return 1; }
  expect_only node "http://$WEB_IP/" 3 pod2 || return 1
  expect_kproxy_alive
}

# udp_request ROLE IP PORT — one datagram from a connected UDP socket (so only a reply from
# IP:PORT itself is received); prints the reply's first line, fails when none came within the
# ceiling.
udp_request() {
  kp_exec "$1" "$KP_PYTHON" -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(float(sys.argv[3]))
s.connect((sys.argv[1], int(sys.argv[2]))); s.send(b"ping\n")
print(s.recv(2048).decode().splitlines()[0])
' "$2" "$3" "$KP_CEILING"
}

# UDP request/reply through a ClusterIP: replies come back from the service address, and
# clients (source ports) are spread over the endpoints.
case_userspace_udp_clusterip() {
  kp_topology_up 3 0 || return 1
  kp_start_pods --port 8080 --udp-port 5353 || return 1
  MANIFESTS="$KP_WORKDIR/manifests"
  mkdir -p "$MANIFESTS"
  kp_manifest_node "$KP_NODE_NAME" "$KP_NODE_IP" | kp_install_manifest "$MANIFESTS" nodes.yaml || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  {
    kp_manifest_service test dns 10.96.0.53 53 5353 protocol=UDP || return 1
    echo ---
    # shellcheck disable=SC2046 # a list of endpoint specs
    kp_manifest_slice test dns dns-abcde 5353 $(pod_eps 2) protocol=UDP || return 1
  } | kp_install_manifest "$MANIFESTS" dns.yaml || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  local role out i who
  for role in node pod3 client; do
    out=""
    for ((i = 0; i < 12; i++)); do
      who="$(udp_request "$role" 10.96.0.53 53)" || { out+=FAIL$'\n'; break; }
      [[ "$who" =~ ^pod=([^ ]+) ]] && who="${BASH_REMATCH[1]}"
      out+="$who"$'\n'
    done
    out="${out%$'\n'}"
    kp_note "$role -> udp 10.96.0.53:53: $(summarize <<<"$out")"
    grep -qv -e '^pod1$' -e '^pod2$' <<<"$out" && { kp_fail "UDP requests from $role failed or reached another pod"; return 1; }
    (($(sort -u <<<"$out" | wc -l) == 2)) || kp_fail "UDP flows from $role all reached one pod" || return 1
  done
  expect_kproxy_alive
}

# nftables mode -> userspace mode -> nftables mode on one node: each start removes the other
# mode's table (kube-proxy, kproxy-userspace), and traffic flows after each switch. The old table
# goes only after the new mode's rules for the service are in (`nft monitor` shows the order): a
# moment with no rule at all for the ClusterIP leaves a connection opened then with a conntrack
# entry without NAT, which blackholes its 4-tuple for 120 s after each SYN that reuses it.
case_userspace_mode_switch() {
  setup 2 || return 1
  add_service web-np.yaml web-np "$WEB_IP" "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  KP_PROXY_MODE=nftables start_kproxy_and_wait "http://$WEB_IP/" || return 1
  kp_nft node list table ip kube-proxy >/dev/null || kp_fail "nftables mode made no kube-proxy table" || return 1
  table_gone() { ! kp_nft node list table ip "$1" >/dev/null 2>&1; }
  # switch_in_order LOG NEW_RULE OLD_TABLE — in the monitor's LOG, the first line matching
  # NEW_RULE (the new mode serving WEB_IP) comes before OLD_TABLE's deletion.
  switch_in_order() { served_before_removal "$1" "$2" "delete table ip $3( |\$)" "table ip $3"; }
  local monitor="$KP_WORKDIR/monitor-userspace.log" monitor_pid
  start_monitor "$monitor" || return 1
  restart_kproxy || return 1
  kp_wait_for "$KP_CEILING" table_gone kube-proxy || { kp_fail "table ip kube-proxy left in the userspace mode"; return 1; }
  kill "$monitor_pid" 2>/dev/null
  kp_nft node list table ip kproxy-userspace >/dev/null || kp_fail "the userspace mode made no table" || return 1
  switch_in_order "$monitor" "add element ip kproxy-userspace services \\{ ${WEB_IP//./\\.} " kube-proxy || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  monitor="$KP_WORKDIR/monitor-nftables.log"
  start_monitor "$monitor" || return 1
  KP_PROXY_MODE=nftables restart_kproxy || return 1
  kp_wait_for "$KP_CEILING" table_gone kproxy-userspace || { kp_fail "table ip kproxy-userspace left in nftables mode"; return 1; }
  kill "$monitor_pid" 2>/dev/null
  switch_in_order "$monitor" "add (element|rule) ip kube-proxy .*$WEB_IP_RE" kproxy-userspace || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_kproxy_alive
}

# --userspace-max-connections holds under a burst: of 6 long connections at once, 3 are
# relayed and 3 reset; once they end, new connections are served again.
_burst_decided() { # N — each of the N streams has data (relayed) or has ended (reset)
  local i
  for ((i = 1; i <= $1; i++)); do
    grep -q '^pod=' "$KP_WORKDIR/burst$i.log" || ! kill -0 "${burst_pids[i - 1]}" 2>/dev/null || return 1
  done
}
case_userspace_connection_cap() {
  setup 2 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 2)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" --userspace-max-connections=3 || return 1
  # The streams last until they are stopped, so all 6 are open together however slowly they start.
  local i burst_pids=()
  for i in 1 2 3 4 5 6; do
    stream_start node "http://$WEB_IP/" "$KP_WORKDIR/burst$i.log"
    burst_pids+=("$KP_LAST_PID")
  done
  kp_wait_for "$KP_CEILING" _burst_decided 6 || kp_fail "some of the 6 connections neither carried data nor ended" || return 1
  local served=0 reset=0
  for i in 1 2 3 4 5 6; do
    if grep -q '^pod=' "$KP_WORKDIR/burst$i.log" && kill -0 "${burst_pids[i - 1]}" 2>/dev/null; then
      served=$((served + 1))
    elif ! grep -q '^pod=' "$KP_WORKDIR/burst$i.log"; then
      reset=$((reset + 1))
    fi
  done
  for i in "${burst_pids[@]}"; do stream_stop "$i"; done
  local limited
  limited="$(userspace_metric 'kproxy_userspace_refused_connections_total{service="test/web:http",protocol="tcp",reason="connection_limit"}')"
  kp_note "burst of 6 with a cap of 3: $served served, $reset reset; connection_limit refusals: $limited"
  ((served == 3 && reset == 3)) || kp_fail "$served of 6 connections served, want exactly 3 (the cap)" || return 1
  ((${limited%.*} == 3)) || kp_fail "connection_limit refusals $limited, want 3" || return 1
  # The relayed ones were stopped: once kproxy has seen them close, new connections are served.
  kp_wait_for_kproxy "$KP_CEILING" answered_by node "http://$WEB_IP/" 1 1 pod1 pod2 ||
    kp_fail "no connection served after the burst ended" || return 1
  expect_spread node "http://$WEB_IP/" 10 2 || return 1
  expect_kproxy_alive
}


# ---------------------------------------------------------------------------------------------
# ebpf mode: socket-level load balancing (BPF programs on a cgroup's connect, sendmsg, recvmsg
# and getpeername hooks), and an nftables part, table kproxy-ebpf, for what no hook sees
# (connections from other hosts to NodePorts, externalIPs, LoadBalancer IPs). Everything for the
# mode is in this block and in the one after the options.
#
# Safety: the programs go only on a cgroup each case makes (never the host's root cgroup), the
# pins only on a bpffs the suite mounts in a mount namespace of its own; both go when the case
# ends, passed or failed. The node's processes and its pods run in the case's cgroup `node`, on
# which kproxy attaches its programs; the outside client and the remote node's processes in its
# sibling `remote`, which no program sees (they are other hosts).

is_ebpf() { [[ $PROXY_MODE == ebpf ]]; }

# ebpf_reason NAME — prints, for a behaviour NAME of shared cases, how ebpf mode's expectation
# differs and why (one line, noted in the case); status 1 in the other modes.
ebpf_reason() {
  is_ebpf || return 1
  case "$1" in
    hairpin) echo "a pod's connect to its own Service goes straight to itself: no packet is rewritten, so none is masqueraded, and the pod sees its own IP" ;;
    outside_clusterip) echo "ClusterIPs are steered by the socket hooks of this node's processes only; a ClusterIP connection routed from another host is not served (the kproxy-ebpf table's cluster-ips check rejects it; its ICMP may be rate-limited behind the node's redirect here, so 'not served' is what is checked)" ;;
    *) return 1 ;;
  esac
}

# hairpin_source POD — the source a pod's hairpin connection reaches it from: the node
# (masqueraded) in the netfilter modes, the pod itself in ebpf mode.
hairpin_source() {
  if ebpf_reason hairpin >/dev/null; then kp_note "ebpf: $(ebpf_reason hairpin)"; kp_pod_ip "$1"; else echo "$KP_NODE_IP"; fi
}

# expect_not_served ROLE URL — no pod answers: the connection is refused or times out (2 s).
expect_not_served() {
  local rc err
  err="$(KP_CURL_TIMEOUT=2 kp_curl "$1" "$2" 2>&1 >/dev/null)"
  rc=$?
  kp_note "$1 -> $2: curl exit $rc: $err"
  [[ $rc -eq 7 || $rc -eq 28 ]] || kp_fail "$1 -> $2: curl exit $rc, want 7 or 28 (not served)"
}

# ebpf_cgroup_of ROLE — the case's cgroup for ROLE's processes (KP_CGROUP_OF).
ebpf_cgroup_of() {
  case "$1" in
    node | pod*) echo "$KP_EBPF_CGROUP/node" ;;
    *) echo "$KP_EBPF_CGROUP/remote" ;;
  esac
}

# ebpf_attached — how many programs are attached to the case's node cgroup.
ebpf_attached() { bpftool cgroup show "$KP_EBPF_CGROUP/node" 2>/dev/null | grep -c 'connect\|sendmsg\|recvmsg\|getpeername'; }

# ebpf_all_attached — the eight programs are on the case's node cgroup.
ebpf_all_attached() { (($(ebpf_attached) == 8)); }

# ebpf_leftovers — prints what ebpf mode leaves: programs on the case's cgroup, pins.
ebpf_leftovers() {
  local n
  n="$(ebpf_attached)"
  ((n == 0)) || echo "bpf: $n programs attached to $KP_EBPF_CGROUP/node"
  [[ ! -e "$KP_EBPF_PINS" ]] || echo "bpf: pins left in $KP_EBPF_PINS: $(ls "$KP_EBPF_PINS" | tr '\n' ' ')"
}

# conntrack_entries ROLE ADDRESS — conntrack entries of ROLE's namespace whose original
# destination is ADDRESS.
conntrack_entries() { kp_exec "$1" conntrack -L -d "$2" 2>/dev/null | grep -c .; }

# The control of issue 35: a connection from the node to a ClusterIP leaves a conntrack entry
# for the ClusterIP in every netfilter mode (its packets are DNATed) and none in ebpf mode (the
# socket connected to the endpoint at once); in both, the flow to the endpoint is tracked, so
# the ebpf check is not empty for want of conntrack.
case_clusterip_conntrack() {
  setup 1 || return 1
  add_service web.yaml web "$WEB_IP" "$(pod_eps 1)" || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  expect_only node "http://$WEB_IP/" 3 pod1 || return 1
  local service endpoint
  service="$(conntrack_entries node "$WEB_IP")"
  endpoint="$(conntrack_entries node "$(kp_pod_ip 1)")"
  kp_note "conntrack entries: to $WEB_IP $service, to pod1 $endpoint"
  if is_ebpf; then
    ((service == 0)) || kp_fail "ebpf mode: $service conntrack entries for the ClusterIP, want none" || return 1
    ((endpoint > 0)) || kp_fail "ebpf mode: no conntrack entry for the endpoint either (conntrack not running?)" || return 1
  else
    ((service > 0)) || kp_fail "$PROXY_MODE mode: no conntrack entry for the ClusterIP" || return 1
  fi
  expect_kproxy_alive
}

# A client outside the node reaches the NodePort and the externalIP through the kproxy-ebpf
# table; the node's connections are steered by the programs on its cgroup; the table dispatches
# nothing to the ClusterIP.
case_ebpf_external_entry_points() {
  setup 2 || return 1
  local ext=192.0.2.60
  add_service web-np.yaml web-np "$WEB_IP" "$(pod_eps 2)" type=NodePort nodePort=30080 externalIP=$ext || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  kp_wait_for "$KP_CEILING" ebpf_all_attached || kp_fail "$(ebpf_attached) programs attached to the case's cgroup, want 8" || return 1
  kp_wait_for "$KP_CEILING" kp_poll_curl client "http://$KP_NODE_IP:30080/" >/dev/null ||
    kp_fail "NodePort not answered from the client" || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_spread client "http://$ext/" 20 2 || return 1
  local table
  table="$(kp_nft node list table ip kproxy-ebpf)" || kp_fail "no table ip kproxy-ebpf" || return 1
  grep -qF "$ext . tcp . 80" <<<"$table" || kp_fail "the externalIP is not in table kproxy-ebpf" || return 1
  grep -qF "$WEB_IP . tcp . 80" <<<"$table" && { kp_fail "the ClusterIP is dispatched by table kproxy-ebpf"; return 1; }
  kp_note "ebpf: $(ebpf_reason outside_clusterip)"
  expect_not_served client "http://$WEB_IP/" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread pod1 "http://$ext/" 20 2 || return 1
  expect_kproxy_alive
}

# ebpf mode -> nftables mode -> ebpf mode: nftables mode detaches ebpf's programs, removes its
# pins and its table once its own rules are in, and ebpf mode removes nftables mode's table;
# traffic flows after each switch.
case_ebpf_mode_switch() {
  setup 2 || return 1
  add_service web-np.yaml web-np "$WEB_IP" "$(pod_eps 2)" type=NodePort nodePort=30080 || return 1
  start_kproxy_and_wait "http://$WEB_IP/" || return 1
  kp_wait_for "$KP_CEILING" ebpf_all_attached || kp_fail "ebpf mode attached $(ebpf_attached) programs, want 8" || return 1
  _ebpf_gone() { [[ -z "$(ebpf_leftovers)" ]] && ! kp_nft node list table ip kproxy-ebpf >/dev/null 2>&1; }
  KP_PROXY_MODE=nftables restart_kproxy || return 1
  kp_wait_for "$KP_CEILING" _ebpf_gone || kp_fail "left by ebpf mode in nftables mode: $(ebpf_leftovers)" || return 1
  kp_nft node list table ip kube-proxy >/dev/null || kp_fail "nftables mode made no kube-proxy table" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  _kube_proxy_gone() { ! kp_nft node list table ip kube-proxy >/dev/null 2>&1; }
  restart_kproxy || return 1
  kp_wait_for "$KP_CEILING" _kube_proxy_gone || kp_fail "table ip kube-proxy left in ebpf mode" || return 1
  kp_wait_for "$KP_CEILING" ebpf_all_attached ||
    kp_fail "ebpf mode attached $(ebpf_attached) programs after the switch back, want 8" || return 1
  expect_spread node "http://$WEB_IP/" 20 2 || return 1
  expect_spread client "http://$KP_NODE_IP:30080/" 20 2 || return 1
  expect_kproxy_alive
}

# ---------------------------------------------------------------------------------------------

# The suite's own options; the rest go to kp_suite_begin.
suite_argv=("$@")
suite_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --proxy-mode | --iptables-variant)
      [[ $# -ge 2 ]] || { echo "$1 needs a value" >&2; exit 2; }
      [[ $1 == --proxy-mode ]] && PROXY_MODE="$2" || IPTABLES_VARIANT_GIVEN="$2"
      shift 2 ;;
    --proxy-mode=*) PROXY_MODE="${1#*=}"; shift ;;
    --iptables-variant=*) IPTABLES_VARIANT_GIVEN="${1#*=}"; shift ;;
    *) suite_args+=("$1"); shift ;;
  esac
done
case "$PROXY_MODE" in
  nftables | userspace | ebpf)
    [[ -z "${IPTABLES_VARIANT_GIVEN:-}" ]] ||
      { echo "--iptables-variant applies to --proxy-mode iptables only" >&2; exit 2; } ;;
  iptables | ipvs)
    IPTABLES_VARIANT="${IPTABLES_VARIANT_GIVEN:-nft}"
    [[ $IPTABLES_VARIANT == nft || $IPTABLES_VARIANT == legacy ]] ||
      { echo "unknown --iptables-variant '$IPTABLES_VARIANT' (nft or legacy)" >&2; exit 2; } ;;
  *) echo "unknown --proxy-mode '$PROXY_MODE' (nftables, iptables, ipvs, userspace or ebpf)" >&2; exit 2 ;;
esac
KP_PROXY_MODE="$PROXY_MODE"
KP_KPROXY_MODE_ARGS=""
uses_iptables && KP_KPROXY_MODE_ARGS="--iptables-variant=$IPTABLES_VARIANT"

# userspace mode: its own table in the kernel-object helpers, and the shared cases that do not
# apply are SKIP with their reason (see the userspace block above).
if is_userspace; then
  NFT_TABLE=kproxy-userspace
  eval "_kp_case_shared() $(declare -f kp_case | tail -n +2)"
  kp_case() {
    local why
    if why="$(userspace_skip_reason "$1")"; then kp_skip "$1" "$why"; else _kp_case_shared "$@"; fi
  }
fi

# ebpf mode: the suite re-runs itself in a mount namespace of its own, where it mounts a bpffs
# for the pins and binds the cgroup v2 hierarchy (found in /proc/self/mountinfo) under its own
# directory: `ip netns exec` mounts a fresh /sys, which hides /sys/fs/cgroup and /sys/fs/bpf.
# Each case then makes its cgroups `node` and `remote` under the suite's cgroup, and a pin
# directory (kp_init below), and removes them when it ends (kp_teardown below); the suite's
# cgroup goes when the suite exits.
if is_ebpf; then
  source "$KP_LIB_DIR/ebpf-lib.sh"
  kp_ebpf_reexec "$0" "${suite_argv[@]}"
  NFT_TABLE=kproxy-ebpf
  _ebpf_refuse() { echo "ERROR: $*; nothing was tested." >&2; echo "0 passed, 1 failed"; exit 1; }
  command -v bpftool >/dev/null && command -v conntrack >/dev/null || _ebpf_refuse "ebpf mode needs bpftool and conntrack"
  kp_ebpf_mount "kproxy-datapath-$$" || { kp_ebpf_unmount; _ebpf_refuse "$KP_EBPF_ERROR"; }
  KP_EBPF_SUITE_CGROUP="$KP_EBPF_TOP_CGROUP"
  KP_CGROUP_OF=ebpf_cgroup_of
  _ebpf_rmdir_cgroup() { kp_ebpf_rmdir_cgroup "$@"; }
  _ebpf_suite_cleanup() { kp_ebpf_unmount; }

  eval "_kp_init_base() $(declare -f kp_init | tail -n +2)"
  kp_init() {
    _kp_init_base "$@"
    KP_EBPF_CGROUP="$KP_EBPF_SUITE_CGROUP/${KP_PREFIX%-}"
    KP_EBPF_PINS="$KP_EBPF_DIR/bpffs/${KP_PREFIX%-}"
    mkdir -p "$KP_EBPF_CGROUP/node" "$KP_EBPF_CGROUP/remote" || kp_die "cannot make the case's cgroups"
    # Every start of kproxy (and its --cleanup) gets them: never the default, the root cgroup.
    KP_KPROXY_MODE_ARGS="--ebpf-cgroup-path=$KP_EBPF_CGROUP/node --ebpf-pin-path=$KP_EBPF_PINS"
  }
  eval "_kp_teardown_base() $(declare -f kp_teardown | tail -n +2)"
  kp_teardown() {
    local rc=$?
    (exit "$rc")
    _kp_teardown_base
    # The pins hold the links: once they are removed (kproxy has stopped), the programs leave
    # the cgroup, which goes too.
    [[ -n "${KP_EBPF_PINS:-}" ]] && rm -rf "$KP_EBPF_PINS"
    if [[ -n "${KP_EBPF_CGROUP:-}" ]]; then
      _ebpf_rmdir_cgroup "$KP_EBPF_CGROUP/node"
      _ebpf_rmdir_cgroup "$KP_EBPF_CGROUP/remote"
      _ebpf_rmdir_cgroup "$KP_EBPF_CGROUP"
    fi
    return "$rc"
  }
  eval "_kproxy_leftovers_base() $(declare -f kproxy_leftovers | tail -n +2)"
  kproxy_leftovers() {
    _kproxy_leftovers_base
    ebpf_leftovers
  }
fi

kp_suite_begin "${suite_args[@]}"
if is_ebpf; then
  trap '_ebpf_suite_cleanup; rm -rf "$KP_SUITE_DIR"' EXIT
fi
if ! bin="$(kp_kproxy_bin)" || [[ ! -x "$bin" ]]; then
  echo "ERROR: kproxy binary not found (give --kproxy PATH or set KPROXY_BIN); nothing was tested." >&2
  echo "0 passed, 1 failed"
  exit 1
fi
# Every case may inspect both iptables variants (leftovers); a missing tool would make such a
# check pass vacuously, so it stops the run instead.
for tool in iptables-nft iptables-nft-save ip6tables-nft ip6tables-nft-save \
  iptables-legacy iptables-legacy-save ip6tables-legacy ip6tables-legacy-save; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "ERROR: $tool not found; nothing was tested." >&2
    echo "0 passed, 1 failed"
    exit 1
  }
done
# IPVS mode inspects virtual servers and ipsets (only the test VM's kernel has IPVS).
if is_ipvs; then
  for tool in ipvsadm ipset; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "ERROR: $tool not found (IPVS mode); nothing was tested." >&2
      echo "0 passed, 1 failed"
      exit 1
    }
  done
  [[ -e /proc/net/ip_vs ]] || {
    echo "ERROR: this kernel has no IPVS (/proc/net/ip_vs); run IPVS mode in the test VM (tests/vm/)." >&2
    echo "0 passed, 1 failed"
    exit 1
  }
fi
mode_desc="$PROXY_MODE"
uses_iptables && mode_desc+=" (iptables-$IPTABLES_VARIANT)"
echo "kproxy: $bin  plugin dir: ${KPROXY_PLUGIN_DIR:-(default)}  mode: $mode_desc"

# iptables_case NAME FUNCTION — a case for iptables mode only; SKIP in the other modes.
iptables_case() {
  if is_iptables; then kp_case "$1" "$2"; else kp_skip "$1" "iptables mode only"; fi
}

kp_case clusterip_from_node case_clusterip_from_node
kp_case clusterip_from_pod case_clusterip_from_pod
kp_case hairpin case_hairpin
kp_case nodeport_from_client case_nodeport_from_client
kp_case etp_local case_etp_local
kp_case etp_local_short_circuit case_etp_local_short_circuit
kp_case etp_local_short_circuit_masquerade_all case_etp_local_short_circuit_masquerade_all
kp_case source_ranges_admit_node case_source_ranges_admit_node
kp_case detect_local_node_cidr case_detect_local_node_cidr
kp_case detect_local_interface_prefix case_detect_local_interface_prefix
kp_case session_affinity case_session_affinity
kp_case hairpin_with_affinity case_hairpin_with_affinity
kp_case affinity_follows_endpoint_removal case_affinity_follows_endpoint_removal
kp_case no_endpoints_rejected case_no_endpoints_rejected
kp_case wrong_port_rejected case_wrong_port_rejected
kp_case endpoint_changes_applied case_endpoint_changes_applied
kp_case malformed_manifest_ignored case_malformed_manifest_ignored
kp_case restart_keeps_traffic case_restart_keeps_traffic
kp_case cleanup_removes_table case_cleanup_removes_table
kp_case dry_run_changes_nothing case_dry_run_changes_nothing
kp_case affinity_across_addresses case_affinity_across_addresses
kp_case affinity_etp_local case_affinity_etp_local
kp_case nodeport_addresses_secondary case_nodeport_addresses_secondary
kp_case nodeport_addresses_all_local case_nodeport_addresses_all_local
kp_case unallocated_clusterip_dropped case_unallocated_clusterip_dropped
iptables_case localhost_nodeports case_localhost_nodeports
iptables_case flush_repaired case_flush_repaired
iptables_case foreign_rules_untouched case_foreign_rules_untouched
iptables_case mode_switch_leaves_nothing case_mode_switch_leaves_nothing
# userspace mode only.
userspace_case() {
  if is_userspace; then kp_case "$1" "$2"; else kp_skip "$1" "userspace mode only"; fi
}
userspace_case userspace_etp_local case_userspace_etp_local
userspace_case userspace_retry case_userspace_retry
userspace_case userspace_long_transfer_survives_change case_userspace_long_transfer_survives_change
userspace_case userspace_removed_endpoint_closed case_userspace_removed_endpoint_closed
userspace_case userspace_udp_clusterip case_userspace_udp_clusterip
userspace_case userspace_connection_cap case_userspace_connection_cap
userspace_case userspace_mode_switch case_userspace_mode_switch
kp_case clusterip_conntrack case_clusterip_conntrack
# ebpf mode only.
ebpf_case() {
  if is_ebpf; then kp_case "$1" "$2"; else kp_skip "$1" "ebpf mode only"; fi
}
ebpf_case ebpf_external_entry_points case_ebpf_external_entry_points
ebpf_case ebpf_mode_switch case_ebpf_mode_switch
kp_suite_end
