"""dev/gpu-smoke.sh's recording and parser steps, with a fake nvidia-smi (no GPU here).

The fake prints the H200 x8 fixture for the fact's own queries; the script must record what the
facts' commands print, parse it with the project's parsers and say what it saw. The CUDA check
runs for real: where the machine has no libcuda.so.1 it must report that, and the smoke NOT OK.
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

from .helpers import FIXTURES, REPO

FAKE = r"""#!/bin/sh
# fake nvidia-smi: the fixture for gpuserve's queries
case "$*" in
  *nounits*) sed -e 's/ MiB//' -e 's/, GPU-[^,]*$//' "$FIXTURE" ;;
  *--query-gpu*) cat "$FIXTURE" ;;
  -q) echo "==============NVSMI LOG==============" ;;
  *) echo "fake nvidia-smi" ;;
esac
"""


def test_smoke_records_the_fact_outputs_and_parses_them(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    fixture = FIXTURES / "gpus" / "nvidia_smi_h200_x8.csv"
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FIXTURE": str(fixture),
           "PYTHON": sys.executable, "SMOKE_TIMEOUT": "60"}
    done = subprocess.run(["bash", str(REPO / "dev" / "gpu-smoke.sh"), str(out)], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)
    print(done.stdout, done.stderr)
    assert "GPU fact: vendor=nvidia gpus=8 error=None" in done.stdout
    assert "hardware profile: 8x H200" in done.stdout
    assert fixture.read_text().splitlines()[0] in (out / "gpus_fact.txt").read_text()
    assert (out / "gpus_fact.command").read_text().count("--query-gpu=") == 1
    assert "nvidia_smi_gpus" in done.stdout and (out / "nvidia_smi_gpus.txt").is_file()
    assert "nvidia-smi fact: gpus=8 error=None" in done.stdout   # the GPU stack reads it alike
    if ctypes.util.find_library("cuda") is None:   # no driver library here: the check says so
        assert "CUDA check: count=None" in done.stdout
        assert "SMOKE NOT OK" in done.stdout
    assert done.returncode == 0
    assert Path(out / "nvidia-smi-q.txt").read_text().startswith("=====")
