# shellcheck shell=bash
# control-plane.sh — a real etcd + kube-apiserver for end-to-end tests.
#
# Source it (after scripts/netns-lib.sh when the control plane should live in a test's network
# namespace), or run it directly for a standalone control plane on the host's loopback:
#     sudo tests/e2e/control-plane.sh run      # prints how to reach it, Ctrl-C tears it down
#
# Functions (state in CP_* variables):
#   cp_start [EXEC-PREFIX...]   start etcd + kube-apiserver, inside e.g. `ip netns exec NS`;
#                               waits for /readyz. Files in $CP_DIR (a temp dir).
#   cp_stop_apiserver / cp_start_apiserver [EXTRA-FLAGS...]   restart the apiserver alone
#   cp_stop                     stop everything and remove $CP_DIR (also on EXIT via cp_teardown)
#   cp_terminate PID POLL       SIGTERM, up to 100 checks POLL s apart, SIGKILL, reap
#   cp_api METHOD PATH [JSON]   an admin request (client cert in system:masters); prints the
#                               body, fails on HTTP >= 400
#   cp_kproxy_kubeconfig FILE   the ServiceAccount kube-system/kproxy, bound to the ClusterRole
#                               from deploy/ (RBAC), with a TokenRequest token, as a kubeconfig
#   cp_write_kubeconfig FILE CLUSTER-LINES USER-LINES   a kubeconfig for this apiserver
#   cp_etcd_compact             compact etcd at its current revision (forces 410 on old watches)
#
# Set before cp_start: CP_API_SANS (more subjectAltNames for the serving certificate, e.g.
# "IP:10.255.0.1") and CP_API_HOST (the address kubeconfigs name, 127.0.0.1 by default), for
# nodes that reach the apiserver from namespaces of their own (bench/compare).
#
# Binaries: kube-apiserver from ~/.cache/kproxy/bin (tests/e2e/build-control-plane.sh builds
# it), etcd from $ETCD_BIN, ~/.cache/kproxy/bin/etcd or Debian's etcd-server.

CP_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CP_SOURCE_DIR="$(cd "$CP_LIB_DIR/../.." && pwd)"
: "${KPROXY_CACHE:=$HOME/.cache/kproxy}"
CP_DIR=""
CP_EXEC=()
CP_ETCD_PID=""
CP_ETCD_DATA=""
CP_API_PID=""
CP_ETCD_PORT=""
CP_ETCD_PEER_PORT=""
CP_API_PORT=""
CP_API_EXTRA=()

cp_log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S.%3N)" "$*" >&2; }

cp_apiserver_bin() {
  local b="${KUBE_APISERVER_BIN:-$KPROXY_CACHE/bin/kube-apiserver}"
  [[ -x "$b" ]] || { cp_log "kube-apiserver not built: run tests/e2e/build-control-plane.sh"; return 1; }
  printf '%s' "$b"
}

cp_etcd_bin() {
  local b
  for b in "${ETCD_BIN:-}" "$KPROXY_CACHE/bin/etcd" "$(command -v etcd 2>/dev/null)"; do
    [[ -n "$b" && -x "$b" ]] && { printf '%s' "$b"; return; }
  done
  cp_log "etcd not found: apt-get install -y etcd-server, or tests/e2e/build-control-plane.sh etcd"
  return 1
}

# _cp_free_port [TAKEN...] — a TCP port on 127.0.0.1 for etcd or the apiserver, other than
# TAKEN, chosen below the namespace's ephemeral port range. A port asked of the kernel with
# bind(0) would be free only until it is released, and any connect() could take it before the
# server binds it; below the ephemeral range the kernel never hands a port out by itself, so
# only an explicit bind of that very port could (and in a test's own network namespace nothing
# else runs).
_cp_free_port() {
  "${CP_EXEC[@]}" python3 -c '
import socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
taken = {int(p) for p in sys.argv[1:] if p}
for port in range(low - 1, 1024, -1):
    if port in taken:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
else:
    sys.exit("no free TCP port below the ephemeral range")
' "$@"
}

