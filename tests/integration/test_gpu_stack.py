"""The GPU stack layer end to end on sandbox hosts, from the stand-in vendor repositories.

One set of hosts for the module; the tests build on each other in order: converge, bump a
branch, refuse a reboot, repair a fabric manager drift, lose a GPU.
"""

import json

import pytest

from gpuserve.facts.nvidia import CUDA_CHECK

INVENTORY, DEPLOY = "inventories/sandbox.py", "deploys/gpu_stack.py"
NVIDIA_SET = {"nvidia-driver-pinning-580", "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-persistenced",
              "cuda-toolkit-13-0"}
FABRIC = {"nvidia-fabricmanager", "libnvidia-nscq"}
DRIVER_PACKAGES = ("nvidia-open", "nvidia-driver", "nvidia-kernel-open-dkms", "libcuda1", "nvidia-smi",
                   "nvidia-persistenced", "nvidia-fabricmanager", "libnvidia-nscq")


@pytest.fixture(scope="module")
def hosts(make_hosts):
    h = make_hosts(["hopper_x8", "blackwell_x4", "hopper_x8:no-nvswitch", "mi355x_x4"])
    return {x.spec: x for x in h}


def state(sandbox, host) -> dict:
    """What a host shows, in one SSH round trip."""
    script = r"""
import json, shlex, subprocess
CUDA = %r
def sh(c):
    return subprocess.run(c, shell=True, capture_output=True, text=True).stdout
versions = {}
for line in sh("dpkg-query -W -f='${db:Status-Abbrev}=${Package}=${Version}\n' 'nvidia*' 'libnvidia*' "
               "libcuda1 nvlsm 'cuda-toolkit*' rocm amdgpu-dkms 2>/dev/null").splitlines():
    status, name, version = line.split("=", 2)
    if status[:2] in ("ii", "hi"):
        versions[name] = version
print(json.dumps({
    "versions": versions,
    "held": sh("apt-mark showhold").split(),
    "upgrade": [l for l in sh("apt-get upgrade -s").splitlines() if l.startswith("Inst")],
    "loaded": sh("head -n1 /proc/driver/nvidia/version 2>/dev/null").split("  ")[1:2],
    "active": {u: sh("systemctl is-active " + u).strip() for u in ("nvidia-fabricmanager", "nvidia-persistenced")},
    "cuda": sh("python3 -c " + shlex.quote(CUDA) + " 2>&1").strip(),
    "groups": sh("id -nG gpuserve").split(),
}))
""" % CUDA_CHECK
    return json.loads(sandbox.ssh(host, f"python3 - <<'EOF'\n{script}\nEOF").stdout)


def test_converge_pins_holds_verifies_and_a_second_run_changes_nothing(sandbox, hosts, pyinfra):
    first = pyinfra(INVENTORY, DEPLOY, "--data", "reboot=allowed").check()
    assert first.changed > 0 and first.errors == 0
    second = pyinfra(INVENTORY, DEPLOY, "--data", "reboot=allowed").check()
    assert second.changed == 0, second.output[-4000:]

    for spec, host in hosts.items():
        s = state(sandbox, host)
        if spec == "mi355x_x4":
            assert s["versions"]["rocm"].startswith("7.2.0.") and "amdgpu-dkms" in s["versions"]
            assert {"rocm", "amdgpu-dkms"} <= set(s["held"])
            assert {"render", "video"} <= set(s["groups"])
            assert not any(v.startswith("nvidia") for v in s["versions"])
            continue
        # exactly the pinned driver, although the repository offers 580.105.08 in the same branch
        for pkg in DRIVER_PACKAGES:
            if pkg in s["versions"]:
                assert s["versions"][pkg] == "580.95.05-1", (spec, pkg)
        assert s["loaded"] == ["580.95.05"]
        assert s["upgrade"] == [], "apt upgrade would move the held stack"
        assert s["active"]["nvidia-persistenced"] == "active"
        assert s["cuda"] == f"count {8 if spec.startswith('hopper') else 4}"
        if spec == "hopper_x8:no-nvswitch":
            assert not FABRIC & set(s["versions"]) and s["active"]["nvidia-fabricmanager"] != "active"
            assert set(s["held"]) == NVIDIA_SET
        else:
            assert s["active"]["nvidia-fabricmanager"] == "active"
            want = NVIDIA_SET | FABRIC | ({"nvlsm"} if spec == "blackwell_x4" else set())
            assert set(s["held"]) == want
        assert ("nvlsm" in s["versions"]) == (spec == "blackwell_x4")
    assert sandbox.ssh(hosts["hopper_x8"], "cat /etc/modprobe.d/gpuserve-blacklist-nouveau.conf").stdout.count(
        "blacklist nouveau") == 1


