#!/usr/bin/env bash
# Soak: hundreds of changes per second to Services and EndpointSlices through a real
# kube-apiserver while kproxy (nftables mode) is SIGKILLed mid-sync and restarted and its table
# is deleted, flushed and trimmed by hand; at the end the kernel must hold exactly what the
# apiserver's objects say, curl through a sample of services must reach their pods, and
# kproxy's memory must not have grown.
#
#   phase A (60% of the time): churn; every few seconds one disruption, in turn: SIGKILL while
#            the restarted kproxy builds or commits its first full sync, `nft delete table`,
#            SIGKILL at a random moment (between or inside partial-sync batches), `nft flush
#            table`, deletion of map elements by hand (then a SIGKILL, whose restart must
#            repair whatever the partial syncs did not).
#   phase B (40%):       churn, and the table deleted or flushed by hand, with no more kills, so
#            that the last kproxy lives through churn and repairs (its memory is measured).
#   end:     churn stops; kproxy settles; soak_driver.py check compares table ip kube-proxy with
#            the state computed from the apiserver's objects; curl a sample of services from a
#            pod; compare the last kproxy's RSS with its own at the start of phase B; then show
#            that the check fails when the kernel is wrong (an element deleted by hand after
#            kproxy stopped).
#
# The soak checks its own load and disruptions too: at least KPROXY_SOAK_MIN_RATE changes a
# second over the planned churn (the driver's count; on a busy machine the churn runs on until
# it has made them, rather than racing the clock), at least one kill inside
# a first sync when that disruption is on, every hand-made breakage repaired, and no more failed
# syncs logged by kproxy than breakages made by hand. Every wait is for an event (the kernel's
# state, kproxy's sync log or metrics) under KP_CEILING (scripts/netns-lib.sh), which only
# catches a hang.
#
# Everything runs in the network namespaces of scripts/netns-lib.sh (the control plane on the
# node namespace's loopback). Needs root and tests/e2e/build-control-plane.sh.
#
# usage: sudo tests/soak/soak.sh [--kproxy BIN] [--plugin-dir DIR]
#   KPROXY_SOAK_SECONDS   churn duration (default 120; longer by hand)
#   KPROXY_SOAK_SERVICES  base Services (default 300)
#   KPROXY_SOAK_WORKERS   churn connections (default 4)
#   KPROXY_SOAK_RSS_TOLERANCE_KIB  allowed RSS growth (default 8192 KiB plus 10%)
#   KPROXY_SOAK_MIN_RATE  the churn's least rate, changes a second (default 100)
#   KPROXY_SOAK_DISRUPTIONS  phase A's disruptions, in turn (default
#                         "kill-first-sync delete kill flush elements"; "" for churn alone)
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$HERE/../../scripts/netns-lib.sh"
# shellcheck source=../e2e/control-plane.sh
source "$HERE/../e2e/control-plane.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --kproxy) export KPROXY_BIN="$2"; shift 2 ;;
    --plugin-dir) export KPROXY_PLUGIN_DIR="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

SECONDS_TOTAL=${KPROXY_SOAK_SECONDS:-120}
SERVICES=${KPROXY_SOAK_SERVICES:-300}
WORKERS=${KPROXY_SOAK_WORKERS:-4}
RSS_TOLERANCE_KIB=${KPROXY_SOAK_RSS_TOLERANCE_KIB:-8192}
MIN_RATE=${KPROXY_SOAK_MIN_RATE:-100}
# The load the soak must make: MIN_RATE changes a second over its planned churn. A busy machine
# makes it more slowly; the churn then goes on past the planned end until it has (the driver's
# ceiling, the planned seconds and 4 KP_CEILINGs, only catches a hang).
MIN_CHANGES=$((MIN_RATE * SECONDS_TOTAL))
DRIVER="$HERE/soak_driver.py"
# The disruptions of phase A, in turn (phase B uses delete and flush of these): a subset, or
# none, helps to tell which one a failure needs.
read -r -a STEPS_A <<<"${KPROXY_SOAK_DISRUPTIONS-kill-first-sync delete kill flush elements}"

kp_require_root
cp_apiserver_bin >/dev/null || exit 1
kp_cleanup_stale
kp_init
trap '_rc=$?; cp_stop; (exit $_rc); kp_teardown' EXIT

