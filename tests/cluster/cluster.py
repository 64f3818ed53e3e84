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
LB_IPS = ["10.78.0.10", "10.78.0.11", "10.78.0.12"]  # the LoadBalancer Services' ingress IPs (lb-local, lb-cluster, lb-udp)


def log(msg):
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


class Failed(Exception):
    """A wait that reached its ceiling, or a process that died: the scenario cannot go on."""


# ---------------------------------------------------------------------------------------------
# The API server


TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"


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
    """A program started in a network namespace (`ip netns exec` execs it: the pid is its own)
    and, with `cgroup`, in that cgroup v2 directory (a shell moves itself there, then execs it)."""

    def __init__(self, ns, argv, log_path, cgroup=None):
        self.argv = argv
        self.log = open(log_path, "ab")
        self.log.write(f"===== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        self.log.flush()
        in_cgroup = ["sh", "-c", 'echo $$ >"$0/cgroup.procs" && exec "$@"', cgroup] if cgroup else []
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, *in_cgroup, *argv], stdout=self.log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

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


class KernelView:
    """Which endpoints a node's kernel sends a Service port's connections to, read from the
    rules upstream kube-proxy and kproxy both write under the same names: nftables mode, the
    `endpoint-…__IP/PORT` chains the port's `service-…` chain jumps to; iptables mode, the DNAT
    targets of the `KUBE-SEP-…` chains its `KUBE-SVC-…` chain jumps to. A port without such a
    chain sends nowhere (the empty set). Used to judge upstream kube-proxy, which has no
    /debug/services; chain names are looked up once per node."""

    def __init__(self, mode):
        self.mode = mode
        self.chains = {}  # (node, service, port) -> chain name
        self.seps = {}  # (node, KUBE-SEP-… chain) -> endpoint IP

    def chain(self, node, service, port_name):
        key = (node.name, service, port_name)
        if key not in self.chains:
            if self.mode == "nftables":
                text = node_exec(node, ["nft", "-j", "list", "chains", "ip"])
                if text is None:
                    return None
                suffixes = [f"-{service}/{proto}/{port_name}" for proto in ("tcp", "udp", "sctp")]
                names = [c["chain"]["name"] for c in json.loads(text)["nftables"]
                         if "chain" in c and c["chain"]["table"] == "kube-proxy"]
                found = [n for n in names if n.startswith("service-") and any(n.endswith(x) for x in suffixes)]
            else:
                text = node_exec(node, ["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"])
                if text is None:
                    return None
                found = [line.split("-j ")[1].split()[0] for line in text.splitlines()
                         if f'"{service}:{port_name} cluster IP"' in line and "-j KUBE-SVC-" in line]
            if not found:
                return None
            self.chains[key] = found[0]
        return self.chains[key]

    def used(self, node, service, port_name):
        name = self.chain(node, service, port_name)
        if name is None:
            return frozenset()
        if self.mode == "nftables":
            text = node_exec(node, ["nft", "list", "chain", "ip", "kube-proxy", name])
            words = (text or "").replace(",", " ").replace("}", " ").split()
            return frozenset(w.split("__", 1)[1].rsplit("/", 1)[0] for w in words
                             if w.startswith("endpoint-") and "__" in w)
        text = node_exec(node, ["iptables", "-w", "-t", "nat", "-S", name])
        return frozenset(ip for ip in (self.endpoint_ip(node, line.split("-j ", 1)[1].split()[0])
                                       for line in (text or "").splitlines() if "-j KUBE-SEP-" in line)
                         if ip is not None)

    def endpoint_ip(self, node, sep):
        """The endpoint IP a KUBE-SEP-… chain DNATs to. The jumps to these chains name their
        endpoint in a comment only below 1,000 endpoints (upstream's large-cluster mode drops
        the comments), so the chain's DNAT rule is read; its name hashes the endpoint, so the
        answer is kept."""
        key = (node.name, sep)
        if key not in self.seps:
            text = node_exec(node, ["iptables", "-w", "-t", "nat", "-S", sep]) or ""
            found = [line.split("--to-destination ", 1)[1].split()[0].rsplit(":", 1)[0]
                     for line in text.splitlines() if "--to-destination " in line]
            if not found:
                return None
            self.seps[key] = found[0]
        return self.seps[key]


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
        self.mode = "nftables"
        # ebpf mode's cgroup (the node's pods and its client pod run in it) and pin directory;
        # None when ebpf mode could not be set up (the description's ebpfError says why).
        self.cgroup = d.get("cgroup") or None
        self.ebpf_pin_path = d.get("ebpfPinPath") or None


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
        self.cp_ip = desc["cp"]["ip"]
        self.cluster_cidr = desc["clusterCIDR"]
        self.free_slots = {n.index: list(range(1, len(n.slots))) for n in self.nodes}
        self.pods = {}  # name -> Pod
        self.ceiling = args.ceiling
        self.kernel = KernelView(args.mode)
        self.ebpf_error = desc.get("ebpfError", "")

    # --- the control plane -----------------------------------------------------------------------

    def control(self, request):
        """Asks cluster_test.sh (whose children the control plane's processes are) to act on them:
        apiserver-stop (SIGTERM; SIGKILL after 10 s), apiserver-kill (SIGKILL), apiserver-start
        (returns once /readyz answers), etcd-compact."""
        if not self.args.control:
            raise Failed(f"{request}: the driver was started without --control")
        with open(f"{self.args.control}/control-request", "w") as f:
            f.write(request + "\n")
        with open(f"{self.args.control}/control-response") as f:
            answer = f.readline().split()
        if answer != [request, "0"]:
            raise Failed(f"control request {request}: answered {answer}")

    def log_count(self, node, needle):
        """How many lines of the node's kproxy log (every process it ran) contain needle."""
        with open(f"{self.workdir}/kproxy-{node.name}.log", errors="replace") as f:
            return sum(1 for line in f if needle in line)

    def wait_log(self, what, needle, before, since):
        """Waits until each node's kproxy log holds more lines with needle than before[node];
        returns each node's time from `since` to it being seen (the log is read every 50 ms)."""
        seen = {}
        for n in self.nodes:
            wait_until(f"{n.name}: {what}", self.ceiling, lambda n=n: self.log_count(n, needle) > before[n.name])
            seen[n.name] = time.time() - since
        return seen

    # --- kproxy ----------------------------------------------------------------------------------

    def kproxy_start(self, node, mode=None):
        """The node's service proxy: kproxy, or upstream kube-proxy (--program upstream) with the
        same flags, in `mode` (--mode by default)."""
        upstream = self.args.program == "upstream"
        mode = mode or self.args.mode
        argv = [self.args.upstream if upstream else self.args.kproxy, f"--proxy-mode={mode}",
                "--kubeconfig", node.kubeconfig,
                "--hostname-override", node.name, "--cluster-cidr", self.cluster_cidr,
                "--metrics-bind-address", f"{node.ip}:{METRICS_PORT}",
                "--healthz-bind-address", f"{node.ip}:{HEALTHZ_PORT}",
                # nf_conntrack_max is the host's, not the namespace's: leave it alone.
                "--conntrack-max-per-core=0", "-v", "2"]
        if self.args.plugin_dir and not upstream:
            argv += ["--plugin-dir", self.args.plugin_dir]
        if node.cgroup and not upstream:
            # Every mode gets them: ebpf mode attaches and pins there (never the root cgroup, never
            # the host's bpffs), the others remove what ebpf mode left there.
            argv += ["--ebpf-cgroup-path", node.cgroup, "--ebpf-pin-path", node.ebpf_pin_path]
        argv += self.args.kproxy_arg
        node.kproxy = Proc(node.ns, argv, f"{self.workdir}/kproxy-{node.name}.log")
        node.mode = mode

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
        """(every endpoint IP, the IPs in use) of the port as last programmed on the node; for
        upstream kube-proxy, which has no /debug/services, (None, the endpoints its service chain
        in the kernel sends to)."""
        if self.args.program == "upstream":
            if node.kproxy is not None and not node.kproxy.alive():
                raise Failed(f"kube-proxy on {node.name} exited (status {node.kproxy.p.returncode}); "
                             f"log: {self.workdir}/kproxy-{node.name}.log")
            return None, self.kernel.used(node, service, port_name)
        doc = self.debug_services(node, service)
        if not doc or not doc.get("programmed"):
            return None
        for p in doc.get("services", []):
            if p["port"] == port_name:
                every = {e["address"].rsplit(":", 1)[0] for e in p["endpoints"]}
                used = {e["address"].rsplit(":", 1)[0] for e in p["endpoints"] if e["usedFor"]}
                return frozenset(every), frozenset(used)
        return frozenset(), frozenset()

    def programming_observations(self, node):
        """How many changes the node's proxy has observed in
        kubeproxy_network_programming_duration_seconds (each a change with a trigger-time
        annotation, once the sync that carried it succeeded), or None while /metrics cannot be read."""
        try:
            status, body = http_get(node.ip, METRICS_PORT, "/metrics")
        except OSError:
            return None
        if status != 200:
            return None
        m = re.findall(r"^kubeproxy_network_programming_duration_seconds_count(?:\{[^}]*\})? (\S+)$",
                       body.decode(), re.M)
        return sum(float(x) for x in m) if m else 0.0

    def wait_programmed(self, service, port_name, every, used, since, nodes=None, per_node=None,
                        observed_before=None):
        """Polls every node until it has programmed the port with exactly these endpoints (all
        and in use; per_node(node), when given, says what each node uses); returns each node's
        time from `since` (the API write) to it being seen. With observed_before (each node's
        programming_observations before the write), a node counts only once it has observed one
        more: for upstream, whose rules show only the endpoints in use."""
        if self.args.program == "upstream":
            # Its rules are read from the service chain, the cluster-wide pool: a node's own
            # pool under eTP=Local is in another chain.
            per_node = None

        def want(n):
            e, u = per_node(n) if per_node else (every, used)
            return frozenset(e), frozenset(u)

        pending = {n.name: n for n in (nodes or self.nodes)}
        seen = {}
        deadline = time.monotonic() + self.ceiling
        while pending:
            for name, n in list(pending.items()):
                state = self.endpoint_state(n, service, port_name)
                # (A node whose count could not be read before the write is judged by its rules.)
                before = observed_before.get(name) if observed_before is not None else None
                if before is not None:
                    now = self.programming_observations(n)
                    if now is None or now <= before:
                        continue
                # Upstream: what its service chain sends to (the endpoints not used are not seen).
                if state is not None and (state == want(n) or state[0] is None and state[1] == want(n)[1]):
                    seen[name] = time.time() - since
                    del pending[name]
            if not pending:
                break
            if time.monotonic() > deadline:
                states = {name: self.endpoint_state(n, service, port_name) for name, n in pending.items()}
                raise Failed(f"{service} {port_name}: nodes {sorted(pending)} did not program "
                             f"{ {name: want(n) for name, n in pending.items()} } within {self.ceiling} s; "
                             f"they have {states}")
            time.sleep(0.02)
        return seen

    def conntrack_to(self, node, ips):
        """The node's conntrack entries NATed to one of these IPs (the reply comes from it, the
        original destination was another address: a Service's), counted by protocol and state.
        Entries of connections routed through the node to a pod without NAT are not counted."""
        out = subprocess.run(["ip", "netns", "exec", node.ns, "conntrack", "-L"], capture_output=True, text=True)
        if out.returncode != 0:
            raise Failed(f"conntrack -L on {node.name}: {out.stderr.strip()}")
        counts = {}
        for line in out.stdout.splitlines():
            f = line.split()
            srcs = [w[4:] for w in f if w.startswith("src=")]
            dsts = [w[4:] for w in f if w.startswith("dst=")]
            if len(srcs) < 2 or srcs[1] not in ips or dsts[0] == srcs[1]:
                continue
            kind = f[0] + (f" {f[3]}" if f[0] == "tcp" else "")
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def pod_ip(self, name):
        """The IP of pod n<i>-p<slot> (its slot's)."""
        i, slot = name[1:].split("-p")
        return self.nodes[int(i) - 1].slots[int(slot)]["ip"]

    # --- pods ------------------------------------------------------------------------------------

    def pod_start(self, node):
        slot = self.free_slots[node.index].pop(0)
        ns = node.slots[slot]["ns"]
        name = f"n{node.index}-p{slot}"
        proc = Proc(ns, [self.args.podserver, "--name", name, "--port", str(POD_TCP_PORT),
                         "--udp-port", str(POD_UDP_PORT)], f"{self.workdir}/pod-{name}.log", cgroup=node.cgroup)
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
        self.paused = threading.Event()
        self.busy = threading.Lock()  # held while a change is written
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
            with self.busy:
                if self.paused.is_set():
                    continue
                try:
                    self.cluster.api.patch(slice_path(ns, f"bg-{i}-1"),
                                           {"endpoints": bg_endpoints(i, rnd.randrange(1, 1000), self.cluster.nodes)})
                    self.changes += 1
                except Exception as e:  # the churn is background: report, never stop the scenario
                    self.errors += 1
                    log(f"churn: {e}")

    def pause(self):
        """No change is written from the return until resume() (none is half-way at the return)."""
        self.paused.set()
        with self.busy:
            pass

    def resume(self):
        self.paused.clear()

    def stop(self):
        self.stop_flag.set()
        if self.thread.is_alive():
            self.thread.join()


