"""What the proxy's limits buy (issue 12), on a converged sandbox host:

- the time a chat takes idle, and while the largest /tokenize the proxy allows runs (in a loop);
- what a 10 MB /tokenize gets;
- what a slow client gets (a body trickled at 1 byte / 12 s; headers that never end);
- systemd-analyze security of the engine's unit and nginx.

    GPUSERVE_SANDBOX_INSTANCE=41 .venv/bin/python bench/hardening.py [--host sandbox-1]

With ``--flood KEYS`` (a file of two client keys the host was converged with, --data
api_keys_file=KEYS) it measures only issue 26's case instead: the second key's chat latency while
the first sends 8 concurrent chats of 120,000 one-character messages (about 4 MB each) in a loop,
and what those get. Converge again with --data proxy_max_messages=1000000 for the case without
the message limit. ``--shape large`` floods with chats inside every limit instead: 2,000
messages of varied words, just under the 4096 KiB body limit, which the engine templates and
tokenizes (and refuses, past the tiny model's context); converge again with --data
proxy_large_prompts_per_key=8 (the fair share: no large-prompt limit) for the case without it.

Every loop is bounded (counts and seconds). Prints one table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
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
    ap.add_argument("--flood", type=Path, help="a file of two client keys: measure issue 26's case only")
    ap.add_argument("--shape", choices=("many", "large"), default="many",
                    help="the flood's chats: 120,000 one-character messages, or large ones inside every limit")
    args = ap.parse_args()
    box = Sandbox()
    host = next(h for h in box.hosts() if h.name == args.host)
    key = fleet_view.client_key(box)
    if args.flood:
        flood_key, key = args.flood.read_text().split()[:2]
    ctx = ssl.create_default_context(cafile=str(fleet_view.host_ca(box, host, Path(tempfile.mkdtemp()))))
    ctx.check_hostname = False

    def request(path: str, body: dict, timeout: float = 120, key: str = key) -> tuple[int, float]:
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

    failed: list[int] = []

    def chats() -> list[float]:
        """Seconds of each of ``args.chats`` chats; a chat answered other than 200 is kept in
        ``failed`` (printed), not timed."""
        out = []
        for _ in range(args.chats):
            status, s = request("/v1/chat/completions", {
                "model": "tiny-chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
            if status == 200:
                out.append(s)
            else:
                failed.append(status)
                print(f"other key's chat answered {status} after {s:.2f} s", flush=True)
        return out or [float("nan")]

    if args.flood:
        return _flood(request, chats, flood_key, args.shape)
    # the largest body /tokenize takes (JSON overhead aside): words, so it tokenizes to many tokens
    allowed = ProxyLimits().body_kib * 1024 - 200
    largest = {"model": "tiny-chat", "prompt": ("ab " * (allowed // 3))[:allowed]}
    idle = chats()
    busy, tok = _while_looping(chats, lambda: request("/tokenize", largest), threads=2, most=500)
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


def flood_body(shape: str) -> tuple[dict, str]:
    """The flood's chat and what it is: 120,000 one-character messages (the audit's), or a large
    one inside every default limit: 2,000 messages (of 2,048) of varied words, under 4096 KiB."""
    if shape == "many":
        return {"model": "tiny-chat", "max_tokens": 4,
                "messages": [{"role": "user", "content": "a"}] * 120_000}, "120,000 messages"
    rng = random.Random(26)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    limit = ProxyLimits().prompt_body_kib * 1024 - 4096
    content = " ".join(rng.choice(words) for _ in range(330))
    per = len(json.dumps({"role": "user", "content": content})) + 2
    n = min(2000, limit // per)
    return {"model": "tiny-chat", "max_tokens": 4,
            "messages": [{"role": "user", "content": content}] * n}, f"{n} messages of {len(content)} characters"


def _flood(request, chats, flood_key: str, shape: str) -> None:
    """Issue 26: one key sends 8 concurrent flood chats (in a loop, bounded); the other key's
    chats, idle and meanwhile."""
    flood, what = flood_body(shape)
    idle = chats()
    busy, got = _while_looping(chats, lambda: request("/v1/chat/completions", flood, key=flood_key),
                               threads=8, most=400)
    med = statistics.median
    codes = {c: sum(1 for s, _ in got if s == c) for c in sorted({s for s, _ in got})}
    print(f"other key's chat, idle (n={len(idle)}): p50 {med(idle):.2f} s, max {max(idle):.2f} s")
    print(f"other key's chat, during the flood (n={len(busy)}): p50 {med(busy):.2f} s, max {max(busy):.2f} s")
    print(f"flood: {len(got)} chats of {what} ({len(json.dumps(flood)) // 1024} KiB), answers {codes}, "
          f"median {med([t for _, t in got]):.2f} s")


def _while_looping(measure, send, threads: int, most: int):
    """(measure()'s result, what send() returned) while ``threads`` threads call send() in a loop,
    at most ``most`` times and 300 s in all."""
    stop, got = threading.Event(), []

    def loop() -> None:
        t_end = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < t_end and len(got) < most:
            got.append(send())

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    time.sleep(1)
    out = measure()
    stop.set()
    for w in workers:
        w.join(150)
    return out, got


def _cut(seconds: float | None) -> str:
    return "still open after 45 s" if seconds is None else f"cut off after {seconds:.1f} s"


if __name__ == "__main__":
    main()
