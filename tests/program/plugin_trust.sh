#!/usr/bin/env bash
# --plugin-dir with the real binary: a plugin that someone other than root (or kproxy's user)
# could replace is refused with one line naming it, and the rest of kproxy carries on. The
# recorder test plugin is copied into a temp directory with good and bad owners and modes; the
# mode "nope" makes kproxy list the modes it loaded and exit before touching any kernel state
# (and it runs in an anonymous network namespace regardless).
# Usage: plugin_trust.sh KPROXY_BIN TEST_PLUGIN_DIR
set -uo pipefail
KPROXY=${1:?usage: plugin_trust.sh KPROXY_BIN TEST_PLUGIN_DIR}
TEST_PLUGINS=${2:?usage: plugin_trust.sh KPROXY_BIN TEST_PLUGIN_DIR}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root plugin_trust "chown to another user, network namespace"
make_workdir plugin-trust

D="$WORK/plugins"
mkdir -p "$D" "$WORK/manifests"
reset_plugin() {
  rm -f "$D/recorder.so"
  cp "$TEST_PLUGINS/recorder.so" "$D/recorder.so"
  chown 0:0 "$D" "$D/recorder.so"
  chmod 0755 "$D" "$D/recorder.so"
}
# run: kproxy's output for an unknown mode (it lists the loaded ones) in $out, status in $rc.
run() {
  out=$(unshare -n "$KPROXY" --proxy-mode=nope --plugin-dir "$D" --manifests "$WORK/manifests" 2>&1)
  rc=$?
}
# refused NAME WHAT WHY: kproxy still runs to its own error, recorder is not loaded, and exactly
# one log line names WHAT with WHY.
refused() {
  local name=$1 what=$2 why=$3 lines
  run
  lines=$(grep -F -- "$what" <<<"$out" | grep -cF -- "$why")
  if [[ $rc -eq 1 && "$out" == *'unknown proxy mode "nope"; available: ebpf, iptables, ipvs, nftables'* && "$out" != *recorder,* &&
        "$out" != *", recorder"* && $lines -eq 1 ]]; then
    pass "$name"
  else
    fail "$name" "rc=$rc lines=$lines out=$out"
  fi
}

reset_plugin
run
if [[ $rc -eq 1 && "$out" == *'available: ebpf, iptables, ipvs, nftables, recorder'* && "$out" != *refused* ]]; then
  pass "a root-owned 0755 plugin in a root-owned 0755 directory loads"
else
  fail "trusted plugin loads" "rc=$rc out=$out"
fi

reset_plugin; chmod 0775 "$D/recorder.so"
refused "a group-writable plugin is refused" "plugin $D/recorder.so: refused:" "writable by group or others (mode 0775)"
reset_plugin; chmod 0757 "$D/recorder.so"
refused "a world-writable plugin is refused" "plugin $D/recorder.so: refused:" "writable by group or others (mode 0757)"
reset_plugin; chown 12345 "$D/recorder.so"
refused "a plugin owned by another user is refused" "plugin $D/recorder.so: refused:" "is owned by uid 12345"
reset_plugin; chmod 0777 "$D"
refused "a world-writable plugin directory is refused" "plugin directory $D: refused:" "writable by group or others (mode 0777)"
reset_plugin; chown 12345 "$D"
refused "a plugin directory owned by another user is refused" "plugin directory $D: refused:" "is owned by uid 12345"
reset_plugin; ln -s "$D" "$WORK/link"; chmod 0777 "$D"
out=$(unshare -n "$KPROXY" --proxy-mode=nope --plugin-dir "$WORK/link" --manifests "$WORK/manifests" 2>&1)
if [[ "$out" == *"refused: $D is writable by group or others"* ]]; then
  pass "a symlink to a bad directory is judged by its target"
else
  fail "symlinked directory" "$out"
fi

finish plugin_trust