# ---------------------------------------------------------------------------------------------
# The load-balancer simulator


class LbSim:
    """A cloud load balancer in front of the nodes, for LoadBalancer IPs: it probes every node's
    health check as cloud load balancers do (eTP=Local: the Service's healthCheckNodePort; eTP=
    Cluster: kproxy's /healthz on 10256), every `interval` seconds with a 1 s timeout, takes a
    node out after `fall` failed probes in a row and back after `rise` good ones, and sends each
    new connection to a node in use, chosen at random. A TCP connection stays on its node (the
    balancer tracks connections), so taking a node out drains it. A UDP flow (the client's address
    and port) does not persist on a node taken out: its next datagram goes to a node in use, as
    cloud balancers do by default for UDP, whose flows have no end to wait for. (With persisting
    UDP flows, a client that reuses a source port within the flow's idle timeout is sent to the
    node taken out, which drops it once its endpoint is gone: a loss of the balancer's making.)

    The data path is the client namespace's: an nftables chain (route hook, output) marks each
    new connection to a LoadBalancer IP (UDP: also a flow marked with a node out of use) with the
    number of a node in use (numgen random over them) and every packet with its connection's
    mark; mark i routes the IP via node i (one
    routing table a node). Without a node in use the connection is routed to the control plane's
    namespace, which does not forward it: it fails, as it would behind a real balancer."""

    def __init__(self, cluster, services, interval=0.2, fall=2, rise=2):
        self.cluster, self.services = cluster, services
        self.interval, self.fall, self.rise = interval, fall, rise
        self.ns = cluster.client_ns
        self.state = {(s.key, n.name): [False, 0] for s in services for n in cluster.nodes}  # [in use, streak]
        self.events = []  # (time, service, node, "in" or "out")
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.cp_ip = cluster.cp_ip
        for n in cluster.nodes:
            self.ip("rule", "add", "fwmark", str(n.index), "table", str(100 + n.index))
            for svc in services:
                self.ip("route", "add", f"{svc.lb_ip}/32", "via", n.ip, "table", str(100 + n.index))
        for svc in services:
            # The route the connect() finds before the output hook re-routes by mark.
            self.ip("route", "add", f"{svc.lb_ip}/32", "via", self.cp_ip)
        self.program()

    def ip(self, *argv):
        subprocess.run(["ip", "-n", self.ns, *argv], check=True)

    def probe(self, svc, node):
        port, path = (svc.health_check_node_port, "/healthz") if svc.etp_local else (HEALTHZ_PORT, "/healthz")
        try:
            return http_get(node.ip, port, path, timeout=1)[0] == 200
        except OSError:
            return False

    def in_use(self, svc):
        with self.lock:
            return {n.name for n in self.cluster.nodes if self.state[(svc.key, n.name)][0]}

    def program(self):
        rules = []
        for svc in self.services:
            idx = [n.index for n in self.cluster.nodes if self.state[(svc.key, n.name)][0]]
            if not idx:  # to the control plane, which does not forward (UDP: flows on a node too)
                if svc.proto == "udp":
                    rules.append(f"    ip daddr {svc.lb_ip} udp dport {svc.port} ct mark set 0")
                continue
            pick = str(idx[0]) if len(idx) == 1 else \
                f"numgen random mod {len(idx)} map {{ {', '.join(f'{k} : {v}' for k, v in enumerate(idx))} }}"
            if svc.proto == "udp":
                rules.append(f"    ip daddr {svc.lb_ip} udp dport {svc.port} ct mark != {{ {', '.join(map(str, idx))} }} "
                             f"ct mark set {pick}")
            else:
                rules.append(f"    ct state new ip daddr {svc.lb_ip} ct mark set {pick}")
        text = ("table ip lbsim\ndelete table ip lbsim\ntable ip lbsim {\n"
                "  chain out {\n    type route hook output priority mangle; policy accept;\n"
                + "\n".join(rules) + ("\n" if rules else "")
                + "    meta mark set ct mark\n  }\n}\n")
        subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=text.encode(), check=True)

    def round(self):
        changed = False
        for svc in self.services:
            for n in self.cluster.nodes:
                ok = self.probe(svc, n)
                with self.lock:
                    st = self.state[(svc.key, n.name)]
                    if ok == st[0]:
                        st[1] = 0
                        continue
                    st[1] += 1
                    if st[1] >= (self.rise if ok else self.fall):
                        st[0], st[1] = ok, 0
                        changed = True
                        self.events.append((time.time(), svc.key, n.name, "in" if ok else "out"))
                        log(f"  load balancer: {svc.name} {'sends to' if ok else 'takes out'} {n.name}")
        if changed:
            self.program()

    def run(self):
        while not self.stop_flag.wait(self.interval):
            try:
                self.round()
            except Exception as e:  # a balancer that stops balancing would fail the loads: say why
                log(f"load balancer simulator: {e}")

    def start(self):
        self.thread.start()

    def wait_in_use(self, svc, nodes, what):
        """Waits until the balancer uses exactly these nodes for svc; returns the time of its
        last change of svc's nodes (when it came to use these)."""
        want = {n.name for n in nodes}
        wait_until(f"load balancer: {svc.name} {what}", self.cluster.ceiling,
                   lambda: self.in_use(svc) == want, interval=0.02)
        with self.lock:
            return max(t for t, key, _, _ in self.events if key == svc.key)

    def stop(self):
        self.stop_flag.set()
        if self.thread.is_alive():
            self.thread.join()


