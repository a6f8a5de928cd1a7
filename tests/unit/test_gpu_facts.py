"""Fact parsers against the real tools' output formats (nvidia-smi, /proc, dpkg, apt, amd-smi)."""

from gpuserve.facts.amd import parse_amd_smi_static, parse_amd_versions
from gpuserve.facts.apt import parse_apt_policy
from gpuserve.facts.nvidia import (parse_cuda_check, parse_dpkg_status, parse_loaded_module,
                                   parse_module_versions, parse_nvidia_smi)
from gpuserve.stack import FoundGpu

# nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader,nounits
SMI_H200 = [f"{i}, NVIDIA H200, 143771, 580.95.05, 00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(8)]
SMI_NO_DRIVER = [
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
    "the latest NVIDIA driver is installed and running.",
    "",
    "nvidia-smi exited 9",
]
PROC_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
             "(dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 23:41:22 UTC 2025")
PROC_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
PROC_ARM = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@x)  Thu Sep 25 2025"


def test_nvidia_smi_lists_gpus():
    smi = parse_nvidia_smi(SMI_H200)
    assert smi.error is None
    assert len(smi.gpus) == 8
    assert smi.gpus[0] == FoundGpu("NVIDIA H200", "00000000:18:00.0", 143771, "580.95.05")
    h100 = parse_nvidia_smi(["0, NVIDIA H100 80GB HBM3, 81559, 580.95.05, 00000000:19:00.0"])
    assert h100.gpus[0].name == "NVIDIA H100 80GB HBM3" and h100.gpus[0].memory_mib == 81559


def test_nvidia_smi_without_driver_or_tool_is_an_error_not_zero_gpus():
    smi = parse_nvidia_smi(SMI_NO_DRIVER)
    assert smi.gpus == [] and "couldn't communicate with the NVIDIA driver" in smi.error
    assert "exited 9" in smi.error
    assert parse_nvidia_smi(["nvidia-smi: command not found"]).error == "nvidia-smi: command not found"


def test_nvidia_smi_keeps_the_gpus_it_lists_next_to_an_error():
    lines = SMI_H200[:7] + ["Unable to determine the device handle for GPU0000:88:00.0: Unknown Error",
                            "nvidia-smi exited 15"]
    smi = parse_nvidia_smi(lines)
    assert len(smi.gpus) == 7 and "GPU0000:88:00.0: Unknown Error" in smi.error


def test_loaded_module_version_open_proprietary_and_arm():
    assert parse_loaded_module(PROC_OPEN) == "580.95.05"
    assert parse_loaded_module(PROC_PROPRIETARY) == "550.54.15"
    assert parse_loaded_module(PROC_ARM) == "580.95.05"
    assert parse_loaded_module("") is None


def test_module_versions_loaded_and_installed_packages():
    lines = [PROC_OPEN, "--- packages",
             "ii |nvidia-kernel-open-dkms|590.48.01-1",
             "un |nvidia-kernel-dkms|",
             "rc |nvidia-dkms-580-open|580.95.05-0ubuntu1"]
    mv = parse_module_versions(lines)
    assert mv.loaded == "580.95.05"
    assert mv.installed == {"nvidia-kernel-open-dkms": "590.48.01-1"}
    assert parse_module_versions(["--- packages"]).loaded is None
    assert parse_dpkg_status(["hi |nvidia-open|580.95.05-1"]) == {"nvidia-open": "580.95.05-1"}


def test_cuda_check_outcomes():
    assert parse_cuda_check(["count 8"]).count == 8
    busy = parse_cuda_check(["error 802"])
    assert busy.count is None and busy.error_code == 802 and "fabric manager" in busy.error
    missing = parse_cuda_check(["OSError: libcuda.so.1: cannot open shared object file: No such file or directory"])
    assert missing.count is None and "libcuda.so.1" in missing.error


APT_POLICY = """\
nvidia-open:
  Installed: 580.95.05-1
  Candidate: 590.48.01-1
  Version table:
     590.48.01-1 500
        500 http://10.231.11.1:8081/cuda/repos/debian12/x86_64  Packages
     580.105.08-1 500
        500 http://10.231.11.1:8081/cuda/repos/debian12/x86_64  Packages
 *** 580.95.05-1 1001
        500 http://10.231.11.1:8081/cuda/repos/debian12/x86_64  Packages
        100 /var/lib/dpkg/status
nvlsm:
  Installed: (none)
  Candidate: 2025.06.6-1
  Version table:
     2025.06.6-1 500
        500 http://10.231.11.1:8081/cuda/repos/debian12/x86_64  Packages
""".splitlines()


def test_apt_policy():
    policy = parse_apt_policy(APT_POLICY)
    assert policy["nvidia-open"].installed == "580.95.05-1"
    assert policy["nvidia-open"].candidate == "590.48.01-1"
    assert policy["nvidia-open"].versions == ["590.48.01-1", "580.105.08-1", "580.95.05-1"]
    assert policy["nvlsm"].installed is None and policy["nvlsm"].versions == ["2025.06.6-1"]
    assert parse_apt_policy([]) == {}


AMD_STATIC = """\
GPU: 0
    ASIC:
        MARKET_NAME: AMD Instinct MI300X
        VENDOR_ID: 0x1002
        VENDOR_NAME: Advanced Micro Devices Inc. [AMD/ATI]
        SUBVENDOR_ID: 0x1002
        DEVICE_ID: 0x74a1
        REV_ID: 0x00
        OAM_ID: 7
        NUM_COMPUTE_UNITS: 304
        TARGET_GRAPHICS_VERSION: gfx942
    VRAM:
        TYPE: HBM
        VENDOR: HYNIX
        SIZE: 196592 MB
        BIT_WIDTH: 8192
        MAX_BANDWIDTH: 5300 GB/s

GPU: 1
    ASIC:
        MARKET_NAME: AMD Instinct MI300X
        TARGET_GRAPHICS_VERSION: gfx942
    VRAM:
        TYPE: HBM
        SIZE: 196592 MB
""".splitlines()


def test_amd_smi_static():
    smi = parse_amd_smi_static(AMD_STATIC)
    assert smi.error is None
    assert [(g.name, g.memory_mib) for g in smi.gpus] == [("AMD Instinct MI300X", 196592)] * 2
    failed = parse_amd_smi_static([
        "ERROR:root:Unable to detect any GPU devices, check amdgpu version and module status "
        "(sudo modprobe amdgpu)", "amd-smi exited 1"])
    assert failed.gpus == [] and "Unable to detect any GPU devices" in failed.error


def test_amd_versions():
    lines = ["AMDSMI Tool: 25.5.1+41065ee | AMDSMI Library version: 25.5.1 | ROCm version: 6.4.1 | "
             "amdgpu version: 6.12.12 | amd_hsmp version: N/A",
             "--- packages", "ii |amdgpu-dkms|1:6.12.12.60401-2164967.22.04"]
    v = parse_amd_versions(lines)
    assert (v.rocm, v.loaded) == ("6.4.1", "6.12.12")
    assert v.installed == {"amdgpu-dkms": "1:6.12.12.60401-2164967.22.04"}
    not_loaded = parse_amd_versions(["AMDSMI Tool: 26.2.1 | ROCm version: 7.2.0 | amdgpu version: N/A",
                                     "--- packages"])
    assert not_loaded.loaded is None and not_loaded.installed == {}
