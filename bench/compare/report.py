#!/usr/bin/env python3
"""Tables and plots from bench/compare results: report.py DIR [--since ISO-DATE] [--inputs DIR...].

Reads DIR/results.jsonl (compare.py's output), writes DIR/report.md (one table per mode:
median of the runs with min-max, kproxy against upstream kube-proxy, and the ratio) and, with
gnuplot, DIR/sync-<mode>-x<E>.png, DIR/memory-<mode>-x<E>.png and DIR/change-<mode>-x<E>.png
against cluster size.

With --inputs, the results come from those directories instead, and each cell (mode, size,
program) takes the runs of the one directory whose newest run of it is the newest: medians
are never taken across directories, and the table names each cell's directory and version.
A first sync that every run gave up on at the harness's cap is shown as "> cap", and plotted
apart at the cap.
"""
import argparse
import json
import math
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


def source_name(directory):
    """A results directory's name, with its parent's when that is not results/ (runs kept
    beside each other in one day's directory)."""
    path = os.path.normpath(os.path.abspath(directory))
    parent = os.path.basename(os.path.dirname(path))
    name = os.path.basename(path)
    return name if parent == "results" else f"{parent}/{name}"


def read_rows(directory, since):
    rows = [json.loads(l) for l in open(os.path.join(directory, "results.jsonl")) if l.strip()]
    for r in rows:
        r["_from"] = source_name(directory)
    return [r for r in rows if r.get("date", "") >= since]


def group_rows(rows):
    groups = defaultdict(list)
    for r in rows:
        groups[(r["mode"], r["services"], r["endpoints"], r["program"])].append(r)
    return groups


def newest_groups(directories, since):
    """Each (mode, size, program) from the directory holding its newest run."""
    best = {}
    for d in directories:
        for key, rs in group_rows(read_rows(d, since)).items():
            newest = max(r.get("date", "") for r in rs)
            if key not in best or newest > best[key][0]:
                best[key] = (newest, rs)
    return {key: rs for key, (_, rs) in best.items()}


def capped(rs):
    """The cap, when every run of a cell gave up on the first sync there."""
    caps = [r.get("first_sync_capped_s") for r in rs]
    return max(caps) if rs and all(caps) else None


# What a capped run records instead, for the rows that have it (compare.py). Not its CPU: a
# program stopped at the cap has not reaped the children (`nft`, `iptables-restore`) doing its
# work, so the CPU it reports there says nothing.
AT_CAP = {"peak RSS": "peak_rss_at_cap_mib"}


def first_sync_cell(rs, get, unit):
    """The first sync's summary, or "> cap" when every run gave up on it at the cap."""
    cap = capped(rs)
    if cap is not None:
        return f"> {fmt(cap, unit)} (capped)", None, cap
    text, med = summary([get(r) for r in rs], unit)
    return text, med, None


def source_cell(rs):
    if not rs:
        return "–"
    versions = sorted({r.get("version", "").split()[-1] for r in rs if r.get("version")})
    return f"{rs[0]['_from']} ({', '.join(versions) or 'no version'})"


