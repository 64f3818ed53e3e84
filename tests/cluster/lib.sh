# shellcheck shell=bash
# lib.sh — the fabric of a multi-node cluster made of network namespaces, on one real
# kube-apiserver: the cluster suite's harness (tests/cluster/), meant for bench/ as well.
#
# Source it after scripts/netns-lib.sh and tests/e2e/control-plane.sh. Everything it makes is
# named with netns-lib's prefix (kp<pid>-), recorded, and removed by kc_teardown, which
# kc_init installs as the EXIT trap (with the control plane); kc_init first sweeps what dead runs
# left. Nothing is configured in the host's network namespace.
#
#                      fab namespace: bridge br0 (never in the host's namespace)
#      ┌──────────────┬───────────┴──┬──────────────┬──────────────┐
#   cp 10.77.0.1    n1 10.77.0.11   n2 10.77.0.12 … nN 10.77.0.(10+N)   client 10.77.0.100
#   etcd +          kproxy          kproxy                              (outside the cluster)
#   kube-apiserver  pods 10.244.1.0/24, pods 10.244.2.0/24, …
#
# Node i holds pod CIDR 10.244.i.0/24: pod slot j is 10.244.i.(10+j) in namespace n<i>p<j>,
# routed to it over a veth (/32 on the pod, the node's IP as its gateway, as netns-lib's pods);
# slot 0 is the node's client pod (the load's source). Every node routes each other node's pod
# CIDR via that node. The outside client knows only the nodes' addresses.
#
# Functions:
#   kc_init                   netns-lib's kp_init, a sweep of dead runs, the EXIT trap
#   kc_fabric_up N SLOTS      the namespaces above: N nodes with SLOTS pod slots each (+ slot 0)
#   kc_control_plane_up       etcd + kube-apiserver in the cp namespace, on 10.77.0.1
#   kc_node_credentials       per node: a client certificate (CN system:kproxy:node-<i>, group
#                             kproxy:nodes, bound to deploy/rbac.yaml's ClusterRole) and a
#                             kubeconfig in $KP_WORKDIR/node-<i>.kubeconfig
#   kc_ebpf_up                ebpf mode's ground (after kc_fabric_up, in the private mount
#                             namespace of kp_ebpf_reexec): a cgroup per node and a bpffs
#   kc_describe FILE          the cluster as JSON for the driver (cluster.py)
#   kc_driver ARGS...         run cluster.py's scenarios in the cp namespace
#   kc_serve_control DIR PID  while PID (the driver) runs, do what it asks through DIR's FIFOs:
#                             stop, kill or start the apiserver, compact etcd

KC_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/ebpf-lib.sh
source "$KC_LIB_DIR/../../scripts/ebpf-lib.sh"
KC_NET=10.77.0
KC_CP_IP=$KC_NET.1
KC_CLIENT_IP=$KC_NET.100
KC_NODE_COUNT=0
KC_SLOT_COUNT=0
KC_EBPF_ERROR="not set up"
KC_EBPF_PINS=""
# The words that run a program in the run's cgroup (kc_ebpf_up), or none.
KC_IN_RUN_CGROUP=()

kc_node_ip() { printf '%s.%d' "$KC_NET" $((10 + $1)); }
kc_pod_ip() { printf '10.244.%d.%d' "$1" $((10 + $2)); }

