#!/usr/bin/env bash
# examples/embed as an embedder builds and runs it: kproxy installed into a temporary prefix,
# the agent built out of tree with find_package(kproxy COMPONENTS apiwatch), then run over a
# copy of the demo manifests. It must print the first sync (both demo services added, with
# their endpoints) and, after a manifest is removed, a partial sync removing that service; the
# core's log lines must come out through the agent's LogSink, none in kproxy's stderr format.
# No root needed, nothing touches the network.
# Usage: example_embed.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1
SRC=$2
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

make_workdir example-embed
install_kproxy "$BUILD"
if build_example "$BUILD" "$SRC/examples/embed" embed; then
  pass "the embedding agent builds with find_package(kproxy COMPONENTS apiwatch)"
else
  fail "embedding agent build" "$(tail -10 "$WORK/embed.log")"
fi

mkdir -p "$WORK/manifests"
cp "$SRC"/examples/demo-manifests/*.yaml "$WORK/manifests/"
OUT="$WORK/agent.out"
"$WORK/embed/kproxy-embed-agent" "$WORK/manifests" demo-node 2 >"$OUT" 2>"$WORK/agent.err" &
AGENT=$!; PIDS+=("$AGENT")
DETAIL=$(cat "$OUT" "$WORK/agent.err")
check "the agent prints its first sync" wait_for "$HANG_CEILING" grep -q '^sync 1 ' "$OUT"
rm "$WORK/manifests/web-nodeport.yaml"
DETAIL="the agent did not exit after its second sync: $(tail -5 "$OUT")"
check "the agent exits after its second sync" wait_for "$HANG_CEILING" bash -c "! kill -0 $AGENT 2>/dev/null"
wait "$AGENT"; rc=$?
[[ $rc -eq 0 ]] && pass "the agent exits 0" || fail "the agent's exit status" "$rc: $(cat "$WORK/agent.err")"

eps=10.244.1.11:8080,10.244.1.12:8080,10.244.1.13:8080
expect_line() {
  DETAIL=$(cat "$OUT")
  check "$1" grep -qxF -- "$2" "$OUT"
}
expect_line "sync 1 is the full one with both service ports" \
  "sync 1 generation=1 kind=full changed=2"
expect_line "sync 1 adds demo/web with its three endpoints" \
  "  + demo/web:http IPv4 TCP 10.96.0.10:80 endpoints=$eps"
expect_line "sync 1 adds demo/web-nodeport with its node port" \
  "  + demo/web-nodeport:http IPv4 TCP 10.96.0.11:80 nodePort=30080 endpoints=$eps"
expect_line "sync 2 is partial with one change" "sync 2 generation=2 kind=partial changed=1"
expect_line "sync 2 removes demo/web-nodeport" "  - demo/web-nodeport:http IPv4"
DETAIL=$(grep -c '^  [-+~]' "$OUT")
check "nothing else changed" test "$DETAIL" = 3

DETAIL=$(cat "$OUT")
check "the core's sync log line came through the agent's sink" \
  grep -q '^agent-log info Synced rules {backend=embed-printer kind=partial generation=2 changed=1 ' "$OUT"
DETAIL=$(head -5 "$WORK/agent.err")
check "no log line reached stderr" test ! -s "$WORK/agent.err"

finish example_embed
