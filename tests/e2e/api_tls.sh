#!/usr/bin/env bash
# TLS and authentication of kproxy's API client against a real kube-apiserver + etcd, each case
# a fresh kproxy (nftables mode) with its own kubeconfig:
#   - client-certificate authentication works (client-certificate/client-key, as the systemd
#     host install uses; CN=system:kube-proxy, which the apiserver binds to system:node-proxier):
#     the Service reaches the ruleset;
#   - a CA that did not sign the server's certificate is refused;
#   - a server name the certificate does not carry is refused (and one it carries works);
#   - an expired client certificate is refused (401) and nothing is programmed;
#   - a tokenFile rotated on disk is used without restarting kproxy;
#   - a CA together with insecure-skip-tls-verify, and a token over http://, stop kproxy at
#     start-up with one clear line.
# Everything (etcd, apiserver, kproxy, its nftables table) lives in an anonymous network
# namespace (unshare -n); nothing listens or changes in the host's. Needs root and kube-apiserver
# built by tests/e2e/build-control-plane.sh.
#
# usage: sudo tests/e2e/api_tls.sh --kproxy BIN [--plugin-dir DIR]
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KPROXY=""
PLUGIN_DIR=""
ARGS=("$@")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kproxy) KPROXY="$2"; shift 2 ;;
    --plugin-dir) PLUGIN_DIR="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ -x "$KPROXY" ]] || { echo "api_tls: --kproxy BIN is required" >&2; exit 2; }
# shellcheck source=../program/lib.sh
source "$HERE/../program/lib.sh"
require_root api_tls "network namespace, nftables"
enter_own_netns api_tls "${ARGS[@]}"

# shellcheck source=control-plane.sh
source "$HERE/control-plane.sh"
cp_apiserver_bin >/dev/null || exit 1

WORK=$(mktemp -d /tmp/kproxy-api-tls-XXXXXX)
# The ceiling of every wait for an event (it only catches a hang; how soon the event came is
# not checked).
CEILING=${KP_CEILING:-120}
KP=""
stop_kproxy() {
  [[ -n "$KP" ]] || return 0
  cp_terminate "$KP" 0.05
  KP=""
  nft delete table ip kube-proxy 2>/dev/null
  nft delete table ip6 kube-proxy 2>/dev/null
}
trap '_rc=$?; stop_kproxy; cp_stop; [[ -n "${API_TLS_KEEP:-}" ]] && echo "logs kept in $WORK" || rm -rf "$WORK"; exit $_rc' EXIT

cp_start || exit 1
PKI="$CP_DIR/pki"

# kproxy's identity: CN=system:kube-proxy (bound to system:node-proxier by the apiserver's
# bootstrap RBAC), signed by the cluster CA; and the same identity, expired yesterday.
_cp_leaf "$PKI" kproxy "/CN=system:kube-proxy" "" clientAuth || exit 1
python3 - "$PKI" <<'PY' || exit 1
import datetime, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
d = sys.argv[1]
ca_key = serialization.load_pem_private_key(open(d + "/ca.key", "rb").read(), None)
ca = x509.load_pem_x509_certificate(open(d + "/ca.crt", "rb").read())
key = ec.generate_private_key(ec.SECP256R1())
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:kube-proxy")]))
        .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2)).not_valid_after(now - datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256()))
