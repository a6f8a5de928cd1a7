"""GPUs as the host reports them: ``nvidia-smi`` / ``amd-smi`` output -> a hardware profile.

The parsers are pure (tests feed them recorded output from tests/unit/fixtures/); ``Gpus`` is
the pyinfra fact that runs whichever tool the host has and parses it.

A host can list GPUs in nvidia-smi while CUDA itself fails (fabric manager missing): this fact
is an inventory, not a health check.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from pyinfra.api import FactBase

from gpuserve.hardware import GPU_MODELS, HardwareProfile

NVIDIA_FIELDS = ("index", "name", "memory.total", "driver_version", "pci.bus_id", "uuid")
NVIDIA_QUERY = f"nvidia-smi --query-gpu={','.join(NVIDIA_FIELDS)} --format=csv,noheader"
AMD_STATIC = "amd-smi static --asic --vram"
AMD_LIST = "amd-smi list"


class GpuParseError(ValueError):
    """The tool's output is not what it prints when it works."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    vendor: str  # nvidia | amd
    name: str  # as the tool reports it: "NVIDIA H100 80GB HBM3", "AMD Instinct MI355X"
    model: str  # normalized: H100, MI355X, ... (the report's name when unknown)
    memory_mib: int | None = None
    driver_version: str | None = None
    bus_id: str | None = None
    uuid: str | None = None
    gfx: str | None = None  # AMD TARGET_GRAPHICS_VERSION


@dataclass(frozen=True)
class GpuReport:
    vendor: str | None  # nvidia | amd | None (neither tool found)
    gpus: tuple[GpuInfo, ...]
    error: str | None = None  # the tool ran but failed (driver not loaded, ...)

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


# -- NVIDIA ---------------------------------------------------------------------------------

_NVIDIA_MODELS = {m for m, info in GPU_MODELS.items() if info.vendor == "nvidia"}


def nvidia_model(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; ``NVIDIA GH200 480GB`` stays unknown (GH200...)."""
    words = name.removeprefix("NVIDIA ").split()
    first = words[0] if words else name
    return first if first in _NVIDIA_MODELS else name


def _mib(value: str) -> int | None:
    match = re.fullmatch(r"(\d+)\s*MiB", value.strip())
    return int(match.group(1)) if match else None


def _na(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "[N/A]", "N/A", "[Not Supported]") else value


def parse_nvidia_smi(text: str, fields: tuple[str, ...] = ("name", "memory.total", "driver_version")) -> list[GpuInfo]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader`` output, in ``fields`` order.

    ``No devices were found`` is zero GPUs; a failing driver raises GpuParseError.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and lines[0].strip() == "No devices were found":
        return []
    gpus = []
    for position, row in enumerate(csv.reader(lines, skipinitialspace=True)):
        if len(row) != len(fields):
            raise GpuParseError(f"nvidia-smi: expected {len(fields)} columns, got {row!r} "
                                f"(output: {text.strip()[:200]!r})")
        value = dict(zip(fields, row, strict=True))
        name = value.get("name", "").strip()
        memory = _mib(value["memory.total"]) if "memory.total" in value else None
        if "memory.total" in value and memory is None and _na(value["memory.total"]) is not None:
            raise GpuParseError(f"nvidia-smi: memory.total {value['memory.total']!r} is not 'N MiB'")
        index = value.get("index", str(position)).strip()
        if not index.isdigit():
            raise GpuParseError(f"nvidia-smi: index {index!r} is not a number")
        gpus.append(GpuInfo(
            index=int(index), vendor="nvidia", name=name, model=nvidia_model(name),
            memory_mib=memory,
            driver_version=_na(value.get("driver_version", "")),
            bus_id=_na(value.get("pci.bus_id", "")),
            uuid=_na(value.get("uuid", "")),
        ))
    return gpus


# -- AMD ------------------------------------------------------------------------------------

def amd_model(market_name: str | None, gfx: str | None) -> str:
    """``AMD Instinct MI355X`` -> ``MI355X`` (also ``Mi325X VF``, ``MI300X OAM: 750W SKU``)."""
    match = re.search(r"\bMI(\d{3}[A-Z]?)\b", market_name or "", re.IGNORECASE)
    if match:
        return f"MI{match.group(1).upper()}"
    return market_name or gfx or "unknown"


def _amd_sections(text: str) -> dict[int, dict[str, str]]:
    """``GPU: N`` blocks -> {N: {"SECTION.KEY": value}}, keys upper-cased with spaces as ``_``
    (older amd-smi prints ``Market Name``); a value may itself hold ``: ``."""
    gpus: dict[int, dict[str, str]] = {}
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []  # enclosing sections: (indent, name)
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip().upper().replace(" ", "_"), value.strip()
        if indent == 0:
            current = gpus.setdefault(int(value), {}) if key == "GPU" and value.isdigit() else None
            stack = []
            continue
        if current is None or not sep:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if value:
            current[".".join([name for _, name in stack] + [key])] = value
        else:
            stack.append((indent, key))
    return gpus


def parse_amd_smi(static_text: str, list_text: str = "") -> list[GpuInfo]:
    """``amd-smi static --asic [--vram]`` (and optionally ``amd-smi list``) text output."""
    static = _amd_sections(static_text)
    if not static and static_text.strip():
        raise GpuParseError(f"amd-smi: no 'GPU: N' blocks in {static_text.strip()[:200]!r}")
    listed = _amd_sections(list_text)
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
    return gpus


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
    try:
        if vendor == "nvidia":
            gpus = parse_nvidia_smi(text["nvidia-smi"], NVIDIA_FIELDS)
        else:
            gpus = parse_amd_smi(text.get("amd-smi-static", ""), text.get("amd-smi-list", ""))
    except GpuParseError as error:
        return GpuReport(vendor, (), error=str(error))
    return GpuReport(vendor, tuple(gpus))


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