# ---------------------------------------------------------------------------------------------
# Load and counting


class Load:
    """kproxy-cluster-load from a namespace to one target; its lines are read when it stops."""

    def __init__(self, cluster, label, ns, target, proto, service, terminating_ok=False, cgroup=None):
        self.label, self.proto, self.service = label, proto, service
        self.terminating_ok = terminating_ok
        self.path = f"{cluster.workdir}/load-{label}.txt"
        self.proc = Proc(ns, [cluster.args.load, "--target", target, "--proto", proto,
                              "--rate", str(cluster.args.rate), "--timeout", "3", "--out", self.path],
                         f"{cluster.workdir}/load-{label}.log", cgroup=cgroup)

    def answered_count(self):
        try:
            with open(self.path) as f:
                return sum(1 for line in f if " answered " in line)
        except OSError:
            return 0

    def stop(self):
        self.proc.stop(signal.SIGINT, timeout=30)
        rows = []
        self.stalls = []  # (wall time, seconds stalled, sends missed): the machine starved the load
        with open(self.path) as f:
            for line in f:
                if line.startswith("# stall "):
                    _, _, t, secs, missed = line.split()
                    self.stalls.append((float(t), float(secs), int(missed.split("=")[1])))
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
        self.removed_at = {}  # pod name -> time every node had programmed its endpoint's removal
        self.zero_windows = {}  # service -> [(start, end)]
        self.pod_stops = {}  # service -> [(pod name, time)]
        self.changes = []  # (description, {node: seconds})

    def change(self, what, seen):
        self.changes.append((what, seen))
        log(f"  {what}: programmed on every node after {fmt_ms(max(seen.values()))} ms "
            f"({', '.join(f'{k} {fmt_ms(v)}' for k, v in sorted(seen.items()))})")


def judge(load, rows, record):
    """Counts by outcome kind, the failures by kind, and each failed request's send time."""
    counts, failures, fail_times = {}, {}, []
    windows = record.zero_windows.get(load.service, [])
    stops = record.pod_stops.get(load.service, [])
    for t, outcome, detail, _ in rows:
        kind = f"error {detail}" if outcome == "error" else outcome
        failed = outcome != "answered"
        if outcome == "answered":
            # Under eTP=Local a node whose only local endpoints terminate still uses them (the
            # fallback to serving terminating endpoints): for such a load, a pod is stale only
            # once its endpoint is removed.
            gone = (record.removed_at if load.terminating_ok else record.invalid_from).get(detail)
            if gone is not None and t >= gone:
                kind, failed = "answered-by-stale-pod", True
        elif outcome == "refused" and any(a <= t <= b for a, b in windows):
            kind, failed = "refused-expected (zero window)", False
        elif load.proto == "udp" and any(s - 1.0 <= t <= s for _, s in stops):
            kind, failed = "udp-lost-in-flight-to-exiting-pod (inherent)", False
        counts[kind] = counts.get(kind, 0) + 1
        if failed:
            failures[kind] = failures.get(kind, 0) + 1
            fail_times.append(t)
    return counts, failures, fail_times


