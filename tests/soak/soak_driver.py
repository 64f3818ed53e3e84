#!/usr/bin/env python3
"""The soak's driver: load, churn and check, against a real kube-apiserver.

Runs inside the node's network namespace (where the apiserver listens on its loopback and
kproxy's table lives). Sub-commands:

  load   create the base: Services (ClusterIP and NodePort, one or two ports) with an
         EndpointSlice each whose endpoints are the real pods and addresses that answer nothing
  churn  change Services and EndpointSlices as fast as a few keep-alive connections allow,
         until --seconds have passed or --stop-file exists; writes the counts as JSON
  check  compute the desired kernel state from the objects in the apiserver (not from kproxy's
         renderer), read table ip kube-proxy back with `nft -j`, and list every difference;
         exit 1 when there is one. An element or expression the reader does not understand is
         a difference, as is an endpoint-map element that no balancing chain's range holds. Also prints services to curl and the pods that may answer.
  kill-in-first-sync  SIGKILL a freshly started kproxy once it has listed Services and
         EndpointSlices, i.e. while it is building or committing its first full sync
  elements  list the elements of maps of table ip kube-proxy as `nft delete element` takes them

The reader of the kernel knows kproxy's table layout (map names, one balancing chain per
service port ending in `dnat ... numgen random mod 65535 offset BASE map @service-endpoints-N`),
but none of its code: what each Service port should resolve to is worked out here from the
Service and EndpointSlice objects alone.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time

NAMESPACE = "soak"
SLOTS = 65535  # numgen random mod 65535: the slot range of one balancing chain


# --- the apiserver ------------------------------------------------------------------------------
class Api:
    """An admin client on one keep-alive TLS connection (client certificate in system:masters)."""

    def __init__(self, port, pki):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
        self.ctx.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")
        self.conn = None
        self.retries = 0

    def _connect(self):
        self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)

    def call(self, method, path, body=None, ctype="application/json", ok_missing=False):
        """Returns (status, parsed body). Retries what a loaded etcd answers now and then."""
        headers = {"Content-Type": ctype} if body is not None else {}
        data = json.dumps(body) if body is not None else None
        for attempt in range(8):
            try:
                if self.conn is None:
                    self._connect()
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                raw = r.read()
            except (OSError, http.client.HTTPException):
                self.conn = None
                self.retries += 1
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status in (429, 500, 503, 504):
                self.retries += 1
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status >= 400 and not (ok_missing and r.status == 404):
                raise RuntimeError(f"{method} {path}: HTTP {r.status}: {raw[:300]!r}")
            return r.status, (json.loads(raw) if raw else None)
        raise RuntimeError(f"{method} {path}: gave up after retries")

    def list_all(self, path):
        items, cont = [], ""
        while True:
            _, body = self.call("GET", path + ("?limit=500" + (f"&continue={cont}" if cont else "")))
            items += body.get("items", [])
            cont = body.get("metadata", {}).get("continue", "")
            if not cont:
                return items


SVC_PATH = f"/api/v1/namespaces/{NAMESPACE}/services"
SLICE_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
MERGE = "application/merge-patch+json"


# --- the objects --------------------------------------------------------------------------------
class Model:
    """What one churn worker last wrote for the services it owns (for making the next change;
    the check never reads it)."""

    def __init__(self, node, real_ips, rng):
        self.node = node
        self.real = real_ips
        self.rng = rng

    def pick_endpoints(self, first_slice=True):
        """Endpoints for a service's first slice (real pods and addresses that answer nothing)
        or for its second one (only the latter, from another range): as the EndpointSlice
        controller does, no address is in two slices of a service. (Upstream resolves such a
        duplicate by map order, so its readiness would be undefined.)"""
        n = self.rng.choice([0, 1, 1, 2, 2, 3, 3, 4])
        net = "10.245" if first_slice else "10.246"
        fake = {f"{net}.{self.rng.randrange(0, 200)}.{self.rng.randrange(1, 250)}" for _ in range(3)}
        pool = (self.real if first_slice else []) + sorted(fake)
        addrs = self.rng.sample(pool, min(n, len(pool)))
        return [{"ip": a, "ready": self.rng.random() < 0.8} for a in addrs]


def service_body(name, ports, node_port):
    spec = {"type": "NodePort" if node_port else "ClusterIP",
            "ports": [{"name": f"p{i}", "port": p, "targetPort": 8080, "protocol": "TCP"} for i, p in enumerate(ports)]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def slice_body(name, service, nports, endpoints, node):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [e["ip"]], "nodeName": node,
                           "conditions": {"ready": e["ready"], "serving": e["ready"], "terminating": False}}
                          for e in endpoints],
            "ports": [{"name": f"p{i}", "port": 8080, "protocol": "TCP"} for i in range(nports)]}


class Service:
    def __init__(self, index, rng):
        self.index = index
        self.generation = 0
        self.rng = rng
        self.ports = [80 + rng.randrange(0, 50)] + ([8000 + rng.randrange(0, 50)] if rng.random() < 0.3 else [])
        self.node_port = rng.random() < 0.25
        self.slices = {}  # slice name -> endpoints

    @property
    def name(self):
        return f"s{self.index}-{self.generation}"

    def create(self, api, model):
        api.call("POST", SVC_PATH, service_body(self.name, self.ports, self.node_port))
        self.slices = {}
        return 1 + self.put_slice(api, model, f"{self.name}-a", create=True)

    def put_slice(self, api, model, slice_name, create=False, endpoints=None):
        eps = model.pick_endpoints(slice_name.endswith("-a")) if endpoints is None else endpoints
        body = slice_body(slice_name, self.name, len(self.ports), eps, model.node)
        if create:
            api.call("POST", SLICE_PATH, body)
        else:
            api.call("PATCH", f"{SLICE_PATH}/{slice_name}", body, MERGE)
        self.slices[slice_name] = eps
        return 1


def load(args):
    api = Api(args.port, args.pki)
    api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    rng = random.Random(args.seed)
    model = Model(args.node, args.real, rng)
    t0 = time.time()
    writes = 0
    for i in range(args.services):
        writes += Service(i, rng).create(api, model)
    print(json.dumps({"services": args.services, "writes": writes, "seconds": round(time.time() - t0, 1)}))


# --- churn --------------------------------------------------------------------------------------
def churn_worker(args, worker, stats, lock, stop):
    api = Api(args.port, args.pki)
    rng = random.Random(args.seed * 1000 + worker)
    model = Model(args.node, args.real, rng)
    # The worker owns services worker, worker+W, ...: it read them back from the apiserver first.
    mine = []
    for i in range(worker, args.services, args.workers):
        s = Service(i, rng)
        _, svc = api.call("GET", f"{SVC_PATH}/{s.name}")
        s.ports = [p["port"] for p in svc["spec"]["ports"]]
        s.node_port = svc["spec"]["type"] == "NodePort"
        s.slices = {f"{s.name}-a": []}
        mine.append(s)
    counts = {}

    def count(kind, n):
        counts[kind] = counts.get(kind, 0) + n
        with lock:
            stats["live"] += n  # what churn() watches while the workers run

    kinds = ["endpoints", "ready_flip", "service_port", "service_type", "recreate", "second_slice"]
    weights = [40, 25, 10, 8, 7, 10]
    errors = 0
    while not stop.is_set():
        s = rng.choice(mine)
        kind = rng.choices(kinds, weights)[0]
        try:
            if kind == "endpoints":
                count(kind, s.put_slice(api, model, rng.choice(sorted(s.slices))))
            elif kind == "ready_flip":
                name = rng.choice(sorted(s.slices))
                eps = [dict(e) for e in s.slices[name]]
                if not eps:
                    count(kind, s.put_slice(api, model, name))
                else:
                    e = rng.choice(eps)
                    e["ready"] = not e["ready"]
                    count(kind, s.put_slice(api, model, name, endpoints=eps))
            elif kind == "service_port":
                s.ports[0] = 80 + rng.randrange(0, 50)
                # The ports list is replaced whole; a NodePort service gets a new node port.
                api.call("PATCH", f"{SVC_PATH}/{s.name}", {"spec": service_body(s.name, s.ports, s.node_port)["spec"]}, MERGE)
                count(kind, 1)
            elif kind == "service_type":
                s.node_port = not s.node_port
                api.call("PATCH", f"{SVC_PATH}/{s.name}", {"spec": service_body(s.name, s.ports, s.node_port)["spec"]}, MERGE)
                count(kind, 1)
            elif kind == "recreate":
                for name in sorted(s.slices):
                    api.call("DELETE", f"{SLICE_PATH}/{name}", ok_missing=True)
                api.call("DELETE", f"{SVC_PATH}/{s.name}", ok_missing=True)
                n = len(s.slices) + 1
                s.generation += 1
                s.ports = [80 + rng.randrange(0, 50)] + ([8000 + rng.randrange(0, 50)] if rng.random() < 0.3 else [])
                count(kind, n + s.create(api, model))
            elif kind == "second_slice":
                second = f"{s.name}-b"
                if second in s.slices:
                    api.call("DELETE", f"{SLICE_PATH}/{second}", ok_missing=True)
                    del s.slices[second]
                    count(kind, 1)
                else:
                    count(kind, s.put_slice(api, model, second, create=True))
        except RuntimeError as e:
            errors += 1
            if errors <= 5:
                print(f"worker {worker}: {e}", file=sys.stderr)
    with lock:
        for k, v in counts.items():
            stats["by_kind"][k] = stats["by_kind"].get(k, 0) + v
        stats["errors"] += errors
        stats["retries"] += api.retries


def churn(args):
    stats = {"by_kind": {}, "errors": 0, "retries": 0, "live": 0}
    lock = threading.Lock()
    stop = threading.Event()
    workers = [threading.Thread(target=churn_worker, args=(args, w, stats, lock, stop)) for w in range(args.workers)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    end = t0 + args.seconds

    def changes():
        with lock:
            return stats["live"]

    # The stop file ends the churn once it has made --min-changes: on a busy machine the same
    # load takes longer, and the soak waits for it rather than racing the clock (--seconds is
    # the ceiling).
    while time.monotonic() < end and not (os.path.exists(args.stop_file) and changes() >= args.min_changes):
        time.sleep(0.2)
    stop.set()
    for w in workers:
        w.join()
    took = time.monotonic() - t0
    del stats["live"]
    stats["changes"] = sum(stats["by_kind"].values())
    stats["seconds"] = round(took, 1)
    stats["rate_per_s"] = round(stats["changes"] / took, 1)
    with open(args.out, "w") as f:
        json.dump(stats, f)
    print(json.dumps(stats))
    return 1 if stats["errors"] else 0


# --- the desired state, from the apiserver's objects -------------------------------------------
def desired_state(api):
    """{key: frozenset of "ip:port"} for every IPv4 Service port of the cluster.

    key: ("svc", clusterIP, proto, port) and ("nodeport", proto, nodePort). Upstream's rules:
    endpoints of the slices labelled with the Service's name whose port has the same name and
    protocol; ready endpoints (ready unset counts as ready); with none ready, the serving and
    terminating ones; none → an empty set (the kernel must reject)."""
    services = api.list_all("/api/v1/services")
    slices = api.list_all("/apis/discovery.k8s.io/v1/endpointslices")
    by_service = {}
    for sl in slices:
        if sl.get("addressType") != "IPv4":
            continue
        svc = sl["metadata"].get("labels", {}).get("kubernetes.io/service-name")
        if svc:
            by_service.setdefault((sl["metadata"]["namespace"], svc), []).append(sl)
    want, cluster_ips, meta = {}, set(), {}
    for svc in services:
        spec = svc["spec"]
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        cip = spec.get("clusterIP", "")
        if spec.get("type") == "ExternalName" or cip in ("", "None") or ":" in cip:
            continue
        cluster_ips.add(cip)
        for p in spec.get("ports", []):
            proto = p.get("protocol", "TCP").lower()
            ready, fallback = set(), set()
            for sl in by_service.get((ns, name), []):
                for sp in sl.get("ports") or []:
                    if sp.get("name", "") != p.get("name", "") or sp.get("protocol", "TCP").lower() != proto:
                        continue
                    for ep in sl.get("endpoints") or []:
                        c = ep.get("conditions", {})
                        addr = f"{ep['addresses'][0]}:{sp['port']}"
                        if c.get("ready", True) is not False:
                            ready.add(addr)
                        elif c.get("serving", True) is not False and c.get("terminating", False):
                            fallback.add(addr)
            eps = frozenset(ready or fallback)
            want[("svc", cip, proto, p["port"])] = eps
            meta[("svc", cip, proto, p["port"])] = f"{ns}/{name}:{p.get('name', '')}"
            if spec.get("type") in ("NodePort", "LoadBalancer") and p.get("nodePort"):
                want[("nodeport", proto, p["nodePort"])] = eps
                meta[("nodeport", proto, p["nodePort"])] = f"{ns}/{name}:{p.get('name', '')}"
    return want, cluster_ips, meta


# --- the kernel's state, from `nft -j list table ip kube-proxy` --------------------------------
class Unparsed(ValueError):
    """An element or expression of the listing that this reader does not understand: reported
    as a mismatch, never skipped."""


def unwrap(elem):
    """A set or map element's key: `{"elem": {"val": KEY, ...}}` (an element with a timeout, a
    counter or a comment) is KEY."""
    if isinstance(elem, dict) and "elem" in elem:
        if not isinstance(elem["elem"], dict) or "val" not in elem["elem"]:
            raise Unparsed(f"element {json.dumps(elem)}")
        return elem["elem"]["val"]
    return elem


def map_elements(name, elems):
    """The (key, value) pairs of map NAME's elements as `nft -j` lists them."""
    pairs = []
    for elem in elems:
        if not isinstance(elem, list) or len(elem) != 2:
            raise Unparsed(f"map {name}: element {json.dumps(elem)}")
        pairs.append((unwrap(elem[0]), elem[1]))
    return pairs


