#!/usr/bin/env bash
# The --config file as upstream's kube-proxy treats it: a field kproxy does not know (a newer
# version's, a typo) is decoded leniently with upstream's warning and kproxy runs; a write to
# the file, or its rename, makes kproxy exit with an error (for the DaemonSet to restart it with
# the new file). In an anonymous network namespace (root).
# Usage: config_file.sh KPROXY_BIN
set -uo pipefail
KPROXY=$1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
require_root config_file "a network namespace"
enter_own_netns config_file "$@"
make_workdir config-file
make_lb_fixture  # $M with node-a, $WORK/config.yaml (nftables mode)
echo "someFutureField: {enabled: true}" >>"$WORK/config.yaml"

# start NAME: kproxy on $WORK/config.yaml in the background, pid in KP, log in $WORK/NAME.log.
start() {
  "$KPROXY" --config "$WORK/config.yaml" --manifests "$M" >"$WORK/$1.log" 2>&1 &
  KP=$!; PIDS+=("$KP")
}
exited() { ! kproxy_alive; }
synced() { is_code 200 http://127.0.0.1:10256/healthz; }  # healthy: its rules are in

start lenient
DETAIL=$(tail -5 "$WORK/lenient.log")
check "an unknown field: strict decoding fails, lenient decoding warns with upstream's words" \
  wait_for "$HANG_CEILING" grep -q 'Using lenient decoding as strict decoding failed.*unknown field \\"someFutureField\\"' "$WORK/lenient.log"
check "and kproxy runs: its first sync is made" wait_for "$HANG_CEILING" synced
check "it is still running" kproxy_alive

# A write to the file (as `kubectl edit` of a hostPath file, or an editor writing in place).
echo "# changed" >>"$WORK/config.yaml"
DETAIL=$(tail -3 "$WORK/lenient.log")
check "a write to the config file makes kproxy exit" wait_for "$HANG_CEILING" exited
wait "$KP"; rc=$?
DETAIL="rc=$rc $(tail -2 "$WORK/lenient.log")"
check "with an error, in upstream's words" \
  eval '[ $rc -ne 0 ] && grep -q "content of the proxy server.s configuration file was updated" "$WORK/lenient.log"'

# A rename of the file.
start renamed
wait_for "$HANG_CEILING" synced
mv "$WORK/config.yaml" "$WORK/config-old.yaml"
DETAIL=$(tail -3 "$WORK/renamed.log")
check "renaming the config file makes kproxy exit" wait_for "$HANG_CEILING" exited

finish config_file
