#!/usr/bin/env python3
"""What a one-endpoint change costs iptables-nft in upstream's nat layout, and in layouts that
would have fewer chains or fewer entry points, on the same services.

Each commit that adds a rule with a jump or an xtables target makes the kernel validate the
whole table from its base chains (nft_table_validate). This program measures how much of a
one-endpoint change that is, and whether a layout without KUBE-SEP- chains (DNAT in the
KUBE-SVC- chain, which breaks upstream's chain names) would bring it under a target:

  upstream        KUBE-SERVICES from PREROUTING and OUTPUT; KUBE-SVC- jumps to one KUBE-SEP- per
                  endpoint (its hairpin mark and DNAT), as upstream kube-proxy and kproxy write it
  no-sep          the same rules, the endpoint's two written straight into KUBE-SVC-
  one-hook        upstream's, but only PREROUTING jumps to KUBE-SERVICES (half the walk's entry
                  points; not a usable layout, it shows what each entry point costs)

For each layout: a fresh table of SERVICES x ENDPOINTS restored at once, then CHANGES
one-endpoint changes, each `iptables-nft-restore --noflush` of one service's chains (the
endpoint replaced; upstream's layout also deletes the old KUBE-SEP-), timed from the tool's
start to its exit. An empty `*nat COMMIT` gives the tool's own fixed cost.

Runs in a network namespace of its own (removed at the end, even on failure); needs root and
iptables-nft. usage: layout_cost.py [--services N] [--endpoints E] [--changes C]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

LAYOUTS = ("upstream", "no-sep", "one-hook")


def vip(i):
    return f"172.30.{i // 250}.{i % 250 + 1}"


def endpoint(i, e, endpoints):
    n = i * endpoints + e
    return f"10.{128 + n // 62500}.{(n % 62500) // 250}.{n % 250 + 1}"


def service_rules(layout, i, endpoints, changed, declare):
    """KUBE-SVC-i's rules (and KUBE-SEP- chains, declared into `declare`). `changed`: the first
    endpoint is replaced by a new address (a new KUBE-SEP- in upstream's layout)."""
    rules = [f"-A KUBE-SVC-{i} ! -s 10.128.0.0/9 -d {vip(i)}/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ"]
    for e in range(endpoints):
        new = changed and e == 0
        address = f"10.250.{i // 250}.{i % 250 + 1}" if new else endpoint(i, e, endpoints)
        left = endpoints - e
        statistic = f"-m statistic --mode random --probability {1 / left:.11f} " if left > 1 else ""
        if layout == "no-sep":
            rules.append(f"-A KUBE-SVC-{i} -s {address}/32 -j KUBE-MARK-MASQ")
            rules.append(f"-A KUBE-SVC-{i} {statistic}-p tcp -m tcp -j DNAT --to-destination {address}:8080")
            continue
        sep = f"KUBE-SEP-{i}-{e}" + ("-new" if new else "")
        declare.append(f":{sep} - [0:0]")
        rules.append(f"-A KUBE-SVC-{i} {statistic}-j {sep}")
        rules.append(f"-A {sep} -s {address}/32 -j KUBE-MARK-MASQ")
        rules.append(f"-A {sep} -p tcp -m tcp -j DNAT --to-destination {address}:8080")
    return rules


def full_table(layout, services, endpoints):
    declare = ["*nat", ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":KUBE-SERVICES - [0:0]",
               ":KUBE-MARK-MASQ - [0:0]"]
    rules = ["-A PREROUTING -j KUBE-SERVICES", "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"]
    if layout != "one-hook":
        rules.append("-A OUTPUT -j KUBE-SERVICES")
    for i in range(services):
        declare.append(f":KUBE-SVC-{i} - [0:0]")
        rules.append(f"-A KUBE-SERVICES -d {vip(i)}/32 -p tcp -m comment --comment \"ns/svc-{i}\" "
                     f"-m tcp --dport 80 -j KUBE-SVC-{i}")
        rules += service_rules(layout, i, endpoints, False, declare)
    return "\n".join(declare + rules + ["COMMIT", ""])


def change(layout, i, endpoints):
    """Service i's first endpoint replaced (each service is changed once)."""
    declare = ["*nat", f":KUBE-SVC-{i} - [0:0]"]
    rules = service_rules(layout, i, endpoints, True, declare)
    if layout != "no-sep":
        declare.append(f":KUBE-SEP-{i}-0 - [0:0]")  # flushed, then deleted, as upstream
        rules.append(f"-X KUBE-SEP-{i}-0")
    return "\n".join(declare + rules + ["COMMIT", ""])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=2)
    ap.add_argument("--changes", type=int, default=30)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("layout_cost.py: needs root (it creates a network namespace)")
    if args.changes > args.services:
        sys.exit("layout_cost.py: --changes must not exceed --services (each service changes once)")
    ns = f"kproxy-layout-{os.getpid()}"

    def run(*cmd, text=None):
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], input=text, text=True, check=True,
                              capture_output=True)

    def restore(text, noflush=True):
        # The full table goes in without --noflush (the table was just emptied; iptables-nft
        # 1.8.9's --noflush is quadratic in one input's size), each change with it.
        started = time.perf_counter()
        run("iptables-nft-restore", *(["--noflush"] if noflush else []), "-w", text=text)
        return (time.perf_counter() - started) * 1000

    print(f"# {args.services} services x {args.endpoints} endpoints, {args.changes} changes; "
          f"kernel {os.uname().release}; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; load {os.getloadavg()}")
    print("layout    chains   full_ms  empty_commit_ms  change_ms median [min-max]")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for layout in args.layouts.split(","):
            if layout not in LAYOUTS:
                sys.exit(f"layout_cost.py: unknown layout {layout!r} ({', '.join(LAYOUTS)})")
            run("iptables-nft", "-t", "nat", "-F")
            run("iptables-nft", "-t", "nat", "-X")
            full = restore(full_table(layout, args.services, args.endpoints), noflush=False)
            empty = [restore("*nat\nCOMMIT\n") for _ in range(10)]
            step = max(1, args.services // args.changes)
            changes = [restore(change(layout, k * step, args.endpoints)) for k in range(args.changes)]
            chains = run("nft", "list", "chains", "ip").stdout.count("chain ")
            print(f"{layout:9} {chains:6} {full:9.0f} {statistics.median(empty):16.1f}  "
                  f"{statistics.median(changes):.1f} [{min(changes):.1f}-{max(changes):.1f}]", flush=True)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    main()
