"""The prod example's relative ``api_keys_file``, converged on one sandbox host, with the proxy
off and then on (issue 11).

group_data/prod.py names its key file relative to where pyinfra runs
(``api_keys_file = "secrets/prod-api-keys"``). With the proxy off, the service layer once read it
as ``secrets/secrets/prod-api-keys`` (c26c1b4): a converge of the documented example failed.

What the test takes from the example, and what it changes:
- group_data/prod.py is copied verbatim into a temporary working directory (so a change to the
  example is tested), with its ``api_keys_file`` holding a real 0600 key made by the test, and
  pyinfra run from that directory (nowhere else holds the path). Appended to the copy are the
  only two values the test sets: ``model_revision`` (the example's is a placeholder commit; the
  sandbox hub serves the sandbox's pin) and ``proxy`` (the example leaves it at its default,
  False; the second converge sets True).
- inventories/prod.py is not used: it names real hosts and hardware. The inventory here is also
  named prod.py, so its one sandbox host is in group ``prod`` and the example's group data beats
  the other groups as it does in production; that host is a ``cpu`` sandbox host with the
  sandbox's group data (group_data/sandbox.py, cpu.py, all.py: the tiny model, the wheelhouse,
  the hub), whose own api_keys_file and proxy the prod values beat.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.runner import PyinfraRun

# a fresh converge builds the engine venv and loads the model: minutes on 2 cores
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROD = REPO / "group_data" / "prod.py"
SERVED = "tiny-chat"          # group_data/sandbox.py's served_model_name (prod.py sets none)
ENGINE = "http://127.0.0.1:8000/v1/models"   # serve_host and serve_port: gpuserve's defaults

INVENTORY = '''"""One cpu sandbox host of instance $GPUSERVE_SANDBOX_INSTANCE, in group prod (this file's name)."""

from gpuserve_sandbox.inventory import group

cpu = group("cpu")
sandbox = [name for name, _ in cpu]   # group_data/sandbox.py: what sandbox hosts need
'''


def _prod_values() -> dict:
    return {k: v for k, v in runpy.run_path(str(PROD)).items() if not k.startswith("__")}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> tuple[Path, str]:
    """The directory pyinfra runs in, holding the example's key file at its relative path."""
    relative = _prod_values()["api_keys_file"]
    assert not Path(relative).is_absolute(), f"group_data/prod.py: api_keys_file {relative!r} is not relative"
    work = tmp_path_factory.mktemp("prod-example")
    (work / "inventories").mkdir()
    (work / "inventories" / "prod.py").write_text(INVENTORY)
    (work / "group_data").mkdir()
    for name in ("all.py", "cpu.py", "sandbox.py"):
        shutil.copy2(REPO / "group_data" / name, work / "group_data" / name)
    key = secrets.token_hex(24)
    keys = work / relative
    keys.parent.mkdir(parents=True, mode=0o700)
    keys.write_text(key + "\n")
    keys.chmod(0o600)
    return work, key


@pytest.fixture(scope="module")
def host(make_hosts, sandbox_hub, sandbox_wheelhouse):
    return make_hosts(["cpu"])[0]


def _converge(work: Path, *, proxy: bool) -> PyinfraRun:
    """``pyinfra -y inventories/prod.py <repo>/deploys/serve.py`` in ``work``, with the example's
    group data plus the test's two values."""
    sandbox_pin = runpy.run_path(str(REPO / "group_data" / "sandbox.py"))["model_revision"]
    (work / "group_data" / "prod.py").write_text(
        PROD.read_text()
        + "\n\n# tests/integration/test_prod_example.py: the sandbox hub's model, and the proxy\n"
        + f"model_revision = {sandbox_pin!r}\nproxy = {proxy!r}\n")
    args = ["-y", "inventories/prod.py", str(REPO / "deploys" / "serve.py")]
    env = {**os.environ, "GPUSERVE_SANDBOX_INSTANCE": os.environ.get("GPUSERVE_TEST_INSTANCE", "99")}
    t0 = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1800)
    return PyinfraRun(args, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)


def _engine_status(sandbox, host, key: str | None) -> str:
    """The HTTP status of the engine itself (on the host's loopback), the key sent on stdin so it
    is in no argv."""
    header = f"Authorization: Bearer {key}\n" if key else ""
    proc = subprocess.run([*sandbox.ssh_args(host), f"curl -s -o /dev/null -w '%{{http_code}}' -H @- {ENGINE}"],
                          input=header, capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout


def test_prod_values_reach_the_host_with_the_proxy_off(sandbox, host, workdir):
    work, key = workdir
    run = _converge(work, proxy=False).check()
    assert run.errors == 0 and "readiness gate" in run.output
    # the engine checks the example's key itself: no proxy in front
    assert _engine_status(sandbox, host, key) == "200"
    assert _engine_status(sandbox, host, None) == "401"
    assert _engine_status(sandbox, host, "wrong-" + key) == "401"
    listening = sandbox.ssh(host, "ss -Hltn").stdout
    assert re.search(r"127\.0\.0\.1:8000\b", listening) and ":8443" not in listening, listening


def test_prod_values_reach_the_host_with_the_proxy_on(sandbox, host, workdir, tmp_path):
    work, key = workdir
    run = _converge(work, proxy=True).check()
    assert run.errors == 0
    status, body = fleet_view.proxy_request(sandbox, host, tmp_path, "/v1/models", key)
    assert status == 200, body
    assert [m["id"] for m in json.loads(body)["data"]] == [SERVED]
    assert fleet_view.proxy_request(sandbox, host, tmp_path, "/v1/models")[0] == 401
    assert fleet_view.proxy_request(sandbox, host, tmp_path, "/v1/models", "wrong-" + key)[0] == 401
    # behind the proxy the engine still takes no request without its key
    assert _engine_status(sandbox, host, None) == "401"
