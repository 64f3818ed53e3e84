#!/usr/bin/env python3
"""The cluster benchmark's report (bench/cluster/run.sh): from OUT/results.jsonl, one Markdown
table per scenario with a row per program and mode (requests, failed requests by kind, the
requests counted apart: refusals in a scale-to-zero window, which lasts until every node has
programmed the return, and UDP lost in flight to an exiting pod; programming time p50 / p99 over
every node and change, the slowest node of the slowest change),
printed and written to OUT/report.md; with gnuplot, OUT/failed-<scenario>.png: failed requests
per second over the scenario's time, a line per program and mode.

usage: report.py OUT
"""
import json
import os
import shutil
import subprocess
import sys


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, -(-len(v) * p // 100) - 1))] if v else None


def ms(seconds):
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def table(rows):
    out = ["| program, mode | requests | failed (by kind) | not failed: refused at zero, lost in flight | "
           "programming p50 / p99 ms | every node agreed, slowest change ms |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        requests = sum(ld["requests"] for ld in r["loads"])
        kinds = {}
        for ld in r["loads"]:
            for k, v in ld["failures"].items():
                kinds[k] = kinds.get(k, 0) + v
        failed = sum(kinds.values())
        apart = [sum(ld["counts"].get(k, 0) for ld in r["loads"])
                 for k in ("refused-expected (zero window)", "udp-lost-in-flight-to-exiting-pod (inherent)")]
        times = [v for c in r["changes"] for v in c["seconds"].values()]
        slowest = max((max(c["seconds"].values()) for c in r["changes"]), default=None)
        out.append(f"| {r['program']} {r['mode']} | {requests:,} | {failed}"
                   + (f" ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})" if kinds else "")
                   + f" | {apart[0]:,}, {apart[1]:,}"
                   + f" | {ms(percentile(times, 50))} / {ms(percentile(times, 99))} | {ms(slowest)} |")
    return "\n".join(out)


def plot(out_dir, scenario, rows):
    data, series, top = [], [], 1
    for r in rows:
        seconds = max((ld["seconds"] for ld in r["loads"]), default=0)
        bins = [0] * (int(seconds) + 1)
        for ld in r["loads"]:
            for t in ld["failed_at"]:
                bins[min(int(t), len(bins) - 1)] += 1
        path = os.path.join(out_dir, f"failed-{scenario}-{r['program']}-{r['mode']}.dat")
        with open(path, "w") as f:
            f.writelines(f"{i} {n}\n" for i, n in enumerate(bins))
        data.append(path)
        top = max(top, max(bins))
        series.append(f"{r['program']} {r['mode']}")
    png = os.path.join(out_dir, f"failed-{scenario}.png")
    script = (f'set terminal pngcairo size 720,360 font ",10"\nset output "{png}"\n'
              f'set title "{scenario}: failed requests per second (every load of the scenario)"\n'
              'set xlabel "seconds since the loads started"\nset ylabel "failed requests"\n'
              f"set yrange [0:{top + 1}]\n"
              "set key top right\nplot " + ", ".join(f'"{d}" using 1:2 with steps lw 2 title "{s}"'
                                                  for d, s in zip(data, series)) + "\n")
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    for d in data:
        os.remove(d)
    return png


def main():
    out_dir = sys.argv[1]
    with open(os.path.join(out_dir, "results.jsonl")) as f:
        results = [json.loads(line) for line in f if line.strip()]
    scenarios = []
    for r in results:
        if r["scenario"] not in scenarios:
            scenarios.append(r["scenario"])
    text = []
    meta = os.path.join(out_dir, "meta.txt")
    if os.path.exists(meta):
        with open(meta) as f:
            text.append("```\n" + f.read().rstrip() + "\n```\n")
    can_plot = shutil.which("gnuplot") is not None
    for sc in scenarios:
        rows = [r for r in results if r["scenario"] == sc]
        text.append(f"### {sc} ({rows[0]['nodes']} nodes, {rows[0]['services']:,} background Services)\n")
        text.append(table(rows) + "\n")
        for r in rows:
            for note in r["notes"]:
                text.append(f"- {r['program']} {r['mode']}: {note}")
        if can_plot:
            text.append(f"\n![{sc}]({os.path.basename(plot(out_dir, sc, rows))})\n")
        text.append("")
    if not can_plot:
        text.append("gnuplot not found: no plots")
    report = "\n".join(text)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
