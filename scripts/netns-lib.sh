# shellcheck shell=bash
# netns-lib.sh — a throw-away Kubernetes-node topology made of network namespaces.
#
# Source this file from bash. Every namespace, process and temporary file it makes carries a
# prefix unique to the calling shell (kp<pid>-), is recorded, and is removed by kp_teardown,
# which kp_init installs as the EXIT trap (INT/TERM exit through it too). Nothing is ever
# configured in the root network namespace: veth pairs are created directly inside the
# namespaces they join.
#
# Topology (defaults; override the KP_* variables before kp_topology_up):
#
#   client ns  eth0 192.168.50.2/30 ──── eth0 192.168.50.1/30  node ns (runs kproxy)
#                                        eth1 192.168.60.1/30 ──── eth0 192.168.60.2/30  rnode ns
#   pod<i> ns  eth0 10.244.1.(10+i)/32 ── vp<i> (node)                  vp<i> ── rpod<i> ns
#                                                                    eth0 10.244.2.(10+i)/32
#
# Pods route everything via their node's IP (held /32 on the node side of each pod veth), so
# traffic masqueraded towards a pod carries the node IP. The node routes the remote pod CIDR
# via the remote node and everything else via the client (so a virtual IP without rules is
# forwarded, never silently local). The outside client routes everything via the node.
#
# Typical use:
#   source scripts/netns-lib.sh
#   kp_require_root; kp_init
#   kp_topology_up 3 1            # 3 local pods, 1 remote pod
#   kp_start_pods                 # podserver on :8080 in every pod
#   kp_start_kproxy "$dir"        # in the node ns, log in $KP_WORKDIR
#   kp_wait_served "$KP_CEILING" http://10.96.0.10/
#   kp_curl client http://192.168.50.1:30080/

KP_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KP_SOURCE_DIR="$(cd "$KP_LIB_DIR/.." && pwd)"

: "${KP_NODE_NAME:=demo-node}"
: "${KP_REMOTE_NODE_NAME:=remote-node}"
: "${KP_NODE_IP:=192.168.50.1}"
: "${KP_CLIENT_IP:=192.168.50.2}"
: "${KP_NODE_LINK_IP:=192.168.60.1}"   # the node's end of the node<->remote-node link
: "${KP_REMOTE_NODE_IP:=192.168.60.2}"
: "${KP_POD_NET:=10.244.1}"            # local pods are $KP_POD_NET.(10+i)
: "${KP_REMOTE_POD_NET:=10.244.2}"     # remote pods are $KP_REMOTE_POD_NET.(10+i)
: "${KP_CLUSTER_CIDR:=10.244.0.0/16}"
: "${KP_POD_PORT:=8080}"
: "${KP_ROUTE_LOCALNET:=0}"
# The ceiling of a wait for an event (an answer, a state of the kernel, a log line, a counter):
# it only catches a hang. Tests wait for the event itself and never assert how soon it came, so
# this is far above what anything takes, also on a loaded two-core machine or under emulation
# (the test VM, 10-50x slower). A failing check takes this long to report; a passing one does not.
: "${KP_CEILING:=120}"
# One request (kp_curl) waits for its answer up to KP_CURL_TIMEOUT. An attempt inside a poll
# (kp_poll_curl, kp_wait_served) gives up after KP_POLL_TIMEOUT instead, as the poll tries again
# with a new connection: one sent before the rules were in is lost for good (its conntrack entry
# without NAT holds its 4-tuple), so waiting longer for it would only delay the next attempt.
: "${KP_CURL_TIMEOUT:=$KP_CEILING}"
: "${KP_POLL_TIMEOUT:=2}"
# The pods' server and the socket probe are programs built with kproxy (tests/tools):
# $KP_PODSERVER and $KP_NETPROBE when set, else found by kp_tool_bin.
: "${KP_PODSERVER:=}"
: "${KP_NETPROBE:=}"
# The topology itself needs no interpreter (it also runs in the test VM, which has none); the
# scripts that drive an API server from python (tests/soak, bench/) use this one.
if [[ -z "${KP_PYTHON:-}" ]]; then
  # Prefer the system interpreter: version-manager shims add a noticeable start-up delay.
  if [[ -x /usr/bin/python3 ]]; then KP_PYTHON=/usr/bin/python3; else KP_PYTHON="$(command -v python3)"; fi
