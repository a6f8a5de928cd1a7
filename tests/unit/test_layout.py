"""layout.py is the one source of host paths (issue 28).

Every string in gpuserve/ that starts with a host directory gpuserve writes into is in
gpuserve/layout.py, except the ones listed in PENDING, which are not gpuserve's (system
directories a setting may not name, a setting's default). A new path literal elsewhere fails
here: put it in layout.py and import it. Where a module still spells a path that removal.py takes from layout.py,
a test below holds the two equal.
"""

from __future__ import annotations

import ast
import posixpath
from pathlib import Path

import gpuserve
from gpuserve import engine, layout, removal, rollout

PACKAGE = Path(gpuserve.__file__).resolve().parent
PREFIXES = ("/etc/", "/opt/", "/var/", "/run/", "/srv/")

# module (relative to gpuserve/) -> the path literals it may still hold (the start of each string)
PENDING = {
    # not gpuserve's paths: the system directories a path setting may not name, a setting's default
    "values.py": {"/var/lib/dpkg", "/var/lib/apt"},
    "schema/keys.py": {"/var/lib/prometheus/metrics2"},
}


def path_literals(source: str) -> set[str]:
    """The host-path strings of a module (f-strings by their first constant part), not docstrings."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith(PREFIXES):
                found.add(first.value)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and node.value.startswith(PREFIXES)):
            found.add(node.value)
    return found


def test_host_paths_live_in_layout_py():
    strays = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "layout.py":
            continue
        extra = path_literals(path.read_text()) - PENDING.get(rel, set())
        if extra:
            strays[rel] = sorted(extra)
    assert not strays, f"host paths outside gpuserve/layout.py (move them there and import them): {strays}"


def test_the_guard_sees_a_path_literal():
    source = '"""/etc/doc"""\nX = "/etc/foo"\nY = f"/var/lib/{x}/z"\nZ = "etc/no"\n'
    assert path_literals(source) == {"/etc/foo", "/var/lib/"}


def test_what_removal_takes_from_layout_matches_the_modules_that_make_it():
    from gpuserve.layers import gpu_stack, monitoring as monitoring_layer, proxy, units, watchdog
    from gpuserve.operations import secrets as secrets_ops

    assert posixpath.dirname(rollout.LOCK_FILE) == layout.ROLLOUT_LOCK_DIR
    assert engine.LOG_DIR == layout.ENGINE_LOG_DIR
    assert (monitoring_layer.EXPORTERS_CONF, monitoring_layer.EXPORTERS_DIR) == (layout.EXPORTERS_CONF,
                                                                                 layout.EXPORTERS_DIR)
    assert proxy.DROPIN == layout.NGINX_DROPIN_PATH and proxy.conf_path("a") == removal.proxy_site("a")
    assert units.unit_path("a") == removal.unit_path("a") == "/etc/systemd/system/gpuserve-a.service"
    assert watchdog.UNIT == removal.WATCHDOG_TEMPLATE and gpu_stack.DOWNLOADS in removal.HOST_PATHS
    assert posixpath.dirname(secrets_ops.STAGING) == layout.ETC_DIR
