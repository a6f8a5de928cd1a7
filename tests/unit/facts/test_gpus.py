"""The one nvidia-smi / amd-smi GPU parser (gpuserve.facts.gpus), as ``gpuserve status`` and the
GPU-stack verification use it: fixtures in the real tools' output formats, and the sandbox's
simulated tools."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuserve import status
from gpuserve.facts.amd import AmdSmiGpus
from gpuserve.facts.gpus import (
    AMD_STATIC,
    NVIDIA_QUERY,
    GpuReport,
    Gpus,
    amd_model,
    nvidia_model,
    parse_amd_smi,
    parse_gpu_fact,
    parse_nvidia_smi,
)
from gpuserve.facts.nvidia import NvidiaSmiGpus
from gpuserve.hardware import PROFILES, GpuInfo, HardwareProfile
from gpuserve_sandbox import simgpu

from tests.unit.helpers import FIXTURES

GPUS = FIXTURES / "gpus"


def read(name: str) -> str:
    return (GPUS / name).read_text()


BASIC = ("name", "memory.total", "driver_version")


def report(vendor: str, gpus) -> GpuReport:
    return GpuReport(vendor, tuple(gpus))


def test_nvidia_basic_query_h100():
    gpus = parse_nvidia_smi(read("nvidia_smi_h100_x8_basic.csv"), BASIC).gpus
    assert len(gpus) == 8
    assert {g.model for g in gpus} == {"H100"}
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert gpus[0].memory_mib == 81559 and gpus[0].driver_version == "580.95.05"
    assert [g.index for g in gpus] == list(range(8))
    assert report("nvidia", gpus).profile == HardwareProfile(
        "H100", 8, gpu_memory_gib=79.6, driver_version="580.95.05")


def test_nvidia_basic_query_b200():
    profile = report("nvidia", parse_nvidia_smi(read("nvidia_smi_b200_x4_basic.csv"), BASIC).gpus).profile
    assert (profile.gpu_model, profile.gpu_count, profile.gpu_memory_gib) == ("B200", 4, 179.1)


def test_nvidia_full_query_h200_with_bus_ids_and_uuids():
    gpus = parse_nvidia_smi(read("nvidia_smi_h200_x8.csv")).gpus
    assert [g.model for g in gpus] == ["H200"] * 8
    assert gpus[7].index == 7 and gpus[7].bus_id == "00000000:DB:00.0"
    assert gpus[0].uuid == "GPU-6e1f0c4a-3b2d-9e8f-51a7-0c2b4d6e8f10"
    profile = report("nvidia", gpus).profile
    assert profile.gpu_model == "H200" and profile.gpu_memory_gib == 140.4


def test_nvidia_gb200():
    gpus = parse_nvidia_smi(read("nvidia_smi_gb200_x4.csv")).gpus
    assert report("nvidia", gpus).profile.gpu_model == "GB200"


def test_nvidia_mixed_models_have_no_single_profile():
    gpus = parse_nvidia_smi(read("nvidia_smi_mixed.csv")).gpus
    assert [g.model for g in gpus] == ["H100", "NVIDIA A100-SXM4-80GB"]
    assert gpus[1].uuid is None  # [N/A]
    assert report("nvidia", gpus).profile is None


# what NvidiaSmiGpus prints when nvidia-smi fails: its output (stderr merged), then the exit code
SMI_H200 = [f"{i}, NVIDIA H200, 143771 MiB, 580.95.05, 00000000:{0x18 + 0x10 * i:02X}:00.0, GPU-{i}"
            for i in range(8)]
SMI_NO_DRIVER = [
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
    "the latest NVIDIA driver is installed and running.",
    "",
    "nvidia-smi exited 9",
]


def test_nvidia_smi_lists_gpus():
    smi = NvidiaSmiGpus().process(SMI_H200)
    assert smi.error is None and len(smi.gpus) == 8
    assert smi.gpus[0] == GpuInfo(0, "nvidia", "NVIDIA H200", "H200", 143771, "580.95.05",
                                  "00000000:18:00.0", "GPU-0")
    h100 = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 81559 MiB, 580.95.05, 00000000:19:00.0, [N/A]")
    assert h100.gpus[0].name == "NVIDIA H100 80GB HBM3" and h100.gpus[0].memory_mib == 81559


def test_nvidia_driver_failure_is_an_error_not_zero_gpus():
    failed = parse_nvidia_smi(read("nvidia_smi_driver_failed.txt"))
    assert failed.gpus == () and "couldn't communicate with the NVIDIA driver" in failed.error
    smi = NvidiaSmiGpus().process(SMI_NO_DRIVER)
    assert smi.gpus == () and "couldn't communicate with the NVIDIA driver" in smi.error
    assert "exited 9" in smi.error
    assert NvidiaSmiGpus().process(["nvidia-smi: command not found"]).error == "nvidia-smi: command not found"


def test_nvidia_smi_keeps_the_gpus_it_lists_next_to_an_error():
    lines = SMI_H200[:7] + ["Unable to determine the device handle for GPU0000:88:00.0: Unknown Error",
                            "nvidia-smi exited 15"]
    smi = NvidiaSmiGpus().process(lines)
    assert len(smi.gpus) == 7 and "GPU0000:88:00.0: Unknown Error" in smi.error
    assert smi.profile is None


def test_nvidia_rows_of_another_format_are_the_error():
    smi = parse_nvidia_smi("0, NVIDIA H200, 143771, 580.95.05, 00000000:18:00.0, GPU-0\n"   # no MiB
                           "x, NVIDIA H200, 143771 MiB, 580.95.05, 00000000:28:00.0, GPU-1\n"
                           "NVIDIA H200, 143771 MiB")
    assert smi.gpus == () and smi.error.startswith("0, NVIDIA H200, 143771, ")


def test_nvidia_no_devices():
    smi = parse_nvidia_smi(read("nvidia_smi_no_devices.txt"))
    assert smi.gpus == () and smi.error is None


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H200 NVL", "H200"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"),
    ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB"), ("NVIDIA H800", "NVIDIA H800"),
])
def test_nvidia_model_names(name, model):
    assert nvidia_model(name) == model


def test_amd_mi355x_static_and_list():
    gpus = parse_amd_smi(read("amd_smi_static_mi355x_x4.txt"), read("amd_smi_list_mi355x_x4.txt")).gpus
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {g.model for g in gpus} == {"MI355X"} and {g.gfx for g in gpus} == {"gfx950"}
    assert gpus[0].name == "AMD Instinct MI355X"
    assert gpus[2].bus_id == "0000:65:00.0"
    assert gpus[3].uuid == "c2ff75a3-0000-1000-8094-3b8d4a1e9f6c"
    assert gpus[0].memory_mib == 294896
    assert report("amd", gpus).profile == HardwareProfile("MI355X", 4, gpu_memory_gib=288.0)


def test_amd_output_quirks():
    found = parse_amd_smi(read("amd_smi_static_variants.txt"))
    gpus = found.gpus
    assert found.error is None  # the CPU: block is another device, not an error
    assert [g.index for g in gpus] == [0, 1]  # the CPU: block is not a GPU
    assert gpus[0].name == "AMD Instinct MI300X OAM: 750W SKU" and gpus[0].model == "MI300X"
    assert gpus[0].bus_id == "0000:83:00.0"  # BUS.BDF when amd-smi list was not run
    assert gpus[1].name == "AMD Instinct Mi325X VF" and gpus[1].model == "MI325X"
    assert gpus[1].memory_mib is None


def test_amd_garbage_is_an_error():
    assert parse_amd_smi("amd-smi: command failed\n").error == "amd-smi: command failed"


AMD_STATIC_MI300X = """\
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


