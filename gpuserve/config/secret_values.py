"""Secrets never live in data: keys named like one, env names that hold one and values that look
like one are refused, as is an unknown key close to a known one (a typo would quietly serve the
default). A secret comes from a file on the control node, or from a command
(gpuserve.secret_sources, issue 29), whose checks are here."""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Mapping

from gpuserve import secret_sources
from gpuserve.config.sources import KEYS, _Checker, data_source
from gpuserve.values import key_command_problem

# Secrets never live in data: names that hold one, env names that do, values that look like one.
SECRET_KEYS = {"api_key", "api_keys", "vllm_api_key", "sglang_api_key", "admin_api_key",
               "hf_token", "huggingface_token", "modelscope_token"}
SECRET_ENV_NAME = re.compile(r"API_KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
SECRET_VALUE = re.compile(r"(sk-|hf_|ms-)[A-Za-z0-9_-]{16,}")
INLINE = "secrets given inline: put the key in a file on the control node and set api_keys_file"


def _scan_values(c: _Checker, value: Any, path: str, src: str) -> None:
    if isinstance(value, str) and SECRET_VALUE.search(value):
        c.problem(path, f"{INLINE} (this value looks like a key)", src)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _scan_values(c, v, f"{path}.{k}", src)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _scan_values(c, v, f"{path}[{i}]", src)


def _secret_command(c: _Checker, file_key: str, file: Any, command: Any, report: Callable[[str, str], None],
                    keys: bool) -> secret_sources.SecretCommand | None:
    """``file_key``'s command twin (gpuserve.secret_sources), checked; its problems go to
    ``report(key, message)``. A deploy runs it now (once per run) and, for ``keys``, checks the
    keys it prints as a key file's; ``gpuserve plan`` never runs it."""
    twin = secret_sources.SECRET_SETTINGS[file_key]
    if file is not None:
        report(twin, f"set {file_key} or {twin}, not both")
        return None
    why = secret_sources.command_problem(command)
    if why:
        report(twin, why)
        return None
    source = secret_sources.SecretCommand(tuple(command), twin)
    missing = secret_sources.program_missing(source.argv)
    if missing and c.deploying:
        report(twin, missing)
    elif missing:
        c.warnings.append(f"{twin}: {missing}; a deploy refuses to start without it")
    if missing or not c.deploying:
        return source
    if keys:
        why = key_command_problem(source)
    else:
        try:
            secret_sources.read_text(source)
            why = None
        except secret_sources.SecretSourceError as exc:
            why = str(exc)
    if why:
        report(twin, why)
    return source


def _unknown_keys(c: _Checker) -> None:
    for key in c.host.data.dict():
        if key in SECRET_KEYS:
            c.problem(key, INLINE, data_source(c.host, key))
        elif key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.8)
            if close:
                # a typo would silently serve the default instead of what was meant
                c.problem(key, f"unknown key {key!r}; did you mean {close[0]!r}? (every key: "
                          "docs/configuration.md)", data_source(c.host, key))
    for key in KEYS:
        value = c.host.data.get(key)
        if key not in ("serve_flags", "serve_env", "deployments") and value is not None:
            _scan_values(c, value, key, data_source(c.host, key))
