"""Canary bake: compare the canary hosts (new release) with the rest (old release) in Prometheus.

Pure: gpuserve.rollout.canary_bake asks a monitor host's Prometheus (127.0.0.1:9090 there) with
``query_command`` over the rollout's pyinfra connection and reads it with ``parse_response``.
deploys/upgrade.py moves the first ``canary_hosts`` hosts, waits ``canary_bake_s``, then runs
``bake_checks`` through ``run_checks``: the rollout goes on only when every check holds;
otherwise it rolls the canary back and prints ``format_breach`` of each.

Three checks, each over the bake window and joined on the release label that the watchdog
exports (``gpuserve_release_info{host, deployment, release}``):

- error ratio: the canary's share of 5xx responses, at most ``canary_error_ratio_max``;
- TTFT p95 and e2e p95: canary / rest at most ``canary_ttft_p95_ratio_max`` /
  ``canary_e2e_p95_ratio_max``; with no old-release traffic to compare with (every host moved, or
  none served) the canary is held to the SLO (``slo_ttft_p95_s``, ``slo_e2e_p95_s``).

A check without canary data (no request reached it during the bake) fails: nothing proves it.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from typing import Callable, Sequence

from gpuserve import monitoring
from gpuserve.monitoring import MonitorSettings

PROMETHEUS_URL = f"http://127.0.0.1:{monitoring.PROMETHEUS_PORT}"
QUERY_TIMEOUT_S = 20


@dataclass(frozen=True)
class Check:
    name: str
    query: str                  # the canary's value
    rest_query: str | None      # the old release's value (None: an absolute threshold)
    limit: float                # an absolute value, or a ratio to the rest
    relative: bool              # limit is canary / rest
    fallback: float | None = None   # the absolute limit when the rest has no data (the SLO)


@dataclass(frozen=True)
class Result:
    check: Check
    value: float | None
    rest: float | None
    threshold: float            # what the value was held to (absolute)
    ok: bool
    why: str


def _hosts_regex(hosts: Sequence[str]) -> str:
    return "|".join(h.replace(".", "\\\\.") for h in hosts)


def _selector(names: str, deployment: str, hosts: Sequence[str], canary: bool, extra: str = "") -> str:
    op = "=~" if canary else "!~"
    return (f'{{__name__=~"{names}",job="{monitoring.ENGINE_JOB}",deployment="{deployment}",'
            f'host{op}"{_hosts_regex(hosts)}"{extra}}}')


def _by_release(expr: str, release: str) -> str:
    """``expr`` kept only where the host's deployment serves ``release`` (the watchdog's info)."""
    return (f"{expr} * on (host, deployment) group_left (release) "
            f'{monitoring.RELEASE_INFO}{{release="{release}"}}')


def _window(m: MonitorSettings) -> str:
    return f"{max(m.canary_bake_s, 4 * m.scrape_interval_s)}s"


def error_ratio_query(deployment: str, hosts: Sequence[str], release: str, canary: bool,
                      window: str) -> str:
    total = _selector(monitoring.HTTP_REQUESTS, deployment, hosts, canary)
    errors = _selector(monitoring.HTTP_REQUESTS, deployment, hosts, canary, ',status="5xx"')
    # vLLM makes the 5xx series only at its first 5xx: a clean canary has none, which is 0
    return (f"(sum({_by_release(f'rate({errors}[{window}])', release)}) or vector(0)) / "
            f"sum({_by_release(f'rate({total}[{window}])', release)})")


def quantile_query(histogram: Sequence[str], deployment: str, hosts: Sequence[str], release: str,
                   canary: bool, window: str, q: float = 0.95) -> str:
    names = "|".join(h + "_bucket" for h in histogram)
    rate = f"rate({_selector(names, deployment, hosts, canary)}[{window}])"
    return f"histogram_quantile({q}, sum by (le) ({_by_release(rate, release)}))"


def bake_checks(m: MonitorSettings, deployment: str, canary_hosts: Sequence[str],
                new_release: str, old_release: str | None) -> list[Check]:
    """The checks of one deployment's bake (canary: ``canary_hosts`` on ``new_release``; rest:
    every other host still on ``old_release``)."""
    w = _window(m)
    old = old_release or new_release

    def rest(query: str) -> str | None:
        return query if old_release else None

    return [
        Check("error ratio (5xx share)",
              error_ratio_query(deployment, canary_hosts, new_release, True, w), None,
              m.canary_error_ratio_max, relative=False),
        Check("TTFT p95",
              quantile_query(monitoring.TTFT, deployment, canary_hosts, new_release, True, w),
              rest(quantile_query(monitoring.TTFT, deployment, canary_hosts, old, False, w)),
              m.canary_ttft_p95_ratio_max, relative=True, fallback=m.slo_ttft_p95_s),
        Check("e2e latency p95",
              quantile_query(monitoring.E2E, deployment, canary_hosts, new_release, True, w),
              rest(quantile_query(monitoring.E2E, deployment, canary_hosts, old, False, w)),
              m.canary_e2e_p95_ratio_max, relative=True, fallback=m.slo_e2e_p95_s),
    ]


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else value


def evaluate(check: Check, value: float | None, rest: float | None) -> Result:
    value, rest = _number(value), _number(rest)
    if not check.relative:
        threshold = check.limit
    elif rest is not None and rest > 0:
        threshold = rest * check.limit
    else:
        threshold = check.fallback if check.fallback is not None else math.inf
    if value is None:
        return Result(check, None, rest, threshold, False, "no data: no request reached the canary "
                      "during the bake (or Prometheus does not scrape it), so nothing shows it is good")
    if value > threshold:
        if check.relative and rest is not None and rest > 0:
            why = (f"{value:.4g} > {threshold:.4g} = {check.limit:g} x the old release's "
                   f"{rest:.4g}")
        elif check.relative:
            why = f"{value:.4g} > {threshold:.4g} (the SLO; no old-release data to compare with)"
        else:
            why = f"{value:.4g} > {threshold:.4g}"
        return Result(check, value, rest, threshold, False, why)
    return Result(check, value, rest, threshold, True, f"{value:.4g} <= {threshold:.4g}")


def run_checks(checks: Sequence[Check], ask: Callable[[str], float | None]) -> list[Result]:
    """Evaluate each check with ``ask`` (a PromQL query -> its single value, or None)."""
    return [evaluate(c, ask(c.query), ask(c.rest_query) if c.rest_query else None) for c in checks]


def breaches(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if not r.ok]


def format_breach(r: Result) -> str:
    value = "no data" if r.value is None else f"{r.value:.4g}"
    lines = [f"canary breach: {r.check.name}: value {value}, threshold {r.threshold:.4g}: {r.why}",
             f"  query: {r.check.query}"]
    if r.check.rest_query:
        rest = "no data" if r.rest is None else f"{r.rest:.4g}"
        lines.append(f"  compared with ({rest}): {r.check.rest_query}")
    return "\n".join(lines)


# --- asking Prometheus --------------------------------------------------------------------------

def query_command(promql: str) -> str:
    """The curl command a monitor host runs (Prometheus listens on its loopback only)."""
    return (f"curl -fsS --max-time {QUERY_TIMEOUT_S} --get "
            f"--data-urlencode {shlex.quote('query=' + promql)} {PROMETHEUS_URL}/api/v1/query")


def parse_response(text: str) -> float | None:
    """The single value of an instant query's answer; None when it has no sample. Raises
    ValueError for an error answer (a bad query is a bug, not a breach)."""
    data = json.loads(text)
    if data.get("status") != "success":
        raise ValueError(f"Prometheus refused the query: {data.get('error', text[:300])}")
    result = data["data"]["result"]
    kind = data["data"]["resultType"]
    if kind == "scalar":
        return float(result[1])
    if not result:
        return None
    if len(result) > 1:
        raise ValueError(f"the query returned {len(result)} series; a canary check needs one")
    return float(result[0]["value"][1])
