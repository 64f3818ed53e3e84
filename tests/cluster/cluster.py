#!/usr/bin/env python3
"""The life of a multi-node cluster under load: the cluster suite's driver (tests/cluster/).

lib.sh builds the fabric (namespaces, bridge, routes, control plane, node credentials) and
describes it in a JSON file; this program runs in the control plane's namespace and does the
rest: Node objects, background Services under light churn, one kproxy per node, pods (the pod
server in pod slots), constant request load (kproxy-cluster-load), and the scenarios. For each
scenario it prints the requests by outcome and, for each change, how long every node took to
program it (each node's /debug/services, which shows the last snapshot applied to the kernel).

A request fails when it is not answered, except a refusal inside a scale-to-zero window (from
the write that empties the Service to every node having programmed its return), which is an
expected refusal; an answer from a pod after every node had programmed that pod out of use
(terminating or removed) is a stale answer, and fails too. A UDP request without an answer sent
less than a second before a pod of its Service exits is named apart (lost in flight to an
exiting pod: inherent to UDP, whatever the proxy does).

Exit status: 0 when every assertion held, 1 otherwise.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../e2e"))
import kube_api  # noqa: E402  (tests/e2e/kube_api.py)

TEST_NS = "cluster-test"
BG_NAMESPACES = [f"bg-{i}" for i in range(10)]
METRICS_PORT = 10249
HEALTHZ_PORT = 10256
POD_TCP_PORT = 8080
POD_UDP_PORT = 9090


def log(msg):
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


class Failed(Exception):
    """A wait that reached its ceiling, or a process that died: the scenario cannot go on."""


# ---------------------------------------------------------------------------------------------
# The API server


def slice_path(ns, name=None):
    return f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices" + (f"/{name}" if name else "")


def endpoint(ip, node, state="ready"):
    cond = {"ready": True, "serving": True, "terminating": False}
    if state == "terminating":
        cond = {"ready": False, "serving": True, "terminating": True}
    return {"addresses": [ip], "conditions": cond, "nodeName": node}


# ---------------------------------------------------------------------------------------------
# Processes in namespaces


class Proc:
    """A program started in a network namespace (`ip netns exec` execs it: the pid is its own)."""

    def __init__(self, ns, argv, log_path):
        self.argv = argv
        self.log = open(log_path, "ab")
        self.log.write(f"===== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        self.log.flush()
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=self.log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)

    def alive(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.alive():
            self.p.send_signal(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.argv[0]} (pid {self.p.pid}) ignored {sig.name} for {timeout} s: killing it")
            self.p.kill()
            self.p.wait()
        self.log.close()
        return self.p.returncode


def http_get(host, port, path, timeout=5):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_until(what, ceiling, check, interval=0.05):
    """Calls check() until it returns a true value, which is returned; Failed at the ceiling,
    which only catches a hang."""
    deadline = time.monotonic() + ceiling
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {ceiling} s")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# The cluster


class Node:
    def __init__(self, index, d):
        self.index = index
        self.name = d["name"]
        self.ns = d["ns"]
        self.ip = d["ip"]
        self.pod_cidr = d["podCIDR"]
        self.kubeconfig = d["kubeconfig"]
        self.slots = d["slots"]  # [{"ns", "ip"}], slot 0 the client pod
        self.kproxy = None


class Pod:
    def __init__(self, node, slot, proc):
        self.node = node
        self.slot = slot
        self.name = f"n{node.index}-p{slot}"
        self.ip = node.slots[slot]["ip"]
        self.proc = proc


class Cluster:
    def __init__(self, desc, args):
        self.args = args
        self.workdir = desc["workdir"]
        self.api = kube_api.Api(desc["cp"]["port"], desc["cp"]["pki"])
        self.nodes = [Node(i + 1, d) for i, d in enumerate(desc["nodes"])]
        self.client_ns = desc["client"]["ns"]
        self.cluster_cidr = desc["clusterCIDR"]
        self.free_slots = {n.index: list(range(1, len(n.slots))) for n in self.nodes}
        self.pods = {}  # name -> Pod
        self.ceiling = args.ceiling

    # --- kproxy ----------------------------------------------------------------------------------

    def kproxy_start(self, node):
        argv = [self.args.kproxy, "--proxy-mode=nftables", "--kubeconfig", node.kubeconfig,
                "--hostname-override", node.name, "--cluster-cidr", self.cluster_cidr,
                "--metrics-bind-address", f"{node.ip}:{METRICS_PORT}",
                "--healthz-bind-address", f"{node.ip}:{HEALTHZ_PORT}",
                # nf_conntrack_max is the host's, not the namespace's: leave it alone.
                "--conntrack-max-per-core=0", "-v", "2"]
        if self.args.plugin_dir:
            argv += ["--plugin-dir", self.args.plugin_dir]
        argv += self.args.kproxy_arg
        node.kproxy = Proc(node.ns, argv, f"{self.workdir}/kproxy-{node.name}.log")

    def kproxy_stop(self, node, sig):
        rc = node.kproxy.stop(sig)
        node.kproxy = None
        return rc

    def debug_services(self, node, service):
        """The node's /debug/services for one Service, or None while it cannot be read."""
        if node.kproxy is not None and not node.kproxy.alive():
            raise Failed(f"kproxy on {node.name} exited (status {node.kproxy.p.returncode}); "
                         f"log: {self.workdir}/kproxy-{node.name}.log")
        try:
            status, body = http_get(node.ip, METRICS_PORT, f"/debug/services?service={service}")
        except OSError:
            return None
        return json.loads(body) if status == 200 else None

    def endpoint_state(self, node, service, port_name):
        """(every endpoint IP, the IPs in use) of the port as last programmed on the node."""
        doc = self.debug_services(node, service)
        if not doc or not doc.get("programmed"):
            return None
        for p in doc.get("services", []):
            if p["port"] == port_name:
                every = {e["address"].rsplit(":", 1)[0] for e in p["endpoints"]}
                used = {e["address"].rsplit(":", 1)[0] for e in p["endpoints"] if e["usedFor"]}
                return frozenset(every), frozenset(used)
        return frozenset(), frozenset()

    def wait_programmed(self, service, port_name, every, used, since, nodes=None):
        """Polls every node until it has programmed the port with exactly these endpoints (all
        and in use); returns each node's time from `since` (the API write) to it being seen."""
        want = (frozenset(every), frozenset(used))
        pending = {n.name: n for n in (nodes or self.nodes)}
        seen = {}
        deadline = time.monotonic() + self.ceiling
        while pending:
            for name, n in list(pending.items()):
                if self.endpoint_state(n, service, port_name) == want:
                    seen[name] = time.time() - since
                    del pending[name]
            if not pending:
                break
            if time.monotonic() > deadline:
                states = {name: self.endpoint_state(n, service, port_name) for name, n in pending.items()}
                raise Failed(f"{service} {port_name}: nodes {sorted(pending)} did not program "
                             f"every={sorted(every)} used={sorted(used)} within {self.ceiling} s; they have {states}")
            time.sleep(0.02)
        return seen

    # --- pods ------------------------------------------------------------------------------------

    def pod_start(self, node):
        slot = self.free_slots[node.index].pop(0)
        ns = node.slots[slot]["ns"]
        name = f"n{node.index}-p{slot}"
        proc = Proc(ns, [self.args.podserver, "--name", name, "--port", str(POD_TCP_PORT),
                         "--udp-port", str(POD_UDP_PORT)], f"{self.workdir}/pod-{name}.log")
        pod = Pod(node, slot, proc)
        self.pods[name] = pod
        return pod

    def pod_ready(self, pod):
        """The pod answers TCP and UDP from here (the driver probes as a kubelet would)."""
        try:
            status, body = http_get(pod.ip, POD_TCP_PORT, "/", timeout=2)
            if status != 200 or f"pod={pod.name} ".encode() not in body:
                return False
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(2)
                s.connect((pod.ip, POD_UDP_PORT))
                s.send(b"ready?\n")
                return s.recv(512).startswith(f"pod={pod.name} ".encode())
        except OSError:
            return False

    def pods_start(self, nodes):
        pods = [self.pod_start(n) for n in nodes]
        for p in pods:
            wait_until(f"pod {p.name} answering", self.ceiling, lambda p=p: self.pod_ready(p), interval=0.1)
        return pods

    def pod_stop(self, pod):
        t = time.time()
        pod.proc.stop(signal.SIGTERM)
        del self.pods[pod.name]
        # The slot's namespace stays; its veth and address with it. A later pod may use it again.
        self.free_slots[pod.node.index].append(pod.slot)
        return t


