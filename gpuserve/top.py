"""``gpuserve top``: a live view of the fleet read from Prometheus (pure: queries, parsing, frames).

Per serving host and deployment of the inventory: the release it serves, whether its engine
answers, requests running and waiting, generated tokens/s, time to first token p50/p95, KV-cache
use, prefix-cache hit ratio and GPU health (DCGM). The command (gpuserve.cli ``top``) asks the
monitor host's Prometheus (127.0.0.1:9090 there) with ``batch_command`` over SSH, as the canary
bake does, or a Prometheus URL directly; this module builds the queries and draws the frame from
the answers, and ``loop`` redraws it in place like top(1).

The queries read the engines' own series (vLLM's and SGLang's names, gpuserve.monitoring), so
they need no recording rule, over ``window``: at least a minute and four scrapes (tokens/s: the
last two scrapes in it, ``irate``).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Mapping, Sequence

from gpuserve import monitoring as m

PROMETHEUS_URL = f"http://127.0.0.1:{m.PROMETHEUS_PORT}"   # on the monitor host
QUERY_TIMEOUT_S = 10
MARK = "--gpuserve-top--"
CLEAR = "\x1b[H\x1b[2J"       # cursor home, clear screen: the next frame replaces this one
INTERVAL_S = (1.0, 3600.0)   # --interval's bounds


def window(scrape_interval_s: int) -> str:
    """The rate and quantile window: a minute, and at least four scrapes."""
    return f"{max(60, 4 * scrape_interval_s)}s"


def queries(scrape_interval_s: int = 15) -> dict[str, str]:
    """PromQL by column. Per-engine series are kept by (host, deployment); GPU ones by host."""
    w = window(scrape_interval_s)
    by = f"by ({m.SCOPE})"
    dcgm = f'job="{m.DCGM_JOB}"'

    def quantile(q: float) -> str:
        return f"histogram_quantile({q}, sum by ({m.SCOPE}, le) (rate({m.names(m.TTFT, '_bucket')}[{w}])))"

    return {
        "release": m.RELEASE_INFO,
        "up": f'up{{job="{m.ENGINE_JOB}"}}',
        "gave_up": m.WATCHDOG_GAVE_UP,
        "running": f"sum {by} ({m.names(m.RUNNING)})",
        "waiting": f"sum {by} ({m.names(m.WAITING)})",
        # the last two scrapes: what the engines generate now, as top shows it
        "tokens": f"sum {by} (irate({m.names(m.GENERATION_TOKENS)}[{w}]))",
        "ttft_p50": quantile(0.5),
        "ttft_p95": quantile(0.95),
        "kv": f"max {by} ({m.names(m.KV_CACHE)})",
        "prefix": (f"sum {by} (rate({m.names(m.PREFIX_HITS)}[{w}])) / "
                   f"sum {by} (rate({m.names(m.PREFIX_QUERIES)}[{w}]) > 0)"),
        "gpus": f"count by (host) ({m.DCGM_XID}{{{dcgm}}})",
        "dcgm_up": f'min by (host) (up{{{dcgm}}})',
        "xid": f"max by (host) ({m.DCGM_XID}{{{dcgm}}})",
        "ecc": (f"sum by (host) (increase({{__name__=~\"{m.DCGM_UNCORRECTABLE_ROWS}|{m.DCGM_ECC_DBE}\","
                f"{dcgm}}}[1h]))"),
        "remap": f"max by (host) ({m.DCGM_ROW_REMAP_FAILURE}{{{dcgm}}})",
    }


# --- asking Prometheus ---------------------------------------------------------------------------

def batch_command(promql: Sequence[str], url: str | None = None) -> str:
    """One shell command that asks every query in turn, each answer followed by a MARK line (one
    SSH round trip per frame). A query curl cannot ask answers an error in Prometheus's shape."""
    url = url or PROMETHEUS_URL
    parts = []
    for q in promql:
        failed = json.dumps({"status": "error", "error": f"curl could not reach {url}"})
        parts.append(f"{{ curl -sS --max-time {QUERY_TIMEOUT_S} --get "
                     f"--data-urlencode {shlex.quote('query=' + q)} {shlex.quote(url + '/api/v1/query')}"
                     f" || printf %s {shlex.quote(failed)}; }}; printf '\\n%s\\n' {MARK}")
    return "; ".join(parts)


def split_batch(stdout: str, count: int) -> list[str]:
    # a connector's stdout may have lost its last newline (pyinfra joins the lines it read)
    parts = (stdout if stdout.endswith("\n") else stdout + "\n").split(f"\n{MARK}\n")
    answers, rest = parts[:-1], parts[-1]
    if rest.strip():
        raise ValueError(f"unexpected output after the last answer from Prometheus: {rest[-300:]}")
    if len(answers) != count:
        raise ValueError(f"expected {count} answers from Prometheus, got {len(answers)}: {stdout[-300:]}")
    return answers


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


def parse_vector(text: str) -> list[Sample]:
    """An instant query's answer; raises ValueError for an error answer."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"not an answer from Prometheus: {text[:200]!r}") from None
    if data.get("status") != "success":
        raise ValueError(f"Prometheus: {data.get('error', text[:200])}")
    result, kind = data["data"]["result"], data["data"]["resultType"]
    if kind == "scalar":
        return [Sample({}, float(result[1]))]
    return [Sample(r["metric"], float(r["value"][1])) for r in result]


Answers = Mapping[str, "list[Sample] | Exception"]


def ask_all(fetch: Callable[[list[str]], list[str]], qs: Mapping[str, str]) -> dict:
    """Each query's samples, or the exception that says why it has none."""
    texts = fetch(list(qs.values()))
    out: dict = {}
    for key, text in zip(qs, texts):
        try:
            out[key] = parse_vector(text)
        except ValueError as exc:
            out[key] = exc
    return out


