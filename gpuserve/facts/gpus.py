"""GPUs as the host reports them: the one parser of ``nvidia-smi`` and of ``amd-smi``'s GPU list.

Both ``gpuserve status`` (the ``Gpus`` fact here) and the GPU-stack verification
(gpuserve.facts.nvidia.NvidiaSmiGpus, gpuserve.facts.amd.AmdSmiGpus, read by operations/gpu_stack.py)
parse the tools' output with ``parse_nvidia_smi`` / ``parse_amd_smi``. The parsers are pure (tests
feed them recorded output from tests/unit/fixtures/ and the sandbox's simulated tools).

A tool that fails is an error, not zero GPUs; the GPUs it still lists stay beside the error (one
fallen off the bus: the rest are listed). A host can list GPUs in nvidia-smi while CUDA itself
fails (fabric manager missing): this is an inventory, not a health check.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from pyinfra.api import FactBase

from gpuserve.hardware import GPU_MODELS, GpuInfo, HardwareProfile

NVIDIA_FIELDS = ("index", "name", "memory.total", "driver_version", "pci.bus_id", "uuid")
NVIDIA_QUERY = f"nvidia-smi --query-gpu={','.join(NVIDIA_FIELDS)} --format=csv,noheader"
AMD_STATIC = "amd-smi static --asic --vram"
AMD_LIST = "amd-smi list"


@dataclass(frozen=True)
class GpuReport:
    vendor: str | None  # nvidia | amd | None (neither tool found)
    gpus: tuple[GpuInfo, ...]
    error: str | None = None  # the tool failed, or printed what is no GPU (driver not loaded, ...)

    @property
    def profile(self) -> HardwareProfile | None:
        """One profile for the host; None when the tool failed or the GPUs differ."""
        if self.error is not None:
            return None
        if self.vendor is None or not self.gpus:
            return HardwareProfile("cpu", 0) if self.vendor is None else None
        models = {g.model for g in self.gpus}
        if len(models) != 1:
            return None
        memory = [g.memory_mib for g in self.gpus if g.memory_mib is not None]
        drivers = {g.driver_version for g in self.gpus if g.driver_version}
        return HardwareProfile(
            gpu_model=models.pop(),
            gpu_count=len(self.gpus),
            gpu_memory_gib=round(min(memory) / 1024, 1) if len(memory) == len(self.gpus) else None,
            driver_version=drivers.pop() if len(drivers) == 1 else None,
        )


def _report(vendor: str, gpus: list[GpuInfo], other: list[str]) -> GpuReport:
    return GpuReport(vendor, tuple(gpus), " ".join(other) or None)


# -- NVIDIA ---------------------------------------------------------------------------------

_NVIDIA_MODELS = {m for m, info in GPU_MODELS.items() if info.vendor == "nvidia"}


def nvidia_model(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; ``NVIDIA GH200 480GB`` stays unknown (GH200...)."""
    words = name.removeprefix("NVIDIA ").split()
    first = words[0] if words else name
    return first if first in _NVIDIA_MODELS else name


def _na(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "[N/A]", "N/A", "[Not Supported]") else value


def _nvidia_row(row: list[str], fields: tuple[str, ...], position: int) -> GpuInfo | None:
    """One CSV row as a GPU, or None when it is no GPU row (an error line, a changed format)."""
    if len(row) != len(fields):
        return None
    value = dict(zip(fields, (cell.strip() for cell in row), strict=True))
    memory = None
    if "memory.total" in value and _na(value["memory.total"]) is not None:
        match = re.fullmatch(r"(\d+)\s*MiB", value["memory.total"])
        if not match:
            return None
        memory = int(match.group(1))
    index = value.get("index", str(position))
    if not index.isdigit():
        return None
    name = value.get("name", "")
    return GpuInfo(index=int(index), vendor="nvidia", name=name, model=nvidia_model(name),
                   memory_mib=memory, driver_version=_na(value.get("driver_version", "")),
                   bus_id=_na(value.get("pci.bus_id", "")), uuid=_na(value.get("uuid", "")))


