"""Secret environment values, read on the control node at deploy time (never at plan time).

An ``api_keys_file`` holds API keys, one per line (blank lines and ``#`` comments ignored); an
``api_keys_command`` prints them (gpuserve.secret_sources).
vLLM reads exactly ONE key from ``VLLM_API_KEY`` (a list only via ``--api-key``, i.e. argv,
which gpuserve never uses for secrets), so the file must hold exactly one key. The service
layer writes the result into the deployment's 0600 env file.
"""

from __future__ import annotations

from pathlib import Path

from gpuserve import secret_sources
from gpuserve.errors import ConfigError, Problem
from gpuserve.recipes import ServeConfig


def read_api_keys(source: secret_sources.Source, base_dir: str | Path = ".") -> list[str]:
    """The keys in an api_keys_file (or printed by its api_keys_command), in order."""
    keys = []
    for line in secret_sources.read_text(source, base_dir).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    return keys


def secret_env(config: ServeConfig, base_dir: str | Path = ".") -> dict[str, str]:
    """``{"VLLM_API_KEY": <key>}`` for a deployment with an api_keys_file, else ``{}``.

    Relative paths are taken from ``base_dir`` (the directory gpuserve/pyinfra runs in).
    """
    return {name: _one_key(config, name, source, base_dir)
            for name, source in config.secret_env.items()}


def _one_key(config: ServeConfig, name: str, source: secret_sources.Source, base_dir: str | Path) -> str:
    command = isinstance(source, secret_sources.SecretCommand)
    def fail(message: str) -> ConfigError:
        where = f"deployments.{config.deployment}.{source.setting if command else 'api_keys_file'}"
        shown = str(source) if command else f"file {Path(base_dir, source)}"
        return ConfigError([Problem(config.host, shown, where, message)])

    try:
        keys = read_api_keys(source, base_dir)
    except secret_sources.SecretSourceError as error:
        raise fail(str(error)) from None
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
