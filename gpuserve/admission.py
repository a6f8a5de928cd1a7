"""Admission checks: is every GPU of a host healthy enough to (re-)enter rotation?

Pure logic, no pyinfra: parsers turn the vendor tools' output (gathered on the host by
gpuserve.facts.admission) into observations, and `evaluate` turns observations and the
thresholds from group data (docs/gpu-stack.md, "Admission") into one `Finding` per GPU and
check. The GPU-stack layer (gpuserve.operations.gpu_stack.admission) fails a host with any failing
finding; the move pipeline's `verify` step calls the same operation.

NVIDIA sources (formats as NVIDIA documents them; fixtures in tests/unit/fixtures/gpus/):
    nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits   one line per GPU
    nvidia-smi nvlink -s                                           `GPU n: ...` + `\t Link k: 26.562 GB/s`
                                                                   or `\t Link k: <inactive>`
    the kernel log since boot                                      `NVRM: Xid (PCI:0000:18:00): 79, ...`
    /proc/driver/nvidia/gpus                                       bus IDs the driver probed
    systemctl is-active nvidia-fabricmanager                       NVSwitch hosts
    dcgmi diag -r 1 -j                                             with `dcgm: True`, where dcgmi is installed
AMD sources (amd-smi's text layout: `GPU: n` blocks with indented `KEY: value` lines):
    amd-smi metric --ecc --pcie                                    uncorrectable ECC count, PCIe width/speed
    amd-smi static --bus                                           the GPU's maximum PCIe width/speed
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuserve import schema

# The query, in this order. pci.bus_id ties kernel-log XIDs (PCI:0000:18:00) to a GPU.
QUERY_FIELDS = ("index", "uuid", "pci.bus_id", "persistence_mode", "ecc.mode.current",
                "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.failure",
                "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
QUERY = ",".join(QUERY_FIELDS)

# the admission_xid_fatal default (why these XIDs: gpuserve.schema)
DEFAULT_XID_FATAL = tuple(schema.default("admission_xid_fatal"))

CHECKS = ("visible", "persistence", "ecc_mode", "ecc_uncorrectable", "retired_pages_pending",
          "row_remap_failure", "pcie_gen", "pcie_width", "nvlink", "fabric_manager", "xid")


@dataclass(frozen=True)
class AdmissionSettings:
    """Thresholds from group data (validated by gpuserve.stack.settings_from)."""

    enabled: bool = schema.default("admission")
    max_uncorrectable_ecc: int = schema.default("admission_max_uncorrectable_ecc")
    allow_pending_retired_pages: bool = schema.default("admission_allow_pending_retired_pages")
    xid_fatal: tuple[int, ...] = DEFAULT_XID_FATAL
    pcie_min_gen: int | None = schema.default("admission_pcie_min_gen")      # None: the GPU's own maximum
    pcie_min_width: int | None = schema.default("admission_pcie_min_width")  # None: the GPU's own maximum


@dataclass(frozen=True)
class Finding:
    """One check on one GPU ("host" for host-wide checks such as the fabric manager)."""

    check: str
    gpu: str
    value: str
    threshold: str
    ok: bool

    def message(self, host: str) -> str:
        return f"{host}: {self.gpu}: {self.check} is {self.value} (allowed: {self.threshold})"


# --- value helpers ------------------------------------------------------------------------------
_NA = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", ""}


def number(text: str) -> int | None:
    """'0' -> 0; '[N/A]' / '[Not Supported]' -> None (nvidia-smi's words for a field it cannot read)."""
    text = text.strip()
    if text.lower() in _NA:
        return None
    m = re.fullmatch(r"(\d+)(?:\s*\S+)?", text)   # tolerate a unit if nounits was forgotten
    return int(m.group(1)) if m else None


def flag(text: str) -> bool | None:
    """Enabled/Disabled, Yes/No, 1/0 -> True/False; [N/A] -> None."""
    word = text.strip().lower()
    if word in ("enabled", "yes", "1", "true", "active"):
        return True
    if word in ("disabled", "no", "0", "false", "inactive"):
        return False
    return None


def pci_short(bus_id: str) -> str:
    """'00000000:18:00.0', '0000:18:00.0', 'PCI:0000:18:00' -> '0:18:00' (domain:bus:device).
    The domain stays: Grace-based trays put each GPU in its own domain at the same bus 01:00."""
    parts = bus_id.strip().lower().replace("pci:", "").split(":")
    if len(parts) >= 2:
        domain = parts[-3] if len(parts) >= 3 else "0"
        try:
            domain = f"{int(domain, 16):x}"
        except ValueError:
            pass
        return f"{domain}:{parts[-2]}:{parts[-1].split('.')[0]}"
    return bus_id.lower()


# --- NVIDIA parsers -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuHealth:
    """One row of `nvidia-smi --query-gpu=<QUERY>`: raw strings as the tool printed them."""

    index: int
    uuid: str
    bus_id: str
    values: Mapping[str, str]

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.bus_id})"