def test_amd_smi_static_as_the_gpu_stack_reads_it():
    smi = AmdSmiGpus().process(AMD_STATIC_MI300X)
    assert smi.error is None
    assert [(g.name, g.model, g.memory_mib) for g in smi.gpus] == [("AMD Instinct MI300X", "MI300X", 196592)] * 2
    failed = AmdSmiGpus().process([
        "ERROR:root:Unable to detect any GPU devices, check amdgpu version and module status "
        "(sudo modprobe amdgpu)", "amd-smi exited 1"])
    assert failed.gpus == () and "Unable to detect any GPU devices" in failed.error
    assert "amd-smi exited 1" in failed.error


@pytest.mark.parametrize("market, gfx, model", [
    ("AMD Instinct MI350X", "gfx950", "MI350X"), (None, "gfx950", "gfx950"), (None, None, "unknown"),
])
def test_amd_model_names(market, gfx, model):
    assert amd_model(market, gfx) == model


def fact_output(*sections: tuple[str, str, int | None]) -> list[str]:
    lines = []
    for name, body, code in sections:
        lines.append(f"### gpuserve {name}")
        lines += body.splitlines()
        if code is not None:
            lines.append(f"### gpuserve rc {code}")
    return lines


def test_fact_on_an_nvidia_host():
    out = Gpus().process(fact_output(("nvidia-smi", read("nvidia_smi_h200_x8.csv"), 0)))
    assert out.vendor == "nvidia" and out.error is None
    assert out.profile.gpu_model == "H200" and out.profile.gpu_count == 8