def concat(name, key, n):
    """The N parts of a concatenated key."""
    if not isinstance(key, dict) or not isinstance(key.get("concat"), list) or len(key["concat"]) != n:
        raise Unparsed(f"map {name}: key {json.dumps(key)} is not a concatenation of {n}")
    return key["concat"]


def goto_target(name, verdict):
    if not isinstance(verdict, dict) or not isinstance(verdict.get("goto"), dict) or "target" not in verdict["goto"]:
        raise Unparsed(f"map {name}: value {json.dumps(verdict)} is not a goto")
    return verdict["goto"]["target"]


def interval(key):
    if isinstance(key, int) and not isinstance(key, bool):
        return key, key
    if isinstance(key, dict) and isinstance(key.get("range"), list) and len(key["range"]) == 2:
        return key["range"][0], key["range"][1]
    if isinstance(key, dict) and isinstance(key.get("prefix"), dict):
        addr, length = key["prefix"].get("addr"), key["prefix"].get("len")
        if isinstance(addr, int) and isinstance(length, int):
            return addr, addr + (1 << (32 - length)) - 1
    raise Unparsed(f"interval key {json.dumps(key)}")


def endpoint(name, val):
    """An endpoint map's value, "ip:port"."""
    parts = concat(name, val, 2)
    if not isinstance(parts[0], str) or not isinstance(parts[1], int):
        raise Unparsed(f"map {name}: value {json.dumps(val)} is not address . port")
    return f"{parts[0]}:{parts[1]}"


