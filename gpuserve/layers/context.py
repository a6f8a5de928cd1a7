"""The validated settings of the host a deploy is running for.

The whole inventory is validated once per pyinfra run, when the first host asks, before any
operation is added: one bad value anywhere fails the run with every problem listed (host,
source, key), and no host is touched.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.context import ctx_state

from gpuserve.config import HostSettings, validate_inventory


def all_settings() -> dict[str, HostSettings]:
    """Every host's settings by name, validated once per run."""
    state = ctx_state.get()
    validated = getattr(state, "_gpuserve_settings", None)
    if validated is None:
        # raises ConfigError listing everything
        validated = validate_inventory(state.inventory, deploying=True)
        state._gpuserve_settings = validated
        for name, settings in validated.items():  # what `gpuserve plan` would warn about
            for warning in settings.warnings:
                logger.warning(f"{name}: {warning}")
    return validated


def host_settings() -> HostSettings:
    return all_settings()[host.name]
