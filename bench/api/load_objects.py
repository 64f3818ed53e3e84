#!/usr/bin/env python3
"""Loads SERVICES ClusterIP Services with ENDPOINTS ready endpoints each into a real
kube-apiserver, the same shape as bench/process/manifests.py writes for --manifests: one
EndpointSlice per Service, 10% of the Services with ClientIP affinity, and the Node NODE.

With --mix, the Services vary as in a real cluster instead: 10% LoadBalancer (with an ingress
IP in their status), 15% NodePort, a third of those with externalTrafficPolicy Local, 5% with an
externalIP, 20% with two ports, 5% with ClientIP affinity, 2% UDP, 5% with their last endpoint
terminating. That needs more NodePorts than the default range holds (--service-node-port-range).

The apiserver allocates the ClusterIPs and NodePorts. Objects are created over several HTTPS
connections at once (one thread each): one connection is bound by the server's round trip, not
by the client.

usage: load_objects.py --port PORT --pki DIR --services N --endpoints E --node NAME --node-ip IP [--mix]
"""
import argparse
import http.client
import json
import ssl
import sys
import threading
import time

NAMESPACE = "bench"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pki", required=True)
    ap.add_argument("--services", type=int, required=True)
    ap.add_argument("--endpoints", type=int, required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--node-ip", required=True)
    ap.add_argument("--connections", type=int, default=12)
    ap.add_argument("--mix", action="store_true", help="varied Services (see above)")
    args = ap.parse_args()

    ctx = ssl.create_default_context(cafile=f"{args.pki}/ca.crt")
    ctx.load_cert_chain(f"{args.pki}/admin.crt", f"{args.pki}/admin.key")

    def connect():
        return http.client.HTTPSConnection("127.0.0.1", args.port, context=ctx, timeout=60)

    def create(conn, path, body):
        return request(conn, "POST", path, body, "application/json")

    def request(conn, method, path, body, ctype):
        """One write, retrying what a loaded apiserver answers now and then; an existing object
        (409, from a retried POST that had succeeded) counts as created."""
        data = json.dumps(body)
        for attempt in range(10):
            try:
                conn.request(method, path, body=data, headers={"Content-Type": ctype})
                r = conn.getresponse()
                answer = r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = connect()
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status < 300 or r.status == 409:
                return conn
            if r.status not in (429, 500, 503, 504):
                raise RuntimeError(f"{method} {path}: {r.status} {answer[:300]!r}")
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"{method} {path}: gave up after 10 attempts")

    conn = connect()
    conn = create(conn, "/api/v1/nodes",
                  {"apiVersion": "v1", "kind": "Node", "metadata": {"name": args.node},
                   "status": {"addresses": [{"type": "InternalIP", "address": args.node_ip}]}})
    conn = create(conn, "/api/v1/namespaces",
                  {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    conn.close()

    def kind(i):
        r = i % 100
        return "LoadBalancer" if r < 10 else "NodePort" if r < 25 else "ClusterIP"

    def protocol(i):
        return "UDP" if args.mix and i % 50 == 13 else "TCP"

    def two_ports(i):
        return args.mix and i % 5 == 0

    def service(i):
        spec = {"type": "ClusterIP",
                "ports": [{"name": "http", "protocol": protocol(i), "port": 80, "targetPort": 8080}]}
        if not args.mix:
            if i % 10 == 0:
                spec["sessionAffinity"] = "ClientIP"
        else:
            spec["type"] = kind(i)
            if two_ports(i):
                spec["ports"].append({"name": "https", "protocol": protocol(i), "port": 443, "targetPort": 8443})
            if i % 100 in range(25, 30):
                spec["externalIPs"] = [f"172.20.{i // 250 % 250}.{i % 250 + 1}"]
            if kind(i) != "ClusterIP" and i % 3 == 0:
                spec["externalTrafficPolicy"] = "Local"
            if i % 20 == 7:
                spec["sessionAffinity"] = "ClientIP"
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": NAMESPACE, "name": f"svc-{i}"}, "spec": spec}

    def lb_status(i):
        return {"status": {"loadBalancer": {"ingress": [{"ip": f"172.21.{i // 250 % 250}.{i % 250 + 1}"}]}}}

    def endpoint_slice(i):
        eps = []
        for e in range(args.endpoints):
            k = i * args.endpoints + e
            conditions = {"ready": True, "serving": True, "terminating": False}
            if args.mix and i % 20 == 3 and e == args.endpoints - 1:
                conditions = {"ready": False, "serving": True, "terminating": True}
            eps.append({"addresses": [f"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"],
                        "nodeName": args.node if args.mix and k % 50 == 0 else f"node-{k % 50}",
                        "conditions": conditions})
        ports = [{"name": "http", "protocol": protocol(i), "port": 8080}]
        if two_ports(i):
            ports.append({"name": "https", "protocol": protocol(i), "port": 8443})
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"namespace": NAMESPACE, "name": f"svc-{i}-0",
                             "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
                "addressType": "IPv4",
                "ports": ports,
                "endpoints": eps}

    failures = []

    def worker(first):
        try:
            c = connect()
            for i in range(first, args.services, args.connections):
                c = create(c, f"/api/v1/namespaces/{NAMESPACE}/services", service(i))
                if args.mix and kind(i) == "LoadBalancer":
                    c = request(c, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/services/svc-{i}/status", lb_status(i),
                                "application/merge-patch+json")
                c = create(c, f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
                           endpoint_slice(i))
            c.close()
        except Exception as e:  # reported once all threads are done
            failures.append(str(e))

    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit(f"loading failed: {failures[0]}")
    print(f"loaded {args.services} services x {args.endpoints} endpoints in {time.time() - t0:.1f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
