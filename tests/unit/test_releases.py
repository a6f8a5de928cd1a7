import pytest

from gpuserve.releases import RELEASE_ID, Ledger, Release, config_digest

SHA_A = "a" * 40
SHA_B = "b" * 40


def make(sha=SHA_A, version="0.33.0", config="c1", **kw):
    return Release(
        deployment="minimax",
        engine={"name": "vllm", "package": "vllm", "version": version, "python": "3.12",
                "torch_backend": "cu129", "env_id": f"vllm-{version}-py3.12-cu129"},
        checkpoint={"repo": "MiniMaxAI/MiniMax-M3.1-Flash", "sha": sha, "path": f"/mnt/nvme/x/{sha}"},
        config_sha256=config_digest({"serve.yaml": config}),
        **kw,
    )


def test_release_id_is_readable_and_derived_from_content():
    r = make()
    assert r.id.startswith("vllm-0.33.0-aaaaaaaa-")
    assert RELEASE_ID.match(r.id)
    assert make().id == r.id                       # same pins -> same release: converging twice is a no-op
    assert make(sha=SHA_B).id != r.id
    assert make(version="0.33.1").id != r.id
    assert make(config="c2").id != r.id           # a changed flag is a new release
    assert make(gpu_stack={"nvidia_driver_version": "580.95.05"}).id != r.id


def test_release_json_round_trip_and_tamper_detection():
    r = make(gpu_stack={"nvidia_driver_version": "580.95.05"})
    assert Release.from_json(r.to_json()) == r
    tampered = r.to_json().replace(SHA_A, SHA_B)
    with pytest.raises(ValueError, match="hashes to"):
        Release.from_json(tampered)


def test_config_digest_ignores_order_but_not_content():
    assert config_digest({"a": "1", "b": "2"}) == config_digest({"b": "2", "a": "1"})
    assert config_digest({"a": "1"}) != config_digest({"a": "2"})


def test_switch_moves_current_to_previous():
    ledger = Ledger(("r1", "r2"), current="r1", previous=None)
    after = ledger.after_switch("r2")
    assert (after.current, after.previous) == ("r2", "r1")
    assert after.after_switch("r2") == after       # idempotent
    with pytest.raises(ValueError, match="not on the host"):
        ledger.after_switch("r9")


def test_retention_keeps_current_and_n_previous():
    ledger = Ledger(("r1", "r2", "r3", "r4"), current="r4", previous="r3")
    order = ["r1", "r2", "r3", "r4"]
    assert ledger.to_collect(1, order) == ["r1", "r2"]
    assert ledger.to_collect(2, order) == ["r1"]        # one more, the newest other
    assert ledger.to_collect(5, order) == []
    # a fresh host with no previous keeps the newest other as its rollback copy when N >= 1
    fresh = Ledger(("r1", "r2", "r3"), current="r3", previous=None)
    assert fresh.to_collect(1, ["r1", "r2", "r3"]) == ["r1"]


def test_unreferenced_envs_and_checkpoints():
    from gpuserve.releases import unreferenced

    def rel(env, sha):
        return Release("minimax", {"name": "vllm", "version": "1", "env": env},
                       {"repo": "o/m", "sha": sha, "path": f"/n/{sha}"}, "c")

    old, mid, new = rel("/e/1", SHA_A), rel("/e/2", SHA_A), rel("/e/2", SHA_B)
    # the old release's env goes; its checkpoint stays because a kept release still serves it
    assert unreferenced([old], [mid, new]) == (["/e/1"], [])
    assert unreferenced([old, mid], [new]) == (["/e/1"], [f"/n/{SHA_A}"])
    assert unreferenced([], [new]) == ([], [])
