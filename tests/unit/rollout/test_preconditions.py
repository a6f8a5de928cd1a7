"""Every precondition of a host move is a rule of gpuserve/rollout/preconditions.py (issue 28:
"the preconditions live in one place"): the rules written there since, and the rule that keeps
them there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpuserve.rollout import preconditions

PACKAGE = Path(preconditions.__file__).resolve().parents[1]
HOME = "rollout/preconditions.py"


def test_every_refusal_is_defined_in_the_preconditions_module():
    """A function that decides whether a move or a run may go on is named ``*_refusal(s)`` (or
    ``refused_*``); each is defined in the preconditions module, nowhere else."""
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.FunctionDef) and ("refusal" in node.name or node.name.startswith("refused"))
                    and rel != HOME):
                elsewhere.append(f"{rel}: {node.name}")
    assert elsewhere == []
    names = {n.name for n in ast.parse((PACKAGE / HOME).read_text()).body if isinstance(n, ast.FunctionDef)}
    # the table in the module's docstring names each rule it holds
    for name in names - {"bake_s", "monitors", "_judged"}:
        assert re.search(rf"\b{name}\b", preconditions.__doc__), f"{name} is not in preconditions' table"


def test_a_stack_move_is_refused_naming_each_problem():
    assert preconditions.stack_move_refusal("gpu-1", "NVIDIA 580.95.05", [], None, False, 9000, 4096) is None
    why = preconditions.stack_move_refusal("gpu-1", "NVIDIA 580.95.05", ["nvidia-driver 580.95.05 is not offered"],
                                           "the NVIDIA driver 580.95.05", False, 1000, 4096)
    assert why == ("gpu-1: GPU stack move to NVIDIA 580.95.05 refused before the host left rotation: "
                   "nvidia-driver 580.95.05 is not offered; the NVIDIA driver 580.95.05 needs a reboot and "
                   "this host may not be rebooted (reboot: never); 1000 MiB free under /var and /usr, "
                   "below the 4096 MiB a driver set needs (its packages and the DKMS build)")
    # a reboot that is allowed, and free space that could not be read, refuse nothing
    assert preconditions.stack_move_refusal("gpu-1", "x", [], "the driver", True, None, 4096) is None


def test_a_release_move_is_skipped_only_when_another_rollout_finished_it():
    assert preconditions.moved_already("r2", "r2", drained=False, active=True)
    assert not preconditions.moved_already("r1", "r2", drained=False, active=True)   # not moved
    assert not preconditions.moved_already("r2", "r2", drained=True, active=True)    # died before "in"
    assert not preconditions.moved_already("r2", "r2", drained=False, active=False)  # died before the gate
    assert not preconditions.moved_already(None, "r2", drained=False, active=True)
