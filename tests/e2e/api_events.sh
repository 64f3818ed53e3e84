#!/usr/bin/env bash
# Events against a real kube-apiserver + etcd: a Service whose rules keep failing to apply gets a
# Warning Event from the node's kproxy, posted with the RBAC deploy/ ships (the kproxy
# ServiceAccount), found the way `kubectl describe service` finds it (field selector on the
# involved object's kind, namespace, name and UID); a Service that syncs fine gets none, and the
# failing one gets one Event, not one per retry.
# The backend is the test-plugins' recorder, told to refuse every snapshot holding the Service
# "poison" (KPROXY_RECORDER_FAIL_SERVICE): a kernel that keeps refusing one service's rules.
# Everything lives in an anonymous network namespace (unshare -n). Needs root and kube-apiserver
# built by tests/e2e/build-control-plane.sh.
#
# usage: sudo tests/e2e/api_events.sh --kproxy BIN --test-plugins DIR
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../program/lib.sh
source "$HERE/../program/lib.sh"
# shellcheck source=control-plane.sh
source "$HERE/control-plane.sh"
cp_recorder_test api_events API_EVENTS_KEEP "$@"

cp_start || exit 1
cp_kproxy_kubeconfig "$WORK/kubeconfig" || exit 1

# all_events NAME: the Events of Service NAME as kubectl describe selects them (JSON list).
all_events() {
  local uid sel
  uid=$(cp_api GET "/api/v1/namespaces/default/services/$1" | jq -r .metadata.uid) || return 1
  sel="involvedObject.kind=Service,involvedObject.namespace=default,involvedObject.name=$1,involvedObject.uid=$uid"
  cp_api GET "/api/v1/namespaces/default/events?fieldSelector=$(jq -rn --arg s "$sel" '$s|@uri')"
}
# events NAME: those of them kproxy reported. The apiserver posts Events on Services too: its
# ClusterIP repair controller may see a Service created with a fixed clusterIP before the IP's
# allocation and post ClusterIPNotAllocated on it. Those are not this test's subject.
events() { all_events "$1" | jq '.items |= map(select(.reportingComponent == "kproxy"))'; }
event_count() { events "$1" | jq '.items | length'; }

check "Service good created" cp_service good 10.96.0.61
cp_recorder_kproxy KPROXY_RECORDER_FAIL_SERVICE=poison
synced_good() { grep -q 'default/good:http' "$WORK/record" 2>/dev/null; }
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy syncs Service good" wait_for "$CEILING" synced_good

check "Service poison created" cp_service poison 10.96.0.62
has_event() { [[ $(event_count poison) -ge 1 ]]; }
DETAIL="$(grep -i 'event\|failed' "$WORK/kproxy.log" | tail -5)"
check "a Warning Event is posted on Service poison" wait_for "$CEILING" has_event
ev=$(events poison | jq -c '.items[0]')
DETAIL="$ev"
check "its reason is FailedToSyncProxyRules" test "$(jq -r .reason <<<"$ev")" == FailedToSyncProxyRules
check "it is a Warning" test "$(jq -r .type <<<"$ev")" == Warning
check "it comes from kproxy on node-a" test "$(jq -r '"\(.source.component)@\(.source.host)"' <<<"$ev")" == kproxy@node-a
check "its message carries the error" grep -q "refusing the rules of Service poison" <<<"$(jq -r .message <<<"$ev")"
check "it counts the failed attempts (>= 3)" test "$(jq -r .count <<<"$ev")" -ge 3

# The retries go on (one a second): after five more of them, still one Event, not one per retry.
failed_syncs() { grep -c 'Sync failed; retrying' "$WORK/kproxy.log"; }
retried() { (($(failed_syncs) >= $1)); }
DETAIL="$(failed_syncs) failed syncs logged; $(tail -3 "$WORK/kproxy.log")"
check "kproxy keeps retrying Service poison" wait_for "$CEILING" retried $(($(failed_syncs) + 5))
DETAIL="$(events poison | jq -c '[.items[] | {count, lastTimestamp}]'); $(grep -c 'posted an event' "$WORK/kproxy.log") posted"
check "one Event while the failure goes on, not one per retry" test "$(event_count poison)" -eq 1
DETAIL="$(all_events good | jq -c '.items')"
check "Service good has no Event" test "$(event_count good)" -eq 0
DETAIL="$(tail -5 "$WORK/kproxy.log")"
check "kproxy still runs" kill -0 "$KP"
finish "api_events"
