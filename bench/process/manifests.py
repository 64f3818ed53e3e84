#!/usr/bin/env python3
"""Writes SERVICES ClusterIP Services with ENDPOINTS ready endpoints each (one EndpointSlice
per Service, 10% with ClientIP affinity) and the Node NODE as one JSON List in OUTDIR/all.json,
for kproxy --manifests.

usage: manifests.py OUTDIR SERVICES ENDPOINTS NODE NODE_IP
"""
import json
import os
import sys


def main() -> None:
    out, services, endpoints, node, node_ip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.makedirs(out, exist_ok=True)
    items = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
              "status": {"addresses": [{"type": "InternalIP", "address": node_ip}]}}]
    for i in range(services):
        ip = f"172.{16 + i // 65536}.{(i // 256) % 256}.{i % 256}"
        spec = {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]}
        if i % 10 == 0:
            spec["sessionAffinity"] = "ClientIP"
        items.append({"apiVersion": "v1", "kind": "Service",
                      "metadata": {"namespace": "bench", "name": f"svc-{i}"}, "spec": spec})
        eps = []
        for e in range(endpoints):
            k = i * endpoints + e
            eps.append({"addresses": [f"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"],
                        "nodeName": f"node-{k % 50}",
                        "conditions": {"ready": True, "serving": True, "terminating": False}})
        items.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                      "metadata": {"namespace": "bench", "name": f"svc-{i}-0",
                                   "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
                      "addressType": "IPv4",
                      "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
                      "endpoints": eps})
    with open(os.path.join(out, "all.json"), "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)


if __name__ == "__main__":
    main()