fi

KP_PREFIX=""
KP_WORKDIR=""
KP_NAMESPACES=()
KP_PIDS=()
KP_KPROXY_PID=""
KP_KPROXY_STARTS=0
KP_LOCAL_PODS=0
KP_REMOTE_PODS=0

# kp_now — the wall-clock time as HH:MM:SS.mmm, from bash alone (no `date`: busybox's, in the
# test VM, has no %N, and a process per log line is slow under emulation).
kp_now() {
  local t=$EPOCHREALTIME ms
  ms=${t#*.}
  printf '%(%H:%M:%S)T.%s' "${t%.*}" "${ms:0:3}"
}
kp_log() { printf '[netns %s] %s\n' "$(kp_now)" "$*" >&2; }
kp_die() { kp_log "ERROR: $*"; exit 1; }

# kp_require_root — data-path work needs CAP_NET_ADMIN; refuse loudly instead of passing.
# Then the tools (kp_require_tools); a script that installs them first calls the two apart.
kp_require_root() {
  kp_require_root_only
  kp_require_tools
}

kp_require_root_only() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "ERROR: $(basename "$0") must run as root (it creates network namespaces and nftables rules)." >&2
    echo "       Re-run as root (with sudo where it is installed). Nothing was run." >&2
    exit 1
  fi
}

kp_require_tools() {
  local tool
  for tool in ip nft curl; do
    command -v "$tool" >/dev/null 2>&1 || kp_die "required tool not found: $tool"
  done
  # Resolved once and exported, so that nested shells run the same programs.
  KP_PODSERVER="$(kp_tool_bin kproxy-podserver)" || kp_die "kproxy-podserver not found: build it" \
    "(cmake --build build --target kproxy-podserver kproxy-netprobe) or set KP_TOOLS_DIR"
  KP_NETPROBE="$(kp_tool_bin kproxy-netprobe)" || kp_die "kproxy-netprobe not found: build it" \
    "(cmake --build build --target kproxy-podserver kproxy-netprobe) or set KP_TOOLS_DIR"
  export KP_PODSERVER KP_NETPROBE
}

# kp_tool_bin NAME — a program of tests/tools (kproxy-podserver, kproxy-netprobe): $KP_PODSERVER
# or $KP_NETPROBE when set; else in $KP_TOOLS_DIR; else beside $KPROXY_BIN's build
# (BUILD/cli/kproxy -> BUILD/tests/tools), and only there: the tools of the build under test,
# wherever it is, never another build's; with none of these, in the first build dir of the
# source tree that has it (a script run by hand).
kp_tool_bin() {
  local name="$1" given d dirs=()
  case "$name" in
    kproxy-podserver) given="$KP_PODSERVER" ;;
    kproxy-netprobe) given="$KP_NETPROBE" ;;
    *) given="" ;;
  esac
  if [[ -n "$given" ]]; then printf '%s' "$given"; return; fi
  if [[ -n "${KP_TOOLS_DIR:-}" ]]; then
    dirs=("$KP_TOOLS_DIR")
  elif [[ -n "${KPROXY_BIN:-}" ]]; then
    dirs=("$(dirname "$KPROXY_BIN")/../tests/tools")
  else
    dirs=("$KP_SOURCE_DIR/build/tests/tools" "$KP_SOURCE_DIR"/build-*/tests/tools)
  fi
  for d in "${dirs[@]}"; do
    if [[ -x "$d/$name" ]]; then printf '%s' "$d/$name"; return; fi
  done
  return 1
}

