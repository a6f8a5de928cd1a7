"""Secret environment values, read on the control node at deploy time (never at plan time).

An ``api_keys_file`` holds API keys, one per line (blank lines and ``#`` comments ignored).
vLLM reads exactly ONE key from ``VLLM_API_KEY`` (a list only via ``--api-key``, i.e. argv,
which gpuserve never uses for secrets), so the file must hold exactly one key. The service
layer writes the result into the deployment's 0600 env file.
"""

from __future__ import annotations

from pathlib import Path

from gpuserve.errors import ConfigError, Problem
from gpuserve.recipes import ServeConfig


def read_api_keys(path: str | Path) -> list[str]:
    """The keys in an api_keys_file, in order."""
    keys = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    return keys


def secret_env(config: ServeConfig, base_dir: str | Path = ".") -> dict[str, str]:
    """``{"VLLM_API_KEY": <key>}`` for a deployment with an api_keys_file, else ``{}``.

    Relative paths are taken from ``base_dir`` (the directory gpuserve/pyinfra runs in).
    """
    return {name: _one_key(config, name, Path(base_dir, file))
            for name, file in config.secret_env.items()}


def _one_key(config: ServeConfig, name: str, path: Path) -> str:
    def fail(message: str) -> ConfigError:
        where = f"deployments.{config.deployment}.api_keys_file"
        return ConfigError([Problem(config.host, f"file {path}", where, message)])

    try:
        keys = read_api_keys(path)
    except OSError as error:
        raise fail(f"cannot read the key file: {error.strerror or error}") from error
    if len(keys) != 1:
        raise fail(
            f"holds {len(keys)} keys; {name} takes exactly one (vLLM reads a list only from "
            "--api-key, which would put keys in argv). Rotate by replacing the key, or "
            "authenticate several clients at the proxy in front"
        )
    if any(c.isspace() for c in keys[0]):
        raise fail("the key contains whitespace")
    return keys[0]