def table(groups, mode, scales, sources):
    out = ["| | " + " | ".join(f"{s}×{e} kproxy | {s}×{e} upstream | ratio" for s, e in scales) + " |",
           "|" + "---|" * (1 + 3 * len(scales))]
    extra = [("programming latency p50", None, "ms"), ("programming latency p99", None, "ms"),
             ("runs (capped or failed)", None, "")]
    if sources:
        extra.append(("from (results directory, version)", None, ""))
    for label, get, unit in METRICS + extra:
        cells = []
        for s, e in scales:
            meds, caps = {}, {}
            for prog in ("kproxy", "upstream"):
                rs = groups.get((mode, s, e, prog), [])
                if label.startswith("programming latency"):
                    raw = [x for r in rs for x in (r.get("latency") or {}).get("raw_ms", [])]
                    v = pct(raw, 50 if "p50" in label else 99)
                    miss = sum((r.get("latency") or {}).get("missing", 0) for r in rs)
                    cells.append(f"{fmt(v, unit)} (n={len(raw)}{f', {miss} missed' if miss else ''})" if raw else "–")
                    meds[prog] = v
                elif label.startswith("runs"):
                    bad = sum(1 for r in rs if "error" in r or "first_sync_capped_s" in r)
                    cap = max((r.get("first_sync_capped_s", 0) for r in rs), default=0)
                    cells.append(f"{len(rs)} ({bad}{f', cap {cap:.0f} s' if cap else ''})")
                    meds[prog] = None
                elif label.startswith("from"):
                    cells.append(source_cell(rs))
                    meds[prog] = None
                elif label.startswith("first sync"):
                    text, meds[prog], caps[prog] = first_sync_cell(rs, get, unit)
                    cells.append(text)
                elif label in AT_CAP and capped(rs) is not None:
                    # Every run capped: what the program held or used until the cap, a lower bound.
                    text, caps[prog] = summary([r.get(AT_CAP[label]) for r in rs], unit)
                    cells.append("–" if caps[prog] is None else f"≥ {text} (at the cap)")
                    meds[prog] = None
                else:
                    text, meds[prog] = summary([get(r) for r in rs], unit)
                    cells.append(text)
            k, u = meds.get("kproxy"), meds.get("upstream")
            if k and u:
                cells.append(f"{u / k:.1f}×")
            elif k and caps.get("upstream"):
                bound = ">" if label.startswith("first sync") else "≥"
                cells.append(f"{bound} {caps['upstream'] / k:.1f}×")
            else:
                cells.append("")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def plot_points(groups, mode, scales):
    """Per size: each program's medians of first sync, peak RSS and one endpoint changed, then
    upstream's cap where every run of it gave up on the first sync (else NaN)."""
    pts = []
    for s, e in scales:
        row = [s]
        for prog in ("kproxy", "upstream"):
            rs = groups.get((mode, s, e, prog), [])
            for get in (lambda r: r.get("first_sync_s"), lambda r: r.get("peak_rss_mib"),
                        lambda r: (r.get("one_endpoint") or {}).get("wall_ms")):
                vals = [get(r) for r in rs if get(r) is not None]
                row.append(statistics.median(vals) if vals else float("nan"))
        cap = capped(groups.get((mode, s, e, "upstream"), []))
        row.append(cap if cap is not None else float("nan"))
        pts.append(row)
    return pts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", help="where report.md and the plots go; its results.jsonl is read unless --inputs")
    ap.add_argument("--since", default="", help="only results dated at or after this (ISO 8601)")
    ap.add_argument("--inputs", nargs="+", metavar="DIR",
                    help="results directories to draw from; each cell takes the runs of the directory "
                         "with its newest run")
    args = ap.parse_args()
    if args.inputs:
        groups = newest_groups(args.inputs, args.since)
    else:
        groups = group_rows(read_rows(args.dir, args.since))
    rows = [r for rs in groups.values() for r in rs]
    if not rows:
        raise SystemExit("no results")
    modes = sorted({k[0] for k in groups}, key=lambda m: ["nftables", "iptables", "ipvs"].index(m)
                   if m in ("nftables", "iptables", "ipvs") else 9)
    out = []
    versions = sorted({r.get("version", "") for r in rows if r.get("version")})
    dates = [r["date"] for r in rows if r.get("date")]
    out.append(f"Programs: {', '.join(versions)}. Dates: {min(dates)} to {max(dates)}.\n")
    plots = {}
    for mode in modes:
        for e in sorted({k[2] for k in groups if k[0] == mode}):
            scales = sorted({(k[1], k[2]) for k in groups if k[0] == mode and k[2] == e})
            out.append(f"\n#### {mode} mode, {e} endpoints per Service\n")
            out.extend(table(groups, mode, scales, bool(args.inputs)))
            plots[(mode, e)] = plot_points(groups, mode, scales)
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
                    "upstream_change_ms upstream_capped_s\n")
            for row in pts:
                f.write(" ".join(str(x) for x in row) + "\n")
        for what, col, ylabel, name in (("first full sync", 2, "seconds (log)", "sync"),
                                         ("peak RSS", 3, "MiB", "memory"),
                                         ("one endpoint changed, API write to kernel", 4, "milliseconds (log)",
                                          "change")):
            png = os.path.join(args.dir, f"{name}-{mode}-x{e}.png")
            logy = "set logscale y" if name != "memory" else "set yrange [0:*]"
            # A first sync upstream never finished: a point at the cap, marked as a lower bound.
            cap = "" if name != "sync" or all(math.isnan(r[-1]) for r in pts) else (
                f', \\\n     "{data}" using 1:8 with points pt 9 ps 2 title "kube-proxy v1.34: not done at the cap"')
            script = f"""
set terminal pngcairo size 720,440 font ",10"
set output "{png}"
set title "{mode} mode: {what} ({e} endpoints per Service)"
set xlabel "Services"
set ylabel "{ylabel}"
set logscale x
{logy}
set offsets 0, 0, graph 0.1, 0
set key top left
set grid
plot "{data}" using 1:{col} with linespoints lw 2 pt 7 title "kproxy", \\
     "{data}" using 1:{col + 3} with linespoints lw 2 pt 5 title "kube-proxy v1.34"{cap}
"""
            subprocess.run(["gnuplot"], input=script, text=True, check=True)
            print(f"wrote {png}")


if __name__ == "__main__":
    main()