# kp_init [prefix] — choose the unique prefix, make the work dir, install the cleanup trap.
# Call it in the shell (or subshell) whose exit should tear the topology down.
kp_init() {
  KP_PREFIX="${1:-kp${BASHPID}-}"
  KP_NAMESPACES=()
  KP_PIDS=()
  KP_KPROXY_PID=""
  KP_KPROXY_STARTS=0
  KP_LOCAL_PODS=0
  KP_REMOTE_PODS=0
  KP_WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/${KP_PREFIX}XXXXXX")" || kp_die "mktemp failed"
  trap kp_teardown EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# kp_ns ROLE — the namespace name of a role: node, client, rnode, pod<i>, rpod<i>.
kp_ns() { printf '%s%s' "$KP_PREFIX" "$1"; }

kp_pod_ip() { printf '%s.%d' "$KP_POD_NET" $((10 + $1)); }
kp_remote_pod_ip() { printf '%s.%d' "$KP_REMOTE_POD_NET" $((10 + $1)); }

# kp_in_ns ROLE — sets the array KP_IN_NS to the words that run a program in ROLE's namespace:
# `ip netns exec NS`, and, when $KP_CGROUP_OF names a function (ebpf mode's data-path tests,
# whose socket hooks act on a cgroup's processes), a shell that first moves itself into the
# cgroup directory that function prints for ROLE, then execs the program: one process all
# along, so that $! of a background start is still the program's pid.
kp_in_ns() {
  KP_IN_NS=(ip netns exec "$(kp_ns "$1")")
  if [[ -n "${KP_CGROUP_OF:-}" ]]; then
    local cg
    cg="$("$KP_CGROUP_OF" "$1")" || return 1
    # shellcheck disable=SC2016 # expanded by that shell
    KP_IN_NS+=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg")
  fi
}

# kp_exec ROLE CMD... — run a command inside a role's namespace.
kp_exec() {
  local role="$1"
  shift
  kp_in_ns "$role" || return 1
  "${KP_IN_NS[@]}" "$@"
}

_kp_add_ns() {
  local ns
  ns="$(kp_ns "$1")"
  ip netns add "$ns" || return 1
  KP_NAMESPACES+=("$ns")
  ip -n "$ns" link set lo up
}

_kp_sysctl() {
  local role="$1"
  shift
  kp_exec "$role" sysctl -q -w "$@" >/dev/null
}

# _kp_attach_pod NODE_ROLE POD_ROLE INDEX POD_IP GATEWAY_IP — a routed veth, Calico style:
# /32 on the pod, a host route on the node, the node IP as the pod's gateway.
_kp_attach_pod() {
  local node_role="$1" pod_role="$2" index="$3" pod_ip="$4" gw="$5"
  local node_ns pod_ns
  node_ns="$(kp_ns "$node_role")"
  pod_ns="$(kp_ns "$pod_role")"
  _kp_add_ns "$pod_role" || return 1
  ip -n "$node_ns" link add "vp$index" type veth peer name eth0 netns "$pod_ns" || return 1
  ip -n "$node_ns" addr add "$gw/32" dev "vp$index" noprefixroute || return 1
  ip -n "$node_ns" link set "vp$index" up
  ip -n "$node_ns" route add "$pod_ip/32" dev "vp$index" scope link src "$gw" || return 1
  _kp_sysctl "$node_role" "net.ipv4.conf.vp$index.rp_filter=0"
  ip -n "$pod_ns" addr add "$pod_ip/32" dev eth0 || return 1
  ip -n "$pod_ns" link set eth0 up
  ip -n "$pod_ns" route add "$gw/32" dev eth0 scope link || return 1
  ip -n "$pod_ns" route add default via "$gw" dev eth0 src "$pod_ip" || return 1
}

# kp_topology_up NLOCAL [NREMOTE] — node + client namespaces, NLOCAL pods on the node and,
# when NREMOTE > 0, a remote node with NREMOTE pods of its own.
kp_topology_up() {
  local nlocal="${1:-3}" nremote="${2:-0}" i
  [[ -n "$KP_PREFIX" ]] || kp_die "kp_init must be called before kp_topology_up"
  local node_ns client_ns
  node_ns="$(kp_ns node)"
  client_ns="$(kp_ns client)"

  _kp_add_ns node || return 1
  _kp_sysctl node net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
    net.ipv4.conf.default.rp_filter=0 "net.ipv4.conf.all.route_localnet=$KP_ROUTE_LOCALNET"

  # The client link first, so the node IP is the node's primary address.
  _kp_add_ns client || return 1
  ip -n "$node_ns" link add eth0 type veth peer name eth0 netns "$client_ns" || return 1
  ip -n "$node_ns" addr add "$KP_NODE_IP/30" dev eth0 || return 1
  ip -n "$node_ns" link set eth0 up
  ip -n "$client_ns" addr add "$KP_CLIENT_IP/30" dev eth0 || return 1
  ip -n "$client_ns" link set eth0 up
  ip -n "$client_ns" route add default via "$KP_NODE_IP" || return 1
  ip -n "$node_ns" route add default via "$KP_CLIENT_IP" || return 1

  for ((i = 1; i <= nlocal; i++)); do
    _kp_attach_pod node "pod$i" "$i" "$(kp_pod_ip "$i")" "$KP_NODE_IP" || return 1
  done
  KP_LOCAL_PODS=$nlocal

  if ((nremote > 0)); then
    local rnode_ns
    rnode_ns="$(kp_ns rnode)"
    _kp_add_ns rnode || return 1
    _kp_sysctl rnode net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
    ip -n "$node_ns" link add eth1 type veth peer name eth0 netns "$rnode_ns" || return 1
    ip -n "$node_ns" addr add "$KP_NODE_LINK_IP/30" dev eth1 || return 1
    ip -n "$node_ns" link set eth1 up
    _kp_sysctl node net.ipv4.conf.eth1.rp_filter=0
    ip -n "$rnode_ns" addr add "$KP_REMOTE_NODE_IP/30" dev eth0 || return 1
    ip -n "$rnode_ns" link set eth0 up
    ip -n "$node_ns" route add "$KP_REMOTE_POD_NET.0/24" via "$KP_REMOTE_NODE_IP" || return 1
    ip -n "$rnode_ns" route add default via "$KP_NODE_LINK_IP" || return 1
    for ((i = 1; i <= nremote; i++)); do
      _kp_attach_pod rnode "rpod$i" "$i" "$(kp_remote_pod_ip "$i")" "$KP_REMOTE_NODE_IP" || return 1
    done
  fi
  KP_REMOTE_PODS=$nremote
  kp_log "topology up: prefix=$KP_PREFIX pods=$nlocal remote_pods=$nremote workdir=$KP_WORKDIR"
}

# kp_bg LOGFILE CMD... — start a background process we own; its pid is in KP_LAST_PID.
kp_bg() {
  local logfile="$1"
  shift
  "$@" >>"$logfile" 2>&1 &
  KP_LAST_PID=$!
  KP_PIDS+=("$KP_LAST_PID")
}

# kp_start_pods [EXTRA_PODSERVER_ARGS...] — a podserver in every pod namespace (name pod<i> /
# rpod<i>, TCP $KP_POD_PORT unless ports are given), then wait until each answers through
# its veth from the node namespace.
kp_start_pods() {
  local extra=("$@") i role ip server
  [[ ${#extra[@]} -gt 0 ]] || extra=(--port "$KP_POD_PORT")
  server="$(kp_tool_bin kproxy-podserver)" || { kp_log "kproxy-podserver not found (see kp_tool_bin)"; return 1; }
  local targets=()
  for ((i = 1; i <= KP_LOCAL_PODS; i++)); do targets+=("pod$i=$(kp_pod_ip "$i")"); done
  for ((i = 1; i <= KP_REMOTE_PODS; i++)); do targets+=("rpod$i=$(kp_remote_pod_ip "$i")"); done
  local t
  for t in "${targets[@]}"; do
    role="${t%%=*}"
    kp_in_ns "$role" || return 1
    kp_bg "$KP_WORKDIR/$role.log" "${KP_IN_NS[@]}" "$server" --name "$role" "${extra[@]}"
  done
  local port
  port="$(_kp_first_port "${extra[@]}")"
  for t in "${targets[@]}"; do
    role="${t%%=*}"
    ip="${t#*=}"
    kp_wait_for "$KP_CEILING" kp_poll_curl node "http://$ip:$port/healthz" >/dev/null ||
      { kp_log "pod $role ($ip:$port) did not come up; its log:"; cat "$KP_WORKDIR/$role.log" >&2; return 1; }
  done
}

_kp_first_port() {
  while [[ $# -gt 0 ]]; do
    if [[ "$1" == --port ]]; then printf '%s' "$2"; return; fi
    shift
  done
  printf '%s' "$KP_POD_PORT"
}

# kp_kproxy_bin — the kproxy binary: $KPROXY_BIN, else the first build dir that has one.
kp_kproxy_bin() {
  if [[ -n "${KPROXY_BIN:-}" ]]; then printf '%s' "$KPROXY_BIN"; return; fi
  local d
  for d in "$KP_SOURCE_DIR/build" "$KP_SOURCE_DIR"/build-*; do
    if [[ -x "$d/cli/kproxy" ]]; then printf '%s' "$d/cli/kproxy"; return; fi
  done
  return 1
}

# kp_kproxy_options ARGS... — takes `--kproxy BIN` and `--plugin-dir DIR` off the front of ARGS
# (exporting KPROXY_BIN and KPROXY_PLUGIN_DIR) and leaves the rest in the array KP_ARGS. An
# unknown option ends the script (status 2). For the bench scripts' command lines.
kp_kproxy_options() {
  while [[ $# -gt 0 && "$1" == --* ]]; do
    case "$1" in
      --kproxy) export KPROXY_BIN="$2"; shift 2 ;;
      --plugin-dir) export KPROXY_PLUGIN_DIR="$2"; shift 2 ;;
      *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
  done
  KP_ARGS=("$@")
}

# kp_kproxy_args MANIFEST_DIR — kproxy's standard arguments for this topology: the mode from
# $KP_PROXY_MODE (default nftables), then the words of $KP_KPROXY_MODE_ARGS (options every start
# of this mode takes, e.g. "--iptables-variant=legacy"; split on blanks).
kp_kproxy_args() {
  local args=(--proxy-mode="${KP_PROXY_MODE:-nftables}" --manifests "$1"
    --hostname-override "$KP_NODE_NAME"
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 0.0.0.0:10256 -v "${KP_VERBOSITY:-2}")
  [[ -n "$KP_CLUSTER_CIDR" ]] && args+=(--cluster-cidr "$KP_CLUSTER_CIDR")
  [[ -n "${KPROXY_PLUGIN_DIR:-}" ]] && args+=(--plugin-dir "$KPROXY_PLUGIN_DIR")
  local mode_args
  read -ra mode_args <<<"${KP_KPROXY_MODE_ARGS:-}"
  args+=("${mode_args[@]}")
  printf '%s\n' "${args[@]}"
}

# kp_start_kproxy MANIFEST_DIR [EXTRA_ARGS...] — start kproxy INSIDE the node namespace.
# Output goes to $KP_WORKDIR/kproxy.log (appended across restarts); the pid is KP_KPROXY_PID.
kp_start_kproxy() {
  local dir="$1"
  shift
  local bin
  bin="$(kp_kproxy_bin)" || { kp_log "kproxy binary not found (set KPROXY_BIN)"; return 1; }
  local args
  mapfile -t args < <(kp_kproxy_args "$dir")
  KP_KPROXY_STARTS=$((KP_KPROXY_STARTS + 1))
  echo "===== kproxy start #$KP_KPROXY_STARTS: $bin ${args[*]} $* =====" >>"$KP_WORKDIR/kproxy.log"
  # `ip netns exec` execs the command in place (as kp_in_ns's shell does), so $! is kproxy's
  # own pid.
  kp_in_ns node || return 1
  kp_bg "$KP_WORKDIR/kproxy.log" "${KP_IN_NS[@]}" "$bin" "${args[@]}" "$@"
  KP_KPROXY_PID=$KP_LAST_PID
  kp_log "kproxy started pid=$KP_KPROXY_PID log=$KP_WORKDIR/kproxy.log"
}

# kp_kproxy_alive — kproxy is still running.
kp_kproxy_alive() { [[ -n "$KP_KPROXY_PID" ]] && kill -0 "$KP_KPROXY_PID" 2>/dev/null; }

# kp_stop_kproxy [SIGNAL] — stop kproxy and wait (at most 10 s, then SIGKILL).
kp_stop_kproxy() {
  local sig="${1:-TERM}" i
  [[ -n "$KP_KPROXY_PID" ]] || return 0
  kill "-$sig" "$KP_KPROXY_PID" 2>/dev/null
  for ((i = 0; i < 100; i++)); do
    kill -0 "$KP_KPROXY_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$KP_KPROXY_PID" 2>/dev/null; then
    kp_log "kproxy pid=$KP_KPROXY_PID ignored SIG$sig for 10s; killing"
    kill -KILL "$KP_KPROXY_PID" 2>/dev/null
  fi
  wait "$KP_KPROXY_PID" 2>/dev/null
  KP_KPROXY_PID=""
}

# kp_kproxy_log_tail [N] — the last N lines of kproxy's log (for failure reports).
kp_kproxy_log_tail() { tail -n "${1:-40}" "$KP_WORKDIR/kproxy.log" 2>/dev/null; }

# kp_wait_for SECONDS CMD... — run CMD every 0.1 s until it succeeds or the deadline passes.
# Returns CMD's last status; its output is discarded except on the successful attempt.
kp_wait_for() { _kp_poll "$1" false "${@:2}"; }

# kp_wait_served SECONDS URL — wait until URL answers from the node namespace. Gives up at
# once (status 2) if kproxy exits meanwhile, so a crash is not reported as a slow start.
kp_wait_served() { kp_wait_for_kproxy "$1" _kp_served "$2"; }
_kp_served() { kp_poll_curl node "$1" >/dev/null 2>&1; }

# kp_wait_for_kproxy SECONDS CMD... — kp_wait_for, but gives up at once (status 2) when kproxy
# exits meanwhile, so a crash is not reported as a slow change. For polling a check until the
# state it expects is in place, instead of sleeping a fixed time before checking.
kp_wait_for_kproxy() { _kp_poll "$1" _kp_kproxy_gone "${@:2}"; }
_kp_kproxy_gone() {
  kp_kproxy_alive && return 1
  kp_log "kproxy (pid ${KP_KPROXY_PID:-none}) is not running"
}

# _kp_poll SECONDS GIVE_UP CMD... — the loop behind the kp_wait_* functions: CMD every 0.1 s
# until it succeeds (its output printed), GIVE_UP succeeds (status 2) or the deadline passes.
_kp_poll() {
  local timeout="$1" give_up="$2"
  shift 2
  local deadline=$((${EPOCHREALTIME/./} + timeout * 1000000)) out
  while true; do
    if out="$("$@" 2>/dev/null)"; then
      [[ -n "$out" ]] && printf '%s\n' "$out"
      return 0
    fi
    "$give_up" && return 2
    ((${EPOCHREALTIME/./} >= deadline)) && return 1
    sleep 0.1
  done
}

# kp_kproxy_syncs — how many syncs kproxy has logged (at -v 2 and above), all starts together.
kp_kproxy_syncs() { grep -c '"Synced rules"' "$KP_WORKDIR/kproxy.log" 2>/dev/null; }

# kp_kproxy_synced_after N — kproxy has logged more than N syncs.
kp_kproxy_synced_after() { (($(kp_kproxy_syncs) > $1)); }

# kp_curl ROLE URL [CURL_ARGS...] — one HTTP request from a namespace, bounded by
# $KP_CURL_TIMEOUT seconds. Prints the body; exits with curl's status.
kp_curl() {
  local role="$1" url="$2"
  shift 2
  kp_in_ns "$role" || return 1
  "${KP_IN_NS[@]}" curl -sS --max-time "$KP_CURL_TIMEOUT" --connect-timeout "$KP_CURL_TIMEOUT" "$@" "$url"
}

# kp_poll_curl ROLE URL [CURL_ARGS...] — kp_curl as one attempt of a poll (kp_wait_for ...
# kp_poll_curl ROLE URL), bounded by $KP_POLL_TIMEOUT.
kp_poll_curl() { KP_CURL_TIMEOUT=$KP_POLL_TIMEOUT kp_curl "$@"; }

# kp_who ROLE URL — which pod answered (e.g. "pod2"), or nothing and a failure status.
kp_who() {
  local body
  body="$(kp_curl "$1" "$2" 2>/dev/null)" || return 1
  body="${body%%$'\n'*}"
  [[ "$body" =~ ^pod=([^ ]+) ]] || return 1
  printf '%s' "${BASH_REMATCH[1]}"
}

# kp_client_seen ROLE URL — the client address (ip only) the answering pod saw.
kp_client_seen() {
  local body
  body="$(kp_curl "$1" "$2" 2>/dev/null)" || return 1
  [[ "$body" =~ client=([0-9.]+): ]] || return 1
  printf '%s' "${BASH_REMATCH[1]}"
}

# kp_connect_errno ROLE IP PORT [TIMEOUT] — try one TCP connect from a namespace and print
# how it ended: OK, or the errno name (ECONNREFUSED, ETIMEDOUT, EHOSTUNREACH, ...). curl's
# message for a refused connection varies between versions; the errno does not. IP may be IPv6.
kp_connect_errno() {
  local probe
  probe="$(kp_tool_bin kproxy-netprobe)" || { echo "kproxy-netprobe not found"; return 1; }
  kp_exec "$1" "$probe" connect "$2" "$3" "${4:-2}"
}

# kp_nft ROLE ARGS... — nft inside a namespace (e.g. kp_nft node list table ip kube-proxy).
kp_nft() {
  local role="$1"
  shift
  kp_exec "$role" nft "$@"
}

# ---------------------------------------------------------------------------------------------
# Manifests. Each writer prints one YAML document to stdout; redirect into a file in the
# manifest directory. Use kp_install_manifest to replace a file atomically (kproxy polls the
# directory and must never see a half-written file).

# kp_manifest_node NAME IP [POD_CIDR]
kp_manifest_node() {
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $1
EOF
  [[ -n "${3:-}" ]] && printf 'spec:\n  podCIDR: %s\n  podCIDRs: [%s]\n' "$3" "$3"
  cat <<EOF
status:
  addresses:
  - type: InternalIP
    address: $2
  - type: Hostname
    address: $1
EOF
}

# kp_manifest_service NAMESPACE NAME CLUSTER_IP PORT TARGET_PORT [KEY=VALUE...]
# keys: type=NodePort|LoadBalancer  nodePort=N  etp=Local|Cluster  itp=Local|Cluster
#       affinity=ClientIP  affinityTimeout=S  protocol=TCP|UDP  externalIP=IP  lbIP=IP
#       sourceRanges=CIDR[,CIDR...]
kp_manifest_service() {
  local ns="$1" name="$2" cip="$3" port="$4" tport="$5"
  shift 5
  local type=ClusterIP node_port="" etp="" itp="" affinity="" affinity_timeout="" proto=TCP ext_ip="" lb_ip=""
  local source_ranges=""
  local kv
  for kv in "$@"; do
    case "$kv" in
      type=*) type="${kv#*=}" ;;
      nodePort=*) node_port="${kv#*=}" ;;
      etp=*) etp="${kv#*=}" ;;
      itp=*) itp="${kv#*=}" ;;
      affinity=*) affinity="${kv#*=}" ;;
      affinityTimeout=*) affinity_timeout="${kv#*=}" ;;
      protocol=*) proto="${kv#*=}" ;;
      externalIP=*) ext_ip="${kv#*=}" ;;
      lbIP=*) lb_ip="${kv#*=}" ;;
      sourceRanges=*) source_ranges="${kv#*=}" ;;
      *) kp_log "kp_manifest_service: unknown option $kv"; return 1 ;;
    esac
  done
  cat <<EOF