def list_table():
    """(objects of table ip kube-proxy, None) or (None, why)."""
    out = subprocess.run(["nft", "-j", "list", "table", "ip", "kube-proxy"], capture_output=True, text=True)
    if out.returncode != 0:
        return None, f"table ip kube-proxy cannot be listed: {out.stderr.strip()}"
    return json.loads(out.stdout)["nftables"], None


def kernel_state():
    objs, why = list_table()
    if objs is None:
        return None, None, [why]
    maps, sets, chains = {}, {}, {}
    for o in objs:
        if "map" in o:
            maps[o["map"]["name"]] = o["map"].get("elem", [])
        elif "set" in o:
            sets[o["set"]["name"]] = o["set"].get("elem", [])
        elif "chain" in o:
            chains.setdefault(o["chain"]["name"], [])
        elif "rule" in o:
            chains.setdefault(o["rule"]["chain"], []).append(o["rule"]["expr"])
    problems = []

    # The endpoint maps' elements as slot intervals; one that cannot be read is a problem.
    slots = {}  # map name -> [(lo, hi, "ip:port")]
    for name, elems in maps.items():
        if not name.startswith("service-endpoints"):
            continue
        slots[name] = []
        try:
            pairs = map_elements(name, elems)
        except Unparsed as e:
            problems.append(f"unparsed {e}")
            continue
        for key, val in pairs:
            try:
                lo, hi = interval(key)
                slots[name].append((lo, hi, endpoint(name, val)))
            except Unparsed as e:
                problems.append(f"unparsed: map {name}: {e}")

    def balancing(chain, e):
        """The (map, base) a dnat expression balances over, or None and a problem."""
        m = e["dnat"].get("addr", {}).get("map", {}) if isinstance(e["dnat"], dict) else {}
        ng = m.get("key", {}).get("numgen", {}) if isinstance(m, dict) else {}
        name = str(m.get("data", "")).lstrip("@") if isinstance(m, dict) else ""
        if ng.get("mod") != SLOTS or name not in slots:
            problems.append(f"chain {chain}: unexpected dnat {json.dumps(e)}")
            return None
        return name, ng.get("offset", 0)

    # Every slot range a balancing chain (a dnat through numgen and a map) owns, in any chain;
    # an endpoint-map element outside all of them is stale.
    claimed = {}
    for chain, rules in chains.items():
        for expr in rules:
            for e in expr:
                addr = e.get("dnat", {}).get("addr") if isinstance(e, dict) and isinstance(e.get("dnat"), dict) else None
                if isinstance(addr, dict) and isinstance(addr.get("map"), dict) and "numgen" in addr["map"].get("key", {}):
                    b = balancing(chain, e)
                    if b:
                        claimed.setdefault(b[0], []).append(b[1])
    for name, elems in slots.items():
        bases = claimed.get(name, [])
        for lo, hi, ep in elems:
            if not any(base <= lo and hi < base + SLOTS for base in bases):
                problems.append(f"@{name}: element {lo}-{hi} : {ep} is in no balancing chain's slot range")

    def endpoints_of(chain, depth=0):
        """The endpoint set a chain balances over, or None (and a problem) when it does not."""
        if depth > 4 or chain not in chains:
            problems.append(f"chain {chain} missing")
            return None
        for expr in chains[chain]:
            for e in expr:
                if "dnat" in e:
                    b = balancing(chain, e)
                    if b is None:
                        return None
                    name, base = b
                    got, spans = set(), []
                    for lo, hi, ep in slots[name]:
                        if base <= lo and hi < base + SLOTS:
                            spans.append((lo, hi))
                            got.add(ep)
                        elif lo < base + SLOTS and hi >= base:
                            problems.append(f"chain {chain}: element {lo}-{hi} of @{name} straddles its range")
                    # Every slot of the chain's range must lead to an endpoint, or a connection
                    # would find no element and fall through.
                    spans.sort()
                    pos = base
                    for lo, hi in spans:
                        if lo != pos:
                            problems.append(f"chain {chain}: slots {pos}..{lo - 1} of @{name} lead nowhere")
                            break
                        pos = hi + 1
                    else:
                        if pos != base + SLOTS:
                            problems.append(f"chain {chain}: slots {pos}..{base + SLOTS - 1} of @{name} lead nowhere")
                    return frozenset(got)
                if "goto" in e:
                    return endpoints_of(e["goto"]["target"], depth + 1)
                if "jump" in e and e["jump"]["target"] != "mark-for-masquerade":
                    return endpoints_of(e["jump"]["target"], depth + 1)
        problems.append(f"chain {chain} has no dnat")
        return None

    have = {}

    def add(key, value, where):
        if key in have:
            problems.append(f"{key} is in two maps (also {where})")
        have[key] = value

    def each(name, n):
        """The (key parts, value) of map NAME's elements; what cannot be read is a problem."""
        try:
            pairs = map_elements(name, maps.get(name, []))
        except Unparsed as e:
            problems.append(f"unparsed {e}")
            return
        for key, val in pairs:
            try:
                yield concat(name, key, n), val
            except Unparsed as e:
                problems.append(f"unparsed {e}")

    def target(name, verdict):
        try:
            return goto_target(name, verdict)
        except Unparsed as e:
            problems.append(f"unparsed {e}")
            return None

    for (ip, proto, port), verdict in each("service-ips", 3):
        t = target("service-ips", verdict)
        add(("svc", ip, proto, port), endpoints_of(t) if t else None, "service-ips")
    for (ip, proto, port), verdict in each("no-endpoint-services", 3):
        t = target("no-endpoint-services", verdict)
        add(("svc", ip, proto, port), frozenset() if t == "reject-chain" else None, "no-endpoint-services")
    for (proto, port), verdict in each("service-nodeports", 2):
        t = target("service-nodeports", verdict)
        add(("nodeport", proto, port), endpoints_of(t) if t else None, "service-nodeports")
    for (proto, port), verdict in each("no-endpoint-nodeports", 2):
        t = target("no-endpoint-nodeports", verdict)
        add(("nodeport", proto, port), frozenset() if t == "reject-chain" else None, "no-endpoint-nodeports")
    cluster_ips = set()
    for e in sets.get("cluster-ips", []):
        try:
            ip = unwrap(e)
        except Unparsed as u:
            problems.append(f"unparsed: set cluster-ips: {u}")
            continue
        if isinstance(ip, str):
            cluster_ips.add(ip)
        else:
            problems.append(f"unparsed: set cluster-ips: element {json.dumps(e)}")
    return have, cluster_ips, list(dict.fromkeys(problems))