# ---------------------------------------------------------------------------------------------
# Scenarios


class Service:
    """A test Service with one EndpointSlice that the scenario writes."""

    def __init__(self, cluster, name, proto, port, target_port, node_port=None, lb_ip=None, etp_local=False):
        """lb_ip: a LoadBalancer Service, with that ingress IP written into its status (as a
        cloud controller would); etp_local: externalTrafficPolicy Local."""
        self.cluster, self.name, self.proto = cluster, name, proto
        self.port_name = "p"
        spec = {"type": "LoadBalancer" if lb_ip else "NodePort" if node_port else "ClusterIP",
                "ports": [{"name": "p", "port": port, "targetPort": target_port, "protocol": proto.upper()}]}
        if node_port:
            spec["ports"][0]["nodePort"] = node_port
        if etp_local:
            spec["externalTrafficPolicy"] = "Local"
        out = cluster.api.call("POST", f"/api/v1/namespaces/{TEST_NS}/services",
                               {"apiVersion": "v1", "kind": "Service",
                                "metadata": {"name": name, "namespace": TEST_NS}, "spec": spec})
        self.cluster_ip = out["spec"]["clusterIP"]
        self.port, self.target_port = port, target_port
        self.node_port = out["spec"]["ports"][0].get("nodePort")
        self.health_check_node_port = out["spec"].get("healthCheckNodePort")
        self.lb_ip, self.etp_local = lb_ip, etp_local
        if lb_ip:
            cluster.api.patch(f"/api/v1/namespaces/{TEST_NS}/services/{name}/status",
                              {"status": {"loadBalancer": {"ingress": [{"ip": lb_ip}]}}})
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
        """Writes the slice, with the write's time as its last-change-trigger-time annotation, as
        the EndpointSlice controller sets it (both programs then observe the change in
        kubeproxy_network_programming_duration_seconds); returns the time just before the write."""
        self.endpoints = list(endpoints)
        t = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"
        self.cluster.api.patch(slice_path(TEST_NS, f"{self.name}-1"),
                               {"metadata": {"annotations": {TRIGGER_TIME_ANNOTATION: stamp}},
                                "endpoints": [endpoint(p.ip, p.node.name, s) for p, s in self.endpoints]})
        return t

    def expected(self):
        every = {p.ip for p, _ in self.endpoints}
        ready = {p.ip for p, s in self.endpoints if s == "ready"}
        return every, ready or every  # no ready endpoint: the serving terminating ones are used

    def expected_on(self, node):
        """What the node uses: the cluster-wide pool, and under eTP=Local also the node's own
        pool (its ready endpoints, or else its serving terminating ones), as upstream."""
        every, used = self.expected()
        if self.etp_local:
            local = [(p, s) for p, s in self.endpoints if p.node is node]
            used = set(used) | ({p.ip for p, s in local if s == "ready"} or {p.ip for p, _ in local})
        return every, used

    def change(self, record, what, endpoints, after_write=None):
        # Upstream's rules cannot show every change (a terminating endpoint's removal): its
        # programming-latency observations, which only these writes' annotation makes, can.
        observed = ({n.name: self.cluster.programming_observations(n) for n in self.cluster.nodes}
                    if self.cluster.args.program == "upstream" else None)
        t = self.write(endpoints)
        if after_write:
            after_write()
        every, used = self.expected()
        seen = self.cluster.wait_programmed(self.key, self.port_name, every, used, t, per_node=self.expected_on,
                                            observed_before=observed)
        record.change(f"{self.name}: {what}", seen)
        return t, t + max(seen.values())


class Scenario:
    def __init__(self, cluster, name):
        self.cluster, self.name = cluster, name
        self.record = Record()
        self.loads = []
        self.notes = []
        self.failed = []

    def load(self, label, ns, target, proto, service, terminating_ok=False, cgroup=None):
        self.loads.append(Load(self.cluster, f"{self.name}-{label}", ns, target, proto, service.key, terminating_ok,
                               cgroup))

    def load_pod_to_cluster_ip(self, service):
        n1 = self.cluster.nodes[0]
        self.load(f"pod-{service.proto}-clusterip", n1.slots[0]["ns"], f"{service.cluster_ip}:{service.port}",
                  service.proto, service, cgroup=n1.cgroup)

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
                  + ("/debug/services" if self.cluster.args.program == "kproxy" else "the kernel's rules")
                  + " showing it (p50 / p99 / max ms over "
                  f"{len(self.record.changes)} changes): "
                  + ", ".join(f"{k} {fmt_ms(percentile(v, 50))} / {fmt_ms(percentile(v, 99))} / {fmt_ms(max(v))}"
                              for k, v in sorted(per_node.items())))
        for note in self.notes:
            print(f"  {note}")
        # Pods that stopped in this scenario and whose address no running pod has taken again.
        running = {p.ip for p in self.cluster.pods.values()}
        gone = {self.cluster.pod_ip(name) for stops in self.record.pod_stops.values() for name, _ in stops} - running
        if gone:
            left = {n.name: self.cluster.conntrack_to(n, gone) for n in self.cluster.nodes}
            print(f"  conntrack entries NATed to the {len(gone)} removed endpoints, left at the end: "
                  + "; ".join(f"{k} {sum(v.values())}" + (f" ({', '.join(f'{a} {b}' for a, b in sorted(v.items()))})"
                                                           if v else "") for k, v in sorted(left.items())))
            udp = sum(c for v in left.values() for k, c in v.items() if k == "udp")
            if udp:
                self.failed.append(f"{udp} UDP conntrack entries still point at removed endpoints")
        result = {"scenario": self.name, "program": self.cluster.args.program, "mode": self.cluster.args.mode,
                  "nodes": len(self.cluster.nodes), "services": self.cluster.args.services,
                  "changes": [{"what": w, "seconds": seen} for w, seen in self.record.changes],
                  "notes": self.notes, "loads": []}
        for ld in self.loads:
            rows = ld.stop()
            counts, failures, fail_times = judge(ld, rows, self.record)
            total_failed = sum(failures.values())
            t0 = rows[0][0] if rows else 0
            result["loads"].append({"label": ld.label[len(self.name) + 1:], "proto": ld.proto, "requests": len(rows),
                                    "counts": counts, "failures": failures,
                                    "failed_at": [round(t - t0, 3) for t in fail_times],
                                    "seconds": round(rows[-1][0] - t0, 3) if rows else 0,
                                    "stalls": [[round(t - t0, 3), secs, m] for t, secs, m in ld.stalls]})
            print(f"  load {ld.label} ({ld.proto}, {len(rows)} requests): "
                  + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                  + f"; FAILED={total_failed}" + (f" {failures}" if failures else ""))
            pods = {}
            for _, outcome, detail, _ in rows:
                if outcome == "answered":
                    pods[detail] = pods.get(detail, 0) + 1
            print(f"    answered by: {', '.join(f'{k}={v}' for k, v in sorted(pods.items()))}")
            if ld.stalls:
                print(f"    the load itself stalled {len(ld.stalls)} times (the machine did not run it), "
                      f"{sum(m for _, _, m in ld.stalls)} sends missed: "
                      + ", ".join(f"{secs:.1f} s" for _, secs, _ in ld.stalls))
            if total_failed and (ld.proto == "tcp" or not self.cluster.args.udp_report_only):
                self.failed.append(f"{ld.label}: {total_failed} failed requests {failures}")
            if not counts.get("answered"):
                self.failed.append(f"{ld.label}: no request was answered")
        if self.cluster.args.results:
            result["failed"] = self.failed
            with open(self.cluster.args.results, "a") as f:
                f.write(json.dumps(result) + "\n")
        return self.failed


