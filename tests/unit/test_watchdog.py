"""The hang watchdog's decisions (gpuserve/files/gpuserve-watchdog, the program shipped to hosts)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys

import pytest

from gpuserve.monitoring import MonitorSettings

from .helpers import REPO, make_inventory, settings_of

PATH = REPO / "gpuserve/files/gpuserve-watchdog"


def load():
    loader = importlib.machinery.SourceFileLoader("gpuserve_watchdog_program", str(PATH))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module   # dataclasses look their module up
    loader.exec_module(module)
    return module


wd = load()
S = wd.Settings(stall_s=60, probe_timeout_s=30, max_restarts=2, window_s=3600)


def obs(now, active=2.0, tokens=100.0, **kw):
    base = dict(rollout_lock=False, unit_active=True, healthy=True, active_requests=active,
                tokens=tokens)
    base.update(kw)
    return wd.Observation(now, **base)


def run(state, observations, s=S):
    return [wd.decide(s, state, o) for o in observations]


def test_tokens_flowing_is_never_a_hang():
    state = wd.State()
    out = run(state, [obs(t, tokens=100 + t) for t in range(0, 600, 5)])
    assert {a for a, _ in out} == {"none"}


def test_idle_engine_without_tokens_is_not_a_hang():
    state = wd.State()
    out = run(state, [obs(t, active=0, tokens=100) for t in range(0, 600, 5)])
    assert {a for a, _ in out} == {"none"}


def test_requests_and_no_token_for_stall_s_restart_once_and_say_why():
    state = wd.State()
    out = run(state, [obs(t, tokens=100) for t in range(0, 65, 5)])
    actions = [a for a, _ in out]
    assert actions[:12] == ["none"] * 12          # 0..55 s: under watchdog_stall_s
    assert actions[12] == "restart"               # at 60 s
    assert "no generation token for 60 s" in out[12][1] and "2 request(s)" in out[12][1]
    assert state.restarts_total == 1


def test_after_a_restart_the_clock_starts_again_while_the_engine_loads():
    state = wd.State()
    run(state, [obs(t, tokens=100) for t in range(0, 65, 5)])
    loading = run(state, [obs(t, healthy=False, active=None, tokens=None) for t in range(65, 200, 5)])
    assert {a for a, _ in loading} == {"wait"}
    back = run(state, [obs(t, active=0, tokens=0) for t in range(200, 300, 5)])
    assert {a for a, _ in back} == {"none"}
    assert state.restarts_total == 1


def test_a_probe_timeout_restarts():
    state = wd.State()
    action, why = wd.decide(S, state, obs(10, tokens=5, probe_failed=True))
    assert action == "restart" and "within 30 s" in why


def test_a_slow_probe_on_a_busy_engine_that_generates_is_not_a_hang():
    state = wd.State()
    run(state, [obs(t, active=40, tokens=100 + 10 * t) for t in range(0, 40, 5)])
    action, why = wd.decide(S, state, obs(40, active=40, tokens=500, probe_failed=True))
    assert action == "none" and "busy, not hung" in why


def test_a_probe_timeout_on_an_idle_engine_with_no_tokens_restarts():
    """The API server hangs before the scheduler: nothing runs, nothing is generated."""
    state = wd.State()
    run(state, [obs(t, active=0, tokens=100) for t in range(0, 40, 5)])
    action, _ = wd.decide(S, state, obs(40, active=0, tokens=100, probe_failed=True))
    assert action == "restart"


def test_after_max_restarts_in_the_window_it_gives_up_and_stays_quiet():
    state = wd.State()
    t, actions = 0, []
    for _ in range(3):   # three hangs in a row, each stall_s long
        for _ in range(13):
            actions.append(wd.decide(S, state, obs(t, tokens=100))[0])
            t += 5
    assert actions.count("restart") == 2 and actions.count("give_up") == 1
    assert state.gave_up
    later = run(state, [obs(t + i, tokens=100) for i in range(0, 300, 5)])
    assert {a for a, _ in later} == {"none"}   # no restart loop once given up


def test_restarts_outside_the_window_do_not_count():
    state = wd.State(restarts=[0.0, 10.0], restarts_total=2)
    out = run(state, [obs(4000 + t, tokens=100) for t in range(0, 65, 5)])
    assert out[-1][0] == "restart" and not state.gave_up


def test_a_rollout_lock_holds_the_watchdog_and_resets_the_clock():
    state = wd.State()
    held = run(state, [obs(t, tokens=100, rollout_lock=True) for t in range(0, 600, 5)])
    assert {a for a, _ in held} == {"hold"} and state.restarts_total == 0
    after = run(state, [obs(600 + t, tokens=100) for t in range(0, 55, 5)])
    assert {a for a, _ in after} == {"none"}     # the stall counts from the lock's release


def test_report_only_when_disabled():
    s = wd.Settings(stall_s=60, enabled=False)
    state = wd.State()
    out = run(state, [obs(t, tokens=100) for t in range(0, 65, 5)], s)
    assert out[-1][0] == "report" and state.restarts_total == 0


def test_parse_metrics_reads_vllm_and_sglang_names():
    vllm = ('vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
            '# HELP vllm:generation_tokens_total x\n'
            'vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
            'vllm:num_requests_running_other 99\n')
    assert wd.parse_metrics(vllm) == (3.0, 1234.0)
    sglang = 'sglang:num_running_reqs{a="b"} 1\nsglang:num_queue_reqs 4\nsglang:generation_tokens_total 7\n'
    assert wd.parse_metrics(sglang) == (5.0, 7.0)
    assert wd.parse_metrics("") == (None, None)


def test_textfile_names_match_the_alert_rules():
    state = wd.State(restarts_total=3, gave_up=True)
    text = wd.textfile("minimax", "vllm-0.33.0-abc", state, 1000.0, ("/mnt/nvme", 5e9, 1e11), 2e9)
    assert 'gpuserve_release_info{deployment="minimax",release="vllm-0.33.0-abc"} 1' in text
    assert 'gpuserve_watchdog_restarts_total{deployment="minimax"} 3' in text
    assert 'gpuserve_watchdog_gave_up{deployment="minimax"} 1' in text
    from gpuserve import monitoring
    for name in (monitoring.RELEASE_INFO, monitoring.WATCHDOG_RESTARTS, monitoring.WATCHDOG_GAVE_UP,
                 monitoring.WATCHDOG_LAST_CHECK, monitoring.NVME_AVAIL, monitoring.NVME_ALERT,
                 monitoring.TLS_NOT_AFTER):
        assert f"\n{name}{{" in text


def test_the_layer_gives_each_deployment_its_settings(tmp_path):
    from gpuserve.layers.watchdog import watchdog_config
    keys = tmp_path / "keys"
    keys.write_text("client-key-0123456789abcdef\n")
    keys.chmod(0o600)
    s = settings_of(make_inventory(group_data={"watchdog_stall_s": 45, "proxy": True,
                                               "api_keys_file": str(keys)}))
    conf = watchdog_config(s, s.deployments[0])
    assert conf["stall_s"] == 45 and conf["unit"] == "gpuserve-minimax.service"
    assert conf["drain_flag"] == "/etc/nginx/gpuserve/minimax.drain"
    assert conf["lock_file"] == "/var/lib/gpuserve-rollout/lock"
    assert conf["nvme_alert_bytes"] == int(MonitorSettings().alert_nvme_free_gib * 2**30)
    assert "key" not in json.dumps(conf).lower().replace("secrets", "")   # a path, never a key


@pytest.mark.parametrize("bad", [{"watchdog": "yes"}, {"watchdog_max_restarts": -1}])
def test_bad_watchdog_settings_are_refused(bad):
    from .helpers import problems_of
    found = problems_of(make_inventory(group_data=bad))
    assert any(next(iter(bad)) in p for p in found)


def test_a_hanging_probe_fails_after_its_timeout_without_blocking_the_loop():
    """A server that accepts and never answers: poll() reports the failure once the probe
    overran, returns at once meanwhile, and a late result of the abandoned probe is dropped."""
    import socket
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    try:
        prober = wd.Prober()
        prober.start(f"http://127.0.0.1:{port}/v1/completions", 1.0, None, "m")
        t0 = time.monotonic()
        assert prober.poll(1.0) == (None, False)
        assert time.monotonic() - t0 < 0.5           # poll never waits for the probe
        deadline = time.monotonic() + 10
        seen = (None, False)
        while time.monotonic() < deadline and seen == (None, False):
            time.sleep(0.2)
            seen = prober.poll(1.0)
        assert seen[1] is True and seen[0] >= 1.0
        time.sleep(1.5)                              # the abandoned thread ends by now
        assert prober.poll(1.0) == (None, False)     # its late result does not count twice
    finally:
        server.close()


def test_a_failed_unit_systemd_gave_up_on_is_restarted_and_a_stopped_one_is_left_alone():
    """Issue 26 (2): after kill -9 of the engine core the watchdog only logged "the engine is not
    up" for 300 s. A failed unit (systemd past its start limit) is restarted, within
    max_restarts; a unit stopped on purpose (inactive, not failed) is not."""
    state = wd.State()
    stopped = run(state, [obs(t, unit_active=False, healthy=False, active=None, tokens=None)
                          for t in range(0, 300, 5)])
    assert {a for a, _ in stopped} == {"wait"}
    failed = run(state, [obs(t, unit_active=False, healthy=False, active=None, tokens=None,
                             unit_failed=True) for t in (300, 305, 310)])
    assert [a for a, _ in failed] == ["restart", "restart", "give_up"]   # max_restarts = 2
    assert "systemd does not restart it" in failed[0][1]
    held = wd.State()
    assert wd.decide(S, held, obs(0, unit_active=False, healthy=False, unit_failed=True,
                                  rollout_lock=True))[0] == "hold"
