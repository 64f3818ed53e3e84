"""Admin requests to the test apiserver of tests/e2e/control-plane.sh, shared by the end-to-end
tooling, the cluster suite (tests/cluster/cluster.py) and the benchmarks (bench/compare,
bench/api): one HTTPS connection per thread with the admin client certificate (system:masters),
retrying what a loaded apiserver answers now and then."""

import http.client
import json
import ssl
import threading
import time


class Api:
    """Admin connections to the apiserver on 127.0.0.1:PORT, one per thread."""

    def __init__(self, port, pki):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
        self.ctx.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")
        self.local = threading.local()

    def call(self, method, path, body=None, ctype="application/json", ok=()):
        """One request; returns the decoded answer of a 2xx (None when empty). Statuses in OK are
        accepted too and return None (409 for a POST of what exists, or a retried POST that had
        succeeded; 404 for a DELETE of what is gone). Connection errors, 429, 5xx and 422
        "already allocated" (a ClusterIP or NodePort of a Service just deleted, not yet
        released) are retried; any other status raises."""
        for attempt in range(10):
            c = getattr(self.local, "conn", None)
            if c is None:
                c = self.local.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx,
                                                                  timeout=60)
            try:
                headers = {"Content-Type": ctype} if body is not None else {}
                payload = body if body is None or isinstance(body, str) else json.dumps(body)
                c.request(method, path, body=payload, headers=headers)
                r = c.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException):
                c.close()
                self.local.conn = None
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status < 300 or r.status in ok:
                return json.loads(data) if data and r.status < 300 else None
            if r.status not in (422, 429, 500, 503, 504) or (r.status == 422 and b"allocated" not in data):
                raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"{method} {path}: gave up after 10 attempts")

    def patch(self, path, body):
        """A JSON merge patch."""
        return self.call("PATCH", path, body, ctype="application/merge-patch+json")

    def list(self, path):
        """The objects of a collection, a page at a time (only one page held at once)."""
        cont = ""
        while True:
            page = self.call("GET", f"{path}?limit=5000" + (f"&continue={cont}" if cont else ""))
            yield from page.get("items") or []
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                return