def percentile(values, p):
    """The nearest-rank percentile: with few values, p99 is the largest."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, -(-len(v) * p // 100) - 1))]


def settle(cluster):
    time.sleep(cluster.args.settle)


def break_termination(sc):
    """KC_BREAK_TERMINATION (ready, early or unset): how the scenario breaks its pods' graceful
    termination on purpose, to show that the suite fails then."""
    broken = os.environ.get("KC_BREAK_TERMINATION", "")
    if broken not in ("", "ready", "early"):
        raise SystemExit(f"KC_BREAK_TERMINATION={broken}: ready or early")
    if broken:
        sc.notes.append(f"KC_BREAK_TERMINATION={broken}: pods end without graceful termination, on purpose")
    return broken


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
    broken = break_termination(sc)

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
        retire(cluster, sc, web, old, new, grace)
    settle(cluster)
    return sc


def retire(cluster, sc, svc, old, new, grace):
    """The graceful end of an endpoint replaced by `new` (already written ready): it turns
    terminating (ready=false, serving=true) while its pod keeps serving for the grace period;
    then it is removed, and only then its pod stops."""
    others = [(p, s) for p, s in svc.endpoints if p is not old and p is not new]
    _, t_agreed = svc.change(sc.record, f"{old.name} terminating", others + [(old, "terminating"), (new, "ready")])
    sc.record.invalid_from[old.name] = t_agreed
    time.sleep(grace)
    _, sc.record.removed_at[old.name] = svc.change(sc.record, f"remove {old.name}", others + [(new, "ready")])
    sc.record.pod_stops.setdefault(svc.key, []).append((old.name, cluster.pod_stop(old)))


def replace_endpoint(cluster, sc, svc, grace, what=""):
    """One step of a rolling update of svc: its first endpoint's pod is replaced by a new pod on
    the same node, added ready before the old one retires. Returns the time of the first write."""
    old = svc.endpoints[0][0]
    new, = cluster.pods_start([old.node])
    others = [(p, s) for p, s in svc.endpoints if p is not old]
    t, _ = svc.change(sc.record, f"{what}add {new.name} ready", others + [(old, "ready"), (new, "ready")])
    retire(cluster, sc, svc, old, new, grace)
    return t


def scenario_apiserver_restart(cluster, web, churn, down, grace):
    """The apiserver stops for `down` seconds and starts again, twice: first a graceful stop
    (SIGTERM), then a crash (SIGKILL) after which etcd is compacted while it is down, so that
    every watch resumes from a resourceVersion that is gone (410 Expired) and every kproxy
    relists. The rules stay in place while the apiserver is away;
    right after each start a rolling-update step of `web` is written, and the report says when
    every node had programmed it (its reconnect and, the second time, its relist included)."""
    sc = Scenario(cluster, "apiserver-restart")
    sc.load_pod_to_cluster_ip(web)
    sc.load_client_to_node_port(web, cluster.nodes[1 % len(cluster.nodes)])
    sc.start_loads()
    settle(cluster)
    for compact in (False, True):
        label = "crash and restart with etcd compacted" if compact else "graceful restart"
        count = {k: {n.name: cluster.log_count(n, k) for n in cluster.nodes}
                 for k in ("API server watch interrupted", "API server connection established",
                           "watch resourceVersion expired; relisting")}
        churn.pause()  # its writes would only fail while the apiserver is down
        t_stop = time.time()
        cluster.control("apiserver-kill" if compact else "apiserver-stop")
        t_gone = time.time()
        sc.notes.append(f"{label}: the apiserver took {fmt_ms(t_gone - t_stop)} ms to exit")
        logs = cluster.args.program == "kproxy"  # the log lines waited for below are kproxy's
        if logs:
            seen = cluster.wait_log("kproxy noticed the apiserver gone", "API server watch interrupted",
                                    count["API server watch interrupted"], t_stop)
            sc.notes.append(f"{label}: every kproxy noticed within {fmt_ms(max(seen.values()))} ms of the signal")
        time.sleep(down)
        if compact:
            cluster.control("etcd-compact")
        cluster.control("apiserver-start")
        t_up = time.time()
        churn.resume()
        replace_endpoint(cluster, sc, web, grace, what=f"after the {label}: ")
        if not logs:
            continue
        seen = cluster.wait_log("kproxy watching again", "API server connection established",
                                count["API server connection established"], t_up)
        sc.notes.append(f"{label}: every kproxy watched every resource again within {fmt_ms(max(seen.values()))} ms "
                        "of the apiserver being ready (the reconnect backoff, 0.5 s doubling to 30 s, included)")
        if compact:
            cluster.wait_log("kproxy relisted after 410 Expired", "watch resourceVersion expired; relisting",
                             count["watch resourceVersion expired; relisting"], t_up)
            sc.notes.append(f"{label}: every kproxy got 410 Expired and relisted")
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


def node_drain_mark(cluster, node, drained):
    """Cordons the node and taints it ToBeDeletedByClusterAutoscaler, as the cluster autoscaler
    does before it deletes a node (drained), or undoes both."""
    spec = {"unschedulable": True,
            "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": str(int(time.time())),
                        "effect": "NoSchedule"}]} if drained else {"unschedulable": None, "taints": None}
    cluster.api.patch(f"/api/v1/nodes/{node.name}", {"spec": spec})


def scenario_node_drain(cluster, lb_local, lb_cluster, lb_udp, sim, grace):
    """Node 2 is drained while the outside client reaches three LoadBalancer Services through the
    load-balancer simulator, lb-local (eTP=Local, health-checked on its healthCheckNodePort),
    lb-cluster (eTP=Cluster, health-checked on kproxy's /healthz) and lb-udp (UDP, eTP=Local like
    lb-local), and a pod reaches lb-local's ClusterIP. The node is cordoned and tainted
    ToBeDeletedByClusterAutoscaler: its /healthz
    fails and the balancer takes it out of lb-cluster. Its pod moves: a new one starts on the
    next node and is added ready, the old endpoint turns terminating (the node's health check
    for lb-local and lb-udp fails, having no ready local endpoint, and the balancer takes the
    node out of both: until then the node still sends to its terminating pod, the eTP=Local
    fallback),
    and after the grace period the endpoint is removed and the pod stops. Then the node is
    uncordoned and the balancer sends lb-cluster's connections to it again."""
    sc = Scenario(cluster, "node-drain")
    sc.load("client-lb-local", cluster.client_ns, f"{lb_local.lb_ip}:{lb_local.port}", "tcp", lb_local,
            terminating_ok=True)
    sc.load("client-lb-cluster", cluster.client_ns, f"{lb_cluster.lb_ip}:{lb_cluster.port}", "tcp", lb_cluster)
    sc.load("client-lb-udp", cluster.client_ns, f"{lb_udp.lb_ip}:{lb_udp.port}", "udp", lb_udp, terminating_ok=True)
    sc.load_pod_to_cluster_ip(lb_local)
    sc.start_loads()
    settle(cluster)
    node = cluster.nodes[1 % len(cluster.nodes)]
    dest = cluster.nodes[2 % len(cluster.nodes)]
    rest = [n for n in cluster.nodes if n is not node]
    t = time.time()
    node_drain_mark(cluster, node, True)
    t_out = sim.wait_in_use(lb_cluster, rest, f"takes out {node.name}")
    sc.notes.append(f"{node.name} cordoned and tainted: the balancer took it out of {lb_cluster.name} "
                    f"{fmt_ms(t_out - t)} ms after the write (its /healthz failing)")
    services = (lb_local, lb_cluster, lb_udp)
    broken = break_termination(sc)

    def stop(pod, before_removal=False):
        """The pod stops; broken: before its endpoint is removed (ready), or at once with the
        removal, without a terminating phase (early)."""
        if before_removal:
            t_stop = cluster.pod_stop(pod)
        if broken:
            for svc in services:
                svc.write([(p, s) for p, s in svc.endpoints if p is not pod])
            if not before_removal:
                t_stop = cluster.pod_stop(pod)
        else:
            t_stop = cluster.pod_stop(pod)
        for svc in services:
            sc.record.pod_stops.setdefault(svc.key, []).append((pod.name, t_stop))

    for old in [p for p, _ in lb_local.endpoints if p.node is node]:
        new, = cluster.pods_start([dest])

        def change_all(what, state_of_old, with_new=True):
            agreed = 0
            for svc in services:
                others = [(p, s) for p, s in svc.endpoints if p is not old and p is not new]
                eps = others + ([(old, state_of_old)] if state_of_old else []) + [(new, "ready")]
                _, t_agreed = svc.change(sc.record, what, eps)
                agreed = max(agreed, t_agreed)
            return agreed

        change_all(f"{old.name} moves: add {new.name} ready on {dest.name}", "ready")
        if broken:
            stop(old, before_removal=broken == "ready")
            continue
        t = time.time()
        sc.record.invalid_from[old.name] = change_all(f"{old.name} terminating", "terminating")
        for svc in (lb_local, lb_udp):
            t_out = sim.wait_in_use(svc, rest, f"takes out {node.name}")
            sc.notes.append(f"{old.name} terminating: the balancer took {node.name} out of {svc.name} "
                            f"{fmt_ms(t_out - t)} ms after the write (its health check failing)")
        time.sleep(grace)
        sc.record.removed_at[old.name] = change_all(f"remove {old.name}", None)
        stop(old)
    t = time.time()
    node_drain_mark(cluster, node, False)
    t_in = sim.wait_in_use(lb_cluster, cluster.nodes, f"sends to {node.name} again")
    sc.notes.append(f"{node.name} uncordoned: the balancer sent {lb_cluster.name}'s connections to it again "
                    f"{fmt_ms(t_in - t)} ms after the write")
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
                if cluster.args.program == "kproxy":
                    sc.failed.append(f"kproxy on {node.name} exited with status {rc} on SIGTERM")
                else:  # upstream kube-proxy leaves SIGTERM to its default action
                    sc.notes.append(f"{node.name}: kube-proxy exited with status {rc} on SIGTERM")
    settle(cluster)
    return sc


