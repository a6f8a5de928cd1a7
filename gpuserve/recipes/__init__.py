"""Hardware recipes: a host's settings + one deployment -> the exact serve configuration.

Pure: no I/O, no pyinfra. ``render(settings)`` returns every deployment's ``ServeConfig`` and the
problems found. Validation calls it once per host and keeps the configs in the validated
``HostSettings.serve_configs``; nothing else renders.

Where each flag comes from, in the order it appears in the rendered config:
    1. the recipe table for the host's hardware (seed commands, token for token; see
       docs/recipes.md for the source of every flag)
    2. flags the model family requires (MiniMax M3: block size 128), when the recipe lacks them
    3. deployment-level settings: host, port, served model name, generation config, default
       reasoning effort, max model len / num seqs
    4. ``serve_flags``: replaces a flag in place, adds a new one at the end, ``None`` removes one

A package, one concern a module (gpuserve/__init__.py's ``recipes/`` section lists them); every
name recipes.py had is importable from ``gpuserve.recipes`` as before the split (issue 28).
``render`` lives here and looks ``_Render`` up in this module, so that a test that replaces it
here (``monkeypatch.setattr(recipes, "_Render", ...)``) replaces it for ``render``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuserve.errors import Problem

# every name recipes.py had, importable from gpuserve.recipes as before the split (issue 28), and
# what render calls
from gpuserve.recipes.types import (  # noqa: F401 - re-exported
    EFFORT_KWARG, EngineTable, GENERIC, MINIMAX_M3, MODEL_FAMILIES, ModelFamily, REASONING_EFFORTS, Recipe,
    _frozen, model_family)
from gpuserve.recipes.table import (  # noqa: F401 - re-exported
    RECIPES, RECIPE_FOR_HARDWARE, SEED, VLLM_M31_RECIPE, _DSPARK_AMD, _DSPARK_NVIDIA, derive_recipe)
from gpuserve.recipes.flags import (  # noqa: F401 - re-exported
    ALWAYS_FLAGS, ALWAYS_RENDERED, DEPLOYMENT_FLAGS, FORBIDDEN_FLAGS, FP4_KV_VALUES, SECRET_ENV,
    SECRET_FLAGS, ServeConfig, _world_size, flag_tokens, normalize_flag)
from gpuserve.recipes.render import (  # noqa: F401 - re-exported
    _Render, _gpu_set_checks, _rocm_gpu_set)
from gpuserve.recipes.checks import (  # noqa: F401 - re-exported
    _host_problems, _pin_problems)

if TYPE_CHECKING:  # only for annotations: config imports this package
    from gpuserve.config import HostSettings


def render(settings: HostSettings) -> tuple[dict[str, ServeConfig], list[Problem]]:
    """Every deployment of a host, rendered once, by name, and every problem rendering hit (the
    configs of a host with problems are not to be served). Validation (gpuserve.config) calls
    it once per host and keeps the configs in ``HostSettings.serve_configs``: every reader
    (releases, units, the gate, ``gpuserve plan``) reads them there. A deployment's GPUs depend
    on the deployments before it, so a host renders whole."""
    problems = _host_problems(settings)
    if problems:
        return {}, problems
    problems = _pin_problems(settings)
    configs: dict[str, ServeConfig] = {}
    offset = 0
    taken: dict[str, str] = {}  # GPU -> the deployment that uses it
    for dep in settings.deployments:
        r = _Render(settings, dep)
        r.resolve()
        r.pin_checks()
        gpus = r.hardware_checks(offset)
        offset += len(gpus)
        r.memory_check(len(gpus))
        env = r.env(gpus)
        if "CUDA_VISIBLE_DEVICES" in dep.serve_env and gpus:
            given = [g for g in str(dep.serve_env["CUDA_VISIBLE_DEVICES"]).split(",") if g]
            if len(given) != len(gpus):
                path, source = dep.origin("serve_env")
                r.problem(
                    (f"{path}.CUDA_VISIBLE_DEVICES", source),
                    f"lists {len(given)} GPUs, the deployment's parallel size is {len(gpus)}",
                )
        if gpus and r.recipe.rocm:
            _gpu_set_checks(r, dep, *_rocm_gpu_set(r, dep, env.get("CUDA_VISIBLE_DEVICES", "")),
                            taken)
        elif gpus:
            _gpu_set_checks(r, dep, env.get("CUDA_VISIBLE_DEVICES", ""), "CUDA_VISIBLE_DEVICES", taken)
        problems += r.problems
        secret = {}
        if dep.api_keys_file and settings.engine in SECRET_ENV:
            secret[SECRET_ENV[settings.engine]] = dep.api_keys_file
        configs[dep.name] = ServeConfig(
            host=settings.host,
            deployment=dep.name,
            recipe=settings.recipe,
            engine=settings.engine,
            model=settings.model_repo,
            config=_frozen(r.flags),
            env=_frozen(env),
            secret_env=_frozen(secret),
            gpus=gpus,
            package=settings.engine_package,
        )
    return configs, problems