# ---------------------------------------------------------------------------------------------
# Background Services and their churn


def bg_service(i, nodes):
    kind = "NodePort" if i % 10 == 0 else "ClusterIP"
    ns = BG_NAMESPACES[i % len(BG_NAMESPACES)]
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"bg-{i}", "namespace": ns},
           "spec": {"type": kind, "selector": {"app": f"bg-{i}"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}
    return ns, svc


def bg_endpoints(i, generation, nodes):
    # Addresses in 10.128.0.0/10 that nothing answers: they only have to be programmed.
    out = []
    for k in range(2):
        n = (i * 2 + k) * 7 + generation
        out.append(endpoint(f"10.{128 + (n >> 16) % 64}.{(n >> 8) & 255}.{n & 255}",
                            nodes[(i + k) % len(nodes)].name))
    return out


def load_background(cluster, count):
    api = cluster.api
    for ns in BG_NAMESPACES:
        api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                 ok=(409,))

    def one(i):
        ns, svc = bg_service(i, cluster.nodes)
        api.call("POST", f"/api/v1/namespaces/{ns}/services", svc, ok=(409,))
        api.call("POST", slice_path(ns), {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"bg-{i}-1", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": f"bg-{i}",
                                    "endpointslice.kubernetes.io/managed-by": "kproxy-cluster"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": bg_endpoints(i, 0, cluster.nodes)}, ok=(409,))

    t0 = time.time()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, range(count)))
    log(f"{count} background Services with their EndpointSlices in {time.time() - t0:.1f} s")