apiVersion: v1
kind: Service
metadata:
  namespace: $ns
  name: $name
spec:
  type: $type
  clusterIP: $cip
  clusterIPs: [$cip]
  ipFamilies: [IPv4]
  ports:
  - name: http
    protocol: $proto
    port: $port
    targetPort: $tport
EOF
  [[ -n "$node_port" ]] && echo "    nodePort: $node_port"
  [[ -n "$etp" ]] && echo "  externalTrafficPolicy: $etp"
  [[ -n "$itp" ]] && echo "  internalTrafficPolicy: $itp"
  if [[ -n "$affinity" ]]; then
    echo "  sessionAffinity: $affinity"
    if [[ -n "$affinity_timeout" ]]; then
      printf '  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: %s\n' "$affinity_timeout"
    fi
  fi
  [[ -n "$ext_ip" ]] && printf '  externalIPs: [%s]\n' "$ext_ip"
  [[ -n "$source_ranges" ]] && printf '  loadBalancerSourceRanges: [%s]\n' "$source_ranges"
  if [[ -n "$lb_ip" ]]; then
    printf 'status:\n  loadBalancer:\n    ingress:\n    - ip: %s\n' "$lb_ip"
  fi
  return 0
}

# kp_manifest_slice NAMESPACE SERVICE SLICE_NAME PORT [ENDPOINT...] [protocol=UDP]
# ENDPOINT: IP[@NODE][:notready|:terminating]   (NODE defaults to $KP_NODE_NAME)
kp_manifest_slice() {
  local ns="$1" svc="$2" slice="$3" port="$4"
  shift 4
  local proto=TCP eps=() e
  for e in "$@"; do
    case "$e" in
      protocol=*) proto="${e#*=}" ;;
      *) eps+=("$e") ;;
    esac
  done
  cat <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: $ns
  name: $slice
  labels:
    kubernetes.io/service-name: $svc