# kc_sweep_stale — what runs that died left behind: netns-lib's namespaces (kp<pid>-…, with
# their processes) whose <pid> is gone, and, for this suite's runs (a work dir holding
# control-plane-dirs), the work dir and the control plane's directories it lists; their cgroups
# (kproxy-cluster-<pid> under the cgroup v2 root, with what still runs in them) and the empty
# mount points of their private mounts (kpebpf<pid>.*: the mounts went with the run).
kc_sweep_stale() {
  kp_cleanup_stale
  local d pid listed cg
  for cg in "$(kp_cgroup2_root)"/kproxy-cluster-*; do
    [[ -d "$cg" && "$(basename "$cg")" =~ ^kproxy-cluster-([0-9]+)$ ]] || continue
    kill -0 "${BASH_REMATCH[1]}" 2>/dev/null && continue
    kp_log "removing the cgroups of a dead run: $cg"
    for d in "$cg"/*/; do [[ -d "$d" ]] && kp_ebpf_rmdir_cgroup "${d%/}"; done
    kp_ebpf_rmdir_cgroup "$cg"
  done
  for d in "${TMPDIR:-/tmp}"/kpebpf*.*; do
    [[ -d "$d" && "$(basename "$d")" =~ ^kpebpf([0-9]+)\. ]] || continue
    kill -0 "${BASH_REMATCH[1]}" 2>/dev/null && continue
    # rmdir only: never anything under a mount.
    rmdir "$d/bpffs" "$d/cgroup2" "$d" 2>/dev/null
  done
  for d in "${TMPDIR:-/tmp}"/kp*-*/control-plane-dirs; do
    [[ -f "$d" ]] || continue
    d="$(dirname "$d")"
    [[ "$(basename "$d")" =~ ^kp([0-9]+)- ]] || continue
    pid="${BASH_REMATCH[1]}"
    kill -0 "$pid" 2>/dev/null && continue
    while read -r listed; do
      [[ "$listed" == /dev/shm/kproxy-etcd-* || "$listed" == "${TMPDIR:-/tmp}"/kproxy-cp-* ]] && rm -rf "$listed"
    done <"$d/control-plane-dirs"
    kp_log "removing the work dir of a dead run: $d"
    rm -rf "$d"
  done
}

kc_init() {
  kc_sweep_stale
  kp_init
  trap kc_teardown EXIT
}

kc_teardown() {
  local rc=$?
  set +eu
  cp_stop
  # A work dir kept on purpose is not a dead run's: kc_sweep_stale of a later run leaves it.
  [[ -n "${KP_KEEP_WORKDIR:-}" && -n "$KP_WORKDIR" ]] && rm -f "$KP_WORKDIR/control-plane-dirs"
  (exit "$rc")
  kp_teardown
  # Every process of the run is gone: the pins (they hold the programs' links), then the
  # cgroups and the mounts.
  [[ -n "$KC_EBPF_PINS" ]] && rm -rf "$KC_EBPF_PINS"
  kp_ebpf_unmount
  return "$rc"
}

# _kc_join ROLE IP — a namespace for ROLE on the bridge, with IP/24 on its eth0.
_kc_join() {
  local role="$1" ip="$2" fab ns
  fab="$(kp_ns fab)"
  ns="$(kp_ns "$role")"
  _kp_add_ns "$role" || return 1
  ip -n "$fab" link add "v-$role" type veth peer name eth0 netns "$ns" || return 1
  ip -n "$fab" link set "v-$role" master br0 up || return 1
  ip -n "$ns" addr add "$ip/24" dev eth0 || return 1
  ip -n "$ns" link set eth0 up
}

kc_fabric_up() {
  local n="$1" slots="$2" i j k
  KC_NODE_COUNT=$n
  KC_SLOT_COUNT=$slots
  _kp_add_ns fab || return 1
  ip -n "$(kp_ns fab)" link add br0 type bridge || return 1
  ip -n "$(kp_ns fab)" link set br0 up
  _kc_join cp "$KC_CP_IP" || return 1
  _kc_join client "$KC_CLIENT_IP" || return 1
  for ((i = 1; i <= n; i++)); do
    _kc_join "n$i" "$(kc_node_ip "$i")" || return 1
    # icmp_ratelimit=0: every UDP datagram kproxy rejects (a Service scaled to zero) gets its
    # ICMP port unreachable, and is counted refused; the kernel's default of one a second per
    # peer turns all the others into timeouts, which would hide a drop among them.
    _kp_sysctl "n$i" net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
      net.ipv4.icmp_ratelimit=0
    # A default route, as every real node has: a virtual IP without a rule is routed (and reaches
    # kproxy's forward-hook rules, which reject it when its Service has no endpoint) instead of
    # failing the route lookup before any hook (ICMP net unreachable, rate-limited: timeouts).
    # The cp namespace does not forward: what kproxy lets through dies there.
    ip -n "$(kp_ns "n$i")" route add default via "$KC_CP_IP" || return 1
    for ((k = 1; k <= n; k++)); do
      ((k == i)) && continue
      ip -n "$(kp_ns "n$i")" route add "10.244.$k.0/24" via "$(kc_node_ip "$k")" || return 1
    done
    # The driver, in the cp namespace, probes pods directly as a kubelet would.
    ip -n "$(kp_ns cp)" route add "10.244.$i.0/24" via "$(kc_node_ip "$i")" || return 1
    for ((j = 0; j <= slots; j++)); do
      _kp_attach_pod "n$i" "n${i}p$j" "$j" "$(kc_pod_ip "$i" "$j")" "$(kc_node_ip "$i")" || return 1
    done
  done
  kp_log "fabric up: $n nodes × $slots pod slots, prefix $KP_PREFIX"
}

