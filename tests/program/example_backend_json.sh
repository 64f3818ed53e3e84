#!/usr/bin/env bash
# examples/backend-json as a third party builds and runs it: kproxy installed into a temporary
# prefix, the plugin and its unit test built out of tree against it, the unit test run, then
# kproxy loading the plugin with --plugin-dir over the demo manifests: once with --dry-run (the
# document on stdout), once for real, writing a file that a partial sync then rewrites. Each
# document is checked with check_desired_state.jq, which is itself shown to fail on a wrong one.
# Runs in its own network namespace (unshare -n), which kproxy's own settings stay in.
# Usage: example_backend_json.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1
SRC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

require_root example_backend_json "runs kproxy in its own network namespace"
command -v jq >/dev/null || { echo "example_backend_json: ERROR: needs jq"; echo "example_backend_json: 0 passed, 1 failed"; exit 1; }
enter_own_netns example_backend_json "$@"
make_workdir example-json

install_kproxy "$BUILD"
if build_example "$BUILD" "$SRC/examples/backend-json" json; then
  pass "backend-json builds with find_package(kproxy)"
else
  fail "backend-json build" "$(tail -10 "$WORK/json.log")"
fi
DETAIL=$(ctest --test-dir "$WORK/json" --output-on-failure 2>&1 | tail -20)
check "its unit test passes against the SDK's fake host" \
  ctest --test-dir "$WORK/json" --output-on-failure -Q

# The demo cluster as demo-node sees it.
endpoints='["10.244.1.11:8080","10.244.1.12:8080","10.244.1.13:8080"]'
web='{"type":"ClusterIP","clusterIP":"10.96.0.10","port":80,"nodePort":0,"endpoints":'$endpoints'}'
nodeport='{"type":"NodePort","clusterIP":"10.96.0.11","port":80,"nodePort":30080,"endpoints":'$endpoints'}'
want_both='{"node":"demo-node","ports":{"demo/web:http":'$web',"demo/web-nodeport:http":'$nodeport'}}'
want_web='{"node":"demo-node","ports":{"demo/web:http":'$web'}}'
holds() { jq -e --argjson want "$1" -f "$HERE/check_desired_state.jq" "$2" >/dev/null 2>&1; }
refuses() { ! holds "$@"; }

kproxy=("$PREFIX/bin/kproxy" --plugin-dir "$WORK/json" --proxy-mode=json --hostname-override demo-node)
if "${kproxy[@]}" --manifests "$SRC/examples/demo-manifests" --dry-run \
     >"$WORK/dry-run.json" 2>"$WORK/dry-run.log"; then
  pass "kproxy --proxy-mode=json --dry-run exits 0"
else
  fail "kproxy --dry-run" "$(tail -5 "$WORK/dry-run.log")"
fi
DETAIL=$(head -c 600 "$WORK/dry-run.json")
check "--dry-run prints the desired state of both demo services" holds "$want_both" "$WORK/dry-run.json"
jq 'del(.servicePorts[0].clusterEndpoints[1])' "$WORK/dry-run.json" >"$WORK/tampered.json"
DETAIL="a document with an endpoint missing passed"
check "the checker refuses a document with an endpoint missing" refuses "$want_both" "$WORK/tampered.json"
DETAIL="the node names differ but the checker passed"
check "the checker refuses another node" refuses "${want_both/demo-node/other-node}" "$WORK/dry-run.json"

# kproxy explain through the plugin's explain entry point, as text and as JSON.
out=$("$PREFIX/bin/kproxy" explain 10.244.1.5 10.96.0.10:80 --plugin-dir "$WORK/json" \
        --proxy-mode=json --manifests "$SRC/examples/demo-manifests" \
        --hostname-override demo-node 2>&1)
want_text="json: demo/web:http (10.96.0.10:80), cluster endpoints: 10.244.1.11:8080 10.244.1.12:8080 10.244.1.13:8080"
if [[ "$out" == "$want_text" ]]; then
  pass "kproxy explain answers through the plugin"
else
  fail "kproxy explain" "got: $out; want: $want_text"
fi
DETAIL=$("$PREFIX/bin/kproxy" explain 10.244.1.5 10.96.0.11:80 --json --plugin-dir "$WORK/json" \
           --proxy-mode=json --manifests "$SRC/examples/demo-manifests" \
           --hostname-override demo-node 2>&1)
check "kproxy explain --json names the service port hit" \
  jq -e '.backend == "json" and .servicePort.key == "demo/web-nodeport:http"' <<<"$DETAIL"

# For real: kproxy keeps running and rewrites the file on each sync.
mkdir -p "$WORK/manifests"
cp "$SRC"/examples/demo-manifests/*.yaml "$WORK/manifests/"
KPROXY_JSON_FILE="$WORK/state.json" "${kproxy[@]}" --manifests "$WORK/manifests" \
  --iptables-min-sync-period=100ms --conntrack-max-per-core=0 \
  --metrics-bind-address=127.0.0.1:10249 -v 2 >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")
DETAIL=$(tail -5 "$WORK/kproxy.log"; cat "$WORK/state.json" 2>/dev/null)
check "the first sync writes both demo services to the file" wait_for "$HANG_CEILING" holds "$want_both" "$WORK/state.json"
rm "$WORK/manifests/web-nodeport.yaml"
DETAIL=$(tail -5 "$WORK/kproxy.log"; cat "$WORK/state.json" 2>/dev/null)
check "a partial sync removes the deleted service from the file" wait_for "$HANG_CEILING" holds "$want_web" "$WORK/state.json"
DETAIL=$(grep 'Synced rules' "$WORK/kproxy.log" | tail -2)
check "kproxy logged the partial sync of the json backend" \
  grep -q 'Synced rules.*backend="json" kind="partial".*summary="partial 1 service ports"' "$WORK/kproxy.log"
DETAIL=$(curl -s --max-time "$REQUEST_CEILING" http://127.0.0.1:10249/metrics | grep kproxy_json)
check "the plugin's metrics are served" bash -c \
  "curl -s --max-time $REQUEST_CEILING http://127.0.0.1:10249/metrics | grep -q '^kproxy_json_service_ports 1$'"
kproxy_alive && pass "kproxy still runs" || fail "kproxy exited" "$(tail -5 "$WORK/kproxy.log")"

# Stopping kproxy leaves what it programmed; --cleanup removes it (and tolerates a second run).
kill -TERM "$KP"
DETAIL="kproxy did not stop on SIGTERM"
check "kproxy stops on SIGTERM" wait_for "$HANG_CEILING" bash -c "! kill -0 $KP 2>/dev/null"
DETAIL="the file is gone"
check "the file stays after kproxy stopped" holds "$want_web" "$WORK/state.json"
for run in first second; do
  KPROXY_JSON_FILE="$WORK/state.json" "$PREFIX/bin/kproxy" --cleanup --plugin-dir "$WORK/json" \
    >"$WORK/cleanup.log" 2>&1
  DETAIL=$(grep -E 'json|cleanup' "$WORK/cleanup.log" | tail -3)
  check "kproxy --cleanup ($run run) cleans up the json backend" \
    grep -q '"cleaned up" mode="json"' "$WORK/cleanup.log"
done
DETAIL="$WORK/state.json still exists"
check "--cleanup removed the file" test ! -e "$WORK/state.json"

finish example_backend_json
