#!/usr/bin/env bash
# Self-test of the namespace harness (scripts/netns-lib.sh) — needs root, not kproxy.
# Checks that the topology routes as documented, that the kernel NATs inside it (with a
# hand-written nftables table, so a kproxy failure is never mistaken for a harness one), and
# that teardown leaves no namespace behind, also when a case fails or is killed.
#
# usage: tests/datapath/harness_selftest.sh [CASE...]

set -u
source "$(dirname "$0")/testlib.sh"

case_pods_reachable_from_node() {
  kp_topology_up 3 1 || return 1
  kp_start_pods || return 1
  local i who seen
  for i in 1 2 3; do
    who="$(kp_who node "http://$(kp_pod_ip "$i"):8080/")" || kp_fail "pod$i unreachable" || return 1
    [[ "$who" == "pod$i" ]] || kp_fail "pod$i's address answered as '$who'" || return 1
    seen="$(kp_client_seen node "http://$(kp_pod_ip "$i"):8080/")" || return 1
    [[ "$seen" == "$KP_NODE_IP" ]] || kp_fail "pod$i saw the node as $seen, want $KP_NODE_IP" || return 1
  done
  who="$(kp_who node "http://$(kp_remote_pod_ip 1):8080/")" || kp_fail "remote pod unreachable" || return 1
  [[ "$who" == rpod1 ]] || kp_fail "remote pod answered as '$who'" || return 1
}

