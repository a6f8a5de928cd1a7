"""The GPU stack's fact parsers against the real tools' output formats (/proc, dpkg, apt, libcuda,
amd-smi version). The GPU lists of nvidia-smi and amd-smi: test_facts_gpus.py."""

from gpuserve.facts.amd import parse_amd_versions
from gpuserve.facts.apt import parse_apt_policy
from gpuserve.facts.nvidia import parse_cuda_check, parse_dpkg_status, parse_loaded_module, parse_module_versions

PROC_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
             "(dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 23:41:22 UTC 2025")
PROC_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
PROC_ARM = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@x)  Thu Sep 25 2025"


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
