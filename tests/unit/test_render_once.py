"""One render per host (issue 11): validation renders each deployment's serve config once and keeps
it in the validated settings; the releases, the gate and `gpuserve plan` read the kept configs."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuserve import engine, plan, recipes
from gpuserve.config import validate_inventory
from gpuserve.rollout import gate
from gpuserve.release_files import desired_releases

from .helpers import make_inventory

ROOT = Path(__file__).resolve().parents[2]
TWO = {"deployments": {"a": {"serve_flags": {"tensor-parallel-size": 4}},
                       "b": {"serve_port": 8001, "serve_flags": {"tensor-parallel-size": 4}}}}


def test_validate_releases_gate_and_plan_render_each_deployment_once(monkeypatch):
    rendered: list[str] = []

    class Counting(recipes._Render):
        def __init__(self, settings, dep):
            rendered.append(dep.name)
            super().__init__(settings, dep)

    monkeypatch.setattr(recipes, "_Render", Counting)
    settings = validate_inventory(make_inventory(group_data=TWO))
    assert rendered == ["a", "b"]
    s = settings["h1"]

    releases = desired_releases(s, engine.spec_for(s))
    monkeypatch.setattr(gate, "shell", lambda h, command, timeout: (True, _Output("ok")))
    assert gate.gate(None, s, "b") == (True, "ok")
    for fmt in plan.FORMATS:
        assert plan.render_plan(settings, fmt)
    assert rendered == ["a", "b"]   # nothing after validation rendered again
    # and what they read is what validation rendered
    assert 'CUDA_VISIBLE_DEVICES="4,5,6,7"' in releases["b"].files["env"]
    assert s.serve_configs["b"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_only_validation_calls_the_renderer():
    """No module but gpuserve/config/__init__.py calls recipes.render (layers, deploys, plan, status)."""
    callers = []
    for path in [*(ROOT / "gpuserve").rglob("*.py"), *(ROOT / "deploys").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "render" and \
                    isinstance(node.value, ast.Name) and node.value.id == "recipes":
                callers.append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.ImportFrom) and node.module == "gpuserve.recipes" and \
                    any(a.name == "render" for a in node.names):
                callers.append(str(path.relative_to(ROOT)))
    assert callers == ["gpuserve/config/__init__.py"]


class _Output:
    def __init__(self, stderr: str):
        self.stderr = stderr
