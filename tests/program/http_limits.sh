#!/usr/bin/env bash
# kproxy's HTTP servers (health 10256, metrics 10249, a health-check node port) under abuse, with
# the real binary in its own network namespace (unshare -n) and systemd's default fd limit (1024):
# a thousand idle connections, oversized headers, a body, other methods, a slowloris request.
# Through all of it /healthz must answer, kproxy's fds stay bounded, and a new Service is still
# programmed (its rules, its node port, its health-check port).
# Usage: http_limits.sh KPROXY_BIN
set -uo pipefail
KPROXY=${1:?usage: http_limits.sh KPROXY_BIN}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

require_root http_limits "own network namespace, nftables"
enter_own_netns http_limits "$@"
make_workdir http-limits

make_lb_fixture
write_lb web 10.96.0.30 32000 node-a

# systemd's default soft limit for a service: the budget an attacker would try to exhaust.
(ulimit -n 1024 && exec "$KPROXY" --config "$WORK/config.yaml" --manifests "$M" -v 1) >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")

HZ=http://127.0.0.1:10256
MET=http://127.0.0.1:10249
HC=http://127.0.0.1:32000
DETAIL="$(tail -5 "$WORK/kproxy.log" 2>/dev/null)"
check "health server answers" wait_for "$HANG_CEILING" is_code 200 "$HZ/healthz"
check "health-check node port answers" wait_for "$HANG_CEILING" is_code 200 "$HC/"

# --- one bad request at a time: status and a closed connection --------------------------------
# raw PORT PAYLOAD_PY: sends the payload (a Python bytes expression), prints the status line's
# code (or "closed"/"timeout", after $REQUEST_CEILING s without an answer).
raw() {
  python3 - "$@" "$REQUEST_CEILING" <<'PY'
import socket, sys
port, payload = int(sys.argv[1]), eval(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port), timeout=float(sys.argv[3]))
try:
    s.sendall(payload)
except OSError:
    pass
try:
    data = s.recv(4096)
    print(data.split(b" ")[1].decode() if data.startswith(b"HTTP/1.") else "closed")
except socket.timeout:
    print("timeout")
except OSError:
    print("closed")
PY
}
is_raw() { local want=$1; shift; DETAIL="got $(raw "$@")"; [[ "$DETAIL" == "got $want" ]]; }
check "oversized headers get 431" is_raw 431 10256 'b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n"'
check "a large body gets 413" is_raw 413 10256 'b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n" + b"a" * 1048576'
check "POST gets 405" is_raw 405 10256 'b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"'
check "PUT on the metrics server gets 405" is_raw 405 10249 'b"PUT /configz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"'
check "DELETE on a health-check port gets 405" is_raw 405 32000 'b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n"'
allow=$(curl -s -o /dev/null -D - --max-time "$REQUEST_CEILING" -X POST "$HZ/healthz" | tr -d '\r' | awk -F': ' 'tolower($1) == "allow" {print $2}')
DETAIL="Allow: $allow"; check "405 says Allow: GET, HEAD" test "$allow" = "GET, HEAD"
check "HEAD still works" is_code 200 -I "$HZ/healthz"

# --- the siege: idle connections, a slowloris, all at once ------------------------------------
# Opens 1000 idle connections (most to the health server, some to the others) and a slowloris
# that sends one header byte a second; writes how many connections it opened to siege.ready when
# it has tried them all, then holds them.
python3 - "$WORK" "$REQUEST_CEILING" >"$WORK/siege.log" 2>&1 <<'PY' &
import os, resource, socket, sys, time, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
work, ceiling = sys.argv[1], float(sys.argv[2])
held = []
for i in range(1000):
    port = 10256 if i % 10 < 8 else (10249 if i % 10 == 8 else 32000)
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=ceiling))
    except OSError as e:
        print("connect", i, e, flush=True)
slow = socket.create_connection(("127.0.0.1", 10256), timeout=ceiling)
slow.sendall(b"GET /healthz HTTP/1.1\r\n")
start = time.monotonic()
with open(work + "/siege.tmp", "w") as f:
    f.write("%d\n" % len(held))
os.rename(work + "/siege.tmp", work + "/siege.ready")
closed_after = None
for _ in range(60):
    try:
        slow.sendall(b"X")
    except OSError:
        closed_after = time.monotonic() - start
        break
    time.sleep(1)
