#!/usr/bin/env python3
"""A tiny "pod" for data-path tests: answers who it is and who it sees as the client.

Runs inside a pod network namespace. TCP (HTTP) on every --port:
  GET /            -> "pod=<name> client=<ip>:<port>\n"
  GET /healthz     -> "ok\n"
  GET /stream?seconds=N&interval=S
                   -> one "pod=<name> client=... seq=<i>" line every S seconds for N seconds,
                      over one connection (a long-lived flow for restart tests)
UDP echo on every --udp-port: each datagram is answered with "pod=<name> client=<ip>:<port>\n".

Standard library only, so it runs wherever python3 does.
"""

import argparse
import http.server
import signal
import socket
import socketserver
import sys
import threading
import time
import urllib.parse


class PodHandler(http.server.BaseHTTPRequestHandler):
    pod_name = "unknown"
    # HTTP/1.1 keeps a connection open when the client asks, so one flow can carry many requests.
    protocol_version = "HTTP/1.1"

    def _identity(self) -> str:
        host, port = self.client_address[0], self.client_address[1]
        return f"pod={self.pod_name} client={host}:{port}"

    def _send_text(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/healthz":
            self._send_text(200, "ok\n")
            return
        if url.path == "/stream":
            self._stream(urllib.parse.parse_qs(url.query))
            return
        self._send_text(200, self._identity() + "\n")

    def _stream(self, query) -> None:
        seconds = float(query.get("seconds", ["5"])[0])
        interval = float(query.get("interval", ["0.2"])[0])
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        # No length: the body ends when the connection closes.
        self.send_header("Connection", "close")
        self.end_headers()
        deadline = time.monotonic() + seconds
        seq = 0
        while time.monotonic() < deadline:
            self.wfile.write(f"{self._identity()} seq={seq}\n".encode())
            self.wfile.flush()
            seq += 1
            time.sleep(interval)
        self.wfile.write(f"{self._identity()} done={seq}\n".encode())
        self.close_connection = True

    def log_message(self, fmt: str, *args) -> None:
        sys.stderr.write(f"{self.pod_name} {self.address_string()} {fmt % args}\n")


class ThreadingHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve_udp(port: int, name: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", port))
    while True:
        _, peer = sock.recvfrom(65535)
        sock.sendto(f"pod={name} client={peer[0]}:{peer[1]}\n".encode(), peer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="pod name reported in every answer")
    parser.add_argument("--port", type=int, action="append", default=[], help="TCP/HTTP port (repeatable)")
    parser.add_argument("--udp-port", type=int, action="append", default=[], help="UDP echo port (repeatable)")
    args = parser.parse_args()
    ports = args.port or [8080]

    PodHandler.pod_name = args.name
    servers = [ThreadingHTTPServer(("0.0.0.0", port), PodHandler) for port in ports]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    for port in args.udp_port:
        threading.Thread(target=serve_udp, args=(port, args.name), daemon=True).start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"podserver name={args.name} tcp={ports} udp={args.udp_port}", file=sys.stderr, flush=True)
    stop.wait()
    for server in servers:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
