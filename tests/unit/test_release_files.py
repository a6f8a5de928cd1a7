"""Release files rendered on the control node, and the deployment state fact's parser."""

import yaml

from gpuserve import layout
from gpuserve.facts.deployment import parse_deployment_state
from gpuserve.releases import RELEASE_ID, Release
from gpuserve.release_files import RELEASE_DIR, env_file, probe_url, render_release

SHA = "c" * 40


def render(**overrides):
    args = dict(
        deployment="minimax",
        serve_config={"tensor-parallel-size": 8, "attention-config": {"indexer_kv_dtype": "fp8"},
                      "port": 8000},
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
        launch_argv=["/opt/gpuserve/envs/e/bin/vllm", "serve", "/m", "--config", f"{RELEASE_DIR}/serve.yaml"],
        serve_host="127.0.0.1", serve_port=8000,
        engine={"name": "vllm", "version": "0.33.0", "env": "/opt/gpuserve/envs/e"},
        checkpoint={"repo": "MiniMaxAI/MiniMax-M3.1-Flash", "sha": SHA, "path": f"/mnt/nvme/x/{SHA}"},
        gpu_stack={"vendor": "nvidia", "version": "580.95.05"},
    )
    args.update(overrides)
    return render_release(**args)


def test_release_files_and_id():
    r = render()
    assert RELEASE_ID.match(r.id) and r.id.startswith("vllm-0.33.0-cccccccc-")
    assert set(r.files) == {"serve.yaml", "env", "launch", "wait-ready", "release.json"}
    # JSON-valued flags stay mappings in the --config file: nothing to quote in ExecStart
    assert yaml.safe_load(r.files["serve.yaml"]) == {
        "tensor-parallel-size": 8, "attention-config": {"indexer_kv_dtype": "fp8"}, "port": 8000}
    rdir = layout.release_dir("minimax", r.id)
    assert r.files["launch"].splitlines()[-1] == (
        f"exec /opt/gpuserve/envs/e/bin/vllm serve /m --config {rdir}/serve.yaml")
    assert "http://127.0.0.1:8000/health" in r.files["wait-ready"]
    assert Release.from_json(r.files["release.json"]).id == r.id


def test_same_inputs_same_release_any_change_a_new_one():
    assert render().id == render().id
    assert render(serve_config={"tensor-parallel-size": 4}).id != render().id
    assert render(env={"X": "1"}).id != render().id
    assert render(serve_port=8001).id != render().id       # wait-ready changes with it
    assert render(gpu_stack={"vendor": "nvidia", "version": "590.48.01"}).id != render().id


def test_env_file_quotes_values_and_refuses_newlines():
    assert env_file({"A": 'say "hi"', "B": "back\\slash"}) == 'A="say \\"hi\\""\nB="back\\\\slash"\n'
    try:
        env_file({"A": "two\nlines"})
    except ValueError as exc:
        assert "A" in str(exc)
    else:
        raise AssertionError("a multi-line value must be refused")


def test_probe_url_reaches_a_wildcard_bind_on_loopback():
    assert probe_url("0.0.0.0", 8000, "/health") == "http://127.0.0.1:8000/health"
    assert probe_url("10.0.0.5", 9000, "") == "http://10.0.0.5:9000"
    assert probe_url("::1", 8000, "/x") == "http://[::1]:8000/x"


def test_deployment_state_parser():
    lines = [
        "release 1700000200 vllm-0.33.0-bbbbbbbb-2222222222",
        "release 1700000100 vllm-0.33.0-aaaaaaaa-1111111111",
        "current: releases/vllm-0.33.0-bbbbbbbb-2222222222",
        "previous: releases/vllm-0.33.0-aaaaaaaa-1111111111",
        "active: active",
        "enabled: enabled",
        "health: 200",
    ]
    st = parse_deployment_state(lines)
    assert st.releases == ("vllm-0.33.0-aaaaaaaa-1111111111", "vllm-0.33.0-bbbbbbbb-2222222222")
    assert st.current == "vllm-0.33.0-bbbbbbbb-2222222222"
    assert st.previous == "vllm-0.33.0-aaaaaaaa-1111111111"
    assert st.serving and st.enabled
    fresh = parse_deployment_state(["current: ", "previous: ", "active: ", "enabled: ", "health: 000"])
    assert fresh.current is None and fresh.releases == () and fresh.health == 0 and not fresh.serving
    starting = parse_deployment_state(["active: activating", "health: 000"])
    assert starting.active_state == "activating" and not starting.serving


def test_release_records_parser_skips_what_it_cannot_trust():
    from gpuserve.facts.deployment import parse_release_records

    good = render()
    other = render(serve_port=8001)
    lines = [f"== {good.id}", *good.files["release.json"].splitlines(),
             f"== {other.id}", *other.files["release.json"].replace(SHA, "d" * 40).splitlines(),
             "== vllm-broken", "{not json"]
    records = parse_release_records(lines)
    assert list(records) == [good.id]      # tampered content and unreadable JSON are left out


def test_a_drained_or_stopped_deployment_counts_as_interrupted():
    base = ["current: /etc/gpuserve/minimax/releases/r2", "previous: /etc/gpuserve/minimax/releases/r1",
            "active: active", "enabled: enabled"]
    assert not parse_deployment_state(base + ["drained: ", "health: 200"]).interrupted
    drained = parse_deployment_state(base + ["drained: yes", "health: 200"])
    assert drained.drained and drained.serving and drained.interrupted
    stopped = ["current: /etc/gpuserve/minimax/releases/r2", "active: inactive", "drained: ", "health: 000"]
    assert parse_deployment_state(stopped).interrupted
    # nothing installed yet is not an interrupted rollout
    assert not parse_deployment_state(["current: ", "active: ", "drained: ", "health: 000"]).interrupted
