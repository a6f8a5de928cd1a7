"""Where the docs list what the code knows, the two agree (they disagreed before)."""

from __future__ import annotations

import re

from gpuserve.hardware import GPU_MODELS

from .helpers import REPO


def test_the_gpu_models_in_the_configuration_doc_are_the_ones_the_code_knows():
    """gpu_model's row (generated from gpuserve.schema, which reads gpuserve.hardware)."""
    doc = (REPO / "docs/configuration.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `gpu_model` |"))
    listed = re.findall(r"`([A-Za-z0-9]+)`", row.split("|")[3])
    assert sorted(listed) == sorted(GPU_MODELS)


def test_every_nvlink5_model_the_doc_names_is_one_the_code_knows():
    doc = (REPO / "docs/gpu-stack.md").read_text()
    named = re.search(r"NVLink 5 models: ([A-Z0-9, ]+)\)", doc).group(1).replace(",", " ").split()
    assert named and set(named) <= set(GPU_MODELS)
    assert all(GPU_MODELS[m].nvlink_gen == 5 for m in named)


def test_every_key_is_documented():
    """Every key the validation knows (host, deployment, monitor, gateway and GPU stack)."""
    from gpuserve.config import KEYS

    doc = (REPO / "docs/configuration.md").read_text()
    missing = [k for k in sorted(KEYS) if f"| `{k}` |" not in doc]
    assert missing == []