@dataclass(frozen=True)
class GpuHealthList:
    gpus: list[GpuHealth] = field(default_factory=list)
    error: str | None = None


def parse_gpu_health(lines: Iterable[str]) -> GpuHealthList:
    """`nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits` (stderr merged)."""
    gpus, other = [], []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(QUERY_FIELDS) and parts[0].isdigit():
            values = dict(zip(QUERY_FIELDS, parts))
            gpus.append(GpuHealth(int(parts[0]), parts[1], parts[2], values))
        elif line.strip():
            other.append(line.strip())
    return GpuHealthList(gpus, " ".join(other) or None)


@dataclass(frozen=True)
class NvLinks:
    """Per GPU index: link number -> active. Links print `Link 3: 26.562 GB/s` when up and
    `Link 3: <inactive>` when down."""

    links: dict[int, dict[int, bool]] = field(default_factory=dict)
    error: str | None = None


_NVLINK_GPU = re.compile(r"^GPU (\d+): ")
_NVLINK_LINK = re.compile(r"^\s*Link (\d+): (.*)$")


def parse_nvlink_status(lines: Iterable[str]) -> NvLinks:
    """`nvidia-smi nvlink -s` (stderr merged)."""
    links: dict[int, dict[int, bool]] = {}
    current, other = None, []
    for line in lines:
        m = _NVLINK_GPU.match(line)
        if m:
            current = int(m.group(1))
            links[current] = {}
            continue
        m = _NVLINK_LINK.match(line)
        if m and current is not None:
            state = m.group(2).strip().lower()
            links[current][int(m.group(1))] = "inactive" not in state and state not in _NA
        elif line.strip():
            other.append(line.strip())
    return NvLinks(links, " ".join(other) or None)


@dataclass(frozen=True)
class Xid:
    pci: str       # as logged: 0000:18:00
    code: int
    text: str      # the whole message, for the report


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),?(.*)")


def parse_xids(lines: Iterable[str]) -> list[Xid]:
    """Kernel log lines (`journalctl -o cat`, or dmesg with its [timestamp] prefix) -> the XIDs."""
    found = []
    for line in lines:
        m = _XID.search(line)
        if m:
            found.append(Xid(m.group(1), int(m.group(2)), line[m.start():].strip()))
    return found


@dataclass(frozen=True)
class DcgmDiag:
    """`dcgmi diag -r 1 -j`: per GPU (DCGM's entity id, nvidia-smi's index), the tests that did
    not pass as (test, status, warning). error: no report (host engine down, bad JSON)."""

    results: dict[int, list[tuple[str, str, str]]] = field(default_factory=dict)
    error: str | None = None


def _dcgm_gpu(entry: Mapping) -> int | None:
    for key in ("entity_id", "gpu_id", "gpu_ids"):   # DCGM 4 / DCGM 3 spellings
        value = entry.get(key)
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            group = entry.get("entity_group", "GPU")
            return int(value) if group == "GPU" else None
    return None