# kc_ebpf_up — what ebpf mode needs, never the host's: in the private mount namespace that
# kp_ebpf_reexec made, a bpffs of the run and the cgroup v2 hierarchy bound under a directory of
# its own (kp_ebpf_mount: `ip netns exec` hides /sys/fs), the cgroup kproxy-cluster-<pid> under
# the hierarchy's root and in it one cgroup per node, node-<i>, where that node's pods and client
# pod run and its kproxy attaches in ebpf mode; node i pins under $KC_EBPF_PINS/node-<i>. The
# control plane and the driver (with every kproxy and load it starts) run in the cgroup `run`
# beside them: should the run die without its EXIT trap, kc_sweep_stale finds all of it there
# (`ip netns pids` cannot, out of this mount namespace). kc_teardown removes it all. On failure
# KC_EBPF_ERROR says why and the suite runs without it.
kc_ebpf_up() {
  local i
  [[ -n "$(kp_cgroup2_root)" ]] || { KC_EBPF_ERROR="no cgroup v2 hierarchy is mounted"; return 1; }
  command -v bpftool >/dev/null || { KC_EBPF_ERROR="bpftool not found"; return 1; }
  if ! kp_ebpf_mount "kproxy-cluster-$$"; then
    KC_EBPF_ERROR="$KP_EBPF_ERROR"
    kp_ebpf_unmount
    return 1
  fi
  local cgroups=(run)
  for ((i = 1; i <= KC_NODE_COUNT; i++)); do cgroups+=("node-$i"); done
  for i in "${cgroups[@]}"; do
    mkdir "$KP_EBPF_TOP_CGROUP/$i" || { KC_EBPF_ERROR="cannot make cgroup $KP_EBPF_TOP_CGROUP/$i"; return 1; }
  done
  # shellcheck disable=SC2016 # expanded by that shell
  KC_IN_RUN_CGROUP=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$KP_EBPF_TOP_CGROUP/run")
  # kproxy makes its pin directory, in a directory on the bpffs.
  KC_EBPF_PINS="$KP_EBPF_DIR/bpffs/kproxy-cluster"
  mkdir "$KC_EBPF_PINS" || { KC_EBPF_ERROR="cannot make $KC_EBPF_PINS"; return 1; }
  KC_EBPF_ERROR=""
  kp_log "ebpf mode: cgroups under $KP_EBPF_TOP_CGROUP, pins under $KC_EBPF_PINS"
}

kc_control_plane_up() {
  export CP_API_SANS="IP:$KC_CP_IP" CP_API_HOST=$KC_CP_IP
  # Both flags come after cp_start_apiserver's own --bind-address, and the last one counts.
  # shellcheck disable=SC2034 # read by control-plane.sh's cp_start_apiserver
  CP_API_EXTRA=(--bind-address 0.0.0.0 --advertise-address "$KC_CP_IP")
  cp_start ip netns exec "$(kp_ns cp)" "${KC_IN_RUN_CGROUP[@]}" || return 1
  # For kc_sweep_stale, should this run die without its EXIT trap.
  printf '%s\n' "$CP_DIR" "$CP_ETCD_DATA" >"$KP_WORKDIR/control-plane-dirs"
}

# kc_node_credentials — RBAC from deploy/rbac.yaml, one ClusterRoleBinding of its ClusterRole to
# the group kproxy:nodes, and per node a client certificate in that group (signed by the
# control plane's CA) in a kubeconfig: each node's kproxy has an identity of its own.
kc_node_credentials() {
  _cp_apply_yaml "$CP_SOURCE_DIR/deploy/rbac.yaml" || return 1
  CP_PATCH_TYPE=application/apply-patch+yaml cp_api PATCH \
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kproxy-nodes?fieldManager=kproxy-cluster&force=true" \
    '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"kproxy-nodes"},
      "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"kproxy"},
      "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"Group","name":"kproxy:nodes"}]}' >/dev/null || return 1
  local i pki="$CP_DIR/pki"
  for ((i = 1; i <= KC_NODE_COUNT; i++)); do
    _cp_leaf "$pki" "node-$i" "/O=kproxy:nodes/CN=system:kproxy:node-$i" "" clientAuth || return 1
    cp_write_kubeconfig "$KP_WORKDIR/node-$i.kubeconfig" "    certificate-authority: $pki/ca.crt" \
      "    client-certificate: $pki/node-$i.crt
    client-key: $pki/node-$i.key" || return 1
  done
}

