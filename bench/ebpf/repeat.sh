#!/usr/bin/env bash
# bench/ebpf/run.sh ROUNDS times in a row, the order of the modes turned by one each round (so
# that a drift of the machine over the rounds falls on every mode alike), then the figures of
# every mode and size over the rounds: median, lowest and highest (bench/ebpf/summarize.py). One
# round's difference under 10 % is noise on these machines; this says which differences hold.
#
# usage: bench/ebpf/repeat.sh [--kproxy BIN] [--plugin-dir DIR] ROUNDS SECONDS S...
#   KP_BENCH_MODES: the modes of a round (default "ebpf nftables upstream-nftables"); OUT:
#   KP_BENCH_OUT (default bench/results/ebpf-repeat-<date>), where each round's result lines go
#   (round-N.txt, the lines run.sh prints for each mode and size) and the summary (summary.md).
#   KP_BENCH_RUNNER: what runs a round (default bench/ebpf/run.sh; bench/ebpf/vm.sh runs it in the
#   test VM, where IPVS mode can be measured). KP_BENCH_REQUESTS: requests on each connection
#   (run.sh's; default 1). Run as root, on a machine that runs nothing else.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PASS=()
while [[ $# -gt 0 && "$1" == --* ]]; do
  PASS+=("$1" "$2")
  shift 2
done
(($# >= 3)) || { echo "usage: $0 [--kproxy BIN] [--plugin-dir DIR] ROUNDS SECONDS S..." >&2; exit 2; }
ROUNDS=$1 SECS=$2
shift 2
read -ra MODES <<<"${KP_BENCH_MODES:-ebpf nftables upstream-nftables}"
RUNNER="${KP_BENCH_RUNNER:-$HERE/run.sh}"
OUT="${KP_BENCH_OUT:-$HERE/../results/ebpf-repeat-$(date +%Y-%m-%d)}"
mkdir -p "$OUT"
{
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kproxy $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null)$(git -C "$HERE" diff --quiet HEAD 2>/dev/null || echo +changes)"
  echo "machine $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
  echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "rounds $ROUNDS, $SECS s per measurement, Services $*, runner ${RUNNER##*/}, requests per connection ${KP_BENCH_REQUESTS:-1}"
} >"$OUT/meta.txt"
for ((r = 1; r <= ROUNDS; r++)); do
  # Round r starts at mode (r-1) mod n.
  order=("${MODES[@]:$(((r - 1) % ${#MODES[@]}))}" "${MODES[@]:0:$(((r - 1) % ${#MODES[@]}))}")
  echo "round $r of $ROUNDS: ${order[*]} ($(date +%T))" >&2
  KP_BENCH_MODES="${order[*]}" "$RUNNER" "${PASS[@]}" "$SECS" "$@" 2>"$OUT/round-$r.log" |
    grep -E '^[a-z-]+ services=[0-9]+ status=' >"$OUT/round-$r.txt"
  echo "round $r: $(wc -l <"$OUT/round-$r.txt") results" >&2
done
echo "end $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$OUT/meta.txt"
python3 "$HERE/summarize.py" "$OUT" | tee "$OUT/summary.md"