# --- the frame -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    host: str
    deployment: str
    release: str
    engine: str
    running: str
    waiting: str
    tokens: str
    ttft_p50: str
    ttft_p95: str
    kv: str
    prefix: str
    gpu: str


HEADER = Row("HOST", "DEPLOYMENT", "RELEASE", "ENGINE", "RUN", "WAIT", "TOK/S", "TTFT50", "TTFT95",
             "KV", "PREFIX", "GPU")
RIGHT = {"running", "waiting", "tokens", "ttft_p50", "ttft_p95", "kv", "prefix"}


def _index(samples, keys: tuple[str, ...]) -> dict[tuple, Sample]:
    if isinstance(samples, Exception) or samples is None:
        return {}
    return {tuple(s.labels.get(k, "") for k in keys): s for s in samples}


def _number(v: float | None, fmt: str) -> str:
    return "-" if v is None or math.isnan(v) else fmt.format(v)


def _seconds(v: float | None) -> str:
    if v is None or math.isnan(v) or math.isinf(v):
        return "-"
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def _rate(v: float | None) -> str:
    return _number(v, "{:.1f}" if v is not None and abs(v) < 10 else "{:.0f}")


def gpu_health(host: str, a: Answers) -> str:
    """ok xN, or each fault DCGM shows; '-' where no DCGM exporter is scraped (CPU, AMD, dcgm off)."""
    def val(key):
        s = _index(a.get(key), ("host",)).get((host,))
        return None if s is None else s.value
    up, count = val("dcgm_up"), val("gpus")
    if up is None and count is None:
        return "-"
    if up == 0:
        return "DCGM DOWN"
    faults = []
    if (xid := val("xid")) and xid > 0:
        faults.append(f"XID {xid:.0f}")
    if (ecc := val("ecc")) and ecc > 0:
        faults.append("ECC uncorrectable")
    if (remap := val("remap")) and remap > 0:
        faults.append("row remap failed")
    return ", ".join(faults) if faults else f"ok x{count:.0f}" if count else "ok"


def rows(targets: Sequence[tuple[str, str]], a: Answers) -> list[Row]:
    """One row per (host, deployment) of the inventory, in its order."""
    key = ("host", "deployment")
    idx = {k: _index(a.get(k), key) for k in ("release", "up", "gave_up", "running", "waiting", "tokens",
                                              "ttft_p50", "ttft_p95", "kv", "prefix")}

    def v(k, t):
        s = idx[k].get(t)
        return None if s is None else s.value

    out = []
    for t in targets:
        rel = idx["release"].get(t)
        up = v("up", t)
        engine = "not scraped" if up is None else "up" if up == 1 else "DOWN"
        if v("gave_up", t) == 1:
            engine += ", watchdog gave up"
        kv, prefix = v("kv", t), v("prefix", t)
        out.append(Row(t[0], t[1], rel.labels.get("release", "?") if rel else "-", engine,
                       _number(v("running", t), "{:.0f}"), _number(v("waiting", t), "{:.0f}"),
                       _rate(v("tokens", t)), _seconds(v("ttft_p50", t)), _seconds(v("ttft_p95", t)),
                       _number(None if kv is None else kv * 100, "{:.0f}%"),
                       _number(None if prefix is None else prefix * 100, "{:.0f}%"),
                       gpu_health(t[0], a)))
    return out


def table(rs: Sequence[Row]) -> str:
    fields = list(Row.__dataclass_fields__)
    all_rows = [HEADER, *rs]
    widths = {f: max(len(getattr(r, f)) for r in all_rows) for f in fields}

    def cell(r, f):
        text = getattr(r, f)
        return text.rjust(widths[f]) if f in RIGHT else text.ljust(widths[f])
    return "\n".join("  ".join(cell(r, f) for f in fields).rstrip() for r in all_rows)


def frame(targets: Sequence[tuple[str, str]], a: Answers, *, source: str, now: datetime | None = None,
          interval: float | None = None) -> str:
    """The whole screen: a title, a fleet summary, the table, and any query that failed."""
    now = now or datetime.now(timezone.utc)
    rs = rows(targets, a)
    up = sum(r.engine.startswith("up") for r in rs)

    def total(key):   # over the rows shown, from the answers (not their rounded text)
        idx = _index(a.get(key), ("host", "deployment"))
        return sum(s.value for t in targets if (s := idx.get(tuple(t))) and not math.isnan(s.value))
    every = f", every {interval:g} s (Ctrl-C quits)" if interval else ""
    lines = [f"gpuserve top: {source}, {now:%Y-%m-%d %H:%M:%S} UTC{every}",
             f"engines up {up}/{len(rs)}, requests running {total('running'):.0f}, "
             f"waiting {total('waiting'):.0f}, tokens/s {total('tokens'):.1f}", "",
             table(rs)]
    failed = [f"  {k}: {v}" for k, v in a.items() if isinstance(v, Exception)]
    if failed:
        lines += ["", "queries that failed:", *failed]
    return "\n".join(lines) + "\n"


def loop(draw: Callable[[], str], write: Callable[[str], None], *, interval: float,
         iterations: int = 0, clear: bool = True, sleep: Callable[[float], None]) -> int:
    """Draw a frame, then again every ``interval`` s, each replacing the last on screen (when
    ``clear``); stops after ``iterations`` frames (0: until interrupted). Returns the frames drawn."""
    drawn = 0
    while True:
        text = draw()
        write((CLEAR if clear else "") + text)
        drawn += 1
        if iterations and drawn >= iterations:
            return drawn
        sleep(interval)
