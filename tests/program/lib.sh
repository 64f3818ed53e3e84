# shellcheck shell=bash
# lib.sh — what the program tests share: the root check, a re-run in an anonymous network
# namespace, a work directory removed on exit together with the processes started into it,
# and the PASS/FAIL tally with its summary line. Source it after `set -uo pipefail`:
#   source "$(dirname "$0")/lib.sh"
#   require_root NAME WHY; enter_own_netns NAME "$@"; make_workdir SLUG
#   ... pass/fail/check ...
#   finish LABEL

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# check NAME CMD...: passes when CMD succeeds, else fails with $DETAIL as the reason.
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "${DETAIL:-}"; fi; }

# require_root NAME WHY: exits 1, as one failed check, when not run as root.
require_root() {
  [[ $(id -u) -eq 0 ]] && return 0
  echo "$1: ERROR: needs root ($2)" >&2
  echo "$1: 0 passed, 1 failed"
  exit 1
}

# enter_own_netns NAME ARGS...: runs the script again with ARGS under `unshare -n` (once:
# ${NAME^^}_IN_NETNS marks the re-run), then brings up the namespace's loopback.
enter_own_netns() {
  local flag="${1^^}_IN_NETNS"
  shift
  if [[ -z "${!flag:-}" ]]; then
    export "$flag=1"
    exec unshare -n "$0" "$@"
  fi
  ip link set lo up
}

# make_workdir SLUG: WORK=/tmp/kproxy-SLUG-XXXXXX; on exit the processes in PIDS are killed
# and waited for, then WORK is removed.
make_workdir() {
  WORK=$(mktemp -d "/tmp/kproxy-$1-XXXXXX")
  PIDS=()
  trap remove_workdir EXIT
}
remove_workdir() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$WORK"
}

# wait_for SECONDS CMD...: polls every 50 ms.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  while ((SECONDS <= deadline)); do "$@" && return 0; sleep 0.05; done
  return 1
}

# code [CURL ARGS...] URL: the HTTP status (000 when nothing answered within 2 s).
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$@"; }
# is_code WANT [CURL ARGS...] URL
is_code() { local want=$1; shift; [[ $(code "$@") == "$want" ]]; }

# finish LABEL: the summary line; exits 0 when nothing failed, else 1.
finish() {
  echo "$1: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit
}
