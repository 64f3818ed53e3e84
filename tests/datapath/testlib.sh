# shellcheck shell=bash
# testlib.sh — a minimal case runner for the data-path suites.
#
# Each case is a bash function run in its own subshell with its own kp_init (so its own
# namespaces, work dir and cleanup trap): a failing or crashing case cannot leak state into
# the next one. The runner prints exactly one "PASS <name>" or "FAIL <name>" line per case,
# the failing case's output and kproxy log tail, and at the end exactly one summary line
# "<N> passed, <M> failed" (", <K> skipped" added when a case does not apply to the run).
#
# Inside a case: return non-zero (or call kp_fail "why") to fail; kp_note prints context that
# is shown only when the case fails (or always with KP_VERBOSE=1). A case that called kp_fail
# fails even if it goes on and returns 0 (e.g. `cmd && kp_fail "x" && return 1`, where the
# `return 1` never runs because kp_fail returns 1): the failure is recorded in a file, so it
# also counts when kp_fail ran in a subshell or a pipeline.

TESTLIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/netns-lib.sh
source "$TESTLIB_DIR/../../scripts/netns-lib.sh"

KP_PASSED=0
KP_FAILED=0
KP_SKIPPED=0
KP_FAILED_NAMES=()
KP_SELECTED=()
KP_SUITE_DIR=""
KP_CASE_FAILED_FILE=""

kp_note() { printf '    %s %s\n' "$(kp_now)" "$*" >&2; }

# kp_fail MESSAGE — record why the case fails and return 1 (use as `... || kp_fail "msg"`,
# then `return 1` follows naturally from `|| return` or the caller's check). The case fails
# whatever it does afterwards. In a predicate that is polled or expected to fail, report with
# a plain non-zero status instead.
kp_fail() {
  printf '    FAILED: %s\n' "$*" >&2
  [[ -n "${KP_CASE_FAILED_FILE:-}" ]] && printf '%s\n' "$*" >>"$KP_CASE_FAILED_FILE"
  return 1
}

# kp_suite_begin ARGS... — parse the common suite arguments:
#   --kproxy PATH        kproxy binary (else $KPROXY_BIN, else a build dir's cli/kproxy)
#   --plugin-dir DIR     passed to kproxy as --plugin-dir (else $KPROXY_PLUGIN_DIR)
#   CASE...              run only these cases (default: all)
kp_suite_begin() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --kproxy) KPROXY_BIN="$2"; shift 2 ;;
      --kproxy=*) KPROXY_BIN="${1#*=}"; shift ;;
      --plugin-dir) KPROXY_PLUGIN_DIR="$2"; shift 2 ;;
      --plugin-dir=*) KPROXY_PLUGIN_DIR="${1#*=}"; shift ;;
      -h | --help)
        echo "usage: $0 [--kproxy PATH] [--plugin-dir DIR] [CASE...]"
        exit 0 ;;
      -*) echo "unknown option: $1" >&2; exit 2 ;;
      *) KP_SELECTED+=("$1"); shift ;;
    esac
  done
  export KPROXY_BIN KPROXY_PLUGIN_DIR
  # After the arguments: the tools are looked for beside the kproxy under test (kp_tool_bin), so
  # that a build directory anywhere, not only inside the source tree, brings its own.
  kp_require_root
  KP_SUITE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/kpsuite$$.XXXXXX")"
  trap 'rm -rf "$KP_SUITE_DIR"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

_kp_case_selected() {
  [[ ${#KP_SELECTED[@]} -eq 0 ]] && return 0
  local s
  for s in "${KP_SELECTED[@]}"; do [[ "$s" == "$1" ]] && return 0; done
  return 1
}

# Runs on the case subshell's exit: show kproxy's log when the case failed, then clean up.
_kp_case_exit() {
  local rc=$?
  if [[ $rc -eq 0 && -s "$KP_CASE_FAILED_FILE" ]]; then
    echo "    the case returned 0 after kp_fail; failing it" >&2
    rc=1
  fi
  if [[ $rc -ne 0 && -n "$KP_WORKDIR" && -s "$KP_WORKDIR/kproxy.log" ]]; then
    echo "    --- kproxy log (last 30 lines) ---" >&2
    kp_kproxy_log_tail 30 | sed 's/^/    | /' >&2
  fi
  kp_teardown
  exit "$rc"
}

# kp_case NAME FUNCTION — run one case in a fresh subshell and report it.
kp_case() {
  local name="$1" fn="$2"
  _kp_case_selected "$name" || return 0
  local out="$KP_SUITE_DIR/$name.out" rc start
  KP_CASE_FAILED_FILE="$KP_SUITE_DIR/$name.failed"
  rm -f "$KP_CASE_FAILED_FILE"
  start=${EPOCHREALTIME/./}
  (
    kp_init
    trap _kp_case_exit EXIT
    "$fn"
  ) >"$out" 2>&1
  rc=$?
  # Also when the subshell's exit trap did not run (killed).
  [[ $rc -eq 0 && -s "$KP_CASE_FAILED_FILE" ]] && rc=1
  KP_CASE_FAILED_FILE=""
  local ms=$(((${EPOCHREALTIME/./} - start) / 1000))
  if [[ $rc -eq 0 ]]; then
    KP_PASSED=$((KP_PASSED + 1))
    echo "PASS $name (${ms} ms)"
    # A slow pass is worth a look: show how the time was spent.
    if [[ -n "${KP_VERBOSE:-}" ]] || ((ms > ${KP_SLOW_MS:-60000})); then sed 's/^/    /' "$out"; fi
  else
    KP_FAILED=$((KP_FAILED + 1))
    KP_FAILED_NAMES+=("$name")
    echo "FAIL $name (${ms} ms, status $rc)"
    sed 's/^/    /' "$out"
  fi
  return 0
}

# kp_skip NAME REASON — a case that does not apply to this run (e.g. another proxy mode's):
# one "SKIP <name>: <reason>" line when it is selected. Never counted as passed.
kp_skip() {
  _kp_case_selected "$1" || return 0
  KP_SKIPPED=$((KP_SKIPPED + 1))
  echo "SKIP $1: $2"
}

# kp_suite_end — the one summary line; non-zero when anything failed or nothing ran.
kp_suite_end() {
  local skipped=""
  ((KP_SKIPPED > 0)) && skipped=", $KP_SKIPPED skipped"
  echo "$KP_PASSED passed, $KP_FAILED failed$skipped"
  if ((KP_FAILED > 0)); then return 1; fi
  if ((KP_PASSED == 0)); then
    echo "ERROR: no case ran (unknown case name, or only cases skipped in this run?)" >&2
    return 1
  fi
  return 0
}
