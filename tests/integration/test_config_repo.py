"""A config repo of its own (docs/config-repo.md), converged on one sandbox host.

gpuserve is installed from a wheel of the current tree into a virtualenv of its own (not this
checkout, not editable). The config repo, in a temporary folder, holds only what a user's repo
holds: an inventory, group data (a hardware group, the sandbox's settings, and the fleet's own
overrides with a secrets reference relative to the repo), a secrets file and a deploy file of
one call that runs the packaged deploy. Its converge serves the real engine through the proxy
with the fleet's overrides and key; a second, run from another directory with pyinfra's
``--chdir``, changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest

from gpuserve import layout
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.runner import PyinfraRun

# a fresh converge builds the engine venv and loads the model: about 4.5 minutes here
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# group_data/lab.py of the config repo below
DEP, SERVED, PORT = "lab", "lab-chat", 8100
UNIT = layout.unit_name(DEP)

INVENTORY = '''"""The lab fleet: the sandbox's cpu hosts of instance $GPUSERVE_SANDBOX_INSTANCE."""

from gpuserve_sandbox.inventory import group

cpu = group("cpu")
sandbox = [name for name, _ in cpu]   # group_data/sandbox.py: what sandbox hosts need
'''
HARDWARE = '''"""Hosts without GPUs: the cpu recipe."""

gpu_model = "cpu"
gpu_count = 0
'''
FLEET = f'''"""What this fleet sets beyond gpuserve's defaults (the inventory's own group wins)."""

deployments = {{"{DEP}": {{}}}}
served_model_name = "{SERVED}"
serve_port = {PORT}
api_keys_file = "secrets/lab-api-keys"   # relative: to the directory pyinfra runs in
'''
DEPLOY = '''from gpuserve.deploys import include

include("serve")
'''


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtualenv holding gpuserve and the sandbox (its own distribution, sandbox/: the config
    repo's inventory uses its host list) from wheels of the current tree (tracked and untracked,
    not ignored files). The pinned dependencies come from this run's virtualenv as a plain path
    (a .pth line, whose own .pth files, the editable install among them, are not read), and the
    checkout is not on the path."""
    tmp = tmp_path_factory.mktemp("installed")
    src, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    # as users build it: pip's isolated build (setuptools, pyproject's build-system, from pip's
    # cache or the index: the one download here)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
          str(src), str(src / "sandbox"), "-w", str(dist)])
    wheels = [str(w) for w in sorted(dist.glob("*.whl"))]
    assert [Path(w).name.split("-")[0] for w in wheels] == ["gpuserve", "gpuserve_sandbox"], wheels
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-index", *wheels])
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout
    (Path(purelib.strip()) / "gpuserve-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.fixture(scope="module")
def config_repo(tmp_path_factory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("config-repo") / "fleet"
    files = {
        "inventories/lab.py": INVENTORY,
        "group_data/cpu.py": HARDWARE,
        # the sandbox's settings as this repository writes them (its mirror, wheelhouse, ...)
        "group_data/sandbox.py": (REPO / "group_data" / "sandbox.py").read_text(),
        "group_data/lab.py": FLEET,
        "deploys/serve.py": DEPLOY,
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    key = secrets.token_hex(24)
    (repo / "secrets").mkdir(mode=0o700)
    keys = repo / "secrets" / "lab-api-keys"
    keys.write_text(key + "\n")
    keys.chmod(0o600)
    return repo, key


@pytest.fixture(scope="module")
def host(make_hosts, sandbox_hub, sandbox_wheelhouse):
    return make_hosts(["cpu"])[0]


def _pyinfra(venv: Path, cwd: Path, *args: str) -> PyinfraRun:
    """pyinfra of the installed virtualenv, as a user types it in ``cwd``."""
    argv = [str(venv / "bin" / "python"), "-m", "pyinfra", "-y", *args]
    env = {**os.environ, "GPUSERVE_SANDBOX_INSTANCE": os.environ.get("GPUSERVE_TEST_INSTANCE", "99")}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    return PyinfraRun(list(args), proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    python = str(installed / "bin" / "python")
    where = json.loads(_run([python, "-c", "import json, sys, gpuserve, gpuserve.deploys, gpuserve_sandbox; "
                             "print(json.dumps([gpuserve.__file__, gpuserve.deploys.path('serve').as_posix(), "
                             "gpuserve_sandbox.__file__, sys.path]))"], cwd="/").stdout)
    *files, path = where
    for f in files:
        assert Path(f).is_relative_to(installed), f
    assert not any(p and Path(p).resolve().is_relative_to(REPO) and ".venv" not in p for p in path), path
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert _run([str(installed / "bin" / "gpuserve"), "--version"]).stdout.strip() == f"gpuserve, version {version}"


def test_converge_from_a_config_repo_serves_its_overrides(sandbox, host, installed, config_repo,
                                                          testinfra_host, tmp_path):
    repo, key = config_repo
    run = _pyinfra(installed, repo, "inventories/lab.py", "deploys/serve.py").check()
    assert run.errors == 0 and "readiness gate" in run.output
    t = testinfra_host(host)
    assert t.service(UNIT).is_running and t.service(UNIT).is_enabled
    listening = t.check_output("ss -Hltn")
    assert re.search(rf"127\.0\.0\.1:{PORT}\b", listening), listening   # serve_port of group_data/lab.py
    assert re.search(r"0\.0\.0\.0:8443\b", listening), listening          # proxy_port: the package's default
    status, body = fleet_view.proxy_request(sandbox, host, tmp_path, "/v1/models", key)
    assert status == 200, body
    assert [m["id"] for m in json.loads(body)["data"]] == [SERVED]
    status, body = fleet_view.chat(sandbox, host, tmp_path, key, SERVED)
    assert status == 200, body
    assert fleet_view.proxy_request(sandbox, host, tmp_path, "/v1/models", "wrong-key-" + key)[0] == 401


def test_a_second_converge_from_elsewhere_with_chdir_changes_nothing(host, installed, config_repo):
    repo, _ = config_repo
    second = _pyinfra(installed, repo.parent, "--chdir", str(repo), "inventories/lab.py",
                      "deploys/serve.py").check()
    assert second.changed == 0, second.output[-4000:]