class Churn:
    """Light background churn: `rate` EndpointSlice changes a second on random background
    Services, so that every node keeps syncing while the scenarios run."""

    def __init__(self, cluster, count, rate):
        self.cluster, self.count, self.rate = cluster, count, rate
        self.stop_flag = threading.Event()
        self.changes = 0
        self.errors = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self):
        if self.rate > 0 and self.count > 0:
            self.thread.start()

    def run(self):
        rnd = random.Random(7)
        while not self.stop_flag.wait(1 / self.rate):
            i = rnd.randrange(self.count)
            ns = BG_NAMESPACES[i % len(BG_NAMESPACES)]
            try:
                self.cluster.api.patch(slice_path(ns, f"bg-{i}-1"),
                                       {"endpoints": bg_endpoints(i, rnd.randrange(1, 1000), self.cluster.nodes)})
                self.changes += 1
            except Exception as e:  # the churn is background: report, never stop the scenario
                self.errors += 1
                log(f"churn: {e}")

    def stop(self):
        self.stop_flag.set()
        if self.thread.is_alive():
            self.thread.join()


# ---------------------------------------------------------------------------------------------
# Load and counting


class Load:
    """kproxy-cluster-load from a namespace to one target; its lines are read when it stops."""

    def __init__(self, cluster, label, ns, target, proto, service):
        self.label, self.proto, self.service = label, proto, service
        self.path = f"{cluster.workdir}/load-{label}.txt"
        self.proc = Proc(ns, [cluster.args.load, "--target", target, "--proto", proto,
                              "--rate", str(cluster.args.rate), "--timeout", "3", "--out", self.path],
                         f"{cluster.workdir}/load-{label}.log")

    def answered_count(self):
        try:
            with open(self.path) as f:
                return sum(1 for line in f if " answered " in line)
        except OSError:
            return 0

    def stop(self):
        self.proc.stop(signal.SIGINT, timeout=30)
        rows = []
        with open(self.path) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                t, outcome, detail, ms = line.split()
                rows.append((float(t), outcome, detail, float(ms)))
        return rows


class Record:
    """What a scenario did, to judge each request against: when each pod stopped being a valid
    target, the expected zero windows of each Service, when pods stopped, each change's
    programming times."""

    def __init__(self):
        self.invalid_from = {}  # pod name -> time every node had programmed it out of use
        self.zero_windows = {}  # service -> [(start, end)]
        self.pod_stops = {}  # service -> [(pod name, time)]
        self.changes = []  # (description, {node: seconds})

    def change(self, what, seen):
        self.changes.append((what, seen))
        log(f"  {what}: programmed on every node after {fmt_ms(max(seen.values()))} ms "
            f"({', '.join(f'{k} {fmt_ms(v)}' for k, v in sorted(seen.items()))})")


def judge(load, rows, record):
    """Counts by outcome kind, and the failures by kind."""
    counts, failures = {}, {}
    windows = record.zero_windows.get(load.service, [])
    stops = record.pod_stops.get(load.service, [])
    for t, outcome, detail, _ in rows:
        kind = f"error {detail}" if outcome == "error" else outcome
        failed = outcome != "answered"
        if outcome == "answered":
            gone = record.invalid_from.get(detail)
            if gone is not None and t >= gone:
                kind, failed = "answered-by-stale-pod", True
        elif outcome == "refused" and any(a <= t <= b for a, b in windows):
            kind, failed = "refused-expected (zero window)", False
        elif load.proto == "udp" and any(s - 1.0 <= t <= s for _, s in stops):
            kind, failed = "udp-lost-in-flight-to-exiting-pod (inherent)", False
        counts[kind] = counts.get(kind, 0) + 1
        if failed:
            failures[kind] = failures.get(kind, 0) + 1
    return counts, failures