FAILED=0
fail() { FAILED=$((FAILED + 1)); kp_log "FAIL: $*"; }
pass() { kp_log "PASS: $*"; }

# --- set-up -----------------------------------------------------------------------------------
kp_topology_up 3 0 || exit 1
kp_start_pods || exit 1
cp_start ip netns exec "$(kp_ns node)" || exit 1
cp_kproxy_kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" || exit 1
cp_api POST /api/v1/nodes "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$KP_NODE_NAME\"}}" >/dev/null || exit 1

REAL=() PODS=()
for i in 1 2 3; do
  REAL+=(--real "$(kp_pod_ip "$i")")
  PODS+=(--pod "pod$i=$(kp_pod_ip "$i")")
done
driver() { # SUBCOMMAND ARGS... — the driver in the node namespace, as admin of the apiserver
  local cmd="$1"
  shift
  kp_exec node "$KP_PYTHON" -u "$DRIVER" "$cmd" --port "$CP_API_PORT" --pki "$CP_DIR/pki" \
    --services "$SERVICES" --node "$KP_NODE_NAME" "$@"
}

kp_log "loading $SERVICES Services with their EndpointSlices"
driver load "${REAL[@]}" || exit 1

KPROXY="$(kp_kproxy_bin)" || kp_die "kproxy binary not found (--kproxy BIN)"
KARGS=(--proxy-mode=nftables --kubeconfig "$KP_WORKDIR/kproxy.kubeconfig" --hostname-override "$KP_NODE_NAME"
  --cluster-cidr "$KP_CLUSTER_CIDR" --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 -v 2)