_cp_certs() {
  local d="$CP_DIR/pki"
  mkdir -p "$d"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  openssl req -x509 "${ec[@]}" -keyout "$d/ca.key" -out "$d/ca.crt" -days 2 -subj /CN=kproxy-e2e-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null || return 1
  _cp_leaf "$d" apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc${CP_API_SANS:+,$CP_API_SANS}" serverAuth || return 1
  _cp_leaf "$d" admin "/O=system:masters/CN=kproxy-e2e-admin" "" clientAuth || return 1
  # A deliberately wrong CA, for the "TLS is verified" check.
  openssl req -x509 "${ec[@]}" -keyout "$d/other-ca.key" -out "$d/other-ca.crt" -days 2 -subj /CN=other-ca 2>/dev/null || return 1
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null || return 1
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

_cp_leaf() {
  local d="$1" name="$2" subj="$3" san="$4" usage="$5"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/$name.key" \
    -out "$d/$name.csr" -subj "$subj" 2>/dev/null || return 1
  local ext="$d/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n "$san" ]] && echo "$san"
  } >"$ext"
  openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$ext" -out "$d/$name.crt" 2>/dev/null
}

_cp_bg() {
  local log="$1"
  shift
  "${CP_EXEC[@]}" "$@" >>"$log" 2>&1 &
  CP_LAST_PID=$!
}

cp_start_etcd() {
  local etcd peer
  etcd="$(cp_etcd_bin)" || return 1
  CP_ETCD_PORT="$(_cp_free_port)" || return 1
  peer="$(_cp_free_port "$CP_ETCD_PORT")" || return 1
  # tmpfs: etcd fsyncs every write, and on a busy shared disk that times requests out.
  CP_ETCD_DATA="$(mktemp -d /dev/shm/kproxy-etcd-XXXXXX 2>/dev/null || echo "$CP_DIR/etcd")"
  CP_ETCD_PEER_PORT="$peer"
  _cp_bg "$CP_DIR/etcd.log" "$etcd" --name e2e --data-dir "$CP_ETCD_DATA" \
    --listen-client-urls "http://127.0.0.1:$CP_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$CP_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "e2e=http://127.0.0.1:$peer" --quota-backend-bytes=$((2 << 30))
  CP_ETCD_PID=$CP_LAST_PID
  local i
  # Up to 1200 polls (two minutes and more), as for the apiserver below: only a hang is too long.
  for ((i = 0; i < 1200; i++)); do
    "${CP_EXEC[@]}" curl -sf --max-time 5 "http://127.0.0.1:$CP_ETCD_PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$CP_ETCD_PID" 2>/dev/null || break
    sleep 0.1
  done
  cp_log "etcd did not become healthy; its log:"
  tail -20 "$CP_DIR/etcd.log" >&2
  return 1
}

