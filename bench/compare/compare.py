#!/usr/bin/env python3
"""kproxy and upstream kube-proxy side by side, against one real kube-apiserver.

Joins the control plane's network namespace itself (bench/compare/run.sh sets it up). For each
scale it loads a synthetic cluster into the apiserver (a realistic mix of Service kinds), then
for each mode and run starts one program at a time in a fresh network namespace of its own, a
node reaching the apiserver over a veth, and measures:

  first sync   from the program's start to the kernel holding the complete ruleset (polled:
               the chain count of the program's tables, complete when it reaches the value it
               settles at), the program's own kubeproxy_sync_proxy_rules_duration_seconds, and
               peak/steady RSS and CPU seconds (its own and its reaped children's: nft,
               iptables-restore);
  changes      one endpoint changed, one Service added, 100 endpoints changed at once: API write
               to the kernel holding every new address (nftables: nft monitor in the node
               namespace; iptables: the service chains listed until they jump to the new
               endpoints' chains), and the sync time the program reports;
  latency      CHANGES one-endpoint changes, each 1.1 s after the previous one reached the
               kernel: API write returned to the new address in the kernel, p50 and p99.

IPVS mode: the host's kernel has no IPVS, so the node is the test VM (VmNode): the ruleset is
polled as the count of virtual and real servers, ipset members and iptables rules, and changes
are seen by kproxy-bench-ipvswait in the guest (IpvsPoller, a ChangePoller).

ebpf mode (kproxy only: upstream has none): the node gets a cgroup and a pin directory of the
run's (EbpfGround); the ruleset is polled as the elements of the pinned services map, and
changes are seen by kproxy-bench-ebpfwait looking the awaited endpoints up among their
ClusterIP's slots (EbpfPoller).

The programs never run at the same time, so neither slows the other. Results are JSON lines.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/e2e"))
import kube_api  # noqa: E402  (tests/e2e/kube_api.py)

NODE = "bench-node"
NODE_IP = "10.255.0.2"
CP_IP = "10.255.0.1"
CLUSTER_CIDR = "10.128.0.0/9"
NAMESPACES = [f"bench-{i}" for i in range(10)]
# Addresses written by the measured changes: 10.250.0.0/15, never used by the loaded cluster.
NEW_ADDR_RE = re.compile(r"\b10\.25[01]\.\d{1,3}\.\d{1,3}\b")
METRIC = "kubeproxy_sync_proxy_rules_duration_seconds"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The API server


class Api(kube_api.Api):
    """The shared admin client (tests/e2e/kube_api.py); a POST of what exists is not an error
    here (a reload after an interrupted load), and OK404 accepts a 404."""

    def call(self, method, path, body=None, ctype="application/json", ok404=False):
        ok = ((404,) if ok404 else ()) + ((409,) if method == "POST" else ())
        return super().call(method, path, body, ctype, ok=ok)


# ---------------------------------------------------------------------------------------------
# The synthetic cluster


def service_shape(i):
    """The kind of Service number i: a fixed mix, the same for every run and program."""
    r = i % 100
    kind = "LoadBalancer" if r < 10 else "NodePort" if r < 25 else "ClusterIP"
    shape = {"kind": kind,
             "external_ips": r in (25, 26, 27, 28, 29),
             "etp_local": kind != "ClusterIP" and i % 3 == 0,
             "affinity": i % 20 == 7,
             "two_ports": i % 5 == 0,
             "named": i % 2 == 1,
             "udp": i % 50 == 13,
             "source_ranges": kind == "LoadBalancer" and i % 30 == 1,
             "terminating": i % 20 == 3}
    return shape


def service_body(i):
    s = service_shape(i)
    proto = "UDP" if s["udp"] else "TCP"
    if s["two_ports"]:
        ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": proto},
                 {"name": "https", "port": 443, "targetPort": 8443, "protocol": proto}]
    elif s["named"]:
        ports = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": proto}]
    else:
        ports = [{"port": 80, "targetPort": 8080, "protocol": proto}]
    spec = {"type": s["kind"], "ports": ports, "selector": {"app": f"svc-{i}"}}
    if s["external_ips"]:
        spec["externalIPs"] = [f"172.20.{i // 250 % 250}.{i % 250 + 1}"]
    if s["etp_local"]:
        spec["externalTrafficPolicy"] = "Local"
    if s["affinity"]:
        spec["sessionAffinity"] = "ClientIP"
    if s["source_ranges"]:
        spec["loadBalancerSourceRanges"] = ["203.0.113.0/24", "198.51.100.0/24"]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"svc-{i}", "namespace": NAMESPACES[i % len(NAMESPACES)]}, "spec": spec}


def endpoint_address(i, k, endpoints):
    n = i * endpoints + k + 1  # unique over the cluster: 10.128.0.0/10 holds 4M
    return f"10.{128 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}"


def slice_body(i, endpoints, override=None):
    s = service_shape(i)
    proto = "UDP" if s["udp"] else "TCP"
    if s["two_ports"]:
        ports = [{"name": "http", "port": 8080, "protocol": proto}, {"name": "https", "port": 8443, "protocol": proto}]
    elif s["named"]:
        ports = [{"name": "http", "port": 8080, "protocol": proto}]
    else:
        ports = [{"name": "", "port": 8080, "protocol": proto}]
    eps = []
    for k in range(endpoints):
        n = i * endpoints + k
        node = NODE if n % 50 == 0 else f"node-{n % 50}"
        cond = {"ready": True, "serving": True, "terminating": False}
        if s["terminating"] and k == endpoints - 1:
            cond = {"ready": False, "serving": True, "terminating": True}
        addr = endpoint_address(i, k, endpoints)
        if override and k in override:
            addr = override[k]
        eps.append({"addresses": [addr], "conditions": cond, "nodeName": node})
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i}-bench", "namespace": NAMESPACES[i % len(NAMESPACES)],
                         "labels": {"kubernetes.io/service-name": f"svc-{i}",
                                    "endpointslice.kubernetes.io/managed-by": "kproxy-bench"}},
            "addressType": "IPv4", "endpoints": eps, "ports": ports}


def plain_services(count, limit):
    """Indexes of plain single-port TCP ClusterIP Services, the targets of measured changes."""
    out = []
    for i in range(1, limit):
        s = service_shape(i)
        if s["kind"] == "ClusterIP" and not (s["external_ips"] or s["affinity"] or s["two_ports"] or s["udp"]
                                             or s["terminating"]):
            out.append(i)
            if len(out) == count:
                break
    return out


def load_cluster(api, start, services, endpoints, threads=6):
    """Services [start, services) with their slices (and LoadBalancer status); the base objects."""
    if start == 0:
        api.call("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
            "spec": {"podCIDR": "10.128.0.0/24", "podCIDRs": ["10.128.0.0/24"]}})
        api.call("PATCH", f"/api/v1/nodes/{NODE}/status",
                 {"status": {"addresses": [{"type": "InternalIP", "address": NODE_IP},
                                           {"type": "Hostname", "address": NODE}]}},
                 ctype="application/merge-patch+json")
        for ns in NAMESPACES:
            api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    t0 = time.time()

    def one(i):
        ns = NAMESPACES[i % len(NAMESPACES)]
        api.call("POST", f"/api/v1/namespaces/{ns}/services", service_body(i))
        api.call("POST", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", slice_body(i, endpoints))
        if service_shape(i)["kind"] == "LoadBalancer":
            api.call("PATCH", f"/api/v1/namespaces/{ns}/services/svc-{i}/status",
                     {"status": {"loadBalancer": {"ingress": [{"ip": f"198.18.{i // 250 % 250}.{i % 250 + 1}"}]}}},
                     ctype="application/merge-patch+json")

    with ThreadPoolExecutor(threads) as pool:
        for n, _ in enumerate(pool.map(one, range(start, services)), 1):
            if n % 2000 == 0:
                log(f"loaded {start + n}/{services} services ({n / (time.time() - t0):.0f}/s)")
    log(f"loaded services [{start}, {services}) × {endpoints} endpoints in {time.time() - t0:.0f} s")


def delete_cluster_slices_and_services(api, services):
    def one(i):
        ns = NAMESPACES[i % len(NAMESPACES)]
        api.call("DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/svc-{i}-bench", ok404=True)
        api.call("DELETE", f"/api/v1/namespaces/{ns}/services/svc-{i}", ok404=True)
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, range(services)))


# ---------------------------------------------------------------------------------------------
# A node and a program on it


def sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


class Node:
    """A fresh network namespace joined to the control plane's by a veth: 10.255.0.2 <-> .1."""

    def __init__(self, name, cp_ns):
        self.ns = name
        self.cp_ns = cp_ns
        # The previous node's veth goes with its namespace, but asynchronously: wait for it.
        for _ in range(100):
            if sh("ip", "-n", cp_ns, "link", "show", "nodelink", check=False).returncode != 0:
                break
            sh("ip", "-n", cp_ns, "link", "del", "nodelink", check=False)
            time.sleep(0.1)
        sh("ip", "netns", "add", name)
        try:
            sh("ip", "-n", name, "link", "set", "lo", "up")
            sh("ip", "-n", cp_ns, "link", "add", "nodelink", "type", "veth", "peer", "name", "eth0", "netns", name)
            sh("ip", "-n", cp_ns, "addr", "add", f"{CP_IP}/30", "dev", "nodelink")
            sh("ip", "-n", cp_ns, "link", "set", "nodelink", "up")
            sh("ip", "-n", name, "addr", "add", f"{NODE_IP}/30", "dev", "eth0")
            sh("ip", "-n", name, "link", "set", "eth0", "up")
            sh("ip", "-n", name, "route", "add", "default", "via", CP_IP)
            sh("ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        except Exception:
            self.remove()
            raise

    def exec(self, *cmd, check=False, timeout=120):
        return sh("ip", "netns", "exec", self.ns, *cmd, check=check, timeout=timeout)

    def remove(self):
        for pid in sh("ip", "netns", "pids", self.ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        sh("ip", "-n", self.cp_ns, "link", "del", "nodelink", check=False)
        sh("ip", "netns", "del", self.ns, check=False)


def proc_stat(pid):
    """(peak RSS MiB, RSS MiB, CPU seconds of the process and its reaped children)."""
    return parse_proc_stat(open(f"/proc/{pid}/status").read(), open(f"/proc/{pid}/stat").read())


def parse_proc_stat(status, stat):
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    fields = stat.rsplit(")", 1)[1].split()
    ticks = 100  # USER_HZ, the same on x86 hosts and guests
    cpu = sum(int(fields[k]) for k in (11, 12, 13, 14)) / ticks  # utime stime cutime cstime
    return hwm, rss, cpu


def program_flags(args, mode, metrics_host):
    """The flags both programs get, the same for each (the metrics server on metrics_host)."""
    return [f"--proxy-mode={mode}", "--kubeconfig", args.kubeconfig, "--hostname-override", NODE,
            "--cluster-cidr", CLUSTER_CIDR, "--metrics-bind-address", f"{metrics_host}:10249",
            "--healthz-bind-address", "127.0.0.1:10256",
            # nf_conntrack_max is global, not per namespace: leave the host's alone.
            "--conntrack-max-per-core=0", "-v", str(args.verbosity)]


HEAPTRACK_PRELOAD = "/usr/lib/heaptrack/libheaptrack_preload.so"


def heaptrack_wrap(cmd, raw):
    """cmd under heaptrack's preload, its data written raw to `raw`: the process keeps its pid
    (its peak then includes heaptrack's own memory, a few MiB)."""
    if not os.path.exists(HEAPTRACK_PRELOAD):
        raise SystemExit(f"--heaptrack needs {HEAPTRACK_PRELOAD} (apt-get install -y heaptrack)")
    return ["env", f"LD_PRELOAD={HEAPTRACK_PRELOAD}", f"DUMP_HEAPTRACK_OUTPUT={raw}"] + cmd


def heaptrack_report(raw):
    """RAW (or RAW.gz) → RAW's stem .heaptrack.gz (for heaptrack_print or heaptrack_gui) and
    .heaptrack.txt: the 25 largest contributors to the heap's peak, and the totals."""
    stem = re.sub(r"\.heaptrack\.raw(\.gz)?$", "", raw)
    interpret = os.path.join(os.path.dirname(HEAPTRACK_PRELOAD), "libexec", "heaptrack_interpret")
    if not os.path.exists(raw):
        log(f"heaptrack: no data in {raw}")
        return
    src = f"gzip -dc '{raw}'" if raw.endswith(".gz") else f"cat '{raw}'"
    sh("sh", "-c", f"{src} | '{interpret}' | gzip > '{stem}.heaptrack.gz'", check=False)
    out = sh("heaptrack_print", "-f", f"{stem}.heaptrack.gz", "--print-peaks", "1", "--print-allocators", "0",
             "--print-temporary", "0", "--print-leaks", "0", "--peak-limit", "25", check=False).stdout
    with open(f"{stem}.heaptrack.txt", "w") as f:
        f.write(out)
    os.unlink(raw)
    peak = re.search(r"peak heap memory consumption: (\S+)", out)
    log(f"heaptrack: {stem}.heaptrack.txt (peak heap {peak.group(1) if peak else '?'})")


class Program:
    def __init__(self, which, mode, node, args, workdir):
        self.which, self.mode, self.node = which, mode, node
        self.logpath = os.path.join(workdir, f"{which}-{mode}-{node.ns}.log")
        cmd = list(args.kproxy_cmd if which == "kproxy" else args.upstream_cmd)
        if which == "kproxy" and args.heaptrack:
            self.heaptrack_raw = self.logpath.replace(".log", ".heaptrack.raw")
            cmd = heaptrack_wrap(cmd, self.heaptrack_raw)
        flags = program_flags(args, mode, "127.0.0.1")
        if mode == "ebpf":
            flags += ["--ebpf-cgroup-path", node.ebpf.cgroup, "--ebpf-pin-path", node.ebpf.pins]
        self.logf = open(self.logpath, "w")
        self.start = time.time()
        # A session of its own: its children (nft, iptables-restore) can be stopped with it.
        self.p = subprocess.Popen(["ip", "netns", "exec", node.ns] + cmd + flags,
                                  stdout=self.logf, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def kill_all(self):
        """SIGKILL to the program and every child it started, e.g. an `nft -f` whose transaction
        holds the kernel's commit lock, so that listings waiting for that lock return."""
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stat(self):
        return proc_stat(self.p.pid)

    def metric(self):
        """(sum, count) of the sync duration histogram, or None."""
        r = self.node.exec("curl", "-s", "--max-time", "5", "http://127.0.0.1:10249/metrics")
        return sync_metric(r.stdout)

    def stop(self):
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.kill_all()  # children it left running
        self.logf.close()
        if getattr(self, "heaptrack_raw", None):
            heaptrack_report(self.heaptrack_raw)

    def tail(self, n=20):
        return file_tail(self.logpath, n)


def file_tail(path, n):
    """The last n lines of a log file, or "" when it cannot be read."""
    try:
        return "".join(open(path).readlines()[-n:])
    except OSError:
        return ""


def sync_metric(text):
    """(sum, count) of the sync duration histogram in a /metrics page, or None."""
    # Upstream labels it by ip_family (one proxier per family, syncing in parallel); the
    # cluster here is IPv4, so its IPv4 series is the one to compare.
    series = {}
    for line in text.splitlines():
        m = re.match(METRIC + r'_(sum|count)(\{[^}]*\})? (\S+)$', line)
        if m:
            series.setdefault(m.group(2) or "", {})[m.group(1)] = float(m.group(3))
    for labels in ('{ip_family="IPv4"}', ""):
        if "sum" in series.get(labels, {}) and "count" in series[labels]:
            return series[labels]["sum"], int(series[labels]["count"])
    return None


# ---------------------------------------------------------------------------------------------
# IPVS mode: the node is the test VM (the host's kernel has no IPVS)


class VmNode:
    """The test VM (tests/vm/run-in-vm.sh) as a node: qemu runs in the control plane's namespace
    (this process's) with user networking, so the guest, 10.255.0.2, reaches the apiserver at
    10.255.0.1; vm_node.sh in the guest starts the program when asked and answers queries over
    HTTP, forwarded by qemu from 127.0.0.1:AGENT_PORT here, and the program's /metrics from
    127.0.0.1:METRICS_PORT. Under TCG (no KVM here) everything in the guest is several times
    slower than on the host: compare programs with each other, not with the other modes."""

    AGENT_PORT, METRICS_PORT = 18000, 18249

    def __init__(self, name, args, which, boot_timeout=300):
        self.ns = name
        self.logpath = os.path.join(args.workdir, f"{which}-ipvs-{name}.vm.log")
        # Files go in under their host paths: the binary, --plugin-dir's directory.
        cmd = [os.path.abspath(w) if os.path.exists(w) else w
               for w in (args.kproxy_cmd if which == "kproxy" else args.upstream_cmd)]
        files = [HERE + "/vm_node.sh", args.kubeconfig, args.ipvs_wait] + [w for w in cmd if w.startswith("/")]
        self.heaptrack = which == "kproxy" and args.heaptrack
        if self.heaptrack:
            cmd = heaptrack_wrap(cmd, "/run/heaptrack.raw")
            files.append(HEAPTRACK_PRELOAD)
        files += re.findall(r"(?:certificate-authority|tokenFile|client-certificate|client-key):\s*(/\S+)",
                            open(args.kubeconfig).read())
        nic = (f"user,model=virtio-net-pci,net=10.255.0.0/24,host={CP_IP},"
               f"hostfwd=tcp:127.0.0.1:{self.AGENT_PORT}-{NODE_IP}:8000,"
               f"hostfwd=tcp:127.0.0.1:{self.METRICS_PORT}-{NODE_IP}:10249")
        self.logf = open(self.logpath, "w")
        vm = [ROOT + "/tests/vm/run-in-vm.sh", "--timeout", str(args.vm_timeout), "--memory", str(args.vm_memory),
              "--nic", nic]
        for f in files:
            vm += ["--file", f]
        # The metrics server on the guest's address, where qemu forwards METRICS_PORT to.
        self.p = subprocess.Popen(vm + ["--", HERE + "/vm_node.sh", args.ipvs_wait] + cmd
                                  + program_flags(args, "ipvs", NODE_IP),
                                  stdout=self.logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + boot_timeout
        while True:
            try:
                if "unknown query" in self.query("ping", timeout=2):
                    break
            except OSError:
                pass
            if self.p.poll() is not None or time.time() > deadline:
                self.remove()
                raise RuntimeError(f"the VM node did not come up:\n{self.tail()}")
            time.sleep(0.5)

    def open_query(self, q, timeout=60):
        """The agent's answer to q, as a response to read (a wait's lines come as they happen)."""
        return urllib.request.urlopen(f"http://127.0.0.1:{self.AGENT_PORT}/cgi-bin/q?{q}", timeout=timeout)

    def query(self, q, timeout=60):
        with self.open_query(q, timeout) as r:
            return r.read().decode()

    def metrics(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.METRICS_PORT}/metrics", timeout=10) as r:
                return r.read().decode()
        except OSError:
            return ""

    def ipvs_objects(self, timeout=120):
        try:
            return int(self.query("count", timeout=timeout).strip())
        except (OSError, ValueError):
            return None

    def tail(self, n=30):
        return file_tail(self.logpath, n)

    def remove(self):
        try:
            # The program's own log, kept beside the VM's console log.
            with open(self.logpath.replace(".vm.log", ".log"), "w") as f:
                f.write(self.query("log", timeout=60))
        except OSError:
            pass
        if self.heaptrack:
            raw = self.logpath.replace(".vm.log", ".heaptrack.raw.gz")
            try:
                with self.open_query("heaptrack", timeout=600) as r, open(raw, "wb") as f:
                    shutil.copyfileobj(r, f)
                heaptrack_report(raw)
            except OSError as e:
                log(f"heaptrack: could not fetch the guest's data: {e}")
        try:
            self.query("stop", timeout=5)
            self.p.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self.logf.close()


class VmProgram:
    """The program on a VmNode: Program's interface, answered by the guest."""

    def __init__(self, which, node):
        self.which, self.mode, self.node = which, "ipvs", node
        self.start = time.time()
        self.pid = node.query("start").strip()

    def _proc(self):
        text = self.node.query("stat", timeout=30)
        status, _, stat = text.partition("\n\n")
        return status, stat

    def alive(self):
        try:
            status, _ = self._proc()
        except OSError:
            return False
        m = re.search(r"State:\s+(\S)", status)
        return bool(m) and m.group(1) not in "ZX"

    def stat(self):
        return parse_proc_stat(*self._proc())

    def metric(self):
        return sync_metric(self.node.metrics())

    def stop(self):
        pass  # the node's removal stops it

    def tail(self, n=20):
        try:
            return "\n".join(self.node.query("log", timeout=30).splitlines()[-n:])
        except OSError:
            return self.node.tail(n)


class ChangePoller:
    """A change detector that asks the kernel itself: a helper process polls for the awaited
    endpoints of each service port and streams "seen …" as each appears (timed here on arrival),
    "polling" once it polls and "done" when all are there. Armed before the API write where the
    service's ClusterIP is known (every change but an added Service, whose ClusterIP the write
    allocates), so that starting the helper is not counted. Subclasses start it (`start`)."""

    def __init__(self, node, api):
        self.node, self.api = node, api
        self.missed = 0
        self.vips = {}
        self.armed = None  # (items, stream, time of an endpoint seen on the first look)

    def vip(self, port_name):
        """The ClusterIP:port of a service port named as upstream does (ns/name[:port]), or None."""
        if port_name not in self.vips:
            ns, _, rest = port_name.partition("/")
            name, _, pname = rest.partition(":")
            svc = self.api.call("GET", f"/api/v1/namespaces/{ns}/services/{name}", ok404=True)
            ip = svc.get("spec", {}).get("clusterIP") if svc else None  # a 404 is a Status
            if not ip:
                return None
            port = next(p["port"] for p in svc["spec"]["ports"] if p.get("name", "") == pname)
            self.vips[port_name] = f"{ip}:{port}"
        return self.vips[port_name]

    def start(self, items, vips, timeout):
        """Starts the helper for items (their VIPs in vips); returns its output stream."""
        raise NotImplementedError

    def arm(self, items, timeout):
        """Starts the wait for items; returns once it polls. False when a VIP is unknown."""
        vips = [self.vip(pn) for _, pn in items]
        if None in vips:
            return False
        self.stop()  # the previous wait's helper
        r = self.start(items, vips, timeout)
        seen = None  # on its first look (an added Service's wait starts after the write)
        while True:
            line = r.readline().decode().strip()
            if line == "polling":
                break
            if not line.startswith("seen "):
                self.stop_helper()  # a process of this side's: ended first, so that the read ends
                rest = r.read().decode()[:500]
                raise RuntimeError(f"{type(self).__name__}'s helper: {line}{rest}")
            seen = time.time()
        self.armed = (list(items), r, seen)
        return True

    def wait_all(self, items, timeout, mode=None):
        if self.armed is None or self.armed[0] != list(items):
            deadline = time.time() + timeout
            while not self.arm(items, timeout):  # an added Service: until its ClusterIP is known
                if time.time() > deadline:
                    return None
                time.sleep(0.05)
        _, r, last = self.armed
        self.armed = None
        with r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("seen "):
                    last = time.time()
                elif line == "done":
                    return last
                else:
                    return None
        return None

    def stop_helper(self):
        """Ends the helper's process where this side owns one."""

    def stop(self):
        if self.armed:
            self.armed[1].close()
            self.armed = None
        self.stop_helper()


class IpvsPoller(ChangePoller):
    """IPVS mode's change detector: kproxy-bench-ipvswait in the guest asks the kernel for each
    awaited endpoint's virtual server's real servers every 5 ms (one netlink dump each; both
    programs add a real server with one netlink message), behind the node's query endpoint;
    starting it in the guest takes tens of ms under TCG, which arming beforehand keeps out."""

    def start(self, items, vips, timeout):
        q = [f"{v}={ip}:8080" for v, (ip, _) in zip(vips, items)]
        q += ["--timeout-s", str(int(timeout)), "--interval-ms", "5" if len(items) < 10 else "20"]
        return self.node.open_query("wait&" + "&".join(q), timeout=timeout + 30)


class EbpfGround:
    """ebpf mode's cgroup and pins for one node: a cgroup of the run's (run.sh's private mount
    namespace binds the hierarchy and mounts a bpffs of its own, so nothing goes on the host's
    root cgroup or its /sys/fs/bpf), which nothing runs in, and a pin directory. The ruleset's
    size is the elements of the services map (kproxy writes a port's slots before its services
    element), counted by kproxy-bench-ebpfwait."""

    def __init__(self, args, node):
        if not (args.ebpf_ground and args.ebpf_wait):
            raise RuntimeError("--modes ebpf needs --ebpf-ground and --ebpf-wait (bench/compare/run.sh sets them)")
        top, bpffs = args.ebpf_ground.split(":", 1)
        self.cgroup, self.pins, self.helper = os.path.join(top, node.ns), os.path.join(bpffs, node.ns), args.ebpf_wait
        self.cleanup_cmd = args.kproxy_cmd + ["--cleanup", "--ebpf-cgroup-path", self.cgroup,
                                              "--ebpf-pin-path", self.pins]
        os.mkdir(self.cgroup)

    def count(self, timeout):
        if not os.path.exists(os.path.join(self.pins, "kproxy_services")):
            return 0
        r = sh(self.helper, self.pins, "count", check=False, timeout=timeout)
        m = re.match(r"services=(\d+)", r.stdout)
        return int(m.group(1)) if m else None

    def remove(self, node):
        """The programs detached and the pins removed (kproxy --cleanup in the node), then the cgroup."""
        node.exec(*self.cleanup_cmd)
        try:
            os.rmdir(self.cgroup)
        except OSError as e:
            log(f"ebpf: cgroup {self.cgroup} not removed: {e}")


class EbpfPoller(ChangePoller):
    """ebpf mode's change detector: kproxy-bench-ebpfwait looks each awaited endpoint up among its
    ClusterIP's cluster slots in the pinned maps every millisecond."""

    def __init__(self, node, api):
        super().__init__(node, api)
        self.ground = node.ebpf
        self.proc = None

    def start(self, items, vips, timeout):
        cmd = [self.ground.helper, self.ground.pins, "--timeout-s", str(int(timeout)), "wait"]
        cmd += [f"{v}={ip}" for v, (ip, _) in zip(vips, items)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        return self.proc.stdout

    def stop_helper(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def chain_count(node, mode, timeout=120):
    """How many chains the mode's table holds in the node's kernel (cheap: no rules listed), or
    None when the listing did not return within `timeout` seconds: a listing waits for a
    transaction being committed (upstream's first sync at 10,000 x 10 holds it for minutes)."""
    if mode == "ipvs":
        return node.ipvs_objects(timeout)
    if mode == "ebpf":
        return node.ebpf.count(timeout)
    table = "table ip kube-proxy {" if mode == "nftables" else "table ip nat {"
    try:
        r = node.exec("nft", "list", "chains", "ip", timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    count, inside = 0, False
    for line in r.stdout.splitlines():
        if line.startswith("table "):
            inside = line.strip() == table
        elif inside and line.lstrip().startswith("chain "):
            count += 1
    return count


class Monitor:
    """`nft monitor` in the node namespace; remembers when each new address (10.250/15) appeared."""

    def __init__(self, node, timeout=120):
        self.seen = {}
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.node = node
        # Only additions: a big sync's deletions would double the output the monitor must keep
        # up with (its netlink socket overflows and events are lost; see wait_all's fallback).
        self.p = subprocess.Popen(["ip", "netns", "exec", node.ns, "nft", "monitor", "new"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.missed = 0  # changes found by the fallback poll, not by the monitor
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        # nft monitor reads the whole ruleset before it subscribes (seconds at 10,000 Services):
        # a change made before that is never printed. Ready once it prints a probe table of its
        # own (neither program touches tables it does not own). Each probe is a transaction that
        # is not the program's (kproxy before 2026-11-27 answered one with a full sync): one
        # every 5 s, so that the program's full syncs do not keep the monitor from the CPU it
        # needs to start (at 30,000 Services the monitor needed more than 120 s with one a second).
        self.ready = threading.Event()
        deadline = time.time() + timeout
        while not self.ready.is_set() and time.time() < deadline:
            node.exec("nft", "add", "table", "ip", "kproxy-bench-probe")
            node.exec("nft", "delete", "table", "ip", "kproxy-bench-probe")
            self.ready.wait(5.0)
        if not self.ready.is_set():
            raise RuntimeError(f"nft monitor did not start within {timeout:.0f} s")

    def _read(self):
        for line in self.p.stdout:
            if "kproxy-bench-probe" in line:
                self.ready.set()
                continue
            if "10.25" not in line:
                continue
            now = time.time()
            with self.cond:
                for a in NEW_ADDR_RE.findall(line):
                    self.seen.setdefault(a, now)
                self.cond.notify_all()

    def wait_all(self, addrs, timeout, mode=None):
        """The time the last of addrs appeared, or None after timeout. When the monitor has not
        seen them within 10 s (it loses events when a huge transaction overflows its socket),
        the kernel is listed once a second; an address found that way counts from the listing
        that found it (an upper bound) and is counted in `missed`."""
        addrs = [a[0] if isinstance(a, tuple) else a for a in addrs]
        deadline = time.time() + timeout
        poll_from = time.time() + 10
        with self.cond:
            while not all(a in self.seen for a in addrs):
                now = time.time()
                if now >= deadline:
                    return None
                if mode and now >= poll_from:
                    self.cond.release()
                    try:
                        wait = max(1.0, deadline - now)  # a listing waits for a commit in progress
                        cmd = (("nft", "list", "table", "ip", "kube-proxy") if mode == "nftables"
                               else ("iptables-save", "-t", "nat"))
                        listing = self.node.exec(*cmd, timeout=wait).stdout
                    except subprocess.TimeoutExpired:
                        listing = ""
                    finally:
                        self.cond.acquire()
                    found = time.time()
                    for a in addrs:
                        if a not in self.seen and re.search(r"\b" + re.escape(a) + r"\b", listing):
                            self.seen[a] = found
                            self.missed += 1
                    poll_from = found + 1
                    continue
                self.cond.wait(min(deadline, poll_from) - now if mode else deadline - now)
            return max(self.seen[a] for a in addrs)

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()


def chain_hash(text):
    """Upstream's iptables chain hash: base32(sha256(text))[:16] (KUBE-SVC-, KUBE-SEP-)."""
    import base64
    import hashlib
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


class ChainPoller:
    """iptables mode's change detector. nft monitor needs minutes of CPU to read a 10,000-Service
    iptables-nft ruleset before it prints anything, so instead each awaited endpoint's service
    chain is listed (`iptables -S KUBE-SVC-…`, about 15 ms) until it jumps to the endpoint's
    chain (both programs name them as upstream: KUBE-SEP- + hash of port, protocol, endpoint)."""

    def __init__(self, node):
        self.node = node
        self.missed = 0

    def wait_all(self, items, timeout, mode=None):
        pending = {}
        for ip, port_name in items:
            svc = "KUBE-SVC-" + chain_hash(port_name + "tcp")
            pending[ip] = (svc, "KUBE-SEP-" + chain_hash(f"{port_name}tcp{ip}:8080"))
        deadline = time.time() + timeout
        last = None
        while pending:
            if time.time() >= deadline:
                return None
            for ip, (svc, sep) in list(pending.items()):
                out = self.node.exec("iptables", "-w", "-t", "nat", "-S", svc).stdout
                if "-j " + sep in out:
                    del pending[ip]
                    last = time.time()
            if pending:
                time.sleep(0.02)
        return last

    def stop(self):
        pass


class NftChainPoller:
    """Upstream's nftables mode with --upstream-nft-watch=chains. `nft monitor` reads the whole
    ruleset before it subscribes, and at 10,000 Services x 10 endpoints upstream's (one chain
    per endpoint, 100,000 chains) takes it more than 120 s, then a core to follow each sync. So
    instead the chain names are listed (`nft list chains ip`, no rules) until each awaited
    endpoint's chain is there: upstream names them endpoint-HASH-NS/NAME/PROTO/PORT__IP/PORT and
    adds them in the transaction that routes the service to them. A change counts from the start
    of the first listing that shows it (the listing's own time is not added: upstream's favour).
    Not for kproxy, whose endpoints are map elements, not chains."""

    def __init__(self, node):
        self.node = node
        self.missed = 0
        self.listing_s = []

    def wait_all(self, items, timeout, mode=None):
        pending = {f"__{ip}/8080" for ip, _ in items}
        deadline = time.time() + timeout
        last = None
        while pending:
            t0 = time.time()
            if t0 >= deadline:
                return None
            try:
                out = self.node.exec("nft", "list", "chains", "ip", timeout=max(1.0, deadline - t0)).stdout
            except subprocess.TimeoutExpired:
                continue
            self.listing_s.append(time.time() - t0)
            for p in [p for p in pending if p in out]:
                pending.discard(p)
                last = t0
            if pending:
                time.sleep(0.05)
        return last

    def stop(self):
        pass


def port_name_of(i):
    """The service port name of plain Service i, as upstream writes it (namespace/name[:port])."""
    return f"{NAMESPACES[i % len(NAMESPACES)]}/svc-{i}" + (":http" if service_shape(i)["named"] else "")


class NewAddresses:
    def __init__(self, seed):
        self.n = seed

    def next(self):
        self.n += 1
        n = self.n
        return f"10.{250 + (n >> 16) % 2}.{(n >> 8) & 255}.{(n & 255) or 1}"


# ---------------------------------------------------------------------------------------------
# One measured run


def count_changes(samples, start):
    """[(seconds after start, count)] at each change of the polled count, and the last sample."""
    out = []
    for t, c in samples:
        if not out or out[-1][1] != c:
            out.append((round(t - start, 3), c))
    if samples and out[-1][0] != round(samples[-1][0] - start, 3):
        out.append((round(samples[-1][0] - start, 3), samples[-1][1]))
    return out[:200] + out[-1:] if len(out) > 201 else out


class CapWatchdog:
    """Enforces the cap on a first sync: at the cap it reads the program's figures and stops it
    with all its children. Without it a listing can wait past the cap: upstream's single `nft -f`
    transaction at 30,000 × 10 held the kernel's commit lock, and a listing blocked on it, for
    14 minutes."""

    def __init__(self, prog, timeout):
        self.prog, self.at_cap, self.fired = prog, None, False
        self.timer = threading.Timer(max(0.0, prog.start + timeout - time.time()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self):
        if not hasattr(self.prog, "kill_all"):
            return  # a VM node's program goes with its VM
        self.fired = True
        try:
            self.at_cap = self.prog.stat()
        except OSError:
            pass
        self.prog.kill_all()

    def cancel(self):
        self.timer.cancel()


def first_sync(prog, node, mode, timeout):
    """Poll the kernel until the chain count settles after the program's first sync."""
    watchdog = CapWatchdog(prog, timeout)
    try:
        return first_sync_polled(prog, node, mode, timeout, watchdog)
    finally:
        watchdog.cancel()


def first_sync_polled(prog, node, mode, timeout, watchdog):
    samples = []
    last_change = time.time()
    last = -1
    next_note = time.time() + 10
    while True:
        now = time.time()
        if now > next_note:
            next_note = now + 10
            log(f"{prog.which} {mode}: waiting for the first sync: {last} chains, metric {prog.metric()}")
        if watchdog.fired:
            prog.at_cap = watchdog.at_cap
            return None, samples
        if not prog.alive():
            raise RuntimeError(f"{prog.which} exited during its first sync:\n{prog.tail()}")
        c = chain_count(node, mode, timeout=max(5.0, prog.start + timeout - now))
        listing_s = time.time() - now
        # The listing's end: a listing that waited for a commit shows the state right after
        # it. (At most the listing's own time late otherwise: tens of ms at 10,000 Services.)
        now = time.time()
        if c is not None:
            samples.append((now, c))
            if c != last:
                last, last_change = c, now
        if now - prog.start > timeout:
            return None, samples
        if last > 0 and now - last_change > 3.0:
            m = prog.metric()
            if m and m[1] >= 1:
                break
        # The VM's count shares the guest's one CPU with the program (at 10,000 Services under
        # TCG, reading /proc/net/ip_vs alone costs 0.3 s): at most a fifth of its time.
        time.sleep(max(1.0, 4 * listing_s) if mode == "ipvs" else 0.05)
    done = next(t for t, c in samples if c == last)
    return done - prog.start, samples


def wait_quiet(prog, quiet=2.0, timeout=120):
    """Until the program's sync count stops moving for `quiet` seconds."""
    deadline = time.time() + timeout
    m = prog.metric()
    since = time.time()
    while time.time() < deadline:
        time.sleep(0.25)
        m2 = prog.metric()
        if m2 != m:
            m, since = m2, time.time()
        elif time.time() - since >= quiet:
            return m
    return m


def measured_change(api, prog, mon, writes, addrs, timeout):
    """Apply writes (callables) in parallel; time from the first write to every addr in the kernel."""
    before = wait_quiet(prog)
    if hasattr(mon, "arm"):
        mon.arm(addrs, timeout)
    t0 = time.time()
    with ThreadPoolExecutor(min(len(writes), 8)) as pool:
        list(pool.map(lambda w: w(), writes))
    t_written = time.time()
    t_seen = mon.wait_all(addrs, timeout, prog.mode)
    after = wait_quiet(prog)
    sync_s = None
    if before and after and after[1] > before[1]:
        sync_s = (after[0] - before[0]) / (after[1] - before[1])
    return {"wall_ms": None if t_seen is None else round((t_seen - t0) * 1000, 1),
            "after_last_write_ms": None if t_seen is None else round((t_seen - t_written) * 1000, 1),
            "syncs": None if not (before and after) else after[1] - before[1],
            "mean_sync_ms": None if sync_s is None else round(sync_s * 1000, 2)}


def patch_slice(api, i, endpoints, override):
    ns = NAMESPACES[i % len(NAMESPACES)]
    return lambda: api.call("PUT", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/svc-{i}-bench",
                            slice_body(i, endpoints, override))


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_one(args, api, which, mode, scale, run, addrs):
    services, endpoints = scale
    name = f"{args.prefix}{which[0]}{mode[:2]}{run}"
    node = VmNode(name, args, which) if mode == "ipvs" else Node(name, args.cp_ns)
    node.ebpf = None
    if mode == "ebpf":
        try:
            node.ebpf = EbpfGround(args, node)
        except Exception:
            node.remove()
            raise
    res = {"program": which, "mode": mode, "services": services, "endpoints": endpoints, "run": run,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": args.versions[which],
           # Other work on the machine skews a run: the load when it started.
           "loadavg_1m": float(open("/proc/loadavg").read().split()[0])}
    prog = None
    mon = None
    timeout = args.upstream_timeout if which == "upstream" else args.kproxy_timeout
    try:
        prog = VmProgram(which, node) if mode == "ipvs" else Program(which, mode, node, args, args.workdir)
        took, samples = first_sync(prog, node, mode, timeout)
        if took is None:
            res["first_sync_capped_s"] = timeout
            # What it held until the cap (a lower bound of its peak), and its own CPU until then,
            # which leaves out the children it has not reaped (`nft`, `iptables-restore`).
            try:
                hwm, rss, cpu = getattr(prog, "at_cap", None) or prog.stat()
                res.update({"peak_rss_at_cap_mib": round(hwm, 1), "rss_at_cap_mib": round(rss, 1),
                            "cpu_at_cap_s": round(cpu, 2)})
            except Exception as e:  # a program gone by now: the cap alone
                log(f"{which} {mode} {services}x{endpoints}: no figures at the cap: {e}")
            log(f"{which} {mode} {services}x{endpoints}: no complete first sync within {timeout} s (capped)")
            return res
        hwm, rss, cpu = prog.stat()
        m = prog.metric()
        res.update({"first_sync_s": round(took, 3), "chains": samples[-1][1],
                    # When the kernel showed what: each change of the count, seconds after the start.
                    "first_sync_counts": count_changes(samples, prog.start),
                    "poll_interval_ms": round(1000 * (samples[-1][0] - samples[0][0]) / max(1, len(samples) - 1), 1),
                    "first_sync_metric_s": round(m[0] / m[1], 3) if m and m[1] == 1 else None,
                    "first_sync_metric_sum_s": round(m[0], 3) if m else None,
                    "cpu_first_sync_s": round(cpu, 2), "peak_rss_first_sync_mib": round(hwm, 1)})
        log(f"{which} {mode} {services}x{endpoints} run {run}: first sync {took:.3f} s, peak {hwm:.0f} MiB")
        if args.dump_state and mode == "ipvs":
            # Both programs' state for the same cluster, to compare (upstream parity).
            path = os.path.join(args.workdir, f"{which}-{mode}-{services}x{endpoints}-run{run}.state")
            with open(path, "w") as f:
                f.write(node.query("dump", timeout=300))
        # A failure after the first sync keeps what was measured up to it.
        try:
            # The monitor reads the whole ruleset before it subscribes: allow it 1 s per 100 Services.
            if mode == "ipvs":
                mon = IpvsPoller(node, api)
            elif mode == "ebpf":
                mon = EbpfPoller(node, api)
            elif mode != "nftables":
                mon = ChainPoller(node)
            elif which == "upstream" and args.upstream_nft_watch == "chains":
                mon = NftChainPoller(node)
            else:
                mon = Monitor(node, max(120.0, services / 100))
            res["watch"] = type(mon).__name__
            targets = plain_services(102, services)  # the last one for the warm-up
            # A warm-up change, not measured: the monitor's probe table was a transaction that was
            # not the program's (kproxy's nftables backend answered one with a full sync before
            # it told other tables' transactions from its own), and neither program should pay
            # for the harness.
            a = addrs.next()
            measured_change(api, prog, mon, [patch_slice(api, targets[-1], endpoints, {0: a})],
                            [(a, port_name_of(targets[-1]))], args.change_timeout)
            # one endpoint
            a = addrs.next()
            res["one_endpoint"] = measured_change(api, prog, mon, [patch_slice(api, targets[0], endpoints, {0: a})],
                                                  [(a, port_name_of(targets[0]))], args.change_timeout)
            # one service added
            name = f"added-{which}-{mode}-{run}"
            a1, a2 = addrs.next(), addrs.next()
            svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "bench-0"},
                   "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
            sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": name, "namespace": "bench-0", "labels": {"kubernetes.io/service-name": name}},
                  "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                  "endpoints": [{"addresses": [x], "conditions": {"ready": True}, "nodeName": "node-1"}
                                for x in (a1, a2)]}

            def add_service():
                api.call("POST", "/api/v1/namespaces/bench-0/services", svc)
                api.call("POST", "/apis/discovery.k8s.io/v1/namespaces/bench-0/endpointslices", sl)
            res["service_added"] = measured_change(api, prog, mon, [add_service],
                                                   [(a1, f"bench-0/{name}:http"), (a2, f"bench-0/{name}:http")],
                                                   args.change_timeout)
            api.call("DELETE", f"/apis/discovery.k8s.io/v1/namespaces/bench-0/endpointslices/{name}", ok404=True)
            api.call("DELETE", f"/api/v1/namespaces/bench-0/services/{name}", ok404=True)
            # 100 endpoints at once
            new = [addrs.next() for _ in targets[1:101]]
            res["hundred_endpoints"] = measured_change(
                api, prog, mon, [patch_slice(api, i, endpoints, {0: x}) for i, x in zip(targets[1:101], new)],
                [(x, port_name_of(i)) for i, x in zip(targets[1:101], new)], args.change_timeout)
            # programming latency
            wait_quiet(prog)
            lat, missing = [], 0
            t_end = time.time() + args.latency_budget
            for k in range(args.changes):
                if time.time() > t_end:
                    break
                a = addrs.next()
                if hasattr(mon, "arm"):
                    mon.arm([(a, port_name_of(targets[k % 100 + 1]))], args.change_timeout)
                patch_slice(api, targets[k % 100 + 1], endpoints, {0: a})()
                t_w = time.time()
                seen = mon.wait_all([(a, port_name_of(targets[k % 100 + 1]))], args.change_timeout, mode)
                if seen is None:
                    missing += 1
                else:
                    lat.append((seen - t_w) * 1000)
                # Each change alone: past the 1 s min sync period counted from the end of the sync
                # that programmed the previous one (upstream's runner counts it from there, so a
                # change 1.1 s after the previous write would wait ~1 s behind its sync).
                time.sleep(1.1)
            res["monitor_missed"] = mon.missed
            if isinstance(mon, NftChainPoller) and mon.listing_s:
                res["listing_ms_median"] = round(1000 * sorted(mon.listing_s)[len(mon.listing_s) // 2], 1)
            res["latency"] = {"changes": len(lat) + missing, "missing": missing,
                              "p50_ms": round(percentile(lat, 50), 1) if lat else None,
                              "p99_ms": round(percentile(lat, 99), 1) if lat else None,
                              "max_ms": round(max(lat), 1) if lat else None,
                              "raw_ms": [round(x, 2) for x in lat]}
            time.sleep(5)
            hwm, rss, cpu = prog.stat()
            res.update({"peak_rss_mib": round(hwm, 1), "steady_rss_mib": round(rss, 1), "cpu_total_s": round(cpu, 2),
                        "wall_total_s": round(time.time() - prog.start, 1)})
            log(f"{which} {mode} {services}x{endpoints} run {run}: one endpoint {res['one_endpoint']['wall_ms']} ms, "
                f"added {res['service_added']['wall_ms']} ms, 100 endpoints {res['hundred_endpoints']['wall_ms']} ms, "
                f"latency p50 {res['latency']['p50_ms']} p99 {res['latency']['p99_ms']} ms, peak {hwm:.0f} MiB, "
                f"steady {rss:.0f} MiB, cpu {cpu:.1f} s")
            return res
        except Exception as e:
            res["error"] = str(e)[:2000]
            log(f"{which} {mode} {services}x{endpoints} run {run} failed after its first sync: {e}")
            return res
    finally:
        if mon:
            mon.stop()
        if prog:
            if not prog.alive() and "first_sync_s" in res and "peak_rss_mib" not in res:
                res["error"] = f"{which} exited: {prog.tail(5)}"
            prog.stop()
        if node.ebpf:
            node.ebpf.remove(node)
        node.remove()


def enter_netns(name):
    """Move this (still single-threaded) process into a named network namespace, keeping the
    host's mount namespace: `ip netns exec` would give it a private one, where the `ip netns add`
    of the nodes could not be seen by anyone else."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns {name}")
    os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pki", required=True)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--cp-ns", required=True)
    ap.add_argument("--prefix", required=True, help="namespace name prefix for the nodes")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kproxy", required=True, help="kproxy command (words split on blanks)")
    ap.add_argument("--upstream", required=True, help="kube-proxy command")
    ap.add_argument("--programs", default="kproxy,upstream")
    ap.add_argument("--modes", default="nftables,iptables",
                    help="nftables, iptables, ipvs (the node is then the test VM: tests/vm/run-in-vm.sh), "
                         "ebpf (kproxy only)")
    ap.add_argument("--scales", default="1000x2,10000x2", help="SERVICESxENDPOINTS,... in increasing order")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--upstream-runs", type=int, help="runs of upstream, when fewer than --runs (its capped ones)")
    ap.add_argument("--changes", type=int, default=100, help="changes timed for the programming latency")
    ap.add_argument("--latency-budget", type=float, default=300, help="seconds at most per latency series")
    ap.add_argument("--change-timeout", type=float, default=120)
    ap.add_argument("--upstream-timeout", type=float, default=900, help="cap on upstream's first sync")
    ap.add_argument("--kproxy-timeout", type=float, default=600, help="cap on kproxy's first sync")
    ap.add_argument("--upstream-nft-watch", choices=["monitor", "chains"], default="monitor",
                    help="how upstream's nftables changes are seen: nft monitor, or its chain names listed "
                         "(for 10 endpoints per Service and more, where the monitor cannot start)")
    ap.add_argument("--ipvs-wait", help="kproxy-bench-ipvswait (bench/compare/ipvs_wait.cpp), for --modes ipvs")
    ap.add_argument("--ebpf-wait", help="kproxy-bench-ebpfwait (bench/compare/ebpf_wait.cpp), for --modes ebpf")
    ap.add_argument("--ebpf-ground", help="CGROUP:BPFFS, a cgroup and a bpffs of the run's, for --modes ebpf "
                                          "(bench/compare/run.sh makes them)")
    ap.add_argument("--dump-state", action="store_true",
                    help="ipvs: write what each program programmed after its first sync to WORKDIR/*.state")
    ap.add_argument("--heaptrack", action="store_true",
                    help="run kproxy under heaptrack's preload; WORKDIR/kproxy-*.heaptrack.txt names what its "
                         "heap's peak holds (its peak RSS then includes heaptrack's own memory)")
    ap.add_argument("--vm-memory", type=int, default=3072, help="MiB of the IPVS node's VM")
    ap.add_argument("--vm-timeout", type=int, default=7200, help="seconds at most of one IPVS node's VM")
    ap.add_argument("--out", required=True, help="JSON lines, appended")
    ap.add_argument("--verbosity", type=int, default=1,
                    help="-v of both programs (kproxy logs each sync's summary, with what its tools cost, at 2)")
    args = ap.parse_args()
    # A TERM (run.sh's cleanup, a kill) unwinds run_one, which removes its node: the VM's qemu
    # runs in a session of its own that nothing else would stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    enter_netns(args.cp_ns)
    if "ipvs" in args.modes.split(",") and not (args.ipvs_wait and os.access(args.ipvs_wait, os.X_OK)):
        ap.error("--modes ipvs needs --ipvs-wait BIN (BUILD/bench/compare/kproxy-bench-ipvswait)")
    args.ipvs_wait = args.ipvs_wait and os.path.abspath(args.ipvs_wait)
    args.kproxy_cmd = args.kproxy.split()
    args.upstream_cmd = args.upstream.split()

    args.versions = {
        "kproxy": " ".join(filter(None, [sh(*args.kproxy_cmd[:1], "--version", check=False).stdout.strip(),
                                        os.environ.get("BENCH_KPROXY_COMMIT")])),
        "upstream": sh(*args.upstream_cmd[:1], "--version", check=False).stdout.strip()}
    api = Api(args.port, args.pki)
    scales = [tuple(int(x) for x in s.split("x")) for s in args.scales.split(",")]
    loaded, loaded_endpoints = 0, None
    addrs = NewAddresses(int(time.time()) % 50000)
    for services, endpoints in scales:
        if loaded_endpoints not in (None, endpoints):
            log(f"re-loading for {endpoints} endpoints per service")
            delete_cluster_slices_and_services(api, loaded)
            loaded = 0
        if services > loaded:
            load_cluster(api, loaded, services, endpoints)
        loaded, loaded_endpoints = max(loaded, services), endpoints
        for mode in args.modes.split(","):
            for run in range(1, args.runs + 1):
                for which in args.programs.split(","):
                    if which == "upstream" and args.upstream_runs is not None and run > args.upstream_runs:
                        continue
                    if which == "upstream" and mode == "ebpf":
                        if run == 1:
                            log("upstream kube-proxy has no ebpf mode: kproxy alone")
                        continue
                    try:
                        res = run_one(args, api, which, mode, (services, endpoints), run, addrs)
                    except Exception as e:  # one failed run is reported, the others go on
                        log(f"{which} {mode} {services}x{endpoints} run {run} failed: {e}")
                        res = {"program": which, "mode": mode, "services": services, "endpoints": endpoints,
                               "run": run, "error": str(e)[:2000],
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