def parse_nvidia_smi(text: str, fields: tuple[str, ...] = NVIDIA_FIELDS) -> GpuReport:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader`` output (stderr merged), in
    ``fields`` order. ``No devices were found`` is zero GPUs; every other line that is no GPU row
    (a failing driver, a GPU it cannot reach, ``nvidia-smi exited 9``) is the error."""
    lines = [line for line in text.splitlines() if line.strip()]
    if [line.strip() for line in lines] == ["No devices were found"]:
        return GpuReport("nvidia", ())
    gpus, other = [], []
    for line in lines:
        gpu = _nvidia_row(next(csv.reader([line], skipinitialspace=True)), fields, len(gpus))
        if gpu is None:
            other.append(line.strip())
        else:
            gpus.append(gpu)
    return _report("nvidia", gpus, other)


# -- AMD ------------------------------------------------------------------------------------

def amd_model(market_name: str | None, gfx: str | None) -> str:
    """``AMD Instinct MI355X`` -> ``MI355X`` (also ``Mi325X VF``, ``MI300X OAM: 750W SKU``)."""
    match = re.search(r"\bMI(\d{3}[A-Z]?)\b", market_name or "", re.IGNORECASE)
    if match:
        return f"MI{match.group(1).upper()}"
    return market_name or gfx or "unknown"


_AMD_BLOCK = re.compile(r"([A-Z][A-Z_ ]*):\s*(\d+)")  # a device block: GPU: 0, CPU: 0


def _amd_sections(text: str) -> tuple[dict[int, dict[str, str]], list[str]]:
    """``GPU: N`` blocks -> {N: {"SECTION.KEY": value}}, keys upper-cased with spaces as ``_``
    (older amd-smi prints ``Market Name``); a value may itself hold ``: ``. Also the top-level
    lines that start no device block (``ERROR:root:Unable to detect any GPU devices``)."""
    gpus: dict[int, dict[str, str]] = {}
    other: list[str] = []
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []  # enclosing sections: (indent, name)
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        if indent == 0:
            block = _AMD_BLOCK.fullmatch(raw.strip())
            current = gpus.setdefault(int(block.group(2)), {}) if block and block.group(1) == "GPU" else None
            stack = []
            if block is None:
                other.append(raw.strip())
            continue
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip().upper().replace(" ", "_"), value.strip()
        if current is None or not sep:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if value:
            current[".".join([name for _, name in stack] + [key])] = value
        else:
            stack.append((indent, key))
    return gpus, other


def parse_amd_smi(static_text: str, list_text: str = "") -> GpuReport:
    """``amd-smi static --asic [--vram]`` (stderr merged; and optionally ``amd-smi list``) text
    output; top-level lines that are no device block are the error."""
    static, other = _amd_sections(static_text)
    listed, _ = _amd_sections(list_text)
    gpus = []
    for index in sorted(static):
        info, ids = static[index], listed.get(index, {})
        market = info.get("ASIC.MARKET_NAME")
        gfx = info.get("ASIC.TARGET_GRAPHICS_VERSION")
        size = re.fullmatch(r"(\d+)\s*MB", info.get("VRAM.SIZE", ""))
        gpus.append(GpuInfo(
            index=index, vendor="amd", name=market or "unknown",
            model=amd_model(market, gfx),
            memory_mib=int(size.group(1)) if size else None,
            bus_id=ids.get("BDF") or info.get("BUS.BDF"),
            uuid=ids.get("UUID"),
            gfx=gfx,
        ))
    return _report("amd", gpus, other)


# -- the fact -------------------------------------------------------------------------------

_MARK = "### gpuserve "


def parse_gpu_fact(output: str) -> GpuReport:
    """The ``Gpus`` fact's combined output: marked sections from whichever tool ran."""
    sections: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    current = None
    for line in output.splitlines():
        if line.startswith(_MARK):
            word, _, rest = line[len(_MARK):].partition(" ")
            if word == "rc" and current is not None:
                codes[current] = int(rest or 0)
            else:
                current = word
                sections[current] = []
        elif current is not None:
            sections[current].append(line)
    text = {name: "\n".join(lines) for name, lines in sections.items()}
    failed = [name for name, code in codes.items() if code != 0]
    if "none" in sections or not sections:
        return GpuReport(None, ())
    vendor = "nvidia" if "nvidia-smi" in sections else "amd"
    if failed:
        return GpuReport(vendor, (), error=f"{failed[0]} failed: {text[failed[0]].strip()[:300]}")
    if vendor == "nvidia":
        return parse_nvidia_smi(text["nvidia-smi"])
    return parse_amd_smi(text.get("amd-smi-static", ""), text.get("amd-smi-list", ""))


class Gpus(FactBase):
    """The host's GPUs (``GpuReport``): nvidia-smi if present, else amd-smi, else none."""

    def command(self) -> str:
        def run(name: str, command: str) -> str:
            return f"echo '{_MARK}{name}'; {command} 2>&1; echo \"{_MARK}rc $?\""

        return (
            f"if command -v nvidia-smi >/dev/null 2>&1; then {run('nvidia-smi', NVIDIA_QUERY)}; "
            f"elif command -v amd-smi >/dev/null 2>&1; then {run('amd-smi-static', AMD_STATIC)}; "
            f"{run('amd-smi-list', AMD_LIST)}; "
            f"else echo '{_MARK}none'; fi"
        )

    def process(self, output: list[str]) -> GpuReport:
        return parse_gpu_fact("\n".join(output))