addressType: IPv4
ports:
- name: http
  protocol: $proto
  port: $port
EOF
  if [[ ${#eps[@]} -eq 0 ]]; then
    echo "endpoints: []"
    return 0
  fi
  echo "endpoints:"
  local ip node state ready serving terminating
  for e in "${eps[@]}"; do
    state=ready
    if [[ "$e" == *:* ]]; then state="${e##*:}"; e="${e%:*}"; fi
    ip="${e%%@*}"
    node="$KP_NODE_NAME"
    [[ "$e" == *@* ]] && node="${e#*@}"
    case "$state" in
      ready) ready=true serving=true terminating=false ;;
      notready) ready=false serving=false terminating=false ;;
      terminating) ready=false serving=true terminating=true ;;
      *) kp_log "kp_manifest_slice: unknown endpoint state $state"; return 1 ;;
    esac
    cat <<EOF
- addresses: [$ip]
  nodeName: $node
  conditions:
    ready: $ready
    serving: $serving
    terminating: $terminating
EOF
  done
}

# kp_install_manifest DIR FILE_NAME < content — write via a temp file and rename, so the
# reader sees either the old or the new file, never a partial one.
kp_install_manifest() {
  local dir="$1" name="$2" tmp
  tmp="$(mktemp "$dir/.tmp.XXXXXX")" || return 1
  cat >"$tmp" && mv -f "$tmp" "$dir/$name"
}

