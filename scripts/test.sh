#!/usr/bin/env bash
# Sets up a fresh machine and runs every test tier:
#   1. unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/), then the
#      libFuzzer targets (build-fuzz/, clang), each fuzzed for FUZZ_SECONDS (10)
#   2. the full suite (build/, Release): unit; kernel (each test in its own network namespace);
#      program (the kproxy binary as a user runs it, install, HTTP endpoints); data path (pods in
#      network namespaces, curl through the real rules); vm (IPVS in a Debian kernel under qemu,
#      tests/vm/, cached in ~/.cache/kproxy/vm); end to end (a real kube-apiserver +
#      etcd, the apiserver built once into ~/.cache/kproxy from the Go module proxy); soak (the
#      same apiserver churned for KPROXY_SOAK_SECONDS, 120 s by default, while kproxy is killed);
#      cluster (three nodes on that apiserver, 1,000 background Services, rolling update, scale
#      to zero, node drain, kproxy restarts, an upgrade from an older commit's kproxy (built once
#      into ~/.cache/kproxy/cluster-old) and back, apiserver restarts, mode switches under constant
#      request load: no request may fail).
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

# stage NAME: one line naming what runs now, with the time, so that a log shows where the time went.
STAGE_START=$SECONDS
stage() {
  if [[ -n "${STAGE_NAME:-}" ]]; then echo "== took $((SECONDS - STAGE_START)) s: $STAGE_NAME"; fi
  STAGE_NAME=$1 STAGE_START=$SECONDS
  echo "== $(date +%T) $1"
}

stage "ASan+UBSan build: unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKPROXY_SANITIZE=ON -DKPROXY_WERROR=ON >/dev/null
cmake --build build-asan -j"$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest -L unit --output-on-failure -j"$JOBS")

stage "Fuzz targets (clang 19, libFuzzer, ASan+UBSan): each for a bounded time"
# Only the libraries the targets need are built. Inputs found are kept in build-fuzz/ for the
# next run; any crash, leak, timeout or sanitizer report fails.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKPROXY_FUZZ=ON -DKPROXY_BUILD_TESTS=OFF \
  -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 -DKPROXY_FUZZ_SECONDS="${FUZZ_SECONDS:-10}" >/dev/null
cmake --build build-fuzz -j"$JOBS" --target kproxy_fuzzers
(cd build-fuzz && ctest -L fuzz --output-on-failure -j1)

stage "Control plane for the end-to-end tier: kube-apiserver from the Go module proxy (cached)"
# Cached in ~/.cache/kproxy after the first build; with the whole machine to itself CI may use
# both cores.
GOMAXPROCS=${GOMAXPROCS:-2} tests/e2e/build-control-plane.sh

# The Release build's tiers, in this order; every test carries exactly one of these labels.
TIERS=(unit kernel program datapath vm e2e soak cluster)
stage "Release build for the tiers ${TIERS[*]}"
# Release (-O3), as the benchmarks are built: g++ 12 has warnings that only -O3 shows.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKPROXY_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
cd build
# A test in none of the tiers would never run: that is an error, not a quiet gap.
tier_regex="^($(IFS='|'; echo "${TIERS[*]}"))\$"
untiered=$(ctest -N -LE "$tier_regex" | sed -n 's/^Total Tests: //p')
if [[ "${untiered:-0}" != 0 ]]; then
  echo "test.sh: ERROR: $untiered test(s) carry none of the labels ${TIERS[*]}:" >&2
  ctest -N -LE "$tier_regex" >&2
  exit 1
fi
# Tiers run one after another, each with -j1: kernel and data-path tests make their own
# namespaces but share the machine's two cores. A failed tier does not stop the others; the
# script fails at the end, with one line that counts every tier's tests.
total_passed=0 total_failed=0 total_skipped=0 failed_tiers=()
for i in "${!TIERS[@]}"; do
  tier=${TIERS[$i]}
  stage "Tier $((i + 1)) of ${#TIERS[@]}: $tier"
  log="Testing/tier-$tier.log"
  mkdir -p Testing
  set +e
  ctest -L "^$tier\$" --output-on-failure -j1 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  failed_n=0 total_n=0
  read -r failed_n total_n < <(sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests? failed out of ([0-9]+)$/\1 \2/p' "$log" | tail -1) || true
  skipped_n=$(grep -cE '\(Skipped\)$' "$log" || true)
  if [[ -z "${total_n:-}" || "$total_n" == 0 ]]; then
    echo "test.sh: ERROR: tier $tier ran no test" >&2
    failed_tiers+=("$tier (no test)")
    continue
  fi
  total_failed=$((total_failed + failed_n))
  total_skipped=$((total_skipped + skipped_n))
  total_passed=$((total_passed + total_n - failed_n - skipped_n))
  ((rc == 0)) || failed_tiers+=("$tier")
done
stage "done"
if ((${#failed_tiers[@]})); then echo "test.sh: failed tiers: ${failed_tiers[*]}"; fi
echo "test.sh: $total_passed passed, $total_failed failed, $total_skipped skipped"
((${#failed_tiers[@]} == 0))