def parse_dcgm_diag(lines: Iterable[str]) -> DcgmDiag | None:
    """The JSON report, read leniently (DCGM 3 and 4 nest it differently): every object with a
    `status` under a test `name` counts for the GPU it names. None: dcgmi was not run."""
    import json

    text = "\n".join(lines).strip()
    if not text:
        return None
    start = text.find("{")
    try:
        report = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        return DcgmDiag(error=" ".join(text.split())[:300])
    results: dict[int, list[tuple[str, str, str]]] = {}

    def walk(node, test: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, test)
        elif isinstance(node, dict):
            test = str(node.get("name", test)) if "tests" not in node else test
            gpu = _dcgm_gpu(node)
            if "status" in node and gpu is not None:
                warnings = [str(w.get("warning") or w.get("message") or w) if isinstance(w, dict) else str(w)
                            for w in node.get("warnings", [])]
                results.setdefault(gpu, []).append((test, str(node["status"]), "; ".join(warnings)))
            for value in node.values():
                walk(value, test)

    walk(report, "")
    return DcgmDiag(results)


@dataclass(frozen=True)
class NvidiaHealth:
    """What gpuserve.facts.admission.NvidiaAdmission gathers on one host."""

    gpus: GpuHealthList
    nvlinks: NvLinks
    xids: list[Xid]
    driver_bus_ids: list[str]            # /proc/driver/nvidia/gpus
    fabric_manager: str | None = None    # `systemctl is-active nvidia-fabricmanager`; None: not asked
    dcgm: DcgmDiag | None = None         # None: not asked or dcgmi not installed


SECTION = "--- gpuserve-admission "