# cp_start_apiserver [EXTRA-FLAGS...] — (re)start the apiserver on the same port and data.
cp_start_apiserver() {
  local bin
  bin="$(cp_apiserver_bin)" || return 1
  [[ $# -gt 0 ]] && CP_API_EXTRA=("$@")
  [[ -n "$CP_API_PORT" ]] || CP_API_PORT="$(_cp_free_port "$CP_ETCD_PORT" "$CP_ETCD_PEER_PORT")" || return 1
  local p="$CP_DIR/pki"
  echo "===== kube-apiserver start $(date +%T) ${CP_API_EXTRA[*]} =====" >>"$CP_DIR/apiserver.log"
  _cp_bg "$CP_DIR/apiserver.log" "$bin" \
    --etcd-servers "http://127.0.0.1:$CP_ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$CP_API_PORT" \
    --cert-dir "$CP_DIR/apiserver-certs" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
    --client-ca-file "$p/ca.crt" \
    --authorization-mode RBAC \
    --allow-privileged=true \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --service-cluster-ip-range "${CP_SERVICE_CIDRS:-10.96.0.0/16,fd00:10:96::/112}" \
    --endpoint-reconciler-type none \
    --enable-priority-and-fairness=false \
    --profiling=false \
    "${CP_API_EXTRA[@]}"
  CP_API_PID=$CP_LAST_PID
  local i
  for ((i = 0; i < 1200; i++)); do
    if [[ "$(cp_api_raw GET /readyz 2>/dev/null)" == ok ]]; then
      cp_log "kube-apiserver ready on https://127.0.0.1:$CP_API_PORT (pid $CP_API_PID)"
      return 0
    fi
    kill -0 "$CP_API_PID" 2>/dev/null || break
    sleep 0.1
  done
  cp_log "kube-apiserver did not become ready; its log:"
  tail -30 "$CP_DIR/apiserver.log" >&2
  return 1
}

# cp_terminate PID POLL — SIGTERM to PID (a child of this shell), up to 100 checks POLL seconds
# apart for it to exit, then SIGKILL; reaps it.
# Each step may fail (the process gone already, its status the signal's): none ends a caller
# that runs under set -e before the teardown is done.
cp_terminate() {
  local pid="$1" poll="$2" i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep "$poll"; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cp_stop_apiserver() {
  [[ -n "$CP_API_PID" ]] || return 0
  cp_terminate "$CP_API_PID" 0.1
  CP_API_PID=""
}

cp_start() {
  CP_EXEC=("$@")
  CP_DIR="$(mktemp -d "${TMPDIR:-/tmp}/kproxy-cp-XXXXXX")" || return 1
  _cp_certs || { cp_log "certificate generation failed"; return 1; }
  cp_start_etcd || return 1
  cp_start_apiserver || return 1
}

cp_stop() {
  cp_stop_apiserver
  if [[ -n "$CP_ETCD_PID" ]]; then
    kill -TERM "$CP_ETCD_PID" 2>/dev/null || true
    wait "$CP_ETCD_PID" 2>/dev/null || true
    CP_ETCD_PID=""
  fi
  [[ "${CP_ETCD_DATA:-}" == /dev/shm/kproxy-etcd-* ]] && rm -rf "$CP_ETCD_DATA"
  CP_ETCD_DATA=""
  if [[ -n "$CP_DIR" && -d "$CP_DIR" ]]; then
    if [[ -n "${CP_KEEP_DIR:-}" ]]; then cp_log "control-plane dir kept: $CP_DIR"; else rm -rf "$CP_DIR"; fi
  fi
  CP_DIR=""
}

# cp_api_raw METHOD PATH [BODY] — admin request, body on stdout, no status check.
cp_api_raw() {
  local method="$1" path="$2" body="${3:-}"
  local args=(-s --max-time 10 --cacert "$CP_DIR/pki/ca.crt" --cert "$CP_DIR/pki/admin.crt" --key "$CP_DIR/pki/admin.key"
    -X "$method" "https://127.0.0.1:$CP_API_PORT$path")
  if [[ -n "$body" ]]; then
    local ct=application/json
    [[ "$method" == PATCH ]] && ct=application/merge-patch+json
    args+=(-H "Content-Type: $ct" --data-binary "$body")
  fi
  "${CP_EXEC[@]}" curl "${args[@]}"
}

# cp_api METHOD PATH [BODY] — as cp_api_raw, but fails (and logs the answer) on HTTP >= 400.
cp_api() {
  local out code
  local method="$1" path="$2" body="${3:-}"
  local args=(-s --max-time 10 --cacert "$CP_DIR/pki/ca.crt" --cert "$CP_DIR/pki/admin.crt" --key "$CP_DIR/pki/admin.key"
    -X "$method" -w $'\n%{http_code}' "https://127.0.0.1:$CP_API_PORT$path")
  if [[ -n "$body" ]]; then
    local ct=application/json
    [[ "$method" == PATCH ]] && ct=${CP_PATCH_TYPE:-application/merge-patch+json}
    args+=(-H "Content-Type: $ct" --data-binary "$body")
  fi
  out="$("${CP_EXEC[@]}" curl "${args[@]}")" || { cp_log "$method $path: curl failed"; return 1; }
  code="${out##*$'\n'}"
  out="${out%$'\n'*}"
  if [[ ! "$code" =~ ^[0-9]+$ ]] || ((code >= 400)); then
    cp_log "$method $path -> HTTP $code: $out"
    return 1
  fi
  printf '%s\n' "$out"
}

# _cp_apply_yaml FILE — server-side apply of every object of a multi-document YAML file, as
# `kubectl apply --server-side` does: the real apiserver validates each object (schema, RBAC
# rules, DaemonSet spec) and running it twice changes nothing.
_cp_apply_yaml() {
  local file="$1" doc
  while IFS= read -r -d '' doc; do
    local path
    path="$(python3 -c '
import json, sys
o = json.loads(sys.argv[1])
kind, ns, api = o["kind"], o["metadata"].get("namespace"), o["apiVersion"]
plural = {"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
          "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings",
          "Namespace": "namespaces", "DaemonSet": "daemonsets", "ConfigMap": "configmaps"}[kind]
base = "/api/v1" if api == "v1" else "/apis/" + api
print(base + ("/namespaces/" + ns if ns else "") + "/" + plural + "/" + o["metadata"]["name"])
' "$doc")" || return 1
    CP_PATCH_TYPE=application/apply-patch+yaml \
      cp_api PATCH "$path?fieldManager=kproxy-e2e&force=true" "$doc" >/dev/null || return 1
  done < <(python3 -c '
import json, sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d:
        sys.stdout.write(json.dumps(d) + "\0")
' "$file")
}

# cp_kproxy_kubeconfig FILE — RBAC from deploy/ (ServiceAccount, ClusterRole, binding), a
# 1-hour token for kube-system/kproxy from the TokenRequest API, and a kubeconfig using it.
cp_kproxy_kubeconfig() {
  local out="$1" rbac
  rbac="$(_cp_rbac_file)" || return 1
  cp_log "RBAC from $rbac"
  _cp_apply_yaml "$rbac" || return 1
  # The rest of what deploy/ ships, applied server-side too: the real apiserver accepts them.
  local f
  for f in configmap.yaml daemonset.yaml; do
    cp_log "applying deploy/$f"
    _cp_apply_yaml "$CP_SOURCE_DIR/deploy/$f" || return 1
  done
  local token
  token="$(cp_api POST /api/v1/namespaces/kube-system/serviceaccounts/kproxy/token \
    '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["token"])')" || return 1
  [[ -n "$token" ]] || return 1
  printf '%s' "$token" >"$CP_DIR/kproxy.token"
  cp_write_kubeconfig "$out" "    certificate-authority: $CP_DIR/pki/ca.crt" "    tokenFile: $CP_DIR/kproxy.token"
}

# cp_write_kubeconfig FILE CLUSTER-LINES USER-LINES — a kubeconfig (context e2e, user kproxy)
# for this apiserver; CLUSTER-LINES and USER-LINES go, as given (indented four spaces), under
# the cluster's server and under the user.
cp_write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
current-context: e2e
contexts:
- name: e2e
  context: {cluster: e2e, user: kproxy}
clusters:
- name: e2e
  cluster:
    server: https://${CP_API_HOST:-127.0.0.1}:$CP_API_PORT
$2
users:
- name: kproxy
  user:
$3
EOF
}

# The RBAC kproxy ships (deploy/rbac.yaml): the tests prove it is enough.
_cp_rbac_file() {
  local f="$CP_SOURCE_DIR/deploy/rbac.yaml"
  [[ -f "$f" ]] || { cp_log "no $f"; return 1; }
  printf '%s' "$f"
}

_cp_etcd() {
  "${CP_EXEC[@]}" curl -sf --max-time 5 -X POST "http://127.0.0.1:$CP_ETCD_PORT/v3/$1" -d "$2"
}

# cp_etcd_compact — write a dummy key (so the revision moves past every watcher), then compact
# etcd at that revision: any watch resuming from an older resourceVersion gets 410 Expired.
cp_etcd_compact() {
  local rev
  rev="$(_cp_etcd kv/put '{"key":"L2twcm94eS1lMmUvYnVtcA==","value":"eA=="}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')" || return 1
  _cp_etcd kv/compaction "{\"revision\":\"$rev\",\"physical\":true}" >/dev/null || return 1
  cp_log "etcd compacted at revision $rev"
}

cp_teardown() { cp_stop; }

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  case "${1:-}" in
    run)
      trap cp_teardown EXIT
      trap 'exit 130' INT
      trap 'exit 143' TERM
      cp_start
      echo "kube-apiserver: https://127.0.0.1:$CP_API_PORT  (dir $CP_DIR)"
      echo "admin: curl --cacert $CP_DIR/pki/ca.crt --cert $CP_DIR/pki/admin.crt --key $CP_DIR/pki/admin.key https://127.0.0.1:$CP_API_PORT/version"
      cp_kproxy_kubeconfig "$CP_DIR/kproxy.kubeconfig" && echo "kproxy kubeconfig: $CP_DIR/kproxy.kubeconfig"
      echo "Ctrl-C to stop"
      wait "$CP_API_PID"
      ;;
    *) echo "usage: $0 run" >&2; exit 2 ;;
  esac
fi

# cp_recorder_test NAME KEEP_VARIABLE ARGS...: the start every API-side test over the
# test-plugins' recorder backend shares. Reads --kproxy BIN and --test-plugins DIR (ARGS) into
# KPROXY and PLUGINS; needs root (tests/program/lib.sh, sourced first); re-runs the script in a
# network namespace of its own; checks that kube-apiserver is built; makes WORK, removed on exit
# unless the variable KEEP_VARIABLE names is set; sets CEILING (KP_CEILING, 120 s by default:
# the ceiling of every wait, which only catches a hang); on exit stops kproxy (pid in KP), the
# other processes whose pids the test adds to CP_TEST_PIDS, and the control plane.
cp_recorder_test() {
  local name=$1 keep=$2
  shift 2
  local args=("$@")
  KPROXY=""
  PLUGINS=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --kproxy) KPROXY="$2"; shift 2 ;;
      --test-plugins) PLUGINS="$2"; shift 2 ;;
      *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
  done
  [[ -x "$KPROXY" && -d "$PLUGINS" ]] || { echo "$name: --kproxy BIN and --test-plugins DIR are required" >&2; exit 2; }
  require_root "$name" "network namespace"
  enter_own_netns "$name" "${args[@]}"
  cp_apiserver_bin >/dev/null || exit 1
  WORK=$(mktemp -d "/tmp/kproxy-${name//_/-}-XXXXXX")
  CEILING=${KP_CEILING:-120}
  KP=""
  CP_TEST_PIDS=()
  CP_KEEP_VARIABLE=$keep
  trap '_rc=$?; for _p in $KP "${CP_TEST_PIDS[@]}"; do cp_terminate "$_p" 0.05; done; cp_stop; [[ -n "${!CP_KEEP_VARIABLE:-}" ]] && echo "logs kept in $WORK" || rm -rf "$WORK"; exit $_rc' EXIT
}