def healthz_ok(node):
    try:
        return http_get(node.ip, HEALTHZ_PORT, "/healthz", timeout=2)[0] == 200
    except OSError:
        return False


# kube-proxy's iptables chains (iptables and IPVS mode), as kproxy's leftover removal names them
# (backends/common/include/kproxy/backends/common/chain_names.h).
KUBE_PROXY_CHAINS = {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY",
                     "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL", "KUBE-NODE-PORT",
                     "KUBE-LOAD-BALANCER", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER",
                     "KUBE-IPVS-OUT-FILTER"}
KUBE_PROXY_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "KUBE-XLB-")
# The iptables tables, as iptables-nft makes them in nftables.
IPTABLES_TABLES = ("nat", "filter", "mangle", "raw", "security")
# Each mode's nftables tables (the ip family; ip6 is checked alike).
NFT_TABLE_OF = {"nftables": "kube-proxy", "ebpf": "kproxy-ebpf", "userspace": "kproxy-userspace"}
# ebpf mode's programs on its cgroup, by attach type (README, "The ebpf mode").
EBPF_HOOKS = ["cgroup_inet4_connect", "cgroup_inet6_connect", "cgroup_udp4_sendmsg", "cgroup_udp6_sendmsg",
              "cgroup_udp4_recvmsg", "cgroup_udp6_recvmsg", "cgroup_inet4_getpeername", "cgroup_inet6_getpeername",
              "cgroup_inet_sock_release"]