# ---------------------------------------------------------------------------------------------
# Teardown.

# kp_teardown — stop our processes, delete our namespaces and work dir. Idempotent.
kp_teardown() {
  local rc=$?
  local pid ns saved_opts
  # Callers may run under `set -eu`; a kill of an already-gone process must not abort cleanup.
  saved_opts="$(set +o)"
  set +eu
  trap - EXIT INT TERM
  for pid in "${KP_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  # Anything else still inside our namespaces was started by us (e.g. a curl loop).
  for ns in "${KP_NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
  done
  local waited=0
  for pid in "${KP_PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((waited < 30)); do sleep 0.1; waited=$((waited + 1)); done
    kill -KILL "$pid" 2>/dev/null
  done
  for ns in "${KP_NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  wait 2>/dev/null
  for ns in "${KP_NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  KP_NAMESPACES=()
  KP_PIDS=()
  KP_KPROXY_PID=""
  if [[ -n "$KP_WORKDIR" && -d "$KP_WORKDIR" ]]; then
    if [[ -n "${KP_KEEP_WORKDIR:-}" ]]; then
      kp_log "work dir kept: $KP_WORKDIR"
    else
      rm -rf "$KP_WORKDIR"
    fi
  fi
  KP_WORKDIR=""
  eval "$saved_opts"
  return "$rc"
}

# kp_cleanup_stale — delete namespaces left by runs that died without cleaning up
# (kp<pid>-… whose <pid> no longer exists). Namespaces of live runs are left alone.
kp_cleanup_stale() {
  local ns pid
  while read -r ns _; do
    [[ "$ns" =~ ^kp([0-9]+)- ]] || continue
    pid="${BASH_REMATCH[1]}"
    kill -0 "$pid" 2>/dev/null && continue
    kp_log "removing stale namespace $ns"
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done < <(ip netns list 2>/dev/null)
}
