"""The import boundaries in pyproject.toml ([tool.importlinter]) hold: the product does not import
the sandbox, layers and facts do not import the command line, the product's modules import
each other without cycles, and the settings schema and recipe catalogue import only data modules;
and the layering (issue 28): nothing imports the deploy files, command line -> layers -> facts ->
pure modules with every module placed, and pure modules do not use pyinfra. Runs the real
import-linter over the installed packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 7 kept, 0 broken." in proc.stdout