# cp_recorder_kproxy [NAME=VALUE...]: starts kproxy over the test-plugins' recorder backend as
# node-a, with $WORK/kubeconfig (cp_kproxy_kubeconfig), the environment NAME=VALUE added, its
# record in $WORK/record and its log in $WORK/kproxy.log; /metrics on 127.0.0.1:10249, /healthz
# on 127.0.0.1:10256. Its pid in KP. After cp_recorder_test and cp_start.
cp_recorder_kproxy() {
  env KPROXY_RECORD_FILE="$WORK/record" "$@" \
    "$KPROXY" --proxy-mode=recorder --plugin-dir "$PLUGINS" --kubeconfig "$WORK/kubeconfig" \
    --hostname-override node-a --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 \
    -v 1 >"$WORK/kproxy.log" 2>&1 &
  KP=$!
}

# cp_service NAME CLUSTER-IP [TRIGGER-TIME]: creates the Service NAME (port http/80, in default)
# and its EndpointSlice NAME-1 (one ready endpoint, 10.244.1.5:8080), annotated with
# endpoints.kubernetes.io/last-change-trigger-time TRIGGER-TIME when it is given.
cp_service() {
  local annotations=""
  [[ -n "${3:-}" ]] && annotations=",\"annotations\":{\"endpoints.kubernetes.io/last-change-trigger-time\":\"$3\"}"
  cp_api POST /api/v1/namespaces/default/services "{\"apiVersion\":\"v1\",\"kind\":\"Service\",
    \"metadata\":{\"name\":\"$1\"},\"spec\":{\"clusterIP\":\"$2\",\"ports\":[{\"name\":\"http\",\"port\":80}]}}" >/dev/null &&
    cp_api POST /apis/discovery.k8s.io/v1/namespaces/default/endpointslices "{\"apiVersion\":\"discovery.k8s.io/v1\",
    \"kind\":\"EndpointSlice\",\"metadata\":{\"name\":\"$1-1\",\"labels\":{\"kubernetes.io/service-name\":\"$1\"}$annotations},
    \"addressType\":\"IPv4\",\"ports\":[{\"name\":\"http\",\"port\":8080,\"protocol\":\"TCP\"}],
    \"endpoints\":[{\"addresses\":[\"10.244.1.5\"],\"conditions\":{\"ready\":true}}]}" >/dev/null
}

# cp_next_second: waits for the next whole second and prints it in RFC 3339, as a trigger time
# for cp_service later than anything done before the call. kproxy drops the trigger times of
# changes made before it started (as upstream's tracker), and the annotation has whole seconds:
# called once kproxy has answered, what it prints is a time after kproxy's start for certain.
cp_next_second() {
  local start
  start=$(date +%s)
  while (($(date +%s) <= start)); do sleep 0.05; done
  date -u +%Y-%m-%dT%H:%M:%SZ
}
