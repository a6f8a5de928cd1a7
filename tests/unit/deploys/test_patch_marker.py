"""Every entry point that moves or restarts a serving host's engines refuses a host whose OS update
move did not finish (docs/patching.md, "An upgrade does not touch a host mid-patch")."""

import ast
from pathlib import Path

import pytest

from gpuserve import patch

DEPLOYS = Path(__file__).resolve().parents[3] / "deploys"


@pytest.mark.parametrize("deploy", ["serve.py", "upgrade.py", "rollback.py", "gpu_stack.py"])
def test_the_deploy_calls_the_refusal_before_anything_else_on_a_serving_host(deploy):
    tree = ast.parse((DEPLOYS / deploy).read_text())
    serving = [n for n in ast.walk(tree) if isinstance(n, ast.If)
               and ast.unparse(n.test) == "settings.serves"]
    assert serving, f"{deploy}: no `if settings.serves:` block"
    first = serving[0].body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
    assert ast.unparse(first.value.func) == "refuse_unfinished_patch", ast.unparse(first)


@pytest.mark.parametrize("kind", ["converge", "upgrade", "rollback", "GPU stack converge"])
def test_the_refusal_names_the_run_the_host_and_what_to_do(kind):
    assert patch.unfinished_patch_refusal(kind, "gpu-3", False) is None
    why = patch.unfinished_patch_refusal(kind, "gpu-3", True)
    assert why.startswith(f"{kind} refused: gpu-3: ") and "Run deploys/patch.py again" in why
    assert why.endswith(f"then run the {kind} again")
