"""Where the docs list what the code knows, the two agree (they disagreed before)."""

from __future__ import annotations

import re

from gpuserve.hardware import GPU_MODELS

from .helpers import REPO


def test_the_gpu_models_in_the_gpu_stack_doc_are_the_ones_the_code_knows():
    doc = (REPO / "docs/gpu-stack.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `gpu_model` |"))
    listed = re.search(r"`([A-Z0-9 ]+)`", row.split("|", 3)[3]).group(1).split()
    assert sorted(listed) == sorted(m for m in GPU_MODELS if m != "cpu")


def test_every_nvlink5_model_the_doc_names_is_one_the_code_knows():
    doc = (REPO / "docs/gpu-stack.md").read_text()
    named = re.search(r"NVLink 5 models: ([A-Z0-9, ]+)\)", doc).group(1).replace(",", " ").split()
    assert named and set(named) <= set(GPU_MODELS)
    assert all(GPU_MODELS[m].nvlink_gen == 5 for m in named)


def test_every_deployment_key_is_documented():
    from gpuserve.config import DEPLOYMENT_DEFAULTS, HOST_DEFAULTS

    doc = (REPO / "docs/configuration.md").read_text()
    missing = [k for k in [*HOST_DEFAULTS, *DEPLOYMENT_DEFAULTS] if f"`{k}`" not in doc]
    assert missing == []