[[ -n "${KPROXY_PLUGIN_DIR:-}" ]] && KARGS+=(--plugin-dir "$KPROXY_PLUGIN_DIR")
LOG="$KP_WORKDIR/kproxy.log"
RESTARTS=0
start_kproxy() {
  echo "===== kproxy start: $KPROXY ${KARGS[*]} =====" >>"$LOG"
  START_OFFSET=$(stat -c %s "$LOG")
  kp_bg "$LOG" ip netns exec "$(kp_ns node)" "$KPROXY" "${KARGS[@]}"
  KP_KPROXY_PID=$KP_LAST_PID
}
# full_synced_since OFFSET — kproxy logged a successful full sync after the log's first OFFSET
# bytes (e.g. the running kproxy's first, with START_OFFSET).
# (grep -c, not -q: an early exit would break the pipe, and pipefail would report the failure.)
full_synced_since() { (($(tail -c +$(($1 + 1)) "$LOG" | grep -F '"Synced rules"' | grep -cF 'kind="full"') > 0)); }
kill_kproxy() {
  kill -KILL "$KP_KPROXY_PID" 2>/dev/null
  wait "$KP_KPROXY_PID" 2>/dev/null
}
metric() { kp_exec node curl -s --max-time 2 http://127.0.0.1:10249/metrics | awk -v m="$1" '$1 == m { print $2 }'; }
# settled — kproxy has nothing pending, and its last sync started after the last change it saw.
settled() {
  local sp ep last queued
  sp="$(metric kubeproxy_sync_proxy_rules_service_changes_pending)" || return 1
  ep="$(metric kubeproxy_sync_proxy_rules_endpoint_changes_pending)" || return 1
  last="$(metric 'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}')"
  queued="$(metric 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}')"
  [[ "$sp" == 0 && "$ep" == 0 && -n "$last" ]] || return 1
  [[ -z "$queued" ]] || awk -v l="$last" -v q="$queued" 'BEGIN { exit !(l >= q) }'
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$KP_KPROXY_PID/status"; }
count_log() { grep -c -- "$1" "$LOG" 2>/dev/null || true; }
# nft_elements MAP... — "MAP KEY" for each element of the maps (soak_driver.py elements; fails
# on an element it cannot read).
nft_elements() { kp_exec node "$KP_PYTHON" "$DRIVER" elements "$@"; }

start_kproxy
kp_wait_for_kproxy "$KP_CEILING" settled || { fail "kproxy did not settle after its first start"; kp_kproxy_log_tail 30 >&2; exit 1; }
RSS_FIRST=$(rss_kib)
kp_log "kproxy settled on the base (RSS ${RSS_FIRST} KiB)"
if driver check "${PODS[@]}" --node-ip "$KP_NODE_IP" --curl-list "$KP_WORKDIR/curl0.txt" >/dev/null; then
  pass "the base is in the kernel as the apiserver has it"
else
  fail "the base is not in the kernel as the apiserver has it"
fi

# --- churn with disruptions -------------------------------------------------------------------
STOP="$KP_WORKDIR/churn.stop"
kp_bg "$KP_WORKDIR/churn.log" ip netns exec "$(kp_ns node)" "$KP_PYTHON" -u "$DRIVER" churn \
  --port "$CP_API_PORT" --pki "$CP_DIR/pki" --services "$SERVICES" --node "$KP_NODE_NAME" "${REAL[@]}" \
  --seconds $((SECONDS_TOTAL + 4 * KP_CEILING)) --workers "$WORKERS" --stop-file "$STOP" \
  --min-changes "$MIN_CHANGES" --out "$KP_WORKDIR/churn.json"
CHURN_PID=$KP_LAST_PID

KILLS_FIRST_SYNC=0 KILLS_AFTER_FIRST_SYNC=0 KILLS_RANDOM=0 BREAKS=0 REPAIRED=0 UNREPAIRED=0 SUPERSEDED=0
table_ok() { # the table is back with its dispatch rule and its maps' elements
  kp_nft node list chain ip kube-proxy services 2>/dev/null | grep -q 'vmap @service-ips' &&
    [[ "$(kp_nft node list map ip kube-proxy service-ips 2>/dev/null | grep -c ' : goto ')" -gt 0 ]]
}
# element_back MAP KEY — the element MAP KEY (as nft_elements prints it) is in the kernel.
element_back() {
  local all
  all="$(nft_elements "$1")" && grep -qxF -- "$1 $2" <<<"$all"
}
# break_and_wait WHAT — break the table by hand, then wait for kproxy to repair it.
break_and_wait() {
  BREAKS=$((BREAKS + 1))
  case "$1" in
    delete) kp_nft node delete table ip kube-proxy ;;
    flush) kp_nft node flush table ip kube-proxy ;;
  esac
  if kp_wait_for_kproxy "$KP_CEILING" table_ok; then
    REPAIRED=$((REPAIRED + 1))
    kp_log "table ${1}d by hand: repaired"
  else
    UNREPAIRED=$((UNREPAIRED + 1))
    kp_log "table ${1}d by hand: not repaired within $KP_CEILING s"
  fi
}
# break_elements — delete by hand one service-ips element and one endpoint-map element. A
# partial sync repairs what it touches; what it does not is left to a restart's full sync,
# which follows at once and is waited for.
break_elements() {
  local elem ep all
  BREAKS=$((BREAKS + 1))
  if ! all="$(nft_elements service-ips --prefix service-endpoints- 2>&1)"; then
    fail "the elements of table ip kube-proxy could not be read: $all"
    return
  fi
  elem="$(grep '^service-ips ' <<<"$all" | shuf -n1)"
  ep="$(grep '^service-endpoints-' <<<"$all" | shuf -n1)"
  [[ -n "$elem" && -n "$ep" ]] || { fail "no element to delete by hand (service-ips: '$elem', endpoint maps: '$ep')"; return; }
  elem="${elem#service-ips }"
  kp_nft node delete element ip kube-proxy service-ips "{ $elem }"
  kp_nft node delete element ip kube-proxy "${ep%% *}" "{ ${ep#* } }"
  # kproxy's next restart must bring them back (or the churn deleted the Service meanwhile;
  # the final check decides).
  sleep 1
  restart_random
  if ! kp_wait_for_kproxy "$KP_CEILING" full_synced_since "$START_OFFSET"; then
    UNREPAIRED=$((UNREPAIRED + 1))
    kp_log "elements deleted by hand: the restarted kproxy did not complete a full sync within $KP_CEILING s"
  elif element_back service-ips "$elem"; then
    REPAIRED=$((REPAIRED + 1))
    kp_log "elements deleted by hand: repaired (service-ips $elem; $ep)"
  else
    # The churn may have changed or deleted that Service port meanwhile: the final check says
    # whether anything was lost.
    SUPERSEDED=$((SUPERSEDED + 1))
    kp_log "elements deleted by hand: service-ips $elem not back after the restart's full sync, the Service port changed since"
  fi
}
# The kill comes 0 to FIRST_SYNC_DELAY_MS after kproxy has listed everything; a kill that found
# the first sync done already halves that range for the next one (on a fast machine the first
# sync may take less than the range), so that kills inside a first sync do happen.
FIRST_SYNC_DELAY_MS=40
restart_in_first_sync() {
  kill_kproxy
  local offset killer out="$KP_WORKDIR/kill.out" ready="$KP_WORKDIR/kill.ready" pidf="$KP_WORKDIR/kill.pid"
  rm -f "$out" "$ready" "$pidf"
  offset=$(stat -c %s "$LOG")
  # The killer reads the log before kproxy starts: its own start-up takes longer than kproxy's
  # list and first sync.
  kp_exec node "$KP_PYTHON" "$DRIVER" kill-in-first-sync --pid-file "$pidf" --ready-file "$ready" --log "$LOG" \
    --offset "$offset" --max-delay-ms "$FIRST_SYNC_DELAY_MS" --timeout "$KP_CEILING" >"$out" &
  killer=$!
  kp_wait_for "$KP_CEILING" test -e "$ready" || fail "the first-sync killer did not start within $KP_CEILING s"
  start_kproxy
  echo "$KP_KPROXY_PID" >"$pidf.tmp" && mv "$pidf.tmp" "$pidf"
  RESTARTS=$((RESTARTS + 1))
  wait "$killer"
  case "$(cat "$out")" in
    in-first-sync) KILLS_FIRST_SYNC=$((KILLS_FIRST_SYNC + 1)) ;;
    after-first-sync)
      KILLS_AFTER_FIRST_SYNC=$((KILLS_AFTER_FIRST_SYNC + 1))
      FIRST_SYNC_DELAY_MS=$((FIRST_SYNC_DELAY_MS / 2))
      ;;
    *)
      fail "kproxy did not list Services and EndpointSlices within $KP_CEILING s of a restart ($(cat "$out"))"
      kill_kproxy  # the killer did not kill it: the wait below would never end
      ;;
  esac
  wait "$KP_KPROXY_PID" 2>/dev/null
  start_kproxy
  RESTARTS=$((RESTARTS + 1))
}
restart_random() {
  sleep "0.$((RANDOM % 1000))"
  kill_kproxy
  KILLS_RANDOM=$((KILLS_RANDOM + 1))
  start_kproxy
  RESTARTS=$((RESTARTS + 1))
}