# ---------------------------------------------------------------------------------------------
# Scenarios


class Service:
    """A test Service with one EndpointSlice that the scenario writes."""

    def __init__(self, cluster, name, proto, port, target_port, node_port=None):
        self.cluster, self.name, self.proto = cluster, name, proto
        self.port_name = "p"
        spec = {"type": "NodePort" if node_port else "ClusterIP",
                "ports": [{"name": "p", "port": port, "targetPort": target_port, "protocol": proto.upper()}]}
        if node_port:
            spec["ports"][0]["nodePort"] = node_port
        out = cluster.api.call("POST", f"/api/v1/namespaces/{TEST_NS}/services",
                               {"apiVersion": "v1", "kind": "Service",
                                "metadata": {"name": name, "namespace": TEST_NS}, "spec": spec})
        self.cluster_ip = out["spec"]["clusterIP"]
        self.port, self.target_port, self.node_port = port, target_port, node_port
        self.key = f"{TEST_NS}/{name}"
        self.endpoints = []  # [(pod, state)]
        cluster.api.call("POST", slice_path(TEST_NS), {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-1", "namespace": TEST_NS,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by": "kproxy-cluster"}},
            "addressType": "IPv4", "ports": [{"name": "p", "port": target_port, "protocol": proto.upper()}],
            "endpoints": []})

    def write(self, endpoints):
        """Writes the slice; returns the time just before the write."""
        self.endpoints = list(endpoints)
        t = time.time()
        self.cluster.api.patch(slice_path(TEST_NS, f"{self.name}-1"),
                               {"endpoints": [endpoint(p.ip, p.node.name, s) for p, s in self.endpoints]})
        return t

    def expected(self):
        every = {p.ip for p, _ in self.endpoints}
        ready = {p.ip for p, s in self.endpoints if s == "ready"}
        return every, ready or every  # no ready endpoint: the serving terminating ones are used

    def change(self, record, what, endpoints, after_write=None):
        t = self.write(endpoints)
        if after_write:
            after_write()
        every, used = self.expected()
        seen = self.cluster.wait_programmed(self.key, self.port_name, every, used, t)
        record.change(f"{self.name}: {what}", seen)
        return t, t + max(seen.values())


class Scenario:
    def __init__(self, cluster, name):
        self.cluster, self.name = cluster, name
        self.record = Record()
        self.loads = []
        self.notes = []
        self.failed = []

    def load(self, label, ns, target, proto, service):
        self.loads.append(Load(self.cluster, f"{self.name}-{label}", ns, target, proto, service.key))

    def load_pod_to_cluster_ip(self, service):
        n1 = self.cluster.nodes[0]
        self.load(f"pod-{service.proto}-clusterip", n1.slots[0]["ns"], f"{service.cluster_ip}:{service.port}",
                  service.proto, service)

    def load_client_to_node_port(self, service, node):
        self.load(f"client-nodeport-{node.name}", self.cluster.client_ns, f"{node.ip}:{service.node_port}",
                  service.proto, service)

    def start_loads(self):
        for ld in self.loads:
            wait_until(f"load {ld.label} answered", self.cluster.ceiling, lambda ld=ld: ld.answered_count() >= 10)

    def report(self):
        print(f"\n=== scenario {self.name} ===")
        for what, seen in self.record.changes:
            print(f"  change {what}: every node after {fmt_ms(max(seen.values()))} ms "
                  f"({', '.join(f'{k} {fmt_ms(v)}' for k, v in sorted(seen.items()))})")
        per_node = {}
        for _, seen in self.record.changes:
            for node, v in seen.items():
                per_node.setdefault(node, []).append(v)
        if per_node:
            print("  programming time per node, from the API write (a restart: the process's start) to "
                  "/debug/services showing it (p50 / p99 / max ms over "
                  f"{len(self.record.changes)} changes): "
                  + ", ".join(f"{k} {fmt_ms(percentile(v, 50))} / {fmt_ms(percentile(v, 99))} / {fmt_ms(max(v))}"
                              for k, v in sorted(per_node.items())))
        for note in self.notes:
            print(f"  {note}")
        for ld in self.loads:
            rows = ld.stop()
            counts, failures = judge(ld, rows, self.record)
            total_failed = sum(failures.values())
            print(f"  load {ld.label} ({ld.proto}, {len(rows)} requests): "
                  + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                  + f"; FAILED={total_failed}" + (f" {failures}" if failures else ""))
            pods = {}
            for _, outcome, detail, _ in rows:
                if outcome == "answered":
                    pods[detail] = pods.get(detail, 0) + 1
            print(f"    answered by: {', '.join(f'{k}={v}' for k, v in sorted(pods.items()))}")
            if total_failed and (ld.proto == "tcp" or not self.cluster.args.udp_report_only):
                self.failed.append(f"{ld.label}: {total_failed} failed requests {failures}")
            if not counts.get("answered"):
                self.failed.append(f"{ld.label}: no request was answered")
        return self.failed