# kc_describe FILE — what the driver needs to know of the fabric, as JSON.
kc_describe() {
  local i j nodes=() pods ebpf
  for ((i = 1; i <= KC_NODE_COUNT; i++)); do
    pods=()
    for ((j = 0; j <= KC_SLOT_COUNT; j++)); do
      pods+=("{\"ns\":\"$(kp_ns "n${i}p$j")\",\"ip\":\"$(kc_pod_ip "$i" "$j")\"}")
    done
    ebpf=""
    [[ -z "$KC_EBPF_ERROR" ]] && ebpf=",\"cgroup\":\"$KP_EBPF_TOP_CGROUP/node-$i\",\"ebpfPinPath\":\"$KC_EBPF_PINS/node-$i\""
    nodes+=("{\"name\":\"node-$i\",\"ns\":\"$(kp_ns "n$i")\",\"ip\":\"$(kc_node_ip "$i")\",\"podCIDR\":\"10.244.$i.0/24\",
      \"kubeconfig\":\"$KP_WORKDIR/node-$i.kubeconfig\",\"slots\":[$(IFS=,; echo "${pods[*]}")]$ebpf}")
  done
  # shellcheck disable=SC2153 # CP_API_PORT and CP_DIR are control-plane.sh's
  cat >"$1" <<EOF
{"prefix":"$KP_PREFIX","workdir":"$KP_WORKDIR","clusterCIDR":"10.244.0.0/16",
 "cp":{"ns":"$(kp_ns cp)","ip":"$KC_CP_IP","port":$CP_API_PORT,"pki":"$CP_DIR/pki"},
 "client":{"ns":"$(kp_ns client)","ip":"$KC_CLIENT_IP"},"ebpfError":"$KC_EBPF_ERROR",
 "nodes":[$(IFS=,; echo "${nodes[*]}")]}
EOF
}

# kc_driver ARGS... — cluster.py in the cp namespace: the apiserver on its loopback, every
# node's metrics server on the bridge, and `ip netns exec` for what runs in the other namespaces.
kc_driver() {
  ip netns exec "$(kp_ns cp)" "${KC_IN_RUN_CGROUP[@]}" "$KP_PYTHON" "$KC_LIB_DIR/cluster.py" "$@"
}

# kc_serve_control DIR PID — the control plane's processes are this shell's children (their
# teardown is its EXIT trap), so the driver asks this shell to act on them: while PID runs, one
# request a line on the FIFO DIR/control-request (apiserver-stop: SIGTERM, after 10 s SIGKILL;
# apiserver-kill: SIGKILL; apiserver-start; etcd-compact), answered with "REQUEST STATUS" on DIR/control-response. Both FIFOs are opened
# read-write here, so that neither side's open waits for the other, and an answer waits in the
# FIFO for the driver to read it.
kc_serve_control() {
  local dir="$1" pid="$2" req resp cmd="" part rc
  mkfifo "$dir/control-request" "$dir/control-response" || return 1
  exec {req}<>"$dir/control-request" {resp}<>"$dir/control-response"
  while kill -0 "$pid" 2>/dev/null; do
    # A read that times out keeps what it had read of a line: the rest comes with the next one.
    part=""
    IFS= read -r -t 1 -u "$req" part
    rc=$?
    cmd+="$part"
    ((rc == 0)) || continue
    case "$cmd" in
      apiserver-stop) cp_stop_apiserver ;;
      apiserver-kill)
        [[ -n "$CP_API_PID" ]] && kill -KILL "$CP_API_PID" && { wait "$CP_API_PID" 2>/dev/null; CP_API_PID=""; } ;;
      apiserver-start) cp_start_apiserver ;;
      etcd-compact) cp_etcd_compact ;;
      *) kp_log "unknown control request: $cmd"; false ;;
    esac
    rc=$?
    kp_log "control request $cmd: status $rc"
    echo "$cmd $rc" >&"$resp"
    cmd=""
  done
  exec {req}>&- {resp}>&-
}