now_s() { echo "${EPOCHREALTIME%.*}"; }
T0=$(now_s)
PHASE_B=$((T0 + SECONDS_TOTAL * 6 / 10))
END=$((T0 + SECONDS_TOTAL))
step=0
kp_log "phase A: churn with kills and hand-made breakage until +$((PHASE_B - T0)) s"
while (($(now_s) < PHASE_B)); do
  kill -0 "$CHURN_PID" 2>/dev/null || { fail "the churn driver exited early: $(tail -5 "$KP_WORKDIR/churn.log")"; break; }
  if ((${#STEPS_A[@]} > 0)); then
    case "${STEPS_A[step % ${#STEPS_A[@]}]}" in
      kill-first-sync) restart_in_first_sync ;;
      delete) break_and_wait delete ;;
      kill) restart_random ;;
      flush) break_and_wait flush ;;
      elements) break_elements ;;
      *) kp_die "unknown disruption ${STEPS_A[step % ${#STEPS_A[@]}]} in KPROXY_SOAK_DISRUPTIONS" ;;
    esac
  fi
  step=$((step + 1))
  sleep "$((2 + RANDOM % 3))"
done
# The kproxy of phase B lives to the end: its RSS once it has done its first full sync is what
# its RSS at the end is compared with (the same process, through the same churn).
RSS_PID=$KP_KPROXY_PID RSS_B=""
if kp_wait_for_kproxy "$KP_CEILING" full_synced_since "$START_OFFSET"; then
  RSS_B=$(rss_kib)
else
  fail "the kproxy of phase B did not complete a full sync within $KP_CEILING s"