def test_fact_on_an_amd_host():
    out = Gpus().process(fact_output(
        ("amd-smi-static", read("amd_smi_static_mi355x_x4.txt"), 0),
        ("amd-smi-list", read("amd_smi_list_mi355x_x4.txt"), 0)))
    assert out.vendor == "amd" and out.profile.gpu_model == "MI355X"
    assert out.gpus[1].uuid == "7aff75a3-0000-1000-80b2-1f6b2e9c7d4a"


def test_fact_when_the_driver_fails():
    out = Gpus().process(fact_output(("nvidia-smi", read("nvidia_smi_driver_failed.txt"), 9)))
    assert out.vendor == "nvidia" and out.profile is None
    assert out.error.startswith("nvidia-smi failed: NVIDIA-SMI has failed")


def test_fact_on_a_host_without_gpu_tools():
    out = parse_gpu_fact("### gpuserve none")
    assert out.vendor is None and out.profile == HardwareProfile("cpu", 0)


def test_fact_command_runs_the_parsed_query():
    command = Gpus().command()
    assert "nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id,uuid " \
           "--format=csv,noheader" in command
    assert "amd-smi static --asic --vram" in command and "amd-smi list" in command


def test_status_gpu_column():
    """``gpuserve status``'s GPUS column, from the Gpus fact's output."""
    def column(*sections):
        return status._gpus(Gpus().process(fact_output(*sections)))

    assert status._gpus(None) == "?"
    assert column(("nvidia-smi", read("nvidia_smi_h200_x8.csv"), 0)) == "8x H200 (580.95.05)"
    assert column(("nvidia-smi", read("nvidia_smi_mixed.csv"), 0)) == "mixed"
    assert column(("nvidia-smi", read("nvidia_smi_driver_failed.txt"), 9)) == \
        "error: nvidia-smi failed: NVIDIA-SMI has failed"
    assert column(("amd-smi-static", read("amd_smi_static_mi355x_x4.txt"), 0),
                  ("amd-smi-list", read("amd_smi_list_mi355x_x4.txt"), 0)) == "4x MI355X"
    assert column(("amd-smi-static", "ERROR:root:Unable to detect any GPU devices", 1),
                  ("amd-smi-list", "", 1)) == "error: amd-smi-static failed: ERROR:root:Unable"
    assert column(("none", "", None)) == "none"


# --- the sandbox's simulated tools parse as the machines they simulate ------------------------------

def _sim(tool: str, root, proc, command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUSERVE_SIM_HARDWARE": str(root / simgpu.HARDWARE_FILE),
           "GPUSERVE_SIM_PROC_VERSION": str(proc / "nvidia/version"),
           "GPUSERVE_SIM_AMDGPU_LOADED": str(proc / "gpuserve-sim-amdgpu/version"),
           "GPUSERVE_SIM_STATE": str(root / simgpu.STATE_DIR),
           "GPUSERVE_SIM_FAULTS": str(root / simgpu.FAULTS_FILE)}
    argv = command.split()[1:]
    return subprocess.run([sys.executable, str(simgpu.FILES / f"sim-{tool}"), *argv],
                          capture_output=True, text=True, env=env)


@pytest.mark.parametrize("name", [n for n in PROFILES if PROFILES[n].gpu_count])
def test_the_sandbox_tools_parse_as_the_reference_machine(name, tmp_path):
    root, proc = tmp_path / "root", tmp_path / "proc-driver"
    simgpu.install(root, simgpu.HostSpec.parse(name), "sandbox-1")
    (root / simgpu.NVIDIA_MODULE_VERSION_FILE).write_text("580.95.05\n")
    (root / simgpu.AMDGPU_MODULE_VERSION_FILE).write_text("6.16.6\n")
    simgpu.on_boot(root, proc)
    hw = PROFILES[name]
    if simgpu.PROFILES[name].vendor == "nvidia":
        out = _sim("nvidia-smi", root, proc, NVIDIA_QUERY)
        found = NvidiaSmiGpus().process((out.stdout + out.stderr).splitlines())
        fact = Gpus().process(["### gpuserve nvidia-smi", *out.stdout.splitlines(), "### gpuserve rc 0"])
    else:
        out = _sim("amd-smi", root, proc, AMD_STATIC)
        listed = _sim("amd-smi", root, proc, "amd-smi list")
        found = AmdSmiGpus().process((out.stdout + out.stderr).splitlines())
        fact = Gpus().process(["### gpuserve amd-smi-static", *out.stdout.splitlines(), "### gpuserve rc 0",
                               "### gpuserve amd-smi-list", *listed.stdout.splitlines(), "### gpuserve rc 0"])
    assert out.returncode == 0 and found.error is None and fact.error is None
    assert [g.model for g in found.gpus] == [hw.gpu_model] * hw.gpu_count
    assert (fact.profile.gpu_model, fact.profile.gpu_count) == (hw.gpu_model, hw.gpu_count)
    assert all(g.bus_id and g.memory_mib for g in fact.gpus)
