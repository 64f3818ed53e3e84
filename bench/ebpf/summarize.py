#!/usr/bin/env python3
"""The rounds of bench/ebpf/repeat.sh, per mode and Service count: the median, lowest and
highest of each figure over the rounds, and each mode's median against the first mode's (ebpf).

usage: bench/ebpf/summarize.py DIR   (DIR/round-*.txt: the lines run.sh prints per measurement)
"""
import glob
import os
import statistics
import sys

# (field, heading, higher is better, short name)
FIGURES = [("pod_rate", "pod → ClusterIP: connections/s", True, "rate"),
           ("pod_p50_us", "p50 (µs)", False, "p50"),
           ("pod_p99_us", "p99 (µs)", False, "p99"),
           ("pod_cpu_us", "CPU per connection (µs)", False, "CPU"),
           ("ct_node", "conntrack entries to the ClusterIP (node)", False, None),
           ("ct_node_all", "conntrack entries, all (node)", False, None),
           ("overhead_cpu_us", "CPU per connection above the pod's own address (µs)", False, None),
           ("overhead_p50_us", "p50 above the pod's own address (µs)", False, None)]


def kept_alive(figures, requests):
    """FIGURES as they read when every connection carried REQUESTS requests (run.sh's
    KP_BENCH_REQUESTS): the rate counts requests, and the CPU is per request."""
    if requests == 1:
        return figures
    return [(name, heading.replace("per connection", "per request")
             .replace("connections/s", f"requests/s ({requests} on each connection)"), higher, short)
            for name, heading, higher, short in figures]


def derived(f):
    """The service path's own cost in one measurement: the ClusterIP's figure less the same pod's
    to the endpoint's address, measured right after it (run.sh's poddirect)."""
    out = {}
    for name, pod, direct in (("overhead_cpu_us", "pod_cpu_us", "poddirect_cpu_us"),
                              ("overhead_p50_us", "pod_p50_us", "poddirect_p50_us")):
        try:
            out[name] = str(float(f[pod]) - float(f[direct]))
        except (KeyError, ValueError):
            pass
    return out


def rows(directory):
    for path in sorted(glob.glob(os.path.join(directory, "round-*.txt"))):
        for line in open(path):
            words = line.split()
            if not words:
                continue
            fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            yield words[0], fields


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    cells, order, failed, requests = {}, [], {}, set()
    for mode, f in rows(sys.argv[1]):
        requests.add(int(f.get("requests_per_connection", "1")))
        if mode not in order:
            order.append(mode)
        key = (mode, int(f["services"]))
        if f.get("status") != "ready":
            failed[key] = failed.get(key, 0) + 1
            continue
        f.update(derived(f))
        for name, _, _, _ in FIGURES:
            try:
                cells.setdefault(key, {}).setdefault(name, []).append(float(f[name]))
            except (KeyError, ValueError):
                pass
    if len(requests) > 1:
        raise SystemExit(f"rounds with different requests per connection: {sorted(requests)}")
    figures = kept_alive(FIGURES, requests.pop() if requests else 1)
    sizes = sorted({s for _, s in cells})
    print("| mode | Services | rounds | " + " | ".join(h + ": median (lowest–highest)" for _, h, _, _ in figures)
          + f" | {order[0] if order else '?'}'s median better (+) or worse (−) than this mode's |")
    print("|" + "---|" * (4 + len(FIGURES)))
    for s in sizes:
        base = cells.get((order[0], s), {})
        for mode in order:
            c = cells.get((mode, s))
            if not c:
                print(f"| {mode} | {s} | 0 ({failed.get((mode, s), 0)} not ready) |" + " – |" * (len(FIGURES) + 1))
                continue
            out, against = [], []
            for name, _, higher, short in FIGURES:
                xs = c.get(name, [])
                if not xs:
                    out.append("–")
                    continue
                m = statistics.median(xs)
                out.append(f"{m:.0f} ({min(xs):.0f}–{max(xs):.0f})")
                b = base.get(name)
                if mode != order[0] and b and short and m > 0:
                    bm = statistics.median(b)
                    # How much better (+) or worse (−) the first mode is than this one.
                    gain = (bm - m) / m if higher else (m - bm) / m
                    against.append(f"{short} {gain:+.0%}")
            n = len(c[FIGURES[0][0]]) if FIGURES[0][0] in c else 0
            bad = failed.get((mode, s), 0)
            print(f"| {mode} | {s} | {n}{f' ({bad} not ready)' if bad else ''} | " + " | ".join(out)
                  + f" | {', '.join(against) if against else ''} |")


if __name__ == "__main__":
    main()