fi
kp_log "phase B: churn and hand-made breakage, no more kills, until +$((END - T0)) s (kproxy pid $RSS_PID, RSS ${RSS_B:-?} KiB)"
while (($(now_s) < END)); do
  kill -0 "$CHURN_PID" 2>/dev/null || { fail "the churn driver exited early: $(tail -5 "$KP_WORKDIR/churn.log")"; break; }
  if [[ " ${STEPS_A[*]} " == *" delete "* ]] && ((step % 2)); then
    break_and_wait delete
  elif [[ " ${STEPS_A[*]} " == *" flush "* ]]; then
    break_and_wait flush
  fi
  step=$((step + 1))
  sleep "$((3 + RANDOM % 4))"
done
touch "$STOP"
wait "$CHURN_PID" || fail "the churn driver reported errors: $(tail -5 "$KP_WORKDIR/churn.log")"

# --- the end state ----------------------------------------------------------------------------
kp_kproxy_alive || fail "kproxy exited during the soak"
if ! kp_wait_for_kproxy "$KP_CEILING" settled; then
  fail "kproxy did not settle within $KP_CEILING s after the churn stopped; its last sync: $(grep 'Synced rules\|Sync failed' "$LOG" | tail -1)"
  kp_nft node list table ip kube-proxy >"$KP_WORKDIR/unsettled-table.nft" 2>&1
  kp_log "the table as it was then: $KP_WORKDIR/unsettled-table.nft (KP_KEEP_WORKDIR=1 keeps it)"
fi

# Memory: the same process as at the start of phase B, now that it has settled.
RSS_END=""
if [[ "$KP_KPROXY_PID" != "$RSS_PID" ]] || ! kp_kproxy_alive; then
  fail "the kproxy of phase B (pid $RSS_PID) is not the one running at the end (${KP_KPROXY_PID:-none}): no RSS to compare"
elif [[ -n "$RSS_B" ]]; then
  RSS_END=$(rss_kib)
  allowed=$((RSS_B + RSS_B / 10 + RSS_TOLERANCE_KIB))
  if ((RSS_END <= allowed)); then
    pass "kproxy's RSS ${RSS_END} KiB at the end, ${RSS_B} KiB at the start of phase B (pid $RSS_PID; allowed ${allowed})"
  else
    fail "kproxy's RSS grew: ${RSS_END} KiB at the end, ${RSS_B} KiB at the start of phase B (pid $RSS_PID; allowed ${allowed})"
  fi
fi

check_now() { driver check "${PODS[@]}" --node-ip "$KP_NODE_IP" --curl-list "$KP_WORKDIR/curl.txt" 2>"$KP_WORKDIR/check.err"; }
if summary="$(kp_wait_for_kproxy "$KP_CEILING" check_now)"; then
  MISMATCHES=0
  pass "the kernel holds what the apiserver's objects say: $summary"
else
  MISMATCHES="$(check_now | sed -n 's/.*"mismatches": \([0-9]*\).*/\1/p')"
  fail "the kernel differs from the apiserver's objects (${MISMATCHES:-?} mismatches):"
  head -30 "$KP_WORKDIR/check.err" >&2
  # Tell a loss in kproxy's incremental path from a wrong expectation: a fresh kproxy lists
  # everything again and does a full sync from scratch.
  cp "$KP_WORKDIR/check.err" "$KP_WORKDIR/check-before-restart.err"
  kill_kproxy
  start_kproxy
  if kp_wait_for_kproxy "$KP_CEILING" settled && kp_wait_for_kproxy "$KP_CEILING" check_now >/dev/null; then
    kp_log "after a fresh restart of kproxy the kernel matches: the running kproxy had lost changes"
  else
    kp_log "after a fresh restart of kproxy still $(check_now | sed -n 's/.*"mismatches": \([0-9]*\).*/\1/p') mismatches"
  fi
fi

# Each request waits up to the ceiling for its answer; the first that fails ends the round.
curled=0 curl_failed=0
while read -r _ url pods; do
  curled=$((curled + 1))
  who="$(kp_who pod1 "$url")"
  if [[ -z "$who" || ",$pods," != *",$who,"* ]]; then
    curl_failed=$((curl_failed + 1))
    kp_log "curl $url from pod1: answered by '${who:-nobody}', want one of $pods"
    break
  fi
done <"$KP_WORKDIR/curl.txt"
if ((curled > 0 && curl_failed == 0)); then
  pass "curl from pod1 through $curled services (ClusterIPs and NodePorts) reached their pods"