def elements(args):
    """Prints "MAP KEY" for every element of the maps named (or starting with --prefix), KEY
    as nft writes it in `nft delete element` ("10.96.0.1 . tcp . 80", "0-16383"). Exit 1, with
    the reason, for an element it cannot read."""
    objs, why = list_table()
    if objs is None:
        print(why, file=sys.stderr)
        return 1
    for o in objs:
        name = o.get("map", {}).get("name")
        if name is None or not (name in args.map or (args.prefix and name.startswith(args.prefix))):
            continue
        try:
            for key, _ in map_elements(name, o["map"].get("elem", [])):
                if isinstance(key, dict) and "concat" in key:
                    parts = key["concat"]
                    if not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in parts):
                        raise Unparsed(f"map {name}: key {json.dumps(key)}")
                    print(name, " . ".join(str(p) for p in parts))
                else:
                    lo, hi = interval(key)
                    print(name, f"{lo}-{hi}" if hi != lo else lo)
        except Unparsed as e:
            print(f"unparsed {e}", file=sys.stderr)
            return 1
    return 0


def check(args):
    api = Api(args.port, args.pki)
    want, want_cips, meta = desired_state(api)
    have, have_cips, problems = kernel_state()
    mismatches = list(problems)
    if have is not None:
        for key in sorted(set(want) | set(have), key=str):
            w, h = want.get(key), have.get(key, "absent")
            if key not in want:
                mismatches.append(f"{key}: in the kernel ({sorted(h) if h is not None else 'broken'}), not in the apiserver")
            elif h != w:
                shown = sorted(h) if isinstance(h, frozenset) else h
                mismatches.append(f"{key} ({meta[key]}): kernel {shown}, apiserver {sorted(w)}")
        for ip in sorted(want_cips ^ have_cips):
            mismatches.append(f"cluster-ips set: {ip} {'missing' if ip in want_cips else 'stale'}")
    for m in mismatches:
        print(f"MISMATCH {m}", file=sys.stderr)
    # Curl targets: service ports whose ready endpoints are all real pods.
    real = {f"{ip}:8080": name for name, ip in (r.split("=") for r in args.pod)}
    samples = [(k, sorted(real[e] for e in v)) for k, v in want.items()
               if v and all(e in real for e in v) and (meta[k].startswith(NAMESPACE + "/"))]
    random.Random(args.seed).shuffle(samples)
    with open(args.curl_list, "w") as f:
        for k, pods in samples[:args.curl_sample]:
            addr = f"{k[1]}:{k[3]}" if k[0] == "svc" else f"{args.node_ip}:{k[2]}"
            f.write(f"{k[0]} http://{addr}/ {','.join(pods)}\n")
    summary = {"service_ports": sum(1 for k in want if k[0] == "svc"), "nodeports": sum(1 for k in want if k[0] == "nodeport"),
               "endpoints": sum(len(v) for v in want.values()), "mismatches": len(mismatches)}
    print(json.dumps(summary))
    return 1 if mismatches else 0


