"""nvidia-smi / amd-smi output -> hardware profile, on fixtures in the tools' output formats."""

from __future__ import annotations

import pytest

from gpuserve.facts.gpus import (
    NVIDIA_FIELDS,
    GpuParseError,
    GpuReport,
    Gpus,
    amd_model,
    nvidia_model,
    parse_amd_smi,
    parse_gpu_fact,
    parse_nvidia_smi,
)
from gpuserve.hardware import HardwareProfile

from .helpers import FIXTURES

GPUS = FIXTURES / "gpus"


def read(name: str) -> str:
    return (GPUS / name).read_text()


def report(vendor: str, gpus) -> GpuReport:
    return GpuReport(vendor, tuple(gpus))


def test_nvidia_basic_query_h100():
    gpus = parse_nvidia_smi(read("nvidia_smi_h100_x8_basic.csv"))
    assert len(gpus) == 8
    assert {g.model for g in gpus} == {"H100"}
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert gpus[0].memory_mib == 81559 and gpus[0].driver_version == "580.95.05"
    assert [g.index for g in gpus] == list(range(8))
    assert report("nvidia", gpus).profile == HardwareProfile(
        "H100", 8, gpu_memory_gib=79.6, driver_version="580.95.05")


def test_nvidia_basic_query_b200():
    profile = report("nvidia", parse_nvidia_smi(read("nvidia_smi_b200_x4_basic.csv"))).profile
    assert (profile.gpu_model, profile.gpu_count, profile.gpu_memory_gib) == ("B200", 4, 179.1)


def test_nvidia_full_query_h200_with_bus_ids_and_uuids():
    gpus = parse_nvidia_smi(read("nvidia_smi_h200_x8.csv"), NVIDIA_FIELDS)
    assert [g.model for g in gpus] == ["H200"] * 8
    assert gpus[7].index == 7 and gpus[7].bus_id == "00000000:DB:00.0"
    assert gpus[0].uuid == "GPU-6e1f0c4a-3b2d-9e8f-51a7-0c2b4d6e8f10"
    profile = report("nvidia", gpus).profile
    assert profile.gpu_model == "H200" and profile.gpu_memory_gib == 140.4


def test_nvidia_gb200():
    gpus = parse_nvidia_smi(read("nvidia_smi_gb200_x4.csv"), NVIDIA_FIELDS)
    assert report("nvidia", gpus).profile.gpu_model == "GB200"


def test_nvidia_mixed_models_have_no_single_profile():
    gpus = parse_nvidia_smi(read("nvidia_smi_mixed.csv"), NVIDIA_FIELDS)
    assert [g.model for g in gpus] == ["H100", "NVIDIA A100-SXM4-80GB"]
    assert gpus[1].uuid is None  # [N/A]
    assert report("nvidia", gpus).profile is None


def test_nvidia_driver_failure_is_an_error_not_zero_gpus():
    with pytest.raises(GpuParseError, match="couldn't communicate with the NVIDIA driver"):
        parse_nvidia_smi(read("nvidia_smi_driver_failed.txt"))


def test_nvidia_no_devices():
    assert parse_nvidia_smi(read("nvidia_smi_no_devices.txt")) == []


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H200 NVL", "H200"),
    ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"),
    ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB"), ("NVIDIA H800", "NVIDIA H800"),
])
def test_nvidia_model_names(name, model):
    assert nvidia_model(name) == model


def test_amd_mi355x_static_and_list():
    gpus = parse_amd_smi(read("amd_smi_static_mi355x_x4.txt"), read("amd_smi_list_mi355x_x4.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {g.model for g in gpus} == {"MI355X"} and {g.gfx for g in gpus} == {"gfx950"}
    assert gpus[0].name == "AMD Instinct MI355X"
    assert gpus[2].bus_id == "0000:65:00.0"
    assert gpus[3].uuid == "c2ff75a3-0000-1000-8094-3b8d4a1e9f6c"
    assert gpus[0].memory_mib == 294896
    assert report("amd", gpus).profile == HardwareProfile("MI355X", 4, gpu_memory_gib=288.0)


def test_amd_output_quirks():
    gpus = parse_amd_smi(read("amd_smi_static_variants.txt"))
    assert [g.index for g in gpus] == [0, 1]  # the CPU: block is not a GPU
    assert gpus[0].name == "AMD Instinct MI300X OAM: 750W SKU" and gpus[0].model == "MI300X"
    assert gpus[0].bus_id == "0000:83:00.0"  # BUS.BDF when amd-smi list was not run
    assert gpus[1].name == "AMD Instinct Mi325X VF" and gpus[1].model == "MI325X"
    assert gpus[1].memory_mib is None


def test_amd_garbage_is_an_error():
    with pytest.raises(GpuParseError):
        parse_amd_smi("amd-smi: command failed\n")


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