def percentile(values, p):
    """The nearest-rank percentile: with few values, p99 is the largest."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, -(-len(v) * p // 100) - 1))]


def settle(cluster):
    time.sleep(cluster.args.settle)


def scenario_rolling_update(cluster, web, grace):
    """Each endpoint of `web` in turn is replaced: a new pod starts on the same node and is added
    ready; the old endpoint turns terminating (ready=false, serving=true) while its pod keeps
    serving for the grace period; then the endpoint is removed, and only then the pod stops.

    KC_BREAK_TERMINATION breaks it on purpose, to show that the suite fails then:
      ready   the old pod stops while its endpoint is still listed ready, which is removed after;
      early   no terminating phase: the endpoint is removed and its pod stops at once, before
              the nodes have programmed the removal."""
    sc = Scenario(cluster, "rolling-update")
    sc.load_pod_to_cluster_ip(web)
    sc.load_client_to_node_port(web, cluster.nodes[1 % len(cluster.nodes)])
    sc.start_loads()
    settle(cluster)
    broken = os.environ.get("KC_BREAK_TERMINATION", "")
    if broken not in ("", "ready", "early"):
        raise SystemExit(f"KC_BREAK_TERMINATION={broken}: ready or early")
    if broken:
        sc.notes.append(f"KC_BREAK_TERMINATION={broken}: a broken rollout, on purpose")

    def stop(pod):
        sc.record.pod_stops.setdefault(web.key, []).append((pod.name, cluster.pod_stop(pod)))

    for old, _ in list(web.endpoints):
        new, = cluster.pods_start([old.node])
        others = [(p, s) for p, s in web.endpoints if p is not old]
        web.change(sc.record, f"add {new.name} ready", others + [(old, "ready"), (new, "ready")])
        if broken == "ready":
            stop(old)
            web.change(sc.record, f"remove {old.name}", others + [(new, "ready")])
            continue
        if broken == "early":
            web.change(sc.record, f"remove {old.name}", others + [(new, "ready")], after_write=lambda o=old: stop(o))
            continue
        _, t_agreed = web.change(sc.record, f"{old.name} terminating", others + [(old, "terminating"), (new, "ready")])
        sc.record.invalid_from[old.name] = t_agreed
        time.sleep(grace)
        web.change(sc.record, f"remove {old.name}", others + [(new, "ready")])
        stop(old)
    settle(cluster)
    return sc


def scenario_scale_to_zero(cluster, zt, zu, grace, hold):
    """Both Services (TCP, UDP) go to zero endpoints and back. Down: every endpoint turns
    terminating (serving) for the grace period, then the slices are emptied, then the pods stop.
    Refusals from the emptying write until every node has programmed the return are expected.
    Up: new pods start, answer, and are then written ready."""
    sc = Scenario(cluster, "scale-to-zero")
    sc.load_pod_to_cluster_ip(zt)
    sc.load_pod_to_cluster_ip(zu)
    sc.load_client_to_node_port(zt, cluster.nodes[-1])
    sc.start_loads()
    settle(cluster)
    pods = [p for p, _ in zt.endpoints]
    for svc in (zt, zu):
        svc.change(sc.record, "every endpoint terminating", [(p, "terminating") for p in pods])
    time.sleep(grace)
    starts = {}
    for svc in (zt, zu):
        starts[svc.key], _ = svc.change(sc.record, "scaled to zero", [])
    for p in pods:
        t = cluster.pod_stop(p)
        sc.record.invalid_from[p.name] = t
        for svc in (zt, zu):
            sc.record.pod_stops.setdefault(svc.key, []).append((p.name, t))
    time.sleep(hold)
    new = cluster.pods_start(cluster.nodes)
    for svc in (zt, zu):
        _, t_agreed = svc.change(sc.record, "scaled back up", [(p, "ready") for p in new])
        sc.record.zero_windows.setdefault(svc.key, []).append((starts[svc.key], t_agreed))
    settle(cluster)
    return sc


def scenario_kproxy_restart(cluster, web, downtime):
    """kproxy on every node in turn: SIGTERM, then started again; then SIGKILL, then started again.
    The rules a stopped kproxy leaves keep serving; the new one's first sync takes over."""
    sc = Scenario(cluster, "kproxy-restart")
    sc.load_pod_to_cluster_ip(web)
    sc.load_client_to_node_port(web, cluster.nodes[1 % len(cluster.nodes)])
    sc.start_loads()
    settle(cluster)
    every, used = web.expected()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for node in cluster.nodes:
            t_sig = time.time()
            rc = cluster.kproxy_stop(node, sig)
            t_exit = time.time()
            time.sleep(downtime)
            t_start = time.time()
            cluster.kproxy_start(node)
            seen = cluster.wait_programmed(web.key, web.port_name, every, used, t_start, nodes=[node])
            t_healthy = wait_until(f"{node.name} /healthz 200", cluster.ceiling,
                                   lambda n=node: healthz_ok(n) and time.time(), interval=0.05)
            sc.record.change(f"{node.name} {sig.name} (exit status {rc}, stopped in {fmt_ms(t_exit - t_sig)} ms, "
                             f"down {fmt_ms(t_start - t_exit)} ms): start to first sync", seen)
            sc.notes.append(f"{node.name} {sig.name}: start to /healthz 200 {fmt_ms(t_healthy - t_start)} ms")
            if sig == signal.SIGTERM and rc != 0:
                sc.failed.append(f"kproxy on {node.name} exited with status {rc} on SIGTERM")
    settle(cluster)
    return sc


