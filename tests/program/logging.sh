#!/usr/bin/env bash
# kproxy's log output as kube-proxy's parsers read it: --logging-format=json writes one JSON
# record per line with component-base's fields (ts, caller, msg, v); the text format carries
# klog's header with the caller's file:line; --vmodule raises one file's level; with
# enableProfiling, PUT /debug/flags/v changes the verbosity at run time. In an anonymous network
# namespace (root).
# Usage: logging.sh KPROXY_BIN
set -uo pipefail
KPROXY=$1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
require_root logging "a network namespace"
enter_own_netns logging "$@"
make_workdir logging
make_lb_fixture  # $M: the Node node-a; $WORK/config.yaml: nftables mode, metrics on :10249
write_lb web 10.96.0.50 31080 node-a
MET=http://127.0.0.1:10249
healthy() { is_code 200 http://127.0.0.1:10256/healthz; }
# has LOG PATTERN: the log holds a line matching the extended regex.
has() { grep -Eq "$2" "$1"; }

# stop_kproxy: ends the kproxy started as $KP and waits for it.
stop_kproxy() { kill "$KP" 2>/dev/null; wait "$KP" 2>/dev/null; }

# --- JSON ---------------------------------------------------------------------------------
"$KPROXY" --config "$WORK/config.yaml" --manifests "$M" --logging-format=json -v=2 \
  >"$WORK/json.log" 2>&1 &
KP=$!; PIDS+=("$KP")
DETAIL=$(tail -5 "$WORK/json.log" 2>/dev/null)
check "json: kproxy starts and syncs" wait_for "$HANG_CEILING" healthy
check "json: the v2 sync line is written" wait_for "$HANG_CEILING" has "$WORK/json.log" '"msg":"Synced rules"'
stop_kproxy
# Every line is a JSON object with upstream's fields: ts (milliseconds since the epoch, a
# number), caller (zap's short caller, dir/file:line), msg (a string); "v" (a number) on every
# record except errors, which kproxy's clean start has none of.
bad=$(jq -R -c '(try fromjson catch null) as $r
  | if $r == null then "not JSON: " + .
    elif ($r | type) != "object" then "not an object: " + .
    elif ($r.ts | type) != "number" or $r.ts < 1e12 then "ts: " + .
    elif ($r.caller | type) != "string" or ($r.caller | test("^[^/]+/[^/]+:[0-9]+$") | not) then "caller: " + .
    elif ($r.msg | type) != "string" then "msg: " + .
    elif ($r.v | type) != "number" then "v: " + .
    else empty end' "$WORK/json.log" 2>&1)
jq_rc=$?
lines=$(wc -l <"$WORK/json.log")
DETAIL="jq exit $jq_rc: $(head -3 <<<"$bad") (of $lines lines)"
check "json: every line is a record with ts, caller, msg and v" test "$jq_rc" = 0 -a -z "$bad" -a "$lines" -gt 0
sync=$(grep -m1 '"msg":"Synced rules"' "$WORK/json.log")
DETAIL=$sync
check "json: the sync record names its caller, its level and typed fields" \
  eval '[ -n "$sync" ] && jq -e '"'"'(.caller | test("^src/proxier\\.cpp:[0-9]+$")) and .v == 2 and (.changed | type) == "number"'"'"' <<<"$sync" >/dev/null'
DETAIL=$(grep -m1 '"source":"plugin"' "$WORK/json.log")
check "json: a plugin's record names the plugin's source file" \
  eval 'grep "\"source\":\"plugin\"" "$WORK/json.log" | jq -e -s '"'"'length > 0 and all(.caller | test("^src/[a-z_]+\\.cpp:[0-9]+$"))'"'"' >/dev/null'

# --- text, --vmodule ------------------------------------------------------------------------
"$KPROXY" --config "$WORK/config.yaml" --manifests "$M" -v=0 --vmodule=proxier=2 \
  >"$WORK/text.log" 2>&1 &
KP=$!; PIDS+=("$KP")
DETAIL=$(tail -5 "$WORK/text.log" 2>/dev/null)
check "text: kproxy starts and syncs" wait_for "$HANG_CEILING" healthy
check "text: --vmodule=proxier=2 shows proxier.cpp's v2 sync line, in klog's header" \
  wait_for "$HANG_CEILING" has "$WORK/text.log" \
  '^I[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6} +[0-9]+ proxier\.cpp:[0-9]+\] "Synced rules" .*changed=[0-9]+'
bad=$(grep -Ev '^[IWE][0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6} +[0-9]+ [A-Za-z0-9_.]+:[0-9]+\] "' "$WORK/text.log" | head -3)
DETAIL=$bad
check "text: every line has klog's header and a quoted message" test -z "$bad"
stop_kproxy

# --- the verbosity at run time (enableProfiling) ----------------------------------------------
{ cat "$WORK/config.yaml"; echo "enableProfiling: true"; } >"$WORK/profiling.yaml"
"$KPROXY" --config "$WORK/profiling.yaml" --manifests "$M" -v=0 \
  >"$WORK/runtime.log" 2>&1 &
KP=$!; PIDS+=("$KP")
DETAIL=$(tail -5 "$WORK/runtime.log" 2>/dev/null)
check "runtime: kproxy starts with enableProfiling and syncs" wait_for "$HANG_CEILING" healthy
DETAIL=$(grep "Synced rules" "$WORK/runtime.log")
check "runtime: at -v=0 no sync line" eval '! grep -q "Synced rules" "$WORK/runtime.log"'
answer=$(curl -s --max-time "$REQUEST_CEILING" -X PUT --data-binary 2 "$MET/debug/flags/v")
DETAIL="got '$answer'"
check "runtime: PUT /debug/flags/v answers as upstream" test "$answer" = "successfully set klog.logging.verbosity to 2"
write_lb api 10.96.0.60 31081 node-a  # a change, for a sync to log
DETAIL=$(tail -5 "$WORK/runtime.log" 2>/dev/null)
check "runtime: after PUT 2, the next sync's v2 line is written" \
  wait_for "$HANG_CEILING" has "$WORK/runtime.log" '"Synced rules"'
DETAIL="got $(code -X PUT --data-binary x "$MET/debug/flags/v")"
check "runtime: a malformed level is a 400" is_code 400 -X PUT --data-binary x "$MET/debug/flags/v"
check "runtime: GET /debug/flags/v is a 406, as upstream" is_code 406 "$MET/debug/flags/v"
check "runtime: /debug/pprof is not served" is_code 404 "$MET/debug/pprof/"
stop_kproxy

finish logging
