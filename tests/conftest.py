"""Shared fixtures. Integration tests run against real sandbox hosts (see README: Tests)."""

from __future__ import annotations

import os

import pytest

# pyinfra's CLI module monkey-patches the standard library with gevent when first imported
# (gpuserve plan/status import it). Patching a process that already runs threads (the tests'
# hub server) deadlocks on the import lock, so it happens here, before any thread exists.
import pyinfra_cli  # noqa: E402,F401

# Tests use their own sandbox instance so they never replace the hosts a developer is using
# (instance 0). Helpers working in parallel pick different ones.
TEST_INSTANCE = int(os.environ.get("GPUSERVE_TEST_INSTANCE", "99"))

# Who pyinfra logs in as (gpuserve_sandbox.inventory): the hosts' non-root user with sudo by
# default, as most fleets forbid root logins. A module that sets ``SANDBOX_LOGIN = "root"`` keeps
# root tested; GPUSERVE_TEST_LOGIN=root runs every other module as root too.
DEFAULT_TEST_LOGIN = os.environ.get("GPUSERVE_TEST_LOGIN", "")


@pytest.fixture(scope="session")
def sandbox():
    """The test instance, started from nothing: whatever an earlier run (or a developer's
    `gpuserve sandbox up --instance 99`) left of it is stopped and removed first, so no run can
    pass on an earlier run's state (gpuserve_sandbox.isolation)."""
    from gpuserve_sandbox.hosts import Sandbox
    from gpuserve_sandbox.isolation import reset_instance

    if os.geteuid() != 0:
        pytest.fail("integration tests build sandbox hosts and need root (or deselect: -m 'not sandbox')")
    box = Sandbox(TEST_INSTANCE)
    for line in reset_instance(box):
        print(f"\nsandbox: {line}")
    yield box
    box.down()


@pytest.fixture(scope="module")
def sandbox_hub(sandbox, tmp_path_factory):
    """The sandbox's hub on the test instance's bridge address (group_data/sandbox.py's
    hf_endpoint), serving the tiny model the sandbox pins. Publish more revisions into ``.root``.

    Module-scoped on purpose: a module that converges the weights layer must ask for it, and
    gets a hub of its own that stops when the module ends (see the guard below)."""
    from gpuserve_sandbox import network
    from gpuserve_sandbox.hub import (SANDBOX_PORT, SANDBOX_REPO, SANDBOX_SEED,
                                      publish_tiny_checkpoint, serve_in_thread)

    network.ensure_bridge(sandbox.instance)
    root = tmp_path_factory.mktemp("sandbox-hub")
    publish_tiny_checkpoint(root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=0)
    server = serve_in_thread(root, host=sandbox.bridge_ip, port=SANDBOX_PORT)
    yield server
    server.stop()


@pytest.fixture(scope="module", autouse=True)
def _integration_module_starts_clean(request):
    """The guard (issue: README's test command must pass on a fresh machine). Every integration
    module starts as if it ran alone on a fresh machine: the control node's checkpoint cache of
    the test instance is emptied, and nothing may answer on the instance's addresses that this
    module did not ask for. A module that converges the weights layer without requesting
    ``sandbox_hub`` therefore fails here the same way, whatever ran before it."""
    if "/integration/" not in str(request.path):
        yield
        return
    from gpuserve_sandbox.hosts import Sandbox
    from gpuserve_sandbox.isolation import empty_checkpoint_cache, foreign_listeners, session_ports

    box = Sandbox(TEST_INSTANCE)
    empty_checkpoint_cache(box)
    # the module's own fixtures are set up after this one: anything listening now is left over
    stray = foreign_listeners(box, allowed=session_ports())
    if stray:
        pytest.fail(f"{request.path.name}: before its fixtures started, something already listens on "
                    f"the test instance's addresses: {'; '.join(stray)}. A test must not pass on "
                    f"another module's (or an earlier run's) daemon: stop it, and request the "
                    f"fixture that starts what the test needs (sandbox_hub, make_hosts, ...).")
    yield


@pytest.fixture(scope="module", autouse=True)
def sandbox_login(request):
    """The login user of this module's pyinfra runs (and `gpuserve status`), as
    $GPUSERVE_SANDBOX_LOGIN for the module's duration: inventories/sandbox.py and the inventories
    tests write (gpuserve_sandbox.inventory.group) read it."""
    from gpuserve_sandbox.hosts import LOGIN_USER
    from gpuserve_sandbox.inventory import LOGINS

    user = getattr(request.module, "SANDBOX_LOGIN", None) or DEFAULT_TEST_LOGIN or LOGIN_USER
    if user not in LOGINS:
        pytest.fail(f"{request.path.name}: login {user!r}: use one of {', '.join(LOGINS)}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUSERVE_SANDBOX_LOGIN", user)
        yield user


@pytest.fixture(scope="module")
def make_hosts(sandbox):
    """Fresh sandbox hosts for one test module: make_hosts(["hopper_x8", "blackwell_x4"]).
    A "gateway" host gets smg's wheel set built first (once per machine), as the engine's is."""
    from gpuserve_sandbox.services import ensure_gateway_wheelhouse
    from gpuserve_sandbox.simgpu import HostSpec

    def make(specs: list[str]):
        if any(HostSpec.parse(s).profile == "gateway" for s in specs):
            ensure_gateway_wheelhouse()
        # the tests serve their own hub (sandbox_hub: byte counters, fault injection)
        return sandbox.up([HostSpec.parse(s) for s in specs], services=False)

    return make


@pytest.fixture(scope="session")
def sandbox_wheelhouse():
    """The engine's wheel set that sandbox converges install from (group_data/sandbox.py's
    ``wheelhouse``): built once per machine (about a minute, 922 MB) and kept across runs.
    torch 2.13.0+cpu comes from pip's configuration here; elsewhere set GPUSERVE_TORCH_INDEX
    (e.g. https://download.pytorch.org/whl/cpu)."""
    from gpuserve_sandbox.services import ensure_wheelhouse

    return ensure_wheelhouse()


@pytest.fixture
def pyinfra(sandbox, sandbox_wheelhouse):
    """pyinfra(inventory, deploy, *args) -> PyinfraRun against the test sandbox."""
    from gpuserve_sandbox.runner import run_pyinfra

    def go(inventory: str, deploy: str, *extra: str, **kw):
        return run_pyinfra(inventory, deploy, *extra, instance=sandbox.instance, **kw)

    return go


@pytest.fixture
def testinfra_host(sandbox):
    """testinfra_host(sandbox_host) -> a testinfra host over real SSH with strict known_hosts."""
    import testinfra

    def get(host):
        return testinfra.get_host(f"ssh://root@{host.ip}", ssh_config=str(sandbox.ssh_config))

    return get


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed sandbox test's report (its fixtures' setup included) also carries each host's
    failed units and systemd's notices: CI keeps only the report, and the hosts are gone after
    the run."""
    report = yield
    box = getattr(item, "funcargs", {}).get("sandbox")
    if report.failed and call.when in ("setup", "call") and box is not None:
        try:
            report.sections.append(("sandbox hosts: failed units, journal errors", box.journal_report()))
        except Exception as exc:  # a report must never fail the run
            report.sections.append(("sandbox hosts", f"could not be read: {exc}"))
    return report


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.sandbox)