open(d + "/expired.crt", "wb").write(cert.public_bytes(serialization.Encoding.PEM))
open(d + "/expired.key", "wb").write(key.private_bytes(serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
PY
# The admin (system:masters) can do what kproxy may not: create the Service it should see.
VIP=10.96.0.50
cp_api POST /api/v1/namespaces/default/services \
  "{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"web\",\"namespace\":\"default\"},
    \"spec\":{\"clusterIP\":\"$VIP\",\"ports\":[{\"name\":\"http\",\"port\":80,\"targetPort\":8080,\"protocol\":\"TCP\"}]}}" \
  >/dev/null || exit 1
cp_api POST /apis/discovery.k8s.io/v1/namespaces/default/endpointslices \
  '{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
    "metadata":{"name":"web-1","namespace":"default","labels":{"kubernetes.io/service-name":"web"}},
    "addressType":"IPv4","endpoints":[{"addresses":["10.244.1.2"],"conditions":{"ready":true}}],
    "ports":[{"name":"http","port":8080,"protocol":"TCP"}]}' >/dev/null || exit 1

CERT_USER="    client-certificate: $PKI/kproxy.crt
    client-key: $PKI/kproxy.key"

# start_kproxy NAME KUBECONFIG [FLAGS...]: kproxy in the background, log in $WORK/NAME.log.
start_kproxy() {
  local name=$1 kc=$2
  shift 2
  LOG="$WORK/$name.log"
  local args=(--proxy-mode=nftables --kubeconfig "$kc" --hostname-override node-a
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 -v 2 "$@")
  [[ -n "$PLUGIN_DIR" ]] && args+=(--plugin-dir "$PLUGIN_DIR")
  "$KPROXY" "${args[@]}" >"$LOG" 2>&1 &
  KP=$!
}
connected() { grep -q 'API server connection established' "$LOG"; }
programmed() { nft list table ip kube-proxy 2>/dev/null | grep -qwF -- "$VIP"; }
failures_with() { (($(grep 'API request failed; retrying' "$LOG" | grep -c -- "$1") >= 2)); }
# Services are programmed as soon as they are listed; "connected" is logged once every watch
# (the Node's too) is open, which may come a moment later.
synced() { programmed && connected; }

# accepted NAME: connects, and the Service reaches the ruleset.
accepted() {
  if wait_for "$CEILING" synced && kproxy_alive; then
    pass "$1"
  else
    fail "$1" "$(grep -E 'failed|error' "$LOG" | tail -3)"
  fi
  stop_kproxy
}
# refused NAME WHY: retries fail with WHY (at least twice, so it backs off and keeps failing),
# kproxy stays up, never connects, programs nothing from the API.
refused() {
  if wait_for "$CEILING" failures_with "$2" && kproxy_alive && ! connected && ! programmed; then
    pass "$1"
  else
    fail "$1" "connected=$(connected && echo yes || echo no) programmed=$(programmed && echo yes || echo no) $(grep -E 'failed|error' "$LOG" | tail -2)"
  fi
  stop_kproxy
}

# --- client-certificate authentication -------------------------------------------------------
cp_write_kubeconfig "$WORK/cert.kubeconfig" "    certificate-authority: $PKI/ca.crt" "$CERT_USER"
start_kproxy cert "$WORK/cert.kubeconfig"
accepted "client-certificate authentication works: the Service reaches the ruleset"

# --- the server is verified ------------------------------------------------------------------
cp_write_kubeconfig "$WORK/wrong-ca.kubeconfig" "    certificate-authority: $PKI/other-ca.crt" "$CERT_USER"
start_kproxy wrong-ca "$WORK/wrong-ca.kubeconfig"
refused "a CA that did not sign the server's certificate is refused" "certificate verify failed"

cp_write_kubeconfig "$WORK/wrong-name.kubeconfig" "    certificate-authority: $PKI/ca.crt
    tls-server-name: not-the-apiserver.example" "$CERT_USER"
start_kproxy wrong-name "$WORK/wrong-name.kubeconfig"
refused "a server name the certificate does not carry is refused" "certificate verify failed"

cp_write_kubeconfig "$WORK/right-name.kubeconfig" "    certificate-authority: $PKI/ca.crt
    tls-server-name: kubernetes.default.svc" "$CERT_USER"
start_kproxy right-name "$WORK/right-name.kubeconfig"
accepted "a tls-server-name the certificate carries is accepted (the control for the case above)"

# --- the client is verified by the server ------------------------------------------------------
cp_write_kubeconfig "$WORK/expired.kubeconfig" "    certificate-authority: $PKI/ca.crt" \
  "    client-certificate: $PKI/expired.crt
    client-key: $PKI/expired.key"
start_kproxy expired "$WORK/expired.kubeconfig"
refused "an expired client certificate is refused by the apiserver (401)" ": 401 Unauthorized"

# --- a rotated tokenFile is picked up without a restart ------------------------------------------
# The ServiceAccount and RBAC from deploy/, a TokenRequest token; kproxy starts with a token the
# apiserver rejects, then the file is replaced (rename, as the kubelet does) by the good one.
if cp_kproxy_kubeconfig "$WORK/sa.kubeconfig"; then
  good=$(cat "$CP_DIR/kproxy.token")
  printf 'not-a-valid-token' >"$CP_DIR/kproxy.token"
  start_kproxy token-rotation "$WORK/sa.kubeconfig"
  pid=$KP
  if wait_for "$CEILING" failures_with ": 401 Unauthorized" && ! connected; then
    printf '%s' "$good" >"$CP_DIR/kproxy.token.new" && mv "$CP_DIR/kproxy.token.new" "$CP_DIR/kproxy.token"
    KP=$pid
    accepted "a rotated tokenFile is picked up without a restart (401 before, synced after)"
  else
    fail "token rotation" "the bad token was not refused: $(grep -E 'failed|error|established' "$LOG" | tail -2)"
    stop_kproxy
  fi
else
  fail "token rotation" "could not set up the ServiceAccount token"
fi

# --- refused at start-up ----------------------------------------------------------------------
cp_write_kubeconfig "$WORK/insecure.kubeconfig" "    certificate-authority: $PKI/ca.crt
    insecure-skip-tls-verify: true" "$CERT_USER"
out=$(timeout "$CEILING" "$KPROXY" --proxy-mode=nftables --kubeconfig "$WORK/insecure.kubeconfig" --hostname-override node-a 2>&1)
rc=$?
if [[ $rc -eq 1 && "$out" == *"specifying a root certificates file with the insecure flag is not supported"* ]]; then
  pass "a CA with insecure-skip-tls-verify stops kproxy at start-up with client-go's message"
else
  fail "CA with insecure-skip-tls-verify" "rc=$rc $out"
fi
printf 'secret-token' >"$WORK/token"
cp_write_kubeconfig "$WORK/token.kubeconfig" "" "    tokenFile: $WORK/token"
out=$(timeout "$CEILING" "$KPROXY" --proxy-mode=nftables --kubeconfig "$WORK/token.kubeconfig" --master http://127.0.0.1:1 \
  --hostname-override node-a 2>&1)
rc=$?
if [[ $rc -eq 1 && "$out" == *"refusing to send a bearer token in clear text to http://127.0.0.1:1"* ]]; then
  pass "a token over http:// stops kproxy at start-up"
else
  fail "token over http" "rc=$rc $out"
fi

finish api_tls