def healthz_ok(node):
    try:
        return http_get(node.ip, HEALTHZ_PORT, "/healthz", timeout=2)[0] == 200
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# kproxy-upgrade: an older build on every node, a change under it, and back


class Build:
    """A kproxy build: its binary, its plugin directory, and the commit `kproxy --version` names."""

    def __init__(self, label, kproxy, plugin_dir):
        self.label, self.kproxy, self.plugin_dir = label, kproxy, plugin_dir
        out = subprocess.run([kproxy, "--version"], capture_output=True, text=True, check=True).stdout.strip()
        m = re.search(r"\(commit ([0-9a-f]+|unknown)", out)
        if not m:
            raise SystemExit(f"{kproxy} --version: no commit in {out!r}")
        self.version, self.commit = out, m.group(1)


def old_build_of(args):
    """The older build of scenario kproxy-upgrade, or None when that scenario is not run; stops the
    run at once when it is run without one."""
    if "kproxy-upgrade" not in args.scenarios.split(","):
        return None
    if not args.old_kproxy or not args.old_plugin_dir:
        raise SystemExit("scenario kproxy-upgrade needs --old-kproxy BIN and --old-plugin-dir DIR "
                         "(tests/cluster/old-kproxy.sh builds them; cluster_test.sh passes them)")
    return Build("older", args.old_kproxy, args.old_plugin_dir)


def kproxy_start_build(cluster, node, build):
    """Cluster.kproxy_start with another build's binary and plugin directory: every other argument
    is the one every kproxy of the suite gets."""
    saved = cluster.args.kproxy, cluster.args.plugin_dir
    cluster.args.kproxy, cluster.args.plugin_dir = build.kproxy, build.plugin_dir
    try:
        cluster.kproxy_start(node)
    finally:
        cluster.args.kproxy, cluster.args.plugin_dir = saved


def running_commit(node):
    """The git_commit label of the node's kubernetes_build_info: the build its kproxy runs."""
    try:
        status, body = http_get(node.ip, METRICS_PORT, "/metrics")
    except OSError:
        return None
    m = re.search(r'^kubernetes_build_info\{[^}]*git_commit="([^"]*)"', body.decode(), re.M)
    return m.group(1) if status == 200 and m else None


def log_errors_since(path, offset):
    """klog error lines (E<mmdd> ...) written to a kproxy log from `offset` on."""
    with open(path, "rb") as f:
        f.seek(offset)
        return [line for line in f.read().decode(errors="replace").splitlines() if re.match(r"E\d{4} ", line)]


