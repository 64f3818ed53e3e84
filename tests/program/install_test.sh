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

install_kproxy "$BUILD"
for f in bin/kproxy include/kproxy/plugin/abi.h include/kproxy/plugin/sdk.h \
         include/kproxy/plugin/testing.h include/kproxy/core/log.h \
         lib/cmake/kproxy/kproxyConfig.cmake lib/cmake/kproxy/kproxyApiwatchTargets.cmake \
         lib/kproxy/plugins/kproxy-backend-nftables.so; do
  [[ -e "$PREFIX/$f" ]] && pass "installed $f" || fail "installed $f" "missing"
done

if build_example "$BUILD" "$SRC/examples/out-of-tree-plugin" plugin; then
  pass "third-party plugin builds with find_package(kproxy)"
else
  fail "third-party plugin build" "$(tail -5 "$WORK/plugin.log")"
fi

out=$("$PREFIX/bin/kproxy" --proxy-mode=none --manifests "$WORK" --plugin-dir "$WORK/plugin" 2>&1)
if [[ "$out" == *'available: ebpf, iptables, ipvs, logonly, nftables'* ]]; then
  pass "installed kproxy finds the built-in and the third-party plugin"
else
  fail "plugin discovery" "$out"
fi

out=$(unshare -n "$PREFIX/bin/kproxy" --plugin-dir "$WORK/plugin" --proxy-mode=logonly \
        --manifests "$SRC/examples/demo-manifests" --hostname-override demo-node --dry-run 2>&1)
if [[ "$out" == *'logonly: demo/web:http 10.96.0.10:80 with 3 endpoints'* ]]; then
  pass "the third-party plugin syncs through the ABI"
else
  fail "third-party sync" "$out"
fi

finish install