else
  fail "curl through services: request $curled of $(wc -l <"$KP_WORKDIR/curl.txt") failed (or none to make)"
fi

# --- the check can fail: an element deleted after kproxy stopped, so nothing repairs it -------
kill_kproxy
elem="$(nft_elements service-ips | sed -n 1p)"
elem="${elem#service-ips }"
read -r e_ip _ e_proto _ e_port <<<"$elem"
# The mismatch names exactly this service port (10.96.0.1 port 80 is neither 10.96.0.10 nor port 8080).
e_key="('svc', '$e_ip', '$e_proto', $e_port)"
if [[ -n "$elem" ]] && kp_nft node delete element ip kube-proxy service-ips "{ $elem }" && ! check_now >/dev/null &&
  grep -qF "MISMATCH $e_key " "$KP_WORKDIR/check.err"; then
  pass "with kproxy stopped, an element deleted by hand ($elem) is reported as a mismatch"
else
  fail "the check did not notice an element deleted by hand after kproxy stopped ($elem; want a mismatch of $e_key)"
fi

# --- the soak's own load and disruptions --------------------------------------------------------
churn="$(cat "$KP_WORKDIR/churn.json" 2>/dev/null)"
kp_log "churn: ${churn:-none}"
# changes (the driver's counts) and seconds (the churn's duration, from its start to the stop file)
read -r changes churn_s rate < <("$KP_PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
n = sum(d["by_kind"].values())
print(n, d["seconds"], "%.1f" % (n / d["seconds"]))' "$KP_WORKDIR/churn.json" 2>/dev/null)
if [[ -z "${rate:-}" ]]; then
  fail "no churn counts in $KP_WORKDIR/churn.json"
elif ((changes >= MIN_CHANGES)); then
  pass "churn: $changes changes in $churn_s s, $rate a second (at least $MIN_CHANGES: $MIN_RATE a second over $SECONDS_TOTAL s)"
else
  fail "churn: $changes changes in $churn_s s, $rate a second, fewer than $MIN_CHANGES ($MIN_RATE a second over $SECONDS_TOTAL s): the soak did not make its load"
fi
if [[ " ${STEPS_A[*]} " == *" kill-first-sync "* ]]; then
  ((KILLS_FIRST_SYNC >= 1)) && pass "$KILLS_FIRST_SYNC kills inside a first sync ($KILLS_AFTER_FIRST_SYNC came after it)" ||
    fail "no kill inside a first sync ($KILLS_AFTER_FIRST_SYNC came after it), though kill-first-sync is on"
fi
((UNREPAIRED == 0)) || fail "$UNREPAIRED hand-made breakages were not repaired within $KP_CEILING s"
# A breakage by hand may fail the sync that meets it (then a full sync repairs it); nothing else
# should fail one.
failed_syncs=$(count_log 'Sync failed; retrying\|Verification failed; retrying')
if ((failed_syncs <= BREAKS)); then
  pass "kproxy logged $failed_syncs failed syncs, no more than the $BREAKS breakages made by hand"
else
  fail "kproxy logged $failed_syncs failed syncs, more than the $BREAKS breakages made by hand:"
  grep 'Sync failed; retrying\|Verification failed; retrying' "$LOG" | tail -5 >&2
fi
kp_log "figures: seconds=$SECONDS_TOTAL services=$SERVICES changes=${changes:-?} churn_seconds=${churn_s:-?} rate_per_s=${rate:-?}" \
  "restarts=$RESTARTS kills_in_first_sync=$KILLS_FIRST_SYNC kills_just_after_first_sync=$KILLS_AFTER_FIRST_SYNC" \
  "kills_random=$KILLS_RANDOM hand_breakages=$BREAKS repaired=$REPAIRED superseded=$SUPERSEDED unrepaired=$UNREPAIRED" \
  "kproxy_failed_syncs=$failed_syncs kproxy_full_syncs=$(count_log 'kind="full"')" \
  "final_mismatches=${MISMATCHES:-?} curl=$((curled - curl_failed))/$curled rss_first_kib=$RSS_FIRST" \
  "rss_phase_b_kib=${RSS_B:-?} rss_end_kib=${RSS_END:-?}"
kp_log "failed=$FAILED"
((FAILED == 0))
