#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds examples/out-of-tree-plugin against it with
# find_package(kproxy), and runs the installed kproxy: it must find its built-in plugins with no
# flag and the third-party plugin with --plugin-dir. Runs kproxy only in its own network
# namespace (unshare -n).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1
SRC=$2
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root install_test "runs kproxy in its own network namespace"
make_workdir install

if cmake --install "$BUILD" --prefix "$WORK/prefix" >"$WORK/install.log" 2>&1; then
  pass "cmake --install"
else
  fail "cmake --install" "$(tail -5 "$WORK/install.log")"
fi
for f in bin/kproxy include/kproxy/plugin/abi.h include/kproxy/plugin/sdk.h \
         lib/cmake/kproxy/kproxyConfig.cmake lib/kproxy/plugins/kproxy-backend-nftables.so; do
  [[ -e "$WORK/prefix/$f" ]] && pass "installed $f" || fail "installed $f" "missing"
done

if cmake -S "$SRC/examples/out-of-tree-plugin" -B "$WORK/plugin" -DCMAKE_PREFIX_PATH="$WORK/prefix" \
     >"$WORK/plugin.log" 2>&1 && cmake --build "$WORK/plugin" >>"$WORK/plugin.log" 2>&1; then
  pass "third-party plugin builds with find_package(kproxy)"
else
  fail "third-party plugin build" "$(tail -5 "$WORK/plugin.log")"
fi

out=$("$WORK/prefix/bin/kproxy" --proxy-mode=none --manifests "$WORK" --plugin-dir "$WORK/plugin" 2>&1)
if [[ "$out" == *'available: iptables, ipvs, logonly, nftables'* ]]; then
  pass "installed kproxy finds the built-in and the third-party plugin"
else
  fail "plugin discovery" "$out"
fi

out=$(unshare -n "$WORK/prefix/bin/kproxy" --plugin-dir "$WORK/plugin" --proxy-mode=logonly \
        --manifests "$SRC/examples/demo-manifests" --hostname-override demo-node --dry-run 2>&1)
if [[ "$out" == *'logonly: demo/web:http 10.96.0.10:80 with 3 endpoints'* ]]; then
  pass "the third-party plugin syncs through the ABI"
else
  fail "third-party sync" "$out"
fi

finish install
