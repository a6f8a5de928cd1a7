"""The GPU stack's pure logic: settings, package sets, the held-set plan, reboot and verification."""

import pytest

from gpuserve import stack
from gpuserve.hardware import PROFILES
from gpuserve.facts.gpus import parse_amd_smi, parse_nvidia_smi
from gpuserve.stack import PackageSpec, StackConfigError

HOPPER = PROFILES["hopper_x8"].group_data()
BLACKWELL = PROFILES["blackwell_x4"].group_data()
MI355X = PROFILES["mi355x_x4"].group_data()


def settings(base=None, **data):
    return stack.settings_from({**(base or {}), **data})


def test_defaults_and_derived_values():
    s = settings(HOPPER)
    assert (s.vendor, s.branch, s.nvlink_gen, s.cuda_major) == ("nvidia", 580, 4, 13)
    assert s.driver_version == "580.95.05" and s.flavour == "open" and not s.reboot_allowed
    assert s.cuda_repo_url == "https://developer.download.nvidia.com/compute/cuda/repos"
    assert settings(BLACKWELL).nvlink_gen == 5
    assert settings(BLACKWELL, nvswitch=False).nvlink_gen == 0
    assert settings().vendor is None and settings(MI355X).vendor == "amd"
    assert settings(cuda_repo_url="http://mirror.internal/cuda/repos/").cuda_repo_url == "http://mirror.internal/cuda/repos"
    assert settings(reboot="allowed", reboot_delay="5").reboot_delay == 5   # --data gives strings


@pytest.mark.parametrize("data, key, words", [
    ({"gpu_model": "A100", "gpu_count": 8}, "gpu_model", "known: H100"),
    ({"gpu_model": "H200", "gpu_count": 0}, "gpu_count", "from 1 to 16"),
    ({"nvidia_driver_version": "580"}, "nvidia_driver_version", "exact driver version"),
    ({"nvidia_driver_version": "570.172.08"}, "nvidia_driver_version", "branch 570 predates"),
    ({"nvidia_driver_flavour": "closed"}, "nvidia_driver_flavour", "open, proprietary"),
    ({**BLACKWELL, "nvidia_driver_flavour": "proprietary"}, "nvidia_driver_flavour", "Blackwell"),
    ({"cuda_toolkit": "13.0"}, "cuda_toolkit", "like '13-0'"),
    ({"cuda_toolkit": "11-8"}, "cuda_toolkit", "like '13-0'"),
    ({"cuda_repo_url": "developer.download.nvidia.com"}, "cuda_repo_url", "is not an http(s) URL"),
    ({"rocm_version": "latest"}, "rocm_version", "ROCm release"),
    ({"reboot": "yes"}, "reboot", "never, allowed"),
    ({"dcgm": "True"}, "dcgm", "True or False"),
    ({"dcgm_version": "4.4"}, "dcgm_version", "exact DCGM release like '4.4.1'"),
    ({**MI355X, "nvswitch": True}, "nvswitch", "no NVSwitches"),
    ({"cuda_keyring_sha256": "abc"}, "cuda_keyring_sha256", "64 lowercase hex"),
])
def test_invalid_settings_name_the_key_and_what_is_allowed(data, key, words):
    with pytest.raises(StackConfigError) as err:
        stack.settings_from(data)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ") and words in str(err.value)


def test_os_and_architecture():
    assert stack.os_key({"ID": "debian", "VERSION_ID": "12"}) == "debian12"
    assert stack.os_key({"ID": "ubuntu", "VERSION_ID": "22.04"}) == "ubuntu2204"
    assert stack.os_key({"ID": "ubuntu", "VERSION_ID": "24.04"}) == "ubuntu2404"
    with pytest.raises(stack.StackError, match="this host runs debian 11"):
        stack.os_key({"ID": "debian", "VERSION_ID": "11"})
    assert stack.cuda_arch("amd64") == "x86_64" and stack.cuda_arch("arm64") == "sbsa"