def node_exec(node, argv):
    """argv in the node's namespace: its stdout, or None when it failed."""
    r = subprocess.run(["ip", "netns", "exec", node.ns, *argv], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def kernel_objects(node):
    """What the proxy modes leave in the node's kernel: nftables tables ("ip kube-proxy"),
    kube-proxy's iptables chains per tool ("iptables-nft: KUBE-SERVICES"), the BPF programs
    attached to the node's cgroup (attach types) and the pins under its ebpf pin path."""
    # Chain names only: listing tables or saving iptables-nft's rules reads every rule, seconds at
    # 10,000 Services in iptables mode, and a dump that a sync interrupts starts over (a kproxy
    # syncing once a second kept one `nft list tables` busy for over 15 minutes). iptables-nft's
    # chains are the chains of its tables (nat, filter, ...) in the same families.
    tables, chains = set(), set()
    for family, tool in (("ip", "iptables-nft"), ("ip6", "ip6tables-nft")):
        out = node_exec(node, ["nft", "-j", "list", "chains", family])
        if out is None:
            raise Failed(f"nft list chains {family} failed in {node.name}'s namespace")
        for c in json.loads(out)["nftables"]:
            if "chain" not in c:
                continue
            table, name = c["chain"]["table"], c["chain"]["name"]
            if table in NFT_TABLE_OF.values():
                tables.add(f"{family} {table}")
            elif table in IPTABLES_TABLES and (name in KUBE_PROXY_CHAINS or name.startswith(KUBE_PROXY_CHAIN_PREFIXES)):
                chains.add(f"{tool}: {name}")
    # Plain saves: naming a table would instantiate a legacy table the namespace does not have.
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        out = node_exec(node, [tool])
        if out is None:
            raise Failed(f"{tool} failed in {node.name}'s namespace")
        for line in out.splitlines():
            if line.startswith(":"):
                name = line[1:].split()[0]
                if name in KUBE_PROXY_CHAINS or name.startswith(KUBE_PROXY_CHAIN_PREFIXES):
                    chains.add(f"{tool[:-5]}: {name}")
    programs, pins = [], []
    if node.cgroup:
        r = subprocess.run(["bpftool", "-j", "cgroup", "show", node.cgroup], capture_output=True, text=True)
        if r.returncode != 0:
            raise Failed(f"bpftool cgroup show {node.cgroup}: {r.stderr.strip()}")
        programs = sorted(p.get("attach_type", "?") for p in json.loads(r.stdout.strip() or "[]"))
        if os.path.isdir(node.ebpf_pin_path):
            pins = sorted(os.listdir(node.ebpf_pin_path))
    return {"tables": tables, "chains": chains, "programs": programs, "pins": pins}


def mode_objects_wrong(mode, objs):
    """What in `objs` (kernel_objects) is not `mode`'s alone: the other modes' objects still
    there, or `mode`'s own missing. Empty when the node holds exactly `mode`'s kind of objects."""
    wrong = []
    own = NFT_TABLE_OF.get(mode)
    for t in sorted(objs["tables"]):
        _, name = t.split(None, 1)
        if name in NFT_TABLE_OF.values() and name != own:
            wrong.append(f"nft table {t} left")
    if own and f"ip {own}" not in objs["tables"]:
        wrong.append(f"no nft table ip {own}")
    if mode == "iptables":
        if not any(c.endswith(": KUBE-SERVICES") for c in objs["chains"]):
            wrong.append("no KUBE-SERVICES chain")
    elif objs["chains"]:
        first = ", ".join(sorted(objs["chains"])[:4])
        wrong.append(f"{len(objs['chains'])} kube-proxy iptables chains left ({first} ...)")
    if mode == "ebpf":
        if objs["programs"] != sorted(EBPF_HOOKS):
            wrong.append(f"the programs on the node's cgroup are {objs['programs']}, want one at each of {EBPF_HOOKS}")
        if not objs["pins"]:
            wrong.append("nothing pinned under the node's ebpf pin path")
    else:
        if objs["programs"]:
            wrong.append(f"{len(objs['programs'])} BPF programs left on the node's cgroup ({objs['programs']})")
        if objs["pins"]:
            wrong.append(f"pins left under the node's ebpf pin path ({objs['pins']})")
    return wrong


def describe_objects(objs):
    by_tool = {}
    for c in objs["chains"]:
        tool, _ = c.split(": ", 1)
        by_tool[tool] = by_tool.get(tool, 0) + 1
    return (f"nft tables [{', '.join(sorted(objs['tables']))}]; kube-proxy iptables chains "
            f"{by_tool or 'none'}; {len(objs['programs'])} BPF programs on the node's cgroup"
            f"{' (' + ', '.join(objs['programs']) + ')' if objs['programs'] else ''}; "
            f"{len(objs['pins'])} pins")


def kproxy_cleanup(cluster, node):
    """`kproxy --cleanup` on the node: every mode's objects removed; its exit status."""
    argv = [cluster.args.kproxy, "--cleanup"]
    if cluster.args.plugin_dir:
        argv += ["--plugin-dir", cluster.args.plugin_dir]
    if node.cgroup:
        argv += ["--ebpf-cgroup-path", node.cgroup, "--ebpf-pin-path", node.ebpf_pin_path]
    with open(f"{cluster.workdir}/kproxy-{node.name}.log", "ab") as f:
        f.write(f"===== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        f.flush()
        return subprocess.run(["ip", "netns", "exec", node.ns, *argv], stdout=f, stderr=subprocess.STDOUT).returncode


def scenario_mode_switch(cluster, web, zu, modes, downtime):
    """kproxy on node-1 switches modes, one after the other as `modes` lists them (from the
    suite's nftables): each switch stops it (SIGTERM) and starts it in the next mode. node-1's
    client pod is the source of the ClusterIP loads (`web` over TCP, `zero-udp` over UDP) and
    node-1 the target of `web`'s NodePort load, so every load goes through the switching node:
    the old mode's rules (ebpf: programs) serve until the new mode's first sync is in, which then
    removes them. After each switch the node must hold the new mode's kernel objects and no
    other mode's.

    KC_BREAK_MODE_SWITCH=cleanup breaks it on purpose, to show that the suite fails then: each
    switch removes every mode's objects (`kproxy --cleanup`) before the new mode starts, break
    before make."""
    node = cluster.nodes[0]
    if "ebpf" in modes and not node.cgroup:
        raise Failed(f"mode-switch: ebpf mode cannot run in this cluster: {cluster.ebpf_error}")
    broken = os.environ.get("KC_BREAK_MODE_SWITCH", "")
    if broken not in ("", "cleanup"):
        raise SystemExit(f"KC_BREAK_MODE_SWITCH={broken}: cleanup")
    sc = Scenario(cluster, "mode-switch")
    if broken:
        sc.notes.append(f"KC_BREAK_MODE_SWITCH={broken}: every mode's objects removed before each start, on purpose")
    sc.load_pod_to_cluster_ip(web)
    sc.load_client_to_node_port(web, node)
    sc.load_pod_to_cluster_ip(zu)
    sc.start_loads()
    settle(cluster)
    every, used = web.expected()
    wrong = mode_objects_wrong(node.mode, kernel_objects(node))
    if wrong:
        sc.failed.append(f"{node.name} in {node.mode} mode before the first switch: {'; '.join(wrong)}")
    for mode in modes:
        old = node.mode
        t_sig = time.time()
        rc = cluster.kproxy_stop(node, signal.SIGTERM)
        t_exit = time.time()
        if broken and kproxy_cleanup(cluster, node) != 0:
            sc.failed.append(f"kproxy --cleanup on {node.name} failed")
        time.sleep(downtime)
        t_start = time.time()
        cluster.kproxy_start(node, mode)
        seen = cluster.wait_programmed(web.key, web.port_name, every, used, t_start, nodes=[node])
        t_synced = t_start + seen[node.name]
        # The other modes' objects go right after the first sync: waited for, under the ceiling.
        state = {}

        def only_new_mode():
            t = time.time()
            state["objs"] = kernel_objects(node)
            state["wrong"] = mode_objects_wrong(mode, state["objs"])
            state["took"] = time.time() - t
            return not state["wrong"] and time.time()

        try:
            t_clean = wait_until(f"{node.name}: only {mode} mode's kernel objects", cluster.ceiling, only_new_mode,
                                 interval=0.1)
            clean = (f"only {mode} mode's objects at most {fmt_ms(max(0.0, t_clean - t_synced))} ms after it "
                     f"(a check takes {fmt_ms(state['took'])} ms)")
        except Failed:
            clean = f"NOT only {mode} mode's objects after {cluster.ceiling:.0f} s: {'; '.join(state['wrong'])}"
            sc.failed.append(f"{node.name} {old} -> {mode}: {'; '.join(state['wrong'])}")
        sc.record.change(f"{node.name} {old} -> {mode} (exit status {rc}, stopped in {fmt_ms(t_exit - t_sig)} ms, "
                         f"down {fmt_ms(t_start - t_exit)} ms): start to first sync", seen)
        sc.notes.append(f"{node.name} {old} -> {mode}: first sync {fmt_ms(seen[node.name])} ms after the start, "
                        f"{clean}: {describe_objects(state['objs'])}")
        if rc != 0:
            sc.failed.append(f"kproxy on {node.name} ({old} mode) exited with status {rc} on SIGTERM")
    settle(cluster)
    return sc


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
    plugin = os.path.join(args.old_plugin_dir, f"kproxy-backend-{args.mode}.so")
    if not os.path.exists(plugin):
        raise SystemExit(f"scenario kproxy-upgrade in {args.mode} mode: the older build has no {plugin} "
                         f"(KC_OLD_PLUGINS={args.mode} tests/cluster/old-kproxy.sh builds it; cluster_test.sh asks for it)")
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
    `wipe`, the node's kube-proxy table (iptables mode: every rule and chain of its nat and filter
    tables; other modes: everything `kproxy --cleanup` removes, ebpf mode's programs and pins with
    it) is deleted in between (a build that starts from nothing)."""
    every, used = web.expected()
    log_path = f"{cluster.workdir}/kproxy-{node.name}.log"
    t_sig = time.time()
    rc = cluster.kproxy_stop(node, signal.SIGTERM)
    t_exit = time.time()
    if wipe:
        if node.mode == "iptables":  # every rule and chain of the tables kproxy writes
            for table in ("nat", "filter"):
                for op in ("-F", "-X"):
                    subprocess.run(["ip", "netns", "exec", node.ns, "iptables", "-w", "-t", table, op], check=True)
        elif node.mode == "nftables":
            subprocess.run(["ip", "netns", "exec", node.ns, "nft", "delete", "table", "ip", "kube-proxy"], check=True)
        elif kproxy_cleanup(cluster, node) != 0:  # ebpf mode's programs and pins, every mode's tables
            raise Failed(f"kproxy --cleanup on {node.name} failed")
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
        sc.load(f"pod-{node.name}-tcp-clusterip", node.slots[0]["ns"], f"{web.cluster_ip}:{web.port}", web.proto, web,
                cgroup=node.cgroup)
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
    ap.add_argument("--program", choices=("kproxy", "upstream"), default="kproxy",
                    help="the service proxy on every node: kproxy, or upstream kube-proxy (--upstream)")
    ap.add_argument("--upstream", default="", help="upstream kube-proxy's binary, for --program upstream")
    ap.add_argument("--mode", choices=("nftables", "iptables", "ebpf", "userspace"), default="nftables",
                    help="--proxy-mode of every node (upstream: nftables or iptables)")
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
    ap.add_argument("--scenarios", default="rolling-update,scale-to-zero,node-drain,kproxy-restart,kproxy-upgrade,"
                                           "apiserver-restart,mode-switch")
    ap.add_argument("--control", default="",
                    help="the directory of cluster_test.sh's control FIFOs (apiserver stop and start, etcd compaction)")
    ap.add_argument("--results", default="", help="append each scenario's figures to this file (JSON lines, for bench/cluster)")
    # From nftables, every ordered pair of the three modes at least once, ending where it began.
    ap.add_argument("--switch-modes", default="iptables,nftables,ebpf,nftables,iptables,ebpf,iptables,nftables",
                    help="mode-switch: the modes node-1's kproxy switches to in turn, from nftables")
    ap.add_argument("--old-kproxy", default="", help="scenario kproxy-upgrade's older kproxy (old-kproxy.sh)")
    ap.add_argument("--old-plugin-dir", default="", help="the older kproxy's plugin directory")
    ap.add_argument("--udp-report-only", action="store_true",
                    help="report failed UDP requests without failing the run (TCP ones always fail it)")
    args = ap.parse_args()
    if args.program == "upstream" and args.mode not in ("nftables", "iptables"):
        raise SystemExit(f"--mode {args.mode}: upstream kube-proxy has no such mode (nftables, iptables)")
    with open(args.desc) as f:
        desc = json.load(f)
    cluster = Cluster(desc, args)
    if args.mode == "ebpf" and not all(n.cgroup for n in cluster.nodes):
        raise SystemExit(f"--mode ebpf: ebpf mode cannot run in this cluster: {cluster.ebpf_error}")
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
        lb_local = Service(cluster, "lb-local", "tcp", 80, POD_TCP_PORT, lb_ip=LB_IPS[0], etp_local=True)
        lb_cluster = Service(cluster, "lb-cluster", "tcp", 80, POD_TCP_PORT, lb_ip=LB_IPS[1])
        lb_udp = Service(cluster, "lb-udp", "udp", 53, POD_UDP_PORT, lb_ip=LB_IPS[2], etp_local=True)
        web_pods = cluster.pods_start(cluster.nodes)
        zero_pods = cluster.pods_start(cluster.nodes)
        lb_pods = cluster.pods_start(cluster.nodes)
        web.write([(p, "ready") for p in web_pods])
        for svc in (zt, zu):
            svc.write([(p, "ready") for p in zero_pods])
        for svc in (lb_local, lb_cluster, lb_udp):
            svc.write([(p, "ready") for p in lb_pods])
        t_start = time.time()
        for n in cluster.nodes:
            cluster.kproxy_start(n)
        startup = Record()
        for svc in (web, zt, zu, lb_local, lb_cluster, lb_udp):
            every, used = svc.expected()
            startup.change(f"{svc.name} at start-up", cluster.wait_programmed(svc.key, svc.port_name, every, used,
                                                                             t_start, per_node=svc.expected_on))
        log(f"every kproxy programmed the cluster ({args.services} background Services)")
        sim = LbSim(cluster, [lb_local, lb_cluster, lb_udp])
        sim.start()
        for svc in (lb_local, lb_cluster, lb_udp):
            sim.wait_in_use(svc, cluster.nodes, "sends to every node")
        churn = Churn(cluster, args.services, args.churn)
        churn.start()
        failed = []
        for name in args.scenarios.split(","):
            if name in ("mode-switch", "kproxy-upgrade") and args.program == "upstream":
                log(f"scenario {name} left out: it is about kproxy's own modes and builds")
                continue
            log(f"scenario {name}")
            if name == "rolling-update":
                sc = scenario_rolling_update(cluster, web, args.grace)
            elif name == "scale-to-zero":
                sc = scenario_scale_to_zero(cluster, zt, zu, args.grace, hold=2)
            elif name == "node-drain":
                sc = scenario_node_drain(cluster, lb_local, lb_cluster, lb_udp, sim, args.grace)
            elif name == "kproxy-restart":
                sc = scenario_kproxy_restart(cluster, web, downtime=1)
            elif name == "apiserver-restart":
                sc = scenario_apiserver_restart(cluster, web, churn, down=2, grace=args.grace)
            elif name == "mode-switch":
                sc = scenario_mode_switch(cluster, web, zu, args.switch_modes.split(","), downtime=1)
            elif name == "kproxy-upgrade":
                sc = scenario_kproxy_upgrade(cluster, web, old_build, args.grace)
            else:
                raise SystemExit(f"unknown scenario {name}")
            failed += [f"{sc.name}: {f}" for f in sc.report()]
            sys.stdout.flush()
        churn.stop()
        sim.stop()
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
