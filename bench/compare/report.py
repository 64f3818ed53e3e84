#!/usr/bin/env python3
"""Tables and plots from bench/compare results: report.py DIR [--since ISO-DATE].

Reads DIR/results.jsonl (compare.py's output), writes DIR/report.md (one table per mode:
median of the runs with min-max, kproxy against upstream kube-proxy, and the ratio) and, with
gnuplot, DIR/sync-<mode>.png and DIR/memory-<mode>.png against cluster size.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
from collections import defaultdict

from compare import percentile as pct  # the same percentile as the runs print


def fmt(v, unit):
    if v is None:
        return "–"
    if unit == "s":
        return f"{v:.2f} s" if v < 10 else f"{v:.1f} s"
    if unit == "ms":
        if v >= 1000:
            return f"{v / 1000:.2f} s"
        return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"
    if unit == "MiB":
        return f"{v:.0f} MiB"
    return f"{v:g}"


def summary(vals, unit):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–", None
    med = statistics.median(vals)
    if len(vals) == 1:
        return fmt(med, unit), med
    return f"{fmt(med, unit)} ({fmt(min(vals), unit)}–{fmt(max(vals), unit)})", med


# (label, getter, unit, better-when-lower)
METRICS = [
    ("first sync, wall (kernel polled)", lambda r: r.get("first_sync_s"), "s"),
    ("first sync, own metric", lambda r: r.get("first_sync_metric_s") or r.get("first_sync_metric_sum_s"), "s"),
    ("one endpoint changed", lambda r: (r.get("one_endpoint") or {}).get("wall_ms"), "ms"),
    ("  its sync (own metric)", lambda r: (r.get("one_endpoint") or {}).get("mean_sync_ms"), "ms"),
    ("one Service added", lambda r: (r.get("service_added") or {}).get("wall_ms"), "ms"),
    ("100 endpoints at once", lambda r: (r.get("hundred_endpoints") or {}).get("wall_ms"), "ms"),
    ("  their syncs (mean, own metric)", lambda r: (r.get("hundred_endpoints") or {}).get("mean_sync_ms"), "ms"),
    ("peak RSS", lambda r: r.get("peak_rss_mib"), "MiB"),
    ("steady RSS", lambda r: r.get("steady_rss_mib"), "MiB"),
    ("CPU over the run", lambda r: r.get("cpu_total_s"), "s"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--since", default="", help="only results dated at or after this (ISO 8601)")
    args = ap.parse_args()
    rows = [json.loads(l) for l in open(os.path.join(args.dir, "results.jsonl")) if l.strip()]
    rows = [r for r in rows if r.get("date", "") >= args.since]
    groups = defaultdict(list)
    for r in rows:
        groups[(r["mode"], r["services"], r["endpoints"], r["program"])].append(r)
    modes = sorted({k[0] for k in groups}, key=lambda m: ["nftables", "iptables", "ipvs"].index(m)
                   if m in ("nftables", "iptables", "ipvs") else 9)
    out = []
    versions = sorted({r.get("version", "") for r in rows if r.get("version")})
    dates = [r["date"] for r in rows if r.get("date")]
    out.append(f"Programs: {', '.join(versions)}. Dates: {min(dates)} to {max(dates)}.\n")
    plots = {}
    for mode in modes:
        scales = sorted({(k[1], k[2]) for k in groups if k[0] == mode})
        out.append(f"\n#### {mode} mode\n")
        header = "| | " + " | ".join(f"{s}×{e} kproxy | {s}×{e} upstream | ratio" for s, e in scales) + " |"
        out.append(header)
        out.append("|" + "---|" * (1 + 3 * len(scales)))
        lines = []
        for label, get, unit in METRICS + [("programming latency p50", None, "ms"),
                                           ("programming latency p99", None, "ms"),
                                           ("runs (capped or failed)", None, "")]:
            cells = []
            for s, e in scales:
                meds = {}
                for prog in ("kproxy", "upstream"):
                    rs = groups.get((mode, s, e, prog), [])
                    if label.startswith("programming latency"):
                        raw = [x for r in rs for x in (r.get("latency") or {}).get("raw_ms", [])]
                        v = pct(raw, 50 if "p50" in label else 99)
                        n = len(raw)
                        miss = sum((r.get("latency") or {}).get("missing", 0) for r in rs)
                        cells.append(f"{fmt(v, unit)} (n={n}{f', {miss} missed' if miss else ''})" if raw else "–")
                        meds[prog] = v
                    elif label.startswith("runs"):
                        bad = sum(1 for r in rs if "error" in r or "first_sync_capped_s" in r)
                        cap = max((r.get("first_sync_capped_s", 0) for r in rs), default=0)
                        cells.append(f"{len(rs)} ({bad}{f', cap {cap:.0f} s' if cap else ''})")
                        meds[prog] = None
                    else:
                        text, med = summary([get(r) for r in rs], unit)
                        cells.append(text)
                        meds[prog] = med
                k, u = meds.get("kproxy"), meds.get("upstream")
                cells.append(f"{u / k:.1f}×" if k and u else "")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        out.extend(lines)
        # plot data: services -> medians, per endpoints count
        for e in sorted({e for _, e in scales}):
            pts = []
            for s in sorted({s for s, e2 in scales if e2 == e}):
                row = [s]
                for prog in ("kproxy", "upstream"):
                    rs = groups.get((mode, s, e, prog), [])
                    for get in (lambda r: r.get("first_sync_s"), lambda r: r.get("peak_rss_mib"),
                                lambda r: (r.get("one_endpoint") or {}).get("wall_ms")):
                        vals = [get(r) for r in rs if get(r) is not None]
                        row.append(statistics.median(vals) if vals else float("nan"))
                pts.append(row)
            plots[(mode, e)] = pts
    with open(os.path.join(args.dir, "report.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))
    if not shutil.which("gnuplot"):
        print("gnuplot not found: no plots")
        return
    for (mode, e), pts in plots.items():
        data = os.path.join(args.dir, f"plot-{mode}-x{e}.dat")
        with open(data, "w") as f:
            f.write("# services kproxy_sync_s kproxy_peak_MiB kproxy_change_ms upstream_sync_s upstream_peak_MiB "
                    "upstream_change_ms\n")
            for row in pts:
                f.write(" ".join(str(x) for x in row) + "\n")
        for what, col, ylabel, name in (("first full sync", 2, "seconds (log)", "sync"),
                                         ("peak RSS", 3, "MiB", "memory"),
                                         ("one endpoint changed, API write to kernel", 4, "milliseconds (log)",
                                          "change")):
            png = os.path.join(args.dir, f"{name}-{mode}-x{e}.png")
            logy = "set logscale y" if name != "memory" else "set yrange [0:*]"
            script = f"""
set terminal pngcairo size 720,440 font ",10"
set output "{png}"
set title "{mode} mode: {what} ({e} endpoints per Service)"
set xlabel "Services"
set ylabel "{ylabel}"
set logscale x
{logy}
set key top left
set grid
plot "{data}" using 1:{col} with linespoints lw 2 pt 7 title "kproxy", \\
     "{data}" using 1:{col + 3} with linespoints lw 2 pt 5 title "kube-proxy v1.34"
"""
            subprocess.run(["gnuplot"], input=script, text=True, check=True)
            print(f"wrote {png}")


if __name__ == "__main__":
    main()