case_routes_between_namespaces() {
  kp_topology_up 2 1 || return 1
  kp_start_pods || return 1
  local seen
  # client -> local pod: forwarded by the node, source kept.
  seen="$(kp_client_seen client "http://$(kp_pod_ip 1):8080/")" || kp_fail "client cannot reach pod1" || return 1
  [[ "$seen" == "$KP_CLIENT_IP" ]] || kp_fail "pod1 saw client as $seen" || return 1
  # pod -> pod on the same node.
  seen="$(kp_client_seen pod1 "http://$(kp_pod_ip 2):8080/")" || kp_fail "pod1 cannot reach pod2" || return 1
  [[ "$seen" == "$(kp_pod_ip 1)" ]] || kp_fail "pod2 saw pod1 as $seen" || return 1
  # pod -> remote pod across nodes, and client -> remote pod.
  seen="$(kp_client_seen pod2 "http://$(kp_remote_pod_ip 1):8080/")" || kp_fail "pod2 cannot reach rpod1" || return 1
  [[ "$seen" == "$(kp_pod_ip 2)" ]] || kp_fail "rpod1 saw pod2 as $seen" || return 1
  seen="$(kp_client_seen client "http://$(kp_remote_pod_ip 1):8080/")" || kp_fail "client cannot reach rpod1" || return 1
  [[ "$seen" == "$KP_CLIENT_IP" ]] || kp_fail "rpod1 saw client as $seen" || return 1
  # The pod server's other endpoints.
  [[ "$(kp_curl node "http://$(kp_pod_ip 1):8080/healthz")" == ok ]] || kp_fail "/healthz" || return 1
  local lines
  lines="$(kp_curl node "http://$(kp_pod_ip 1):8080/stream?seconds=0.5&interval=0.1" | grep -c '^pod=pod1 ')"
  ((lines >= 5)) || kp_fail "/stream gave $lines lines" || return 1
}

case_udp_echo() {
  kp_topology_up 1 || return 1
  kp_start_pods --port 8080 --udp-port 5353 || return 1
  local reply
  reply="$(kp_exec node "$KP_NETPROBE" udp "$(kp_pod_ip 1)" 5353 hi 2)" || kp_fail "no UDP echo" || return 1
  [[ "$reply" == "pod=pod1 client=$KP_NODE_IP:"* ]] || kp_fail "UDP echo said '$reply'" || return 1
}

# The pods' server (tests/tools/podserver.cpp) answers exactly as the cases parse it: the
# bodies byte for byte, keep-alive, a stream over one connection, every port on IPv4 and IPv6,
# other methods refused, its command line checked, SIGTERM a clean exit.
case_podserver_answers() {
  kp_topology_up 1 || return 1
  kp_start_pods --port 8080 --port=8081 || return 1
  local ip body headers
  ip="$(kp_pod_ip 1)"
  body="$(kp_curl node "http://$ip:8080/" -D "$KP_WORKDIR/headers"; echo x)"
  [[ "$body" =~ ^pod=pod1\ client=$KP_NODE_IP:[0-9]+$'\n'x$ ]] || kp_fail "GET / said '$body'" || return 1
  headers="$(tr -d '\r' <"$KP_WORKDIR/headers")"
  grep -qx 'HTTP/1.1 200 OK' <<<"$headers" && grep -qx 'Content-Type: text/plain' <<<"$headers" &&
    grep -qx "Content-Length: $((${#body} - 1))" <<<"$headers" || kp_fail "GET / headers: $headers" || return 1
  body="$(kp_curl node "http://$ip:8080/healthz"; echo x)"
  [[ "$body" == $'ok\nx' ]] || kp_fail "/healthz said '$body'" || return 1
  [[ "$(kp_who node "http://$ip:8081/any/path?q=1")" == pod1 ]] || kp_fail "second port (--port=8081)" || return 1
  # Keep-alive: two requests over one connection come from one client port.
  body="$(kp_curl node "http://$ip:8080/a" "http://$ip:8080/b")"
  [[ "$(sort -u <<<"$body" | wc -l)" == 1 && "$(wc -l <<<"$body")" == 2 ]] ||
    kp_fail "two requests on one connection: '$body'" || return 1
  body="$(kp_curl node "http://$ip:8080/stream?seconds=0.6&interval=0.2")"
  kp_note "stream: $(tr '\n' ';' <<<"$body")"
  [[ "$(grep -c "^pod=pod1 client=$KP_NODE_IP:[0-9]* seq=[0-9]*$" <<<"$body")" -ge 2 ]] &&
    [[ "$(tail -n 1 <<<"$body")" =~ \ done=([0-9]+)$ ]] &&
    [[ "${BASH_REMATCH[1]}" == "$(grep -c ' seq=' <<<"$body")" ]] &&
    [[ "$(sed 's/ \(seq\|done\)=.*//' <<<"$body" | sort -u | wc -l)" == 1 ]] ||
    kp_fail "/stream said: $body" || return 1
  body="$(kp_exec pod1 curl -sS --max-time "$KP_CEILING" "http://[::1]:8080/")"
  [[ "$body" =~ ^pod=pod1\ client=::1:[0-9]+$ ]] || kp_fail "over IPv6: '$body'" || return 1
  [[ "$(kp_curl node "http://$ip:8080/" -X POST -o /dev/null -w '%{http_code}')" == 501 ]] ||
    kp_fail "POST not answered 501" || return 1
  local server rc
  server="$(kp_tool_bin kproxy-podserver)"
  "$server" --port 8080 2>/dev/null; rc=$?
  [[ $rc == 2 ]] || kp_fail "without --name: exit $rc, want 2" || return 1
  "$server" --name x --port 99999 2>/dev/null; rc=$?
  [[ $rc == 2 ]] || kp_fail "--port 99999: exit $rc, want 2" || return 1
  kill -TERM "${KP_PIDS[0]}"
  wait "${KP_PIDS[0]}"; rc=$?
  [[ $rc == 0 ]] || kp_fail "SIGTERM: exit $rc, want 0" || return 1
}

# A hand-written NAT table in the node namespace: proves DNAT from the node (output) and from
# the client (prerouting) and masquerade work in this kernel and topology.
case_kernel_nat_in_topology() {
  kp_topology_up 2 || return 1
  kp_start_pods || return 1
  kp_nft node -f - <<EOF || kp_fail "nft -f failed" || return 1
table ip kp-selftest {
  chain pre {
    type nat hook prerouting priority dstnat;
    ip daddr 10.96.0.99 tcp dport 80 mark set 1 dnat to $(kp_pod_ip 2):8080
  }
  chain out {
    type nat hook output priority -100;
    ip daddr 10.96.0.99 tcp dport 80 dnat to $(kp_pod_ip 2):8080
  }
  chain post {
    type nat hook postrouting priority srcnat;
    mark 1 masquerade
  }
}
EOF
  local who seen
  who="$(kp_who node http://10.96.0.99/)" || kp_fail "DNAT from node failed" || return 1
  [[ "$who" == pod2 ]] || kp_fail "DNAT from node reached $who" || return 1
  seen="$(kp_client_seen client http://10.96.0.99/)" || kp_fail "DNAT from client failed" || return 1
  [[ "$seen" == "$KP_NODE_IP" ]] || kp_fail "masqueraded client seen as $seen" || return 1
  # A virtual IP with no rule is not answered locally: it is routed away to the client, which
  # does not forward, so the connection times out (neither answered nor refused nor unreachable).
  local how
  how="$(kp_connect_errno node 10.96.0.98 80 1)"
  [[ "$how" == ETIMEDOUT ]] || kp_fail "connect to 10.96.0.98:80 from the node ended $how, want ETIMEDOUT" || return 1
  # Nothing leaked into the root namespace (only read there).
  local tables
  tables="$(nft list tables)" || kp_fail "nft list tables failed in the root namespace" || return 1
  [[ "$tables" != *kp-selftest* ]] || kp_fail "table visible in the root namespace" || return 1
}

# Teardown must remove every namespace: on success, on failure, and when killed.
# _ns_with_prefix PREFIX — how many namespaces carry PREFIX; not a number when they cannot be
# listed, so that a failed listing never reads as "none left".
_ns_with_prefix() {
  local list
  list="$(ip netns list)" || { echo "unlisted"; return 1; }
  awk '{print $1}' <<<"$list" | grep -c "^$1" || true
}
# _sleeper_in NS — a `sleep` process runs inside the namespace.
_sleeper_in() {
  local p
  for p in $(ip netns pids "$1" 2>/dev/null); do [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == sleep ]] && return 0; done
  return 1
}

case_teardown_leaves_nothing() {
  local before after prefix rc
  before="$(ip netns list | awk '{print $1}' | sort)"
  # 1. normal exit
  prefix="$(bash -c 'source "$1"; kp_init; kp_topology_up 2 1 >/dev/null 2>&1; kp_start_pods >/dev/null 2>&1; echo "$KP_PREFIX"' _ "$KP_LIB_DIR/netns-lib.sh")"
  [[ -n "$prefix" ]] || kp_fail "no prefix reported" || return 1
  [[ "$(_ns_with_prefix "$prefix")" == 0 ]] || kp_fail "namespaces left after normal exit: $prefix" || return 1
  # 2. failing script under set -e
  bash -c 'set -euo pipefail; source "$1"; kp_init; kp_topology_up 2 >/dev/null 2>&1; kp_start_pods >/dev/null 2>&1
           kill "${KP_PIDS[0]}"; sleep 0.2; echo "$KP_PREFIX" >"$2"; false; echo unreachable' \
    _ "$KP_LIB_DIR/netns-lib.sh" "$KP_WORKDIR/p2"
  rc=$?
  [[ $rc -ne 0 ]] || kp_fail "set -e script did not fail" || return 1
  prefix="$(cat "$KP_WORKDIR/p2")" || kp_fail "set -e script reported no prefix" || return 1
  [[ "$(_ns_with_prefix "$prefix")" == 0 ]] || kp_fail "namespaces left after failure: $prefix" || return 1
  # 3. killed with SIGTERM while pods and a sleeper run inside the namespaces
  bash -c 'source "$1"; kp_init; kp_topology_up 2 >/dev/null 2>&1; kp_start_pods >/dev/null 2>&1; kp_exec pod1 sleep 60 & echo "$KP_PREFIX" >"$2"; wait' \
    _ "$KP_LIB_DIR/netns-lib.sh" "$KP_WORKDIR/p3" &
  local pid=$!
  kp_wait_for "$KP_CEILING" test -s "$KP_WORKDIR/p3" >/dev/null || kp_fail "killed script never came up" || return 1
  prefix="$(cat "$KP_WORKDIR/p3")"
  [[ "$(_ns_with_prefix "$prefix")" -ge 3 ]] || kp_fail "killed script had no namespaces" || return 1
  kp_wait_for "$KP_CEILING" _sleeper_in "${prefix}pod1" || kp_fail "the sleeper never started in ${prefix}pod1" || return 1
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [[ $rc -ne 0 ]] || kp_fail "killed script exited 0" || return 1
  [[ "$(_ns_with_prefix "$prefix")" == 0 ]] || kp_fail "namespaces left after SIGTERM: $prefix" || return 1
  after="$(ip netns list | awk '{print $1}' | sort)"
  # Other engineers' runs may add/remove their own namespaces meanwhile; ours must all be gone.
  if [[ "$before" != "$after" ]]; then kp_note "ip netns list changed (other runs?): before=[$before] after=[$after]"; fi
  return 0
}

# The case runner itself: a case that called kp_fail fails even when it goes on and returns 0
# (`cmd && kp_fail "..." && return 1` never reaches its return), also from a subshell.
case_kp_fail_fails_the_case() {
  local suite="$KP_WORKDIR/suite.sh" out rc
  cat >"$suite" <<'EOF'
set -u
source "$1"
case_returns_after_kp_fail() { true && kp_fail "expected failure" && return 1; return 0; }
case_kp_fail_in_subshell() { (kp_fail "expected failure"); true; }
case_passes() { return 0; }
kp_suite_begin
kp_case returns_after_kp_fail case_returns_after_kp_fail
kp_case kp_fail_in_subshell case_kp_fail_in_subshell
kp_case passes case_passes
kp_suite_end
EOF
  out="$(bash "$suite" "$TESTLIB_DIR/testlib.sh" 2>&1)"
  rc=$?
  kp_note "nested suite (status $rc): $(grep -E '^(PASS|FAIL) |passed' <<<"$out" | tr '\n' ' ')"
  [[ $rc -ne 0 ]] || kp_fail "a suite with failed cases exited 0" || return 1
  grep -q '^FAIL returns_after_kp_fail ' <<<"$out" || kp_fail "a case returning 0 after kp_fail passed" || return 1
  grep -q '^FAIL kp_fail_in_subshell ' <<<"$out" || kp_fail "a case with kp_fail in a subshell passed" || return 1
  grep -q '^PASS passes ' <<<"$out" || kp_fail "a passing case did not pass" || return 1
  [[ "$(tail -n 1 <<<"$out")" == "1 passed, 2 failed" ]] || kp_fail "summary: $(tail -n 1 <<<"$out")" || return 1
}

kp_suite_begin "$@"
kp_case pods_reachable_from_node case_pods_reachable_from_node
kp_case routes_between_namespaces case_routes_between_namespaces
kp_case udp_echo case_udp_echo
kp_case podserver_answers case_podserver_answers
kp_case kernel_nat_in_topology case_kernel_nat_in_topology
kp_case teardown_leaves_nothing case_teardown_leaves_nothing
kp_case kp_fail_fails_the_case case_kp_fail_fails_the_case
kp_suite_end
