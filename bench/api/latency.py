#!/usr/bin/env python3
"""Network programming latency: API write returned -> the kernel holds the change.

Runs inside the node's network namespace (where the apiserver's loopback and kproxy's nftables
table are). Loads N Services with one endpoint each, waits until kproxy has programmed them, then
changes one Service's endpoint M times, each time to an address never used before, and times
from the PATCH's response to the first `nft monitor` line that carries the new address.
"""
import argparse
import http.client
import json
import re
import ssl
import subprocess
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pki", required=True)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--raw", help="write one line per change: wall time, address, latency ms (or 'missing')")
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--interval", type=float, default=1.1,
                    help="seconds between changes; above kproxy's min sync period (1 s by default) so each change is timed alone")
    args = ap.parse_args()

    ctx = ssl.create_default_context(cafile=f"{args.pki}/ca.crt")
    ctx.load_cert_chain(f"{args.pki}/admin.crt", f"{args.pki}/admin.key")
    conn = http.client.HTTPSConnection("127.0.0.1", args.port, context=ctx)

    def call(method, path, body=None, ctype="application/json"):
        headers = {"Content-Type": ctype} if body is not None else {}
        for attempt in range(5):
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status < 400:
                return data
            # A loaded etcd on a shared machine times out now and then; that is not kproxy's latency.
            if r.status not in (429, 500, 503, 504) or attempt == 4:
                raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
            print(f"retrying {method} {path}: {r.status}", file=sys.stderr)
            time.sleep(0.5)

    def slice_body(name, svc, ip):
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": "default",
                             "labels": {"kubernetes.io/service-name": svc}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}

    def ip_of(k):  # unique per k, never an address used at load time (those are 10.245.x.y)
        return f"10.246.{k // 250}.{k % 250 + 1}"

    t0 = time.time()
    for i in range(args.services):
        name = f"bench-{i}"
        call("POST", "/api/v1/namespaces/default/services",
             {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
              "spec": {"clusterIP": f"10.96.{100 + i // 250}.{i % 250 + 1}",
                       "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
        call("POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
             slice_body(f"{name}-1", name, f"10.245.{i // 250}.{i % 250 + 1}"))
    print(f"loaded {args.services} services in {time.time() - t0:.1f} s", file=sys.stderr)

    # Wait until the last loaded service is in the kernel.
    last = f"10.245.{(args.services - 1) // 250}.{(args.services - 1) % 250 + 1}"
    deadline = time.time() + 120
    while time.time() < deadline:
        out = subprocess.run(["nft", "list", "table", "ip", "kube-proxy"], capture_output=True, text=True).stdout
        if re.search(re.escape(last) + r"[^0-9]", out):
            break
        time.sleep(0.5)
    else:
        raise SystemExit("services were not programmed within 120 s")
    print(f"all services programmed {time.time() - t0:.1f} s after the first write", file=sys.stderr)

    seen = {}
    lock = threading.Lock()
    addr_re = re.compile(r"10\.246\.\d+\.\d+")
    mon = subprocess.Popen(["nft", "monitor", "rules"], stdout=subprocess.PIPE, text=True, bufsize=1)

    def reader():
        for line in mon.stdout:
            now = time.monotonic()
            for a in addr_re.findall(line):
                with lock:
                    seen.setdefault(a, now)

    threading.Thread(target=reader, daemon=True).start()
    time.sleep(0.5)  # let the monitor subscribe

    latencies = []
    raw = []
    missing = 0
    for k in range(args.changes):
        svc = k % args.services
        ip = ip_of(k)
        call("PATCH", f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/bench-{svc}-1",
             slice_body(f"bench-{svc}-1", f"bench-{svc}", ip), "application/merge-patch+json")
        written = time.monotonic()
        end = written + 5
        while time.monotonic() < end:
            with lock:
                t = seen.get(ip)
            if t is not None:
                latencies.append((t - written) * 1000)
                raw.append(f"{time.time():.3f} {ip} {latencies[-1]:.1f}")
                break
            time.sleep(0.0005)
        else:
            missing += 1
            raw.append(f"{time.time():.3f} {ip} missing")
        time.sleep(args.interval)
    mon.terminate()
    if args.raw:
        with open(args.raw, "w") as f:
            f.write("\n".join(raw) + "\n")
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(round(p / 100 * (len(latencies) - 1))))]

    result = {"services": args.services, "changes": args.changes, "measured": len(latencies),
              "missing": missing, "p50_ms": round(pct(50), 1), "p90_ms": round(pct(90), 1),
              "p99_ms": round(pct(99), 1), "max_ms": round(latencies[-1], 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
