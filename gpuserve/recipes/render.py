"""One deployment rendered: its flags resolved from recipe, model family, deployment keys and
serve_flags, with every check on the way, its environment and its GPU set."""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Any

from gpuserve import engine_pins
from gpuserve.errors import Problem
from gpuserve.hardware import GPU_MODELS
from gpuserve.recipes.flags import (
    ALWAYS_FLAGS, ALWAYS_RENDERED, DEPLOYMENT_FLAGS, FORBIDDEN_FLAGS, FP4_KV_VALUES, SECRET_FLAGS, _world_size,
    normalize_flag)
from gpuserve.recipes.table import RECIPES
from gpuserve.recipes.types import EFFORT_KWARG, model_family

if TYPE_CHECKING:  # only for annotations: config imports this package
    from gpuserve.config import DeploymentSettings, HostSettings

class _Render:
    """Resolves one deployment's flags, remembering where each came from."""

    def __init__(self, settings: HostSettings, dep: DeploymentSettings):
        self.s, self.d = settings, dep
        self.engine = settings.engine
        self.recipe = RECIPES[settings.recipe]
        self.flags: dict[str, Any] = {}
        self.origin: dict[str, tuple[str, str]] = {}  # flag -> (key path, source)
        self.problems: list[Problem] = []

    def known_flags(self) -> frozenset[str] | None:
        """The flags the host's exact engine pin parses (None: no list; the pin is refused)."""
        package, version = self.s.engine_package, self.s.engine_version
        pin = engine_pins.choose(package, version, self.s.engine_overlays)[0]
        return pin.flags if pin is not None else None

    def pin_checks(self) -> None:
        """Recipe flags the pinned parser lacks, and features newer than the pin."""
        for flag, message in engine_pins.flag_problems(self.s.engine_package, self.s.engine_version,
                                                       self.flags, self.s.engine_overlays):
            where = self.origin.get(flag, ("engine_version", self.s.source("engine_version")))
            if where[0] == "recipe" or where == self.s.recipe_origin:
                where = ("engine_version", self.s.source("engine_version"))
                message += f" (flag {flag} of recipe {self.recipe.name})"
            self.problem(where, message)

    def problem(self, where: tuple[str, str], message: str) -> None:
        key, source = where
        self.problems.append(Problem(self.s.host, source, key, message))

    def set(self, flag: str, value: Any, where: tuple[str, str]) -> None:
        self.flags[flag] = value
        self.origin[flag] = where

    def resolve(self) -> None:
        table = self.recipe.table(self.engine)
        assert table is not None  # check() reports a missing engine table before rendering
        for flag, value in table.flags.items():
            self.set(flag, value, self.s.recipe_origin)
        family = model_family(self.s.model_repo)
        for flag, value in family.required_flags[self.engine].items():
            if flag not in self.flags:
                self.set(flag, value, ("model_repo", self.s.source("model_repo")))
        self._deployment_level()
        self._serve_flags()
        for flag, value in family.required_flags[self.engine].items():
            if self.flags.get(flag) != value:
                now = "removed" if flag not in self.flags else f"{self.flags[flag]!r}"
                self.problem(
                    self.origin[flag],
                    f"{flag} must be {value} for {self.s.model_repo} ({family.why}); it is {now}",
                )

    def _deployment_level(self) -> None:
        names = DEPLOYMENT_FLAGS[self.engine]
        d = self.d
        values = {
            "serve_host": d.serve_host,
            "serve_port": d.serve_port,
            "served_model_name": d.served_model_name,
            "max_model_len": d.max_model_len,
            "max_num_seqs": d.max_num_seqs,
            "reasoning_effort": (
                {EFFORT_KWARG: d.reasoning_effort} if d.reasoning_effort is not None else None
            ),
        }
        for key in ALWAYS_RENDERED:
            self.set(names[key], values[key], d.origin(key))
        for flag, value in ALWAYS_FLAGS[self.engine].items():
            self.set(flag, value, ("(gpuserve)", "gpuserve default"))
        for key in ("max_model_len", "max_num_seqs", "reasoning_effort"):
            if values[key] is not None:
                self.set(names[key], values[key], d.origin(key))
        if "shutdown_timeout_s" in names:  # drain on SIGTERM (SGLang has no such flag)
            self.set(names["shutdown_timeout_s"], d.shutdown_timeout_s, d.origin("shutdown_timeout_s"))

    def _serve_flags(self) -> None:
        d, engine = self.d, self.engine
        path, source = d.origin("serve_flags")
        owner = {flag: key for key, flag in DEPLOYMENT_FLAGS[engine].items()}
        seen: dict[str, str] = {}
        for raw, value in d.serve_flags.items():
            flag = normalize_flag(raw)
            where = (f"{path}.{raw}", source)
            if flag in seen:
                self.problem(where, f"flag {flag} is given twice (as {seen[flag]!r} and {raw!r})")
                continue
            seen[flag] = raw
            if flag in SECRET_FLAGS:
                self.problem(where, f"secrets given inline: --{flag} puts keys in argv; put the "
                             "key in a file on the control node and set api_keys_file")
                continue
            if flag in FORBIDDEN_FLAGS:
                self.problem(where, f"{flag} cannot be set in serve_flags: {FORBIDDEN_FLAGS[flag]}")
                continue
            known = self.known_flags()
            if known is not None and flag not in known:
                close = difflib.get_close_matches(flag, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                pin = f"{self.s.engine_package}=={self.s.engine_version}"
                self.problem(where, f"unknown {engine} flag {flag!r} ({pin} has no such "
                             f"option){hint}")
                continue
            key = owner.get(flag)
            if key is not None and (key in ALWAYS_RENDERED or d.is_set(key)):
                self.problem(
                    where,
                    f"flag {flag} is given twice: set it with {key} "
                    f"({d.origin(key)[0]}), not in serve_flags",
                )
                continue
            if value is None:
                if flag not in self.flags:
                    self.problem(
                        where,
                        f"None removes a recipe flag, but {flag} is not in recipe "
                        f"{self.recipe.name} (nothing to remove)",
                    )
                else:
                    del self.flags[flag]
                    self.origin[flag] = where
                continue
            if value is False:
                self.problem(
                    where,
                    f"false is ambiguous for {flag}: use None to remove a recipe flag, or the "
                    f"negative flag (e.g. 'no-{flag}': True) to turn a default off",
                )
                continue
            self.set(flag, value, where)

    def hardware_checks(self, gpu_offset: int) -> tuple[int, ...]:
        """NVFP4 KV cache and GPU counts; returns the GPU indices this deployment uses."""
        s, recipe = self.s, self.recipe
        platform = s.hardware.gpu_model if recipe.uses_gpus else "cpu"
        fp4_ok = GPU_MODELS[platform].nvfp4_kv_cache
        indexer = self.flags.get("attention-config")
        fp4_uses = [
            ("kv-cache-dtype", self.flags.get("kv-cache-dtype")),
            ("attention-config", indexer.get("indexer_kv_dtype") if isinstance(indexer, dict) else None),
        ]
        for flag, value in fp4_uses:
            if value in FP4_KV_VALUES and not fp4_ok:
                self.problem(
                    self.origin[flag],
                    f"{flag} puts the KV cache in NVFP4 ({value}), which only Blackwell "
                    f"(B200/GB200) serves; this deployment runs on {platform}. Use fp8 "
                    "(as the Hopper and AMD recipes do)",
                )
        if not recipe.uses_gpus:
            return ()
        world = _world_size(self.engine, self.flags)
        tp_flag = "tensor-parallel-size" if self.engine == "vllm" else "tp-size"
        tp = self.flags.get(tp_flag, 1)
        count = s.hardware.gpu_count
        where = self.origin.get(tp_flag, s.recipe_origin)
        if world > count or count % tp:
            self.problem(
                where,
                f"{tp_flag} {tp} (world size {world}) does not fit gpu_count {count} "
                f"(from {s.source('gpu_count')}): the parallel size must not exceed the "
                "host's GPUs and the tensor-parallel size must divide their number",
            )
            return ()
        if gpu_offset + world > count:
            self.problem(
                (f"deployments.{self.d.name}", self.s.source("deployments")),
                f"the deployments need {gpu_offset + world} GPUs together, the host has "
                f"{count} (from {s.source('gpu_count')})",
            )
            return ()
        return tuple(range(gpu_offset, gpu_offset + world))

    def memory_check(self, world: int) -> None:
        s, recipe = self.s, self.recipe
        per_gpu = s.hardware.gpu_memory_gib
        if not recipe.uses_gpus or per_gpu is None or recipe.min_vram_gb is None:
            return
        total_gb = per_gpu * world * 1.073741824
        if total_gb < recipe.min_vram_gb:
            self.problem(
                ("gpu_memory_gib", s.source("gpu_memory_gib")),
                f"{world} GPUs x {per_gpu:g} GiB = {total_gb:.0f} GB, below the "
                f"{recipe.min_vram_gb} GB recipe {recipe.name} needs for weights and KV cache",
            )

    def env(self, gpus: tuple[int, ...]) -> dict[str, str]:
        s = self.s
        env: dict[str, str] = {}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        env.update(self.recipe.table(self.engine).env)
        if s.model_source == "modelscope":
            env["VLLM_USE_MODELSCOPE" if self.engine == "vllm" else "SGLANG_USE_MODELSCOPE"] = (
                "True" if self.engine == "vllm" else "true"
            )
        if s.hf_endpoint and s.model_source == "huggingface":
            env["HF_ENDPOINT"] = s.hf_endpoint
        env.update({k: str(v) for k, v in self.d.serve_env.items()})
        return env



def _rocm_gpu_set(r: _Render, dep: DeploymentSettings, cuda: str) -> tuple[str, str]:
    """On ROCm: the host's GPUs a deployment runs on, and the serve_env name that picks them.
    ROCR_VISIBLE_DEVICES picks among the host's GPUs first; HIP numbers what it leaves from 0,
    and reads CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES alike (vLLM refuses to start when the
    two differ: vllm/platforms/rocm.py, _sync_hip_cuda_env_vars)."""
    path, source = dep.origin("serve_env")
    hip = dep.serve_env.get("HIP_VISIBLE_DEVICES")
    if hip is not None and str(hip) != cuda:
        r.problem((f"{path}.HIP_VISIBLE_DEVICES", source),
                  f"{str(hip)!r} differs from CUDA_VISIBLE_DEVICES {cuda!r} (the deployment's "
                  "GPUs), and vLLM refuses to start when they differ; on ROCm they mean the same: "
                  "pick the GPUs with CUDA_VISIBLE_DEVICES only")
    rocr = dep.serve_env.get("ROCR_VISIBLE_DEVICES")
    if rocr is None:
        return cuda, "CUDA_VISIBLE_DEVICES"
    left = [g.strip() for g in str(rocr).split(",") if g.strip()]
    picked = [g.strip() for g in cuda.split(",") if g.strip()]
    beyond = [g for g in picked if g.isdigit() and int(g) >= len(left)]
    if beyond:
        r.problem((f"{path}.ROCR_VISIBLE_DEVICES", source),
                  f"leaves {len(left)} GPU{'s' if len(left) != 1 else ''} visible ({str(rocr)!r}), "
                  f"and CUDA_VISIBLE_DEVICES {cuda!r} picks GPU {', '.join(beyond)} of them "
                  "(counted from 0)")
    # the host's GPUs the deployment runs on first; every GPU it leaves visible is the
    # deployment's too (checked to exist, and not to serve another deployment)
    physical = [left[int(g)] if g.isdigit() else g for g in picked if g not in beyond]
    return ",".join(dict.fromkeys(physical + left)), "ROCR_VISIBLE_DEVICES"


def _gpu_set_checks(r: _Render, dep: DeploymentSettings, visible: str, var: str,
                    taken: dict[str, str]) -> None:
    """``visible`` (from serve_env's ``var``, or gpuserve's own) names GPUs the host has, and
    no GPU serves two deployments."""
    given = var in dep.serve_env
    where = ((f"{dep.origin('serve_env')[0]}.{var}", dep.origin("serve_env")[1])
             if given else (f"deployments.{dep.name}", r.s.source("deployments")))
    count = r.s.hardware.gpu_count
    for gpu in (g.strip() for g in visible.split(",") if g.strip()):
        if gpu.isdigit() and int(gpu) >= count:
            r.problem(where, f"GPU {gpu} does not exist: the host has gpu_count {count} (GPUs 0-"
                      f"{count - 1}, from {r.s.source('gpu_count')})")
        elif not gpu.isdigit() and not re.fullmatch(r"(GPU|MIG)-[0-9A-Fa-f-]+(/\d+/\d+)?", gpu):
            r.problem(where, f"{gpu!r} is not a GPU index or a GPU-/MIG- UUID")
        elif gpu in taken:
            r.problem(where, f"GPU {gpu} is already used by deployment {taken[gpu]!r}; give each "
                      "deployment its own GPUs")
        else:
            taken[gpu] = dep.name