def test_branch_bump_upgrades_and_holds_again(sandbox, hosts, pyinfra):
    host = hosts["hopper_x8"]
    args = ("--limit", host.name, "--data", "nvidia_driver_version=590.48.01")
    bump = pyinfra(INVENTORY, DEPLOY, *args).check()
    assert "held broken packages" not in bump.output and bump.changed > 0
    s = state(sandbox, host)
    assert s["versions"]["nvidia-open"] == "590.48.01-1" and s["versions"]["nvidia-fabricmanager"] == "590.48.01-1"
    assert "nvidia-driver-pinning-580" not in s["versions"]
    assert set(s["held"]) == (NVIDIA_SET - {"nvidia-driver-pinning-580"}) | {"nvidia-driver-pinning-590"} | FABRIC
    assert s["loaded"] == ["590.48.01"] and s["active"]["nvidia-fabricmanager"] == "active"
    assert s["cuda"] == "count 8"
    again = pyinfra(INVENTORY, DEPLOY, *args).check()
    assert again.changed == 0, again.output[-4000:]


@pytest.mark.faults
def test_a_needed_reboot_that_is_not_allowed_fails_the_host_clearly(sandbox, hosts, pyinfra):
    host = hosts["hopper_x8:no-nvswitch"]
    run = pyinfra(INVENTORY, DEPLOY, "--limit", host.name, "--data", "nvidia_driver_version=590.48.01",
                  "--data", "reboot=never")
    assert run.returncode != 0
    assert (f"{host.name}: a reboot is needed to load NVIDIA driver 590.48.01 (loaded now: 580.95.05)"
            in run.output)
    assert "reboot: allowed" in run.output and "verification failed" not in run.output
    s = state(sandbox, host)
    assert s["loaded"] == ["580.95.05"]                      # not rebooted
    assert s["versions"]["nvidia-open"] == "590.48.01-1"     # installed and held, waiting
    assert "nvidia-open" in s["held"]


@pytest.mark.faults
def test_fabric_manager_drift_is_refused_then_repaired_by_a_converge(sandbox, hosts, pyinfra):
    host = hosts["blackwell_x4"]
    drift = sandbox.ssh(host, "apt-get install -y -q --allow-change-held-packages --allow-downgrades "
                              "nvidia-fabricmanager=580.105.08-1 >/dev/null 2>&1; "
                              "systemctl restart nvidia-fabricmanager 2>&1; journalctl -o cat -u nvidia-fabricmanager "
                              "--no-pager", check=False)
    assert "don't match with driver version 580.95.05" in drift.stdout
    assert state(sandbox, host)["cuda"] == "error 802"        # nvidia-smi still lists the GPUs
    repaired = pyinfra(INVENTORY, DEPLOY, "--limit", host.name).check()
    assert repaired.changed > 0
    s = state(sandbox, host)
    assert s["versions"]["nvidia-fabricmanager"] == "580.95.05-1" and "nvidia-fabricmanager" in s["held"]
    assert s["active"]["nvidia-fabricmanager"] == "active" and s["cuda"] == "count 4"


@pytest.mark.faults
def test_a_missing_gpu_fails_the_converge_naming_host_and_gpu(sandbox, hosts, pyinfra):
    host = hosts["blackwell_x4"]
    sandbox.ssh(host, "python3 -c \"import json; p = '/etc/gpuserve-sim/hardware.json'; h = json.load(open(p)); "
                      "h['gpus'] = h['gpus'][:3]; json.dump(h, open(p, 'w'))\"")
    run = pyinfra(INVENTORY, DEPLOY, "--limit", host.name)
    assert run.returncode != 0
    assert f"{host.name}: GPU stack verification failed" in run.output
    assert ("gpu_count: declared 4 x GB200, nvidia-smi found 3 (1 x GB200 missing; "
            "the driver probed 0000:48:00.0 but nvidia-smi does not list it") in run.output
    assert "gpu_count: declared 4, CUDA (cuDeviceGetCount) sees 3" in run.output
