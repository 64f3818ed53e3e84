#!/usr/bin/env python3
"""Makes a real kube-apiserver hold the objects of manifest files, the very files kproxy reads
with --manifests: Nodes, Services and EndpointSlices (multi-document YAML).

What the apiserver already holds as the files say is kept; what differs is deleted and created
again; what is missing is created; and the Services and EndpointSlices of the --prune namespaces
that no file names are deleted. So one call after another turns the cluster of one set of files
into that of the next, doing only the difference (S Services, then S' > S: only S' - S created).
A Node's or Service's status in a file is written after its creation (the apiserver drops it on
create). Namespaces the files name are created.

Objects are written over several HTTPS connections at once (one thread each, as load_objects.py):
one connection is bound by the server's round trip, not by the client.

usage: sync_manifests.py --port PORT --pki DIR [--prune NS[,NS...]] [--connections N] FILE...
Prints "created=N deleted=N kept=N seconds=T client_cpu_s=C" on stdout (C: this program's own
CPU time, parsing the files and its side of the requests).
"""
import argparse
import json
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/e2e"))
import kube_api  # noqa: E402  (tests/e2e/kube_api.py)

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# kind -> (API prefix, resource, namespaced, has a status subresource)
KINDS = {
    "Node": ("/api/v1", "nodes", False, True),
    "Service": ("/api/v1", "services", True, True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True, False),
}
# Deleted in this order (a Service's slices before it), created in the reverse.
ORDER = ["EndpointSlice", "Service", "Node"]


def collection(kind, ns):
    prefix, resource, namespaced, _ = KINDS[kind]
    return f"{prefix}/namespaces/{ns}/{resource}" if namespaced else f"{prefix}/{resource}"


def subset(want, have):
    """Everything WANT says, HAVE says too (HAVE may say more: defaults the apiserver adds)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(subset, want, have))
    return want == have


def same(want, have):
    if not subset(want["metadata"].get("labels", {}), have["metadata"].get("labels") or {}):
        return False
    return all(subset(v, have.get(k)) for k, v in want.items() if k not in ("apiVersion", "kind", "metadata"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pki", required=True)
    ap.add_argument("--prune", default="", help="namespaces whose other Services and EndpointSlices go")
    ap.add_argument("--connections", type=int, default=12)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    t0 = time.time()

    # (kind, namespace or "", name) -> the object as compact JSON: at 100,000 Services the parsed
    # objects would take some 700 MB, their text a fifth of that.
    want = {}
    for f in args.files:
        with open(f) as fh:
            for doc in yaml.load_all(fh, Loader=LOADER):
                if not doc:
                    continue
                kind = doc.get("kind")
                if kind not in KINDS:
                    sys.exit(f"{f}: kind {kind!r} is not handled")
                ns = doc["metadata"].get("namespace", "default") if KINDS[kind][2] else ""
                want[(kind, ns, doc["metadata"]["name"])] = json.dumps(doc, separators=(",", ":"))
    api = kube_api.Api(args.port, args.pki)
    namespaces = sorted({ns for (_, ns, _) in want if ns} | {ns for ns in args.prune.split(",") if ns})
    for ns in namespaces:
        api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                 ok=(409,))

    # What the apiserver holds is compared as it is listed: only the keys are kept (at 100,000
    # Services the objects themselves would take gigabytes).
    present, stale = set(), []
    for kind in KINDS:
        scopes = namespaces if KINDS[kind][2] else [""]
        for ns in scopes:
            for o in api.list(collection(kind, ns)):
                key = (kind, ns, o["metadata"]["name"])
                # Cluster-scoped objects are ours only when a file names them.
                if not KINDS[kind][2] and key not in want:
                    continue
                present.add(key)
                if key not in want or not same(json.loads(want[key]), o):
                    stale.append(key)
    stale_set = set(stale)
    missing = [k for k in want if k not in present or k in stale_set]
    kept = len(want) - len(missing)

    def delete(key):
        kind, ns, name = key
        api.call("DELETE", f"{collection(kind, ns)}/{name}", ok=(404,))

    def create(key):
        kind, ns, name = key
        api.call("POST", collection(kind, ns), want[key], ok=(409,))
        status = json.loads(want[key]).get("status") if KINDS[kind][3] else None
        if status is not None:
            api.call("PATCH", f"{collection(kind, ns)}/{name}/status", {"status": status},
                     ctype="application/merge-patch+json")

    with ThreadPoolExecutor(args.connections) as pool:
        for kind in ORDER:
            list(pool.map(delete, [k for k in stale if k[0] == kind]))
        for kind in reversed(ORDER):
            list(pool.map(create, [k for k in missing if k[0] == kind]))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"created={len(missing)} deleted={len(stale)} kept={kept} seconds={time.time() - t0:.1f} "
          f"client_cpu_s={ru.ru_utime + ru.ru_stime:.1f}")


if __name__ == "__main__":
    main()