# --- a kill timed into the first full sync -----------------------------------------------------
def kill_in_first_sync(args):
    """Waits for the restarted kproxy to log that it listed Services and EndpointSlices (after
    the log's first `offset` bytes), then SIGKILLs it after a random 0..max-delay ms. Prints
    whether its first sync had been reported by then. Started before kproxy, it creates
    --ready-file once it reads the log, and takes kproxy's pid from --pid-file (so that its own
    start-up does not let kproxy's first sync pass unseen)."""
    rng = random.Random()
    deadline = time.monotonic() + args.timeout
    listed = set()
    buf = ""
    with open(args.log) as f:
        f.seek(args.offset)
        open(args.ready_file, "w").close()
        while time.monotonic() < deadline:
            chunk = f.read()
            if not chunk:
                time.sleep(0.001)
                continue
            buf += chunk
            for res in ("Service", "EndpointSlice"):
                # klog's InfoS quotes string values ("listed" resource="Service" ...); the JSON
                # format writes "msg":"listed","resource":"Service".
                if re.search(r'"?listed"?[ ,]"?resource"?[=:]"?' + res + r'[" ]', buf):
                    listed.add(res)
            if len(listed) == 2:
                break
        else:
            print("timeout")
            return 1
    pid = None
    while pid is None and time.monotonic() < deadline:
        try:
            pid = int(open(args.pid_file).read())
        except (OSError, ValueError):
            time.sleep(0.001)
    if pid is None:
        print("timeout")
        return 1
    time.sleep(rng.uniform(0, args.max_delay_ms) / 1000)
    os.kill(pid, signal.SIGKILL)
    with open(args.log) as f:
        f.seek(args.offset)
        synced = '"Synced rules"' in f.read()
    print("after-first-sync" if synced else "in-first-sync")
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("load", "churn", "check"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--pki", required=True)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--services", type=int, default=300)
        p.add_argument("--node", default="demo-node")
        p.add_argument("--real", action="append", default=[], help="a real pod's address (repeat)")
    p = sub.choices["churn"]
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--stop-file", default="/nonexistent")
    p.add_argument("--min-changes", type=int, default=0, help="the stop file waits for this many changes")
    p.add_argument("--out", required=True)
    p = sub.choices["check"]
    p.add_argument("--node-ip", required=True)
    p.add_argument("--pod", action="append", default=[], help="NAME=IP of a real pod (repeat)")
    p.add_argument("--curl-list", required=True)
    p.add_argument("--curl-sample", type=int, default=20)
    p = sub.add_parser("kill-in-first-sync")
    p.add_argument("--pid-file", required=True, help="kproxy's pid, written once it started")
    p.add_argument("--ready-file", required=True, help="created once the log is being read")
    p.add_argument("--log", required=True)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--max-delay-ms", type=float, default=40)
    p.add_argument("--timeout", type=float, default=120, help="a ceiling: only a hang takes this long")
    p = sub.add_parser("elements")
    p.add_argument("map", nargs="*", help="a map of table ip kube-proxy")
    p.add_argument("--prefix", default="", help="also every map whose name starts with this")
    args = ap.parse_args()
    return {"load": load, "churn": churn, "check": check, "kill-in-first-sync": kill_in_first_sync,
            "elements": elements}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