print("slowloris closed after", closed_after, flush=True)
with open(work + "/slowloris", "w") as f:
    f.write("%s\n" % (-1 if closed_after is None else int(closed_after)))
time.sleep(600)
PY
SIEGE=$!; PIDS+=("$SIEGE")
DETAIL=$(cat "$WORK/siege.log")
check "the siege has tried its 1000 connections" wait_for "$HANG_CEILING" test -e "$WORK/siege.ready"
opened=$(cat "$WORK/siege.ready" 2>/dev/null)
DETAIL="${opened:-no} connections opened; $(head -5 "$WORK/siege.log")"
check "at least 990 of the 1000 connections opened" test "${opened:-0}" -ge 990

fds() { ls "/proc/$KP/fd" 2>/dev/null | wc -l; }
most=0
for i in $(seq 20); do n=$(fds); ((n > most)) && most=$n; sleep 0.05; done
DETAIL="kproxy had up to $most fds"; check "kproxy's fds stay bounded under 1000 idle connections" test "$most" -lt 400

healthz_ok() {
  local out
  out=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time "$REQUEST_CEILING" "$HZ/healthz")
  DETAIL="$out"
  [[ ${out%% *} == 200 ]]
}
ok=0
for i in $(seq 10); do healthz_ok && ok=$((ok + 1)); sleep 0.1; done
DETAIL="$ok of 10 answered 200 (last: code and seconds $DETAIL)"
check "/healthz answers while besieged" test "$ok" -eq 10
check "the health-check node port answers while besieged" is_code 200 "$HC/"
check "/metrics answers while besieged" is_code 200 "$MET/metrics"

# A new Service of its own (cluster IP, node port, health-check port: nothing web uses) is
# programmed while besieged: its rules and its health-check listener.
EXTRA_HC=32001
logged=$(wc -l <"$WORK/kproxy.log")
write_lb extra 10.96.0.77 "$EXTRA_HC" node-a
in_ruleset() { nft list table ip kube-proxy 2>/dev/null | grep -q "$1"; }
DETAIL=$(tail -3 "$WORK/kproxy.log")
check "a new Service's cluster IP reaches the ruleset" wait_for "$HANG_CEILING" in_ruleset '10\.96\.0\.77 \. tcp \. 80 '
check "... and its node port $((EXTRA_HC - 1000))" wait_for "$HANG_CEILING" in_ruleset "tcp \\. $((EXTRA_HC - 1000)) "
# (Its own: the body names the Service.)
hc_serves_extra() {
  [[ $(curl -s --max-time "$REQUEST_CEILING" "http://127.0.0.1:$EXTRA_HC/" | jq -r .service.name 2>/dev/null) == extra ]]
}
check "... and its health-check port $EXTRA_HC answers for it" wait_for "$HANG_CEILING" hc_serves_extra
DETAIL=$(tail -n +$((logged + 1)) "$WORK/kproxy.log" | grep -E '^[EW]' | head -3)
check "... with no error or warning logged since" test -z "$DETAIL"

DETAIL=$(cat "$WORK/siege.log")
# It sends a byte a second for 60 s: only a deadline on the whole request (10 s) ends it.
check "the slowloris has ended" wait_for "$HANG_CEILING" test -s "$WORK/slowloris"
slow=$(cat "$WORK/slowloris" 2>/dev/null)
DETAIL="closed after ${slow:-?} s (-1: never)"
check "... cut off by the read timeout while it still sent" test "${slow:--1}" -ge 0
check "/healthz still answers after all that" healthz_ok
DETAIL=$(tail -3 "$WORK/kproxy.log"); check "kproxy is still running" kproxy_alive
accept_errors=$(grep -c 'HTTP accept failed' "$WORK/kproxy.log")
DETAIL="$accept_errors accept failures logged"; check "no accept failures (fd exhaustion)" test "$accept_errors" -eq 0

# Shutting down with hundreds of connections still open (sessions pending on the loop).
if ! kill -TERM "$KP" 2>/dev/null; then
  fail "SIGTERM" "kproxy had already exited: $(tail -3 "$WORK/kproxy.log")"
elif wait_for "$HANG_CEILING" bash -c "! kill -0 $KP 2>/dev/null"; then
  wait "$KP"; rc=$?
  DETAIL="exit status $rc: $(tail -3 "$WORK/kproxy.log")"; check "SIGTERM with connections held: exit 0" test "$rc" -eq 0
else
  fail "SIGTERM" "still running after $HANG_CEILING s"
fi

finish http_limits