def split_sections(lines: Iterable[str]) -> dict[str, list[str]]:
    """The fact's output: `--- gpuserve-admission <name>` headers, each followed by its lines."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith(SECTION):
            current = line[len(SECTION):].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def parse_nvidia(lines: Iterable[str]) -> NvidiaHealth:
    s = split_sections(lines)
    fabric = s.get("fabric")
    return NvidiaHealth(
        gpus=parse_gpu_health(s.get("query", ["no output"])),
        nvlinks=parse_nvlink_status(s.get("nvlink", [])),
        xids=parse_xids(s.get("kernel", [])),
        driver_bus_ids=[x.strip() for x in s.get("driver", []) if x.strip()],
        fabric_manager=(fabric[0].strip() if fabric else "unknown") if fabric is not None else None,
        dcgm=parse_dcgm_diag(s.get("dcgm", [])),
    )


# --- NVIDIA checks ------------------------------------------------------------------------------
def _min(setting: int | None, gpu_max: int | None) -> int | None:
    return setting if setting is not None else gpu_max


def _gen(n: int | None) -> str:
    return "[N/A]" if n is None else f"Gen {n}"


def _width(n: int | None) -> str:
    return "[N/A]" if n is None else f"x{n}"


def evaluate_nvidia(a: AdmissionSettings, seen: NvidiaHealth, gpu_count: int, nvswitch: bool) -> list[Finding]:
    """Every check on every GPU; a Finding with ok=False for each problem. [] only for an
    empty host: a host with GPUs always gets its passing findings too (they are the report)."""
    out: list[Finding] = []
    gpus = seen.gpus.gpus
    # visible: the declared count, and every GPU the driver probed
    listed = {pci_short(g.bus_id) for g in gpus}
    lost = [b for b in seen.driver_bus_ids if pci_short(b) not in listed]
    for bus in lost:
        out.append(Finding("visible", f"GPU at {bus}", "not listed by nvidia-smi (probed by the driver)",
                           "listed", False))
    if len(gpus) != gpu_count:
        why = f" ({seen.gpus.error})" if seen.gpus.error else ""
        out.append(Finding("visible", "host", f"{len(gpus)} GPUs listed{why}", f"{gpu_count} (gpu_count)", False))
    for g in gpus:
        out.append(Finding("visible", g.label, "listed", "listed", True))
        v = g.values
        pm = flag(v["persistence_mode"])
        out.append(Finding("persistence", g.label, v["persistence_mode"], "Enabled", pm is True))
        ecc_on = flag(v["ecc.mode.current"])
        out.append(Finding("ecc_mode", g.label, v["ecc.mode.current"], "Enabled", ecc_on is True))
        unc = number(v["ecc.errors.uncorrected.volatile.total"])
        if ecc_on:
            out.append(Finding("ecc_uncorrectable", g.label,
                               f"{v['ecc.errors.uncorrected.volatile.total']} (volatile)",
                               f"<= {a.max_uncorrectable_ecc} (admission_max_uncorrectable_ecc)",
                               unc is not None and unc <= a.max_uncorrectable_ecc))
        pending = flag(v["retired_pages.pending"])   # [N/A] on row-remapping GPUs (Ampere and later)
        out.append(Finding("retired_pages_pending", g.label, v["retired_pages.pending"],
                           "Yes or No (admission_allow_pending_retired_pages)" if a.allow_pending_retired_pages
                           else "No or [N/A] (admission_allow_pending_retired_pages: False)",
                           a.allow_pending_retired_pages or pending is not True))
        failed = flag(v["remapped_rows.failure"])
        if failed is None and number(v["remapped_rows.failure"]) is not None:
            failed = number(v["remapped_rows.failure"]) > 0
        out.append(Finding("row_remap_failure", g.label, v["remapped_rows.failure"], "No, 0 or [N/A]",
                           failed is not True))
        for what, cur_key, max_key, setting, key in (
                ("pcie_gen", "pcie.link.gen.current", "pcie.link.gen.max", a.pcie_min_gen, "admission_pcie_min_gen"),
                ("pcie_width", "pcie.link.width.current", "pcie.link.width.max", a.pcie_min_width,
                 "admission_pcie_min_width")):
            cur, top = number(v[cur_key]), number(v[max_key])
            want = _min(setting, top)
            source = key if setting is not None else "the GPU's maximum"
            shown = _width if what == "pcie_width" else _gen
            ok = want is None or (cur is not None and cur >= want)
            out.append(Finding(what, g.label, f"{shown(cur)} (max {shown(top)})", f">= {shown(want)} ({source})", ok))
        if nvswitch:
            links = seen.nvlinks.links.get(g.index, {})
            down = sorted(k for k, up in links.items() if not up)
            value = (f"{len(links) - len(down)}/{len(links)} links active"
                     + (f" (down: {', '.join(f'link {k}' for k in down)})" if down else ""))
            if not links:
                value = f"no links listed{' (' + seen.nvlinks.error + ')' if seen.nvlinks.error else ''}"
            out.append(Finding("nvlink", g.label, value, "every link active", bool(links) and not down))
        xids = [x for x in seen.xids if pci_short(x.pci) == pci_short(g.bus_id)]
        fatal = [x for x in xids if x.code in a.xid_fatal]
        codes = ", ".join(f"Xid {x.code}" for x in xids) or "none"
        out.append(Finding("xid", g.label, f"{codes} since boot" + (f": {fatal[0].text}" if fatal else ""),
                           "no Xid in admission_xid_fatal", not fatal))
    for x in seen.xids:   # an XID of a GPU nvidia-smi does not list (fallen off the bus)
        if pci_short(x.pci) not in listed and x.code in a.xid_fatal:
            out.append(Finding("xid", f"GPU at {x.pci}", f"Xid {x.code} since boot: {x.text}",
                               "no Xid in admission_xid_fatal", False))
    if seen.dcgm is not None:
        out += _dcgm_findings(seen.dcgm, gpus)
    if nvswitch:
        state = seen.fabric_manager or "not checked"
        out.append(Finding("fabric_manager", "host", f"nvidia-fabricmanager {state}", "active", state == "active"))
    return out


def _dcgm_findings(diag: DcgmDiag, gpus: list[GpuHealth]) -> list[Finding]:
    if diag.error:
        return [Finding("dcgm_diag", "host", f"no report from dcgmi diag -r 1: {diag.error}", "a report", False)]
    out = []
    for g in gpus:
        results = diag.results.get(g.index)
        bad = [r for r in results or [] if r[1].lower() in ("fail", "error")]
        if results is None:
            value = "not in the report"
        elif bad:
            value = "Fail (" + "; ".join(f"{t}: {w}" if w else t for t, _, w in bad) + ")"
        else:
            value = "Pass"
        out.append(Finding("dcgm_diag", g.label, value, "Pass (dcgmi diag -r 1)", results is not None and not bad))
    return out


# --- AMD ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AmdGpuHealth:
    index: int
    values: Mapping[str, str]     # "ECC.TOTAL_UNCORRECTABLE_COUNT", "PCIE.WIDTH", "BUS.MAX_PCIE_WIDTH", ...

    @property
    def label(self) -> str:
        bdf = self.values.get("BUS.BDF") or self.values.get("BDF")
        return f"GPU {self.index}" + (f" ({bdf})" if bdf else "")


@dataclass(frozen=True)
class AmdHealth:
    gpus: list[AmdGpuHealth] = field(default_factory=list)
    error: str | None = None


def parse_amd_smi_blocks(lines: Iterable[str]) -> AmdHealth:
    """amd-smi's text layout (`metric --ecc --pcie`, `static --bus`, concatenated): `GPU: n`
    blocks, 4-space sections (`ECC:`, `PCIE:`, `BUS:`) with 8-space `KEY: value` lines. Blocks
    for the same GPU index merge; keys are `SECTION.KEY`."""
    merged: dict[int, dict[str, str]] = {}
    current: dict[str, str] | None = None
    section, other = "", []
    for line in lines:
        text = line.strip()
        m = re.fullmatch(r"GPU: (\d+)", text)
        if m:
            current = merged.setdefault(int(m.group(1)), {})
            section = ""
            continue
        key, sep, value = text.partition(":")
        if current is not None and sep and line[:1].isspace():
            indent = len(line) - len(line.lstrip())
            if not value.strip() and indent <= 4:
                section = key.strip()
            else:
                current[f"{section}.{key.strip()}" if section and indent > 4 else key.strip()] = value.strip()
        elif text and not line[:1].isspace():
            other.append(text)
    return AmdHealth([AmdGpuHealth(i, v) for i, v in sorted(merged.items())], " ".join(other) or None)


def _gt_s(text: str) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


# PCIe generation by transfer rate (GT/s), for thresholds given as a generation
PCIE_GEN_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def evaluate_amd(a: AdmissionSettings, seen: AmdHealth, gpu_count: int) -> list[Finding]:
    out: list[Finding] = []
    if len(seen.gpus) != gpu_count:
        why = f" ({seen.error})" if seen.error else ""
        out.append(Finding("visible", "host", f"{len(seen.gpus)} GPUs listed{why}", f"{gpu_count} (gpu_count)", False))
    for g in seen.gpus:
        v = g.values
        out.append(Finding("visible", g.label, "listed", "listed", True))
        unc = number(v.get("ECC.TOTAL_UNCORRECTABLE_COUNT", "N/A"))
        out.append(Finding("ecc_uncorrectable", g.label, v.get("ECC.TOTAL_UNCORRECTABLE_COUNT", "[N/A]"),
                           f"<= {a.max_uncorrectable_ecc} (admission_max_uncorrectable_ecc)",
                           unc is not None and unc <= a.max_uncorrectable_ecc))
        cur_w, max_w = number(v.get("PCIE.WIDTH", "N/A")), number(v.get("BUS.MAX_PCIE_WIDTH", "N/A"))
        want_w = _min(a.pcie_min_width, max_w)
        out.append(Finding("pcie_width", g.label, f"x{cur_w} (max x{max_w})",
                           f">= x{want_w} ({'admission_pcie_min_width' if a.pcie_min_width else 'the GPU maximum'})",
                           want_w is None or (cur_w is not None and cur_w >= want_w)))
        cur_s, max_s = _gt_s(v.get("PCIE.SPEED", "")), _gt_s(v.get("BUS.MAX_PCIE_SPEED", ""))
        want_s = PCIE_GEN_GTS.get(a.pcie_min_gen) if a.pcie_min_gen else max_s
        out.append(Finding("pcie_gen", g.label, f"{cur_s} GT/s (max {max_s} GT/s)",
                           f">= {want_s} GT/s ({'admission_pcie_min_gen' if a.pcie_min_gen else 'the GPU maximum'})",
                           want_s is None or (cur_s is not None and cur_s >= want_s)))
    return out


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]


def failure_message(host: str, findings: Iterable[Finding]) -> str:
    bad = failures(findings)
    return (f"{host}: GPU admission failed ({len(bad)} check(s)); the host must not enter rotation:\n"
            + "\n".join(f"  - {f.message(host)}" for f in bad))