def test_cuda_repository_is_the_one_cuda_keyring_writes():
    s = settings(HOPPER)
    assert stack.cuda_keyring_url(s, "debian12", "x86_64") == (
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb")
    assert stack.cuda_sources(s, "ubuntu2404", "sbsa") == (
        "/etc/apt/sources.list.d/cuda-ubuntu2404-sbsa.list",
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/ /\n")
    prefs = stack.nvidia_preferences(s)
    assert "Pin: version 580.95.05-*\nPin-Priority: 1001" in prefs and "*nvidia*" in prefs


def _names(specs):
    return [(p.name, p.version) for p in specs]


def test_nvidia_packages_follow_the_declared_hardware():
    v = "580.95.05"
    assert _names(stack.nvidia_packages(settings(HOPPER), "debian12")) == [
        ("nvidia-driver-pinning-580", None), ("nvidia-open", v), ("nvidia-kernel-open-dkms", v),
        ("nvidia-persistenced", v), ("nvidia-fabricmanager", v), ("libnvidia-nscq", v),
        ("cuda-toolkit-13-0", None)]
    blackwell = _names(stack.nvidia_packages(settings(BLACKWELL, dcgm=True), "debian12"))
    assert ("nvlsm", None) in blackwell
    # DCGM: core and the CUDA-major package at the exact DCGM release, the exporter with the set
    assert blackwell[-3:] == [("datacenter-gpu-manager-4-core", "4.4.1"),
                              ("datacenter-gpu-manager-4-cuda13", "4.4.1"), ("datacenter-gpu-manager-exporter", None)]
    assert _names(stack.nvidia_packages(settings(HOPPER, dcgm=True, dcgm_version="4.5.0"), "debian12"))[-2] == (
        "datacenter-gpu-manager-4-cuda13", "4.5.0")
    plain = [p.name for p in stack.nvidia_packages(settings(HOPPER, nvswitch=False, cuda_toolkit=None), "debian12")]
    assert not {"nvidia-fabricmanager", "libnvidia-nscq", "nvlsm"} & set(plain)
    assert not any(n.startswith("cuda-toolkit") for n in plain)
    proprietary = _names(stack.nvidia_packages(settings(HOPPER, nvidia_driver_flavour="proprietary"), "debian12"))
    assert ("cuda-drivers", v) in proprietary and ("nvidia-kernel-dkms", v) in proprietary
    assert stack.nvidia_units(settings(HOPPER, dcgm=True)) == [
        "nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "nvidia-dcgm-exporter"]


def test_ubuntu_names_carry_the_branch_until_590():
    names = [p.name for p in stack.nvidia_packages(settings(HOPPER), "ubuntu2204")]
    assert {"nvidia-dkms-580-open", "nvidia-fabricmanager-580", "nvidia-compute-utils-580"} <= set(names)
    names = [p.name for p in stack.nvidia_packages(settings(HOPPER, nvidia_driver_version="590.48.01"), "ubuntu2404")]
    assert {"nvidia-driver-pinning-590", "nvidia-dkms-open", "nvidia-fabricmanager"} <= set(names)


def test_versions():
    assert stack.upstream("1:6.16.6.30200000-2238411.22.04") == "6.16.6.30200000"
    assert stack.upstream("580.95.05-0ubuntu1") == "580.95.05"
    assert stack.version_matches("580.95.05-1", "580.95.05")
    assert not stack.version_matches("580.95.051-1", "580.95.05")
    assert stack.version_matches("7.2.0.70200-43~22.04", "7.2")
    assert not stack.version_matches("7.21.0-1", "7.2")


SPECS = [PackageSpec("nvidia-driver-pinning-580"), PackageSpec("nvidia-open", "580.95.05"),
         PackageSpec("nvidia-fabricmanager", "580.95.05"), PackageSpec("nvlsm")]
FAMILY = stack.nvidia_family("debian12")
OFFERED = {"nvidia-open": ["590.48.01-1", "580.105.08-1", "580.95.05-1"],
           "nvidia-fabricmanager": ["590.48.01-1", "580.105.08-1", "580.95.05-1"],
           "nvidia-driver-pinning-580": ["1.0-1"], "nvlsm": ["2025.06.6-1"]}
INSTALLED = {"nvidia-driver-pinning-580": "1.0-1", "nvidia-open": "580.95.05-1",
             "nvidia-fabricmanager": "580.95.05-1", "nvlsm": "2025.06.6-1", "bash": "5.2.15-2+b8"}


def test_plan_fresh_install_pins_exact_versions():
    plan = stack.plan_packages(SPECS, {}, [], OFFERED, FAMILY)
    assert plan.install == ["nvidia-driver-pinning-580", "nvidia-open=580.95.05-1",
                            "nvidia-fabricmanager=580.95.05-1", "nvlsm"]
    assert plan.unhold == [] and plan.hold == [] and plan.problems == []


def test_plan_converged_set_only_holds_what_is_not_held():
    plan = stack.plan_packages(SPECS, INSTALLED, ["nvidia-open"], OFFERED, FAMILY)
    assert not plan.changes and plan.unhold == []
    assert plan.hold == ["nvidia-driver-pinning-580", "nvidia-fabricmanager", "nvlsm"]
    assert stack.plan_packages(SPECS, INSTALLED, [s.name for s in SPECS], OFFERED, FAMILY).hold == []


def test_plan_branch_bump_releases_the_whole_set_and_replaces_the_pinning_package():
    bumped = [PackageSpec("nvidia-driver-pinning-590"), PackageSpec("nvidia-open", "590.48.01"),
              PackageSpec("nvidia-fabricmanager", "590.48.01"), PackageSpec("nvlsm")]
    held = [s.name for s in SPECS]
    plan = stack.plan_packages(bumped, INSTALLED, held, {**OFFERED, "nvidia-driver-pinning-590": ["1.0-1"]}, FAMILY)
    assert plan.unhold == ["nvidia-driver-pinning-580", "nvidia-fabricmanager", "nvidia-open", "nvlsm"]
    assert plan.install == ["nvidia-driver-pinning-590", "nvidia-open=590.48.01-1",
                            "nvidia-fabricmanager=590.48.01-1", "nvlsm", "nvidia-driver-pinning-580-"]
    assert plan.hold == []


def test_plan_names_what_the_repository_does_not_offer():
    specs = [PackageSpec("nvidia-open", "580.95.06")]
    plan = stack.plan_packages(specs, {}, [], OFFERED, FAMILY)
    assert plan.problems == ["nvidia-open 580.95.06 is not offered by the configured repositories "
                             "(offered: 590.48.01-1, 580.105.08-1, 580.95.05-1)"]
    # before the lists know the repository (planning), versioned specs are planned by name
    assert stack.plan_packages(specs, {}, [], None, FAMILY).install == ["nvidia-open"]


def test_rocm_release_is_the_repository_path():
    s = settings(MI355X, rocm_version="7.2")
    assert stack.rocm_sources(s, "debian12", "amd64") == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.asc] https://repo.radeon.com/amdgpu/7.2/ubuntu jammy main\n"
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.asc] https://repo.radeon.com/rocm/apt/7.2 jammy main\n")
    with pytest.raises(stack.StackError, match="amd64 only"):
        stack.rocm_sources(s, "ubuntu2404", "arm64")
    assert _names(stack.amd_packages(s)) == [("amdgpu-dkms", None), ("rocm", "7.2")]


def test_reboot_only_when_the_installed_module_is_not_the_loaded_one():
    assert not stack.module_differs("580.95.05", "580.95.05-1")
    assert stack.module_differs("580.95.05", "590.48.01-1")
    assert stack.module_differs(None, "580.95.05-1")
    assert not stack.module_differs(None, None)
    assert not stack.module_differs("6.16.6", "1:6.16.6.30200000-2238411.22.04")
    msg = stack.reboot_refused_message("gpu-7", "NVIDIA driver", "590.48.01-1", "580.95.05")
    assert msg.startswith("gpu-7: a reboot is needed to load NVIDIA driver 590.48.01 (loaded now: 580.95.05)")
    assert "reboot: allowed" in msg


def _hopper_ok(**changes):
    gpus = parse_nvidia_smi("\n".join(f"{i}, NVIDIA H200, 143771 MiB, 580.95.05, 00000000:{0x18 + 0x10 * i:02X}:00.0, "
                                      f"GPU-{i}" for i in range(8))).gpus
    seen = dict(loaded_driver="580.95.05", gpus=gpus, smi_error=None,
                driver_gpus=[f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(8)], nvswitches=4,
                units_active={"nvidia-persistenced": True, "nvidia-fabricmanager": True},
                cuda_count=8, cuda_error=None)
    seen.update(changes)
    return stack.NvidiaObserved(**seen)


def test_check_nvidia_passes_a_converged_host():
    assert stack.check_nvidia(settings(HOPPER), _hopper_ok()) == []


def test_check_nvidia_names_the_missing_gpu():
    seen = _hopper_ok(gpus=_hopper_ok().gpus[:7], cuda_count=7)
    problems = stack.check_nvidia(settings(HOPPER), seen)
    assert problems[0].startswith("gpu_count: declared 8 x H200, nvidia-smi found 7 (1 x H200 missing; "
                                  "the driver probed 0000:88:00.0 but nvidia-smi does not list it")
    assert problems[1] == "gpu_count: declared 8, CUDA (cuDeviceGetCount) sees 7"
    msg = stack.failure_message("gpu-3", problems)
    assert msg.startswith("gpu-3: GPU stack verification failed:\n  - gpu_count: declared 8 x H200")


def test_check_nvidia_fabric_and_cuda():
    s = settings(HOPPER)
    problems = stack.check_nvidia(s, _hopper_ok(units_active={"nvidia-persistenced": True},
                                                cuda_count=None, cuda_error="cuInit/cuDeviceGetCount returned 802"))
    assert problems == ["nvidia-fabricmanager is not running (systemctl status nvidia-fabricmanager)",
                        "CUDA check failed: cuInit/cuDeviceGetCount returned 802"]
    assert stack.check_nvidia(s, _hopper_ok(nvswitches=0)) == [
        "nvswitch: declared True, found no NVSwitch in /proc/driver/nvidia-nvswitch/devices"]
    undeclared = stack.check_nvidia(settings(HOPPER, nvswitch=False), _hopper_ok())
    assert undeclared == ["nvswitch: declared False, found 4 NVSwitch devices (fabric manager is not installed)"]


def test_check_nvidia_wrong_model_and_driver():
    gpus = parse_nvidia_smi("\n".join(f"{i}, NVIDIA H100 80GB HBM3, 81559 MiB, 580.82.07, b{i}, GPU-{i}"
                                      for i in range(8))).gpus
    problems = stack.check_nvidia(settings(HOPPER), _hopper_ok(gpus=gpus, loaded_driver="580.82.07"))
    assert problems == [
        "nvidia_driver_version: configured 580.95.05, loaded kernel module 580.82.07",
        "gpu_model: declared H200, nvidia-smi found NVIDIA H100 80GB HBM3",
        "nvidia_driver_version: configured 580.95.05, nvidia-smi reports 580.82.07"]
    no_driver = stack.check_nvidia(settings(HOPPER), _hopper_ok(gpus=[], smi_error="nvidia-smi exited 9",
                                                                  loaded_driver=None))
    assert no_driver[:2] == ["nvidia_driver_version: configured 580.95.05, loaded kernel module none",
                             "nvidia-smi: nvidia-smi exited 9"]


def test_check_amd():
    s = settings(MI355X)
    gpus = parse_amd_smi("".join(f"GPU: {i}\n    ASIC:\n        MARKET_NAME: AMD Instinct MI355X\n"
                                 for i in range(4))).gpus
    assert stack.check_amd(s, stack.AmdObserved(gpus, None, "7.2.0")) == []
    assert stack.check_amd(s, stack.AmdObserved(gpus[:3], None, "7.1.1")) == [
        "gpu_count: declared 4 x MI355X, amd-smi found 3 (1 x MI355X missing; found: AMD Instinct MI355X, "
        "AMD Instinct MI355X, AMD Instinct MI355X)",
        "rocm_version: configured 7.2, amd-smi reports ROCm 7.1.1"]
