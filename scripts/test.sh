#!/usr/bin/env bash
# Sets up a fresh machine and runs every test tier:
#   1. unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), then the
#      libFuzzer targets (build-fuzz/, clang), each fuzzed for FUZZ_SECONDS (10)
#   2. the full suite (build/, Release): unit; kernel (each test in its own network namespace);
#      program (the kproxy binary as a user runs it, install, HTTP endpoints); data path (pods in
#      network namespaces, curl through the real rules); vm (IPVS in a Debian kernel under qemu,
#      tests/vm/, cached in ~/.cache/kproxy/vm); end to end (a real kube-apiserver +
#      etcd, the apiserver built once into ~/.cache/kproxy from the Go module proxy); soak (the
#      same apiserver churned for KPROXY_SOAK_SECONDS, 120 s by default, while kproxy is killed).
# Everything but the unit tier needs root: without it the script fails loudly, never passes
# quietly.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${JOBS:-2}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kproxy/ccache}
# Paths relative to the checkout, so that a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
mkdir -p "$CCACHE_DIR"

scripts/install-deps.sh

if [[ $(id -u) -ne 0 ]]; then
  echo "test.sh: ERROR: the kernel and data-path tiers need root (network namespaces, netfilter)." >&2
  echo "test.sh: run as root: sudo scripts/test.sh" >&2
  exit 1
fi

echo "== ASan+UBSan build: unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKPROXY_SANITIZE=ON -DKPROXY_WERROR=ON >/dev/null
cmake --build build-asan -j"$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest -L unit --output-on-failure -j"$JOBS")

echo "== Fuzz targets (clang 19, libFuzzer, ASan+UBSan): each for a bounded time"
# Only the libraries the targets need are built. Inputs found are kept in build-fuzz/ for the
# next run; any crash, leak, timeout or sanitizer report fails.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKPROXY_FUZZ=ON -DKPROXY_BUILD_TESTS=OFF \
  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DKPROXY_FUZZ_SECONDS="${FUZZ_SECONDS:-10}" >/dev/null
cmake --build build-fuzz -j"$JOBS" --target kproxy_fuzzers
(cd build-fuzz && ctest -L fuzz --output-on-failure -j1)

echo "== Control plane for the end-to-end tier: kube-apiserver from the Go module proxy (cached)"
# Cached in ~/.cache/kproxy after the first build; with the whole machine to itself CI may use
# both cores.
GOMAXPROCS=${GOMAXPROCS:-2} tests/e2e/build-control-plane.sh

echo "== Full suite: unit, kernel, program, data path, vm, end to end"
# Release (-O3), as the benchmarks are built: g++ 12 has warnings that only -O3 shows.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKPROXY_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
# Tiers run one after another: kernel and data-path tests make their own namespaces but share
# the machine's two cores, and timing-sensitive data-path checks should not compete.
cd build
ctest --output-on-failure -j1
