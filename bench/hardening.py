"""What the proxy's limits buy (issue 12), on a converged sandbox host:

- the time a chat takes idle, and while the largest /tokenize the proxy allows runs (in a loop);
- what a 10 MB /tokenize gets;
- what a slow client gets (a body trickled at 1 byte / 12 s; headers that never end);
- systemd-analyze security of the engine's unit and nginx.

    GPUSERVE_SANDBOX_INSTANCE=41 .venv/bin/python bench/hardening.py [--host sandbox-1]

Every loop is bounded (counts and seconds). Prints one table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path

from gpuserve import layout
from gpuserve.proxy_conf import ProxyLimits
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.hosts import Sandbox

PORT = fleet_view.PROXY_PORT


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="sandbox-1")
    ap.add_argument("--chats", type=int, default=5)
    args = ap.parse_args()
    box = Sandbox()
    host = next(h for h in box.hosts() if h.name == args.host)
    key = fleet_view.client_key(box)
    ctx = ssl.create_default_context(cafile=str(fleet_view.host_ca(box, host, Path(tempfile.mkdtemp()))))
    ctx.check_hostname = False

    def request(path: str, body: dict, timeout: float = 120) -> tuple[int, float]:
        conn = http.client.HTTPSConnection(host.ip, PORT, timeout=timeout, context=ctx)
        t0 = time.monotonic()
        try:
            conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {key}",
                                                          "Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status, time.monotonic() - t0
        finally:
            conn.close()

    def chats() -> list[float]:
        out = []
        for _ in range(args.chats):
            status, s = request("/v1/chat/completions", {
                "model": "tiny-chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
            assert status == 200, status
            out.append(s)
        return out

    # the largest body /tokenize takes (JSON overhead aside): words, so it tokenizes to many tokens
    allowed = ProxyLimits().body_kib * 1024 - 200
    largest = {"model": "tiny-chat", "prompt": ("ab " * (allowed // 3))[:allowed]}
    idle = chats()
    stop, tok = threading.Event(), []

    def tokenize_loop() -> None:
        t_end = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < t_end and len(tok) < 500:
            tok.append(request("/tokenize", largest))

    workers = [threading.Thread(target=tokenize_loop) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(1)
    busy = chats()
    stop.set()
    for w in workers:
        w.join(130)
    big_status, big_s = request("/tokenize", {"model": "tiny-chat", "prompt": "a" * 10_000_000}, timeout=120)
    slow = {kind: fleet_view.slow_client(host.ip, ctx, key, kind) for kind in ("body", "header")}
    scores = {}
    for unit in (layout.unit_name("minimax"), "nginx.service"):
        line = box.ssh(host, f"systemd-analyze security {unit} | tail -1").stdout
        scores[unit] = re.search(r": (\d+\.\d+ \S+)", line)[1]

    med = statistics.median
    rows = [
        ("chat, idle (median of %d)" % len(idle), f"{med(idle):.2f} s (max {max(idle):.2f})"),
        ("chat, 2 x largest allowed /tokenize looping", f"{med(busy):.2f} s (max {max(busy):.2f})"),
        (f"  /tokenize of {allowed // 1024} KiB", f"{len(tok)} done, {sorted({s for s, _ in tok})}, "
                                                  f"median {med([t for _, t in tok]):.2f} s" if tok else "none"),
        ("/tokenize of 10 MB", f"HTTP {big_status} in {big_s:.2f} s"),
        ("body trickled 1 byte / 12 s", _cut(slow["body"])),
        ("headers that never end", _cut(slow["header"])),
        *((f"systemd-analyze security {u}", s) for u, s in scores.items()),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def _cut(seconds: float | None) -> str:
    return "still open after 45 s" if seconds is None else f"cut off after {seconds:.1f} s"


if __name__ == "__main__":
    main()