def kproxy_replace(cluster, sc, node, build, web, wipe=False):
    """kproxy on one node: SIGTERM, then `build` started at once with the same arguments; records its
    start to first sync holding `web` and to /healthz 200, and checks that it runs `build`. With
    `wipe`, the node's kube-proxy table is deleted in between (a build that starts from nothing)."""
    every, used = web.expected()
    log_path = f"{cluster.workdir}/kproxy-{node.name}.log"
    t_sig = time.time()
    rc = cluster.kproxy_stop(node, signal.SIGTERM)
    t_exit = time.time()
    if wipe:
        subprocess.run(["ip", "netns", "exec", node.ns, "nft", "delete", "table", "ip", "kube-proxy"], check=True)
    offset = os.path.getsize(log_path)
    t_start = time.time()
    kproxy_start_build(cluster, node, build)
    seen = cluster.wait_programmed(web.key, web.port_name, every, used, t_start, nodes=[node])
    t_healthy = wait_until(f"{node.name} /healthz 200", cluster.ceiling,
                           lambda: healthz_ok(node) and time.time(), interval=0.05)
    commit = wait_until(f"{node.name} /metrics", cluster.ceiling, lambda: running_commit(node))
    sc.record.change(f"{node.name} to the {build.label} build {build.commit} (exit status {rc} on SIGTERM, "
                     f"stopped in {fmt_ms(t_exit - t_sig)} ms): start to first sync", seen)
    errors = log_errors_since(log_path, offset)
    sc.notes.append(f"{node.name} to {build.commit}: start to /healthz 200 {fmt_ms(t_healthy - t_start)} ms, "
                    f"{len(errors)} error lines in its log" + (f", the first: {errors[0]}" if errors else ""))
    if rc != 0:
        sc.failed.append(f"kproxy on {node.name} exited with status {rc} on SIGTERM")
    if commit != build.commit:
        sc.failed.append(f"{node.name} runs commit {commit}, not the {build.label} build's {build.commit}")


