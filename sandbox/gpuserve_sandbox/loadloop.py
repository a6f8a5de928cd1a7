"""A steady client load through the proxies, behaving like a load balancer (tests and benches).

It polls every host's proxy ``/health`` (which answers 503 while a rollout has the host out of
rotation), sends chat completions round-robin to the hosts in rotation only, and counts what
came back. That is how production traffic meets a rolling upgrade: the balancer stops sending
to a drained host, and in-flight requests finish before the engine stops.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


TIMED_OUT = -1
SLOW_OUT_AFTER_S = 10  # seconds of unanswered health checks before a host leaves the rotation


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    min_in_rotation: int | None = None
    by_host: dict[str, int] = field(default_factory=dict)
    rotation: list[str] = field(default_factory=list)   # "HH:MM:SS host in|out (why)"
    # for timelines (gpuserve_sandbox.timeline), seconds since the loop started:
    requests: list[tuple[float, str, int, float]] = field(default_factory=list)  # (t, host, status, latency s)
    moves: list[tuple[float, str, bool]] = field(default_factory=list)           # (t, host, now in rotation)


class LoadLoop:
    """``with LoadLoop(endpoints, key, model) as loop: ...; loop.stats``.

    ``endpoints``: host name -> (base URL of its proxy, CA file that signs its certificate).
    """

    def __init__(self, endpoints: dict[str, tuple[str, str]], api_key: str, model: str,
                 *, health_interval: float = 0.2, max_tokens: int = 8, workers: int = 2,
                 prompt: str = "Hello!"):
        self.endpoints = endpoints
        self.api_key = api_key
        self.model = model
        self.health_interval = health_interval
        self.max_tokens = max_tokens
        self.workers = workers
        self.prompt = prompt
        self.stats = LoadStats()
        self.t0 = time.monotonic()
        self._in_rotation: set[str] = set()
        self._checked: set[str] = set()   # hosts checked at least once
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._contexts = {name: ssl.create_default_context(cafile=ca) for name, (_, ca) in endpoints.items()}
        for ctx in self._contexts.values():
            ctx.check_hostname = False   # pinned to each host's own certificate instead of a name

    def _get(self, name: str, path: str, body: dict | None = None, timeout: float = 60) -> int:
        url, _ = self.endpoints[name]
        req = urllib.request.Request(
            url + path, data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._contexts[name]) as resp:
                resp.read()
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (TimeoutError, socket.timeout):
            return TIMED_OUT
        except urllib.error.URLError as exc:
            return TIMED_OUT if isinstance(exc.reason, (TimeoutError, socket.timeout)) else 0
        except OSError:
            return 0

    def _health(self, name: str) -> None:
        """One host's health check, on its own thread like a balancer's: a slow answer from one
        host never delays noticing that another was drained."""
        slow_since = None
        while not self._stop.is_set():
            status = self._get(name, "/health", timeout=2)
            now = time.monotonic()
            # an answer other than 200 (503 while drained) or a refused connection takes the host
            # out at once; a host that is merely slow to answer (4 hosts share 2 busy cores here)
            # goes out only when it has not answered for SLOW_OUT_AFTER_S
            slow_since = (slow_since or now) if status == TIMED_OUT else None
            with self._lock:
                was = name in self._in_rotation
                up = status == 200 or (status == TIMED_OUT and was
                                       and now - slow_since < SLOW_OUT_AFTER_S)
                if up:
                    self._in_rotation.add(name)
                else:
                    self._in_rotation.discard(name)
                if was != up:
                    self.stats.moves.append((now - self.t0, name, up))
                if was != up and self.stats.sent:
                    why = ("health 200" if up else
                           "no answer" if status == TIMED_OUT else f"health {status}")
                    self.stats.rotation.append(
                        f"{time.strftime('%H:%M:%S')} {name} {'in' if up else 'out'} ({why})")
                self._checked.add(name)
                if self.stats.sent and self._checked == set(self.endpoints):  # from the first request on
                    low = self.stats.min_in_rotation
                    count = len(self._in_rotation)
                    self.stats.min_in_rotation = count if low is None else min(low, count)
            self._stop.wait(self.health_interval)

    def _client(self, offset: int) -> None:
        i = offset
        while not self._stop.is_set():
            with self._lock:
                hosts = sorted(self._in_rotation)
            if not hosts:
                self._stop.wait(0.05)
                continue
            name = hosts[i % len(hosts)]
            i += 1
            start = time.monotonic()
            status = self._get(name, "/v1/chat/completions", {
                "model": self.model, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": self.prompt}]})
            end = time.monotonic()
            with self._lock:
                self.stats.requests.append((start - self.t0, name, status, end - start))
                self.stats.sent += 1
                self.stats.by_host[name] = self.stats.by_host.get(name, 0) + 1
                if status == 200:
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
                    self.stats.failures.append(f"{time.strftime('%H:%M:%S')} {name}: HTTP {status}")

    def wait_until_serving(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._in_rotation) == len(self.endpoints):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"not every host is in rotation after {timeout} s: {sorted(self._in_rotation)}")

    def __enter__(self) -> "LoadLoop":
        self.t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._health, args=(name,), daemon=True)
                         for name in self.endpoints]
        self._threads += [threading.Thread(target=self._client, args=(k,), daemon=True)
                          for k in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
