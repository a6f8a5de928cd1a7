"""One reboot path (issue 28): the converge's GPU-stack layer and every host move reboot a host
through gpuserve.rollout.rebooting.reboot, and nothing else in the product reboots a host."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuserve.operations import gpu_stack as gpu_ops
from gpuserve.rollout import pipeline, rebooting
from gpuserve.rollout.remote import MoveFailed

PACKAGE = Path(gpu_ops.__file__).resolve().parents[1]


def _reboots(path: Path) -> list[str]:
    """What in ``path`` reboots a host: pyinfra's server.reboot, or a command string that runs
    `reboot`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "reboot" and getattr(node.value, "id", "") == "server":
            found.append(f"server.reboot (line {node.lineno})")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "&& reboot" in node.value:
            found.append(f"{node.value!r} (line {node.lineno})")
    return found


def test_only_the_rebooting_module_reboots_a_host():
    found = {str(p.relative_to(PACKAGE)): r for p in sorted(PACKAGE.rglob("*.py")) if (r := _reboots(p))}
    assert found == {"rollout/rebooting.py": [f"{rebooting.REBOOT!r} (line {_line_of('REBOOT =')})"]}
    assert pipeline.reboot is rebooting.reboot


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(Path(rebooting.__file__).read_text().splitlines(), 1)
                if line.startswith(text))


class _Host:
    name = "gpu-1"

    def __init__(self):
        self.logged = []

    def log_styled(self, message, **_kwargs):
        self.logged.append(message)


@pytest.mark.parametrize("outcome", ["back", "not back"])
def test_the_converge_reboot_goes_through_the_one_path(monkeypatch, outcome):
    calls = []

    def reboot(h, delay_s, timeout_s, why):
        calls.append((h.name, delay_s, timeout_s, why))
        if outcome == "not back":
            raise MoveFailed(f"{h.name}: the host did not come back from its reboot ({why}) "
                             f"within reboot_timeout = {timeout_s} s")

    monkeypatch.setattr(rebooting, "reboot", reboot)
    h = _Host()
    ok = gpu_ops._reboot(None, h, 3, 600, "to load the NVIDIA driver")
    assert calls == [("gpu-1", 3, 600, "to load the NVIDIA driver")]
    assert ok is (outcome == "back")
    assert h.logged == ([] if ok else ["gpu-1: the host did not come back from its reboot (to load the "
                                        "NVIDIA driver) within reboot_timeout = 600 s"])