def scenario_kproxy_upgrade(cluster, web, old, grace):
    """On every node in turn, kproxy is stopped (SIGTERM) and the older build (its own binary and
    plugin directory) started with the same arguments; with every node on it, one endpoint of `web`
    is replaced as a rolling update replaces it (added ready, the old one terminating for the grace
    period, removed, its pod stopped), each step programmed by every node; then every node in turn
    goes back to the current build. Loads from every node's client pod to the ClusterIP and from
    the outside client to every node's NodePort, so that each node's switch carries traffic.

    KC_BREAK_UPGRADE=wipe breaks it on purpose, to show that the suite fails then: each node's
    kube-proxy table is deleted before the older build starts, as if that build could not adopt
    the current one's rules and started from nothing."""
    sc = Scenario(cluster, "kproxy-upgrade")
    current = Build("current", cluster.args.kproxy, cluster.args.plugin_dir)
    sc.notes.append(f"older build: {old.version}; current build: {current.version}")
    broken = os.environ.get("KC_BREAK_UPGRADE", "")
    if broken not in ("", "wipe"):
        raise SystemExit(f"KC_BREAK_UPGRADE={broken}: wipe")
    if broken:
        sc.notes.append(f"KC_BREAK_UPGRADE={broken}: each node starts the older build without its table, on purpose")
    for node in cluster.nodes:
        sc.load(f"pod-{node.name}-tcp-clusterip", node.slots[0]["ns"], f"{web.cluster_ip}:{web.port}", web.proto, web)
    for node in cluster.nodes:
        sc.load_client_to_node_port(web, node)
    sc.start_loads()
    settle(cluster)
    for node in cluster.nodes:
        kproxy_replace(cluster, sc, node, old, web, wipe=broken == "wipe")

    old_pod, _ = web.endpoints[0]
    new, = cluster.pods_start([old_pod.node])
    others = [(p, s) for p, s in web.endpoints if p is not old_pod]
    under = f"every node on {old.commit}"
    web.change(sc.record, f"add {new.name} ready ({under})", others + [(old_pod, "ready"), (new, "ready")])
    _, t_agreed = web.change(sc.record, f"{old_pod.name} terminating ({under})",
                             others + [(old_pod, "terminating"), (new, "ready")])
    sc.record.invalid_from[old_pod.name] = t_agreed
    time.sleep(grace)
    web.change(sc.record, f"remove {old_pod.name} ({under})", others + [(new, "ready")])
    sc.record.pod_stops.setdefault(web.key, []).append((old_pod.name, cluster.pod_stop(old_pod)))

    for node in cluster.nodes:
        kproxy_replace(cluster, sc, node, current, web)
    settle(cluster)
    return sc


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--desc", required=True, help="the fabric, as lib.sh's kc_describe wrote it")
    ap.add_argument("--kproxy", required=True)
    ap.add_argument("--plugin-dir", default="")
    ap.add_argument("--kproxy-arg", action="append", default=[],
                    help="one more argument for every kproxy (repeatable), e.g. --kproxy-arg=--iptables-min-sync-period=0")
    ap.add_argument("--podserver", required=True)
    ap.add_argument("--load", required=True, help="kproxy-cluster-load")
    ap.add_argument("--services", type=int, default=1000, help="background Services")
    ap.add_argument("--churn", type=float, default=2, help="background EndpointSlice changes a second")
    ap.add_argument("--rate", type=float, default=50, help="requests a second of each load")
    ap.add_argument("--grace", type=float, default=2, help="seconds a terminating pod keeps serving")
    ap.add_argument("--settle", type=float, default=2, help="seconds of load before and after the changes")
    ap.add_argument("--ceiling", type=float, default=120, help="ceiling of every wait (catches hangs only)")
    ap.add_argument("--scenarios", default="rolling-update,scale-to-zero,kproxy-restart,kproxy-upgrade")
    ap.add_argument("--old-kproxy", default="", help="scenario kproxy-upgrade's older kproxy (old-kproxy.sh)")
    ap.add_argument("--old-plugin-dir", default="", help="the older kproxy's plugin directory")
    ap.add_argument("--udp-report-only", action="store_true",
                    help="report failed UDP requests without failing the run (TCP ones always fail it)")
    args = ap.parse_args()
    with open(args.desc) as f:
        desc = json.load(f)
    cluster = Cluster(desc, args)
    old_build = old_build_of(args)
    api = cluster.api
    t0 = time.time()
    try:
        for n in cluster.nodes:
            api.call("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n.name, "labels": {"kubernetes.io/hostname": n.name}},
                "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]}})
            api.patch(f"/api/v1/nodes/{n.name}/status",
                      {"status": {"addresses": [{"type": "InternalIP", "address": n.ip},
                                                {"type": "Hostname", "address": n.name}]}})
        api.call("POST", "/api/v1/namespaces",
                 {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEST_NS}})
        load_background(cluster, args.services)
        web = Service(cluster, "web", "tcp", 80, POD_TCP_PORT, node_port=30080)
        zt = Service(cluster, "zero-tcp", "tcp", 80, POD_TCP_PORT, node_port=30081)
        zu = Service(cluster, "zero-udp", "udp", 53, POD_UDP_PORT)
        web_pods = cluster.pods_start(cluster.nodes)
        zero_pods = cluster.pods_start(cluster.nodes)
        web.write([(p, "ready") for p in web_pods])
        for svc in (zt, zu):
            svc.write([(p, "ready") for p in zero_pods])
        t_start = time.time()
        for n in cluster.nodes:
            cluster.kproxy_start(n)
        startup = Record()
        for svc in (web, zt, zu):
            every, used = svc.expected()
            startup.change(f"{svc.name} at start-up", cluster.wait_programmed(svc.key, svc.port_name, every, used,
                                                                             t_start))
        log(f"every kproxy programmed the cluster ({args.services} background Services)")
        churn = Churn(cluster, args.services, args.churn)
        churn.start()
        failed = []
        for name in args.scenarios.split(","):
            log(f"scenario {name}")
            if name == "rolling-update":
                sc = scenario_rolling_update(cluster, web, args.grace)
            elif name == "scale-to-zero":
                sc = scenario_scale_to_zero(cluster, zt, zu, args.grace, hold=2)
            elif name == "kproxy-restart":
                sc = scenario_kproxy_restart(cluster, web, downtime=1)
            elif name == "kproxy-upgrade":
                sc = scenario_kproxy_upgrade(cluster, web, old_build, args.grace)
            else:
                # Not in this slice: node drain (with a load-balancer simulator), apiserver
                # restart, mode switch, and upstream kube-proxy side by side.
                raise SystemExit(f"unknown scenario {name}")
            failed += [f"{sc.name}: {f}" for f in sc.report()]
            sys.stdout.flush()
        churn.stop()
        print(f"\nbackground churn: {churn.changes} EndpointSlice changes ({churn.errors} errors) "
              f"over {len(cluster.nodes)} nodes and {args.services} Services; run took {time.time() - t0:.0f} s")
    except Failed as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        for n in cluster.nodes:
            if n.kproxy is not None:
                n.kproxy.stop(signal.SIGTERM)
        for p in list(cluster.pods.values()):
            p.proc.stop(signal.SIGTERM)
    for f in failed:
        print(f"FAIL: {f}")
    if not failed:
        print("PASS: no failed request (beyond the expected and the inherent ones) and no stale answer in any scenario")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
