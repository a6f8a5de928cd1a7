"""The simulated part of a sandbox host: its GPUs. Everything else on a sandbox host is real.

Inside a host (all paths say "gpuserve-sim"):
    /etc/gpuserve-sim/hardware.json          what is "physically" there (written at host creation)
    /etc/gpuserve-sim/faults.json            hardware faults switched on from the control node
                                             (set_fault / `gpuserve sandbox fault`), read by the
                                             stand-in tools; transient ones are cleared at boot
    /usr/local/lib/gpuserve-sim/bin/         stand-in vendor tools (nvidia-smi, amd-smi), linked
                                             into /usr/bin by the stand-in packages only
    /var/lib/gpuserve-sim/                   state the stand-in packages write (the installed
                                             kernel-module version) and nvidia-smi -pm keeps
    /proc/driver                             bound read-only from <host dir>/sim/proc-driver,
                                             rebuilt at every boot: the "loaded" module appears
                                             only when a module was installed before that boot,
                                             like a real driver that needs a reboot; for AMD
                                             hosts /proc/driver/gpuserve-sim-amdgpu/version
                                             (read by the stand-in amd-smi only)
    /proc/sys/kernel/osrelease               bound read-only from <host dir>/sim/osrelease,
                                             written at every boot: the newest stand-in kernel
                                             installed (deploys/patch.py), else this machine's

The stand-in packages that install the "drivers" come from gpuserve_sandbox.standin_repo.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpuserve.hardware import GPU_MODELS, ProfileHardware
from gpuserve.hardware import PROFILES as HARDWARE
from gpuserve_sandbox.util import SandboxError

HARDWARE_FILE = "etc/gpuserve-sim/hardware.json"
FAULTS_FILE = "etc/gpuserve-sim/faults.json"
XID_UNIT = "etc/systemd/system/gpuserve-sim-xid.service"
BIN_DIR = "usr/local/lib/gpuserve-sim/bin"
STATE_DIR = "var/lib/gpuserve-sim"
NVIDIA_MODULE_VERSION_FILE = f"{STATE_DIR}/nvidia-module-version"
AMDGPU_MODULE_VERSION_FILE = f"{STATE_DIR}/amdgpu-module-version"
FILES = Path(__file__).parent / "files"


# how each vendor's tool prints a model's name (nvidia-smi "name", amd-smi "MARKET_NAME")
TOOL_NAMES = {"nvidia": "NVIDIA {}", "amd": "AMD Instinct {}"}


@dataclass(frozen=True)
class SimProfile:
    """Simulated hardware of one host; names follow the inventory groups. The machine itself (model,
    count, NVSwitch) is the recipe profile's reference machine, gpuserve.hardware.PROFILES; this adds
    only what the simulated tools print beyond it."""

    hardware: ProfileHardware | None  # None: no GPU (a monitor or gateway host)
    memory_mib: int = 0    # per GPU, as the vendor tool prints it
    nvswitch_chips: int = 0   # NVSwitch chips on the baseboard (HGX / NVL) when hardware.nvswitch
    gfx: str = ""          # AMD: the gfx target amd-smi reports

    @property
    def vendor(self) -> str:   # nvidia | amd | none
        return GPU_MODELS[self.hardware.gpu_model].vendor if self.hardware and self.count else "none"

    @property
    def gpu_name(self) -> str:
        return TOOL_NAMES[self.vendor].format(self.hardware.gpu_model) if self.vendor != "none" else ""

    @property
    def count(self) -> int:
        return self.hardware.gpu_count if self.hardware else 0

    @property
    def nvswitch_count(self) -> int:   # 0 = PCIe-style host
        return self.nvswitch_chips if self.hardware and self.hardware.nvswitch else 0

    @property
    def nvlink_gen(self) -> int:
        return GPU_MODELS[self.hardware.gpu_model].nvlink_gen if self.nvswitch_count else 0


PROFILES: dict[str, SimProfile] = {
    # HGX H200: 8 GPUs on 4 third-generation NVSwitch chips, NVLink 4
    "hopper_x8": SimProfile(HARDWARE["hopper_x8"], 143771, nvswitch_chips=4),
    # GB200 compute tray: 4 GPUs, NVLink 5 switch fabric (needs fabric manager + nvlsm)
    "blackwell_x4": SimProfile(HARDWARE["blackwell_x4"], 189471, nvswitch_chips=2),
    "mi355x_x4": SimProfile(HARDWARE["mi355x_x4"], 294896, gfx="gfx950"),
    "cpu": SimProfile(HARDWARE["cpu"]),
    # a monitor host (group monitor): Prometheus and alertmanager, no GPU, no engine
    "monitor": SimProfile(None),
    # the fleet gateway (docs/gateway.md): no GPU, serves no model, runs smg
    "gateway": SimProfile(None),
}


@dataclass(frozen=True)
class HostSpec:
    """One requested host: a profile, optionally without its NVSwitches (``hopper_x8:no-nvswitch``)."""

    profile: str
    nvswitch: bool

    @classmethod
    def parse(cls, text: str) -> "HostSpec":
        name, _, variant = text.partition(":")
        if name not in PROFILES:
            raise SandboxError(f"unknown sandbox profile {name!r}; known: {', '.join(PROFILES)}")
        if variant not in ("", "no-nvswitch"):
            raise SandboxError(f"unknown variant {variant!r} in {text!r}; known: no-nvswitch")
        return cls(name, PROFILES[name].nvswitch_count > 0 and variant != "no-nvswitch")

    def __str__(self) -> str:
        has = PROFILES[self.profile].nvswitch_count > 0
        return self.profile + (":no-nvswitch" if has and not self.nvswitch else "")


def hardware(spec: HostSpec, host_name: str) -> dict:
    """The hardware.json of one host: deterministic per host name, so reruns see the same GPUs."""
    p = PROFILES[spec.profile]
    gpus = [
        {
            "index": i,
            "name": p.gpu_name,
            "memory_mib": p.memory_mib,
            "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{host_name}.gpu{i}.gpuserve-sim')}",
            **({"gfx": p.gfx} if p.gfx else {}),
        }
        for i in range(p.count)
    ]
    nvswitches = [f"0000:{0xA0 + i:02x}:00.0" for i in range(p.nvswitch_count)] if spec.nvswitch else []
    return {
        "simulated": "gpuserve sandbox: these GPUs do not exist",
        "profile": str(spec),
        "vendor": p.vendor,
        "gpus": gpus,
        "nvswitches": nvswitches,
        "nvlink_gen": p.nvlink_gen if spec.nvswitch else 0,
    }


def install(root: Path, spec: HostSpec, host_name: str) -> None:
    """Write the simulated hardware and the stand-in tools into a host's root."""
    (root / HARDWARE_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / HARDWARE_FILE).write_text(json.dumps(hardware(spec, host_name), indent=2) + "\n")
    bin_dir = root / BIN_DIR
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("nvidia-smi", "amd-smi", "kmsg", "dcgmi", "dcgm-exporter"):
        shutil.copyfile(FILES / f"sim-{tool}", bin_dir / tool)
        (bin_dir / tool).chmod(0o755)
    (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    # persistent XID faults are logged again at every boot, like a GPU that fails again each time
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (root / XID_UNIT).write_text(XID_UNIT_TEXT)
    link = wants / Path(XID_UNIT).name
    if not link.is_symlink():
        link.symlink_to(f"/{XID_UNIT}")


XID_UNIT_TEXT = f"""[Unit]
Description=gpuserve sandbox: log the simulated GPUs' persistent XID faults (there is no GPU here)
After=systemd-journald.service

[Service]
Type=oneshot
ExecStart=/{BIN_DIR}/kmsg replay

[Install]
WantedBy=multi-user.target
"""


# --- faults -------------------------------------------------------------------------------------
# name -> what the stand-in tools show for the GPU (value: the number the fault uses, if any)
FAULTS = {
    "missing": "nvidia-smi / amd-smi no longer list the GPU (the driver still probed it)",
    "ecc-uncorrectable": "volatile uncorrectable ECC count = value (default 1)",
    "retired-pages": "retired_pages.pending = Yes (a page waits for retirement at the next reset)",
    "row-remap-failure": "remapped_rows.failure = 1 (a row remapping failed: the GPU needs service)",
    "pcie-gen": "PCIe link trained at generation value (default 3) instead of its maximum",
    "pcie-width": "PCIe link trained at width value (default 8) instead of its maximum",
    "nvlink-down": "NVLink link value (default 0) of the GPU <inactive>",
    "xid": "an `NVRM: Xid (PCI:...): value, ...` kernel log line (default 79, fallen off the bus)",
}
FAULT_DEFAULTS = {"ecc-uncorrectable": 1, "pcie-gen": 3, "pcie-width": 8, "nvlink-down": 0, "xid": 79}
XID_TEXT = {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has been detected.",
            94: "Contained ECC error.", 95: "Uncontained ECC error.", 74: "NVLink Error."}


def xid_line(bus_id: str, code: int) -> str:
    """The kernel log line NVIDIA's driver writes: `NVRM: Xid (PCI:0000:48:00): 79, pid=..., ...`."""
    pci = bus_id[4:].lower().rsplit(".", 1)[0] if bus_id.count(":") == 2 else bus_id.lower()
    return (f"NVRM: Xid (PCI:{pci}): {code}, pid=0, name=gpuserve-sim, "
            f"{XID_TEXT.get(code, 'simulated fault.')}")


def read_faults(root: Path) -> list[dict]:
    try:
        return json.loads((root / FAULTS_FILE).read_text())["faults"]
    except (FileNotFoundError, ValueError, KeyError):
        return []


def write_faults(root: Path, faults: list[dict]) -> None:
    path = root / FAULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"simulated": "gpuserve sandbox: hardware faults of GPUs that do not exist",
                               "faults": faults}, indent=2) + "\n")
    tmp.rename(path)


def add_fault(root: Path, gpu: int, fault: str, value: int | None = None, persistent: bool = True) -> dict:
    """Switch a fault on for GPU `gpu` (its index in hardware.json). Returns the fault entry;
    a fault of the same name on the same GPU is replaced."""
    if fault not in FAULTS:
        raise SandboxError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    gpus = json.loads((root / HARDWARE_FILE).read_text())["gpus"]
    if not 0 <= gpu < len(gpus):
        raise SandboxError(f"no GPU {gpu} on this host (it has {len(gpus)}: 0-{len(gpus) - 1})")
    entry = {"gpu": gpu, "fault": fault, "persistent": persistent}
    if fault in FAULT_DEFAULTS:
        entry["value"] = FAULT_DEFAULTS[fault] if value is None else int(value)
    if fault == "xid":
        entry["line"] = xid_line(gpus[gpu]["pci_bus_id"], entry["value"])
    faults = [f for f in read_faults(root) if not (f["gpu"] == gpu and f["fault"] == fault)]
    write_faults(root, faults + [entry])
    return entry


def clear_faults(root: Path, gpu: int | None = None, fault: str | None = None) -> list[dict]:
    """Switch faults off (all, one GPU's, or one kind); returns the ones removed. A logged XID
    stays in the kernel log until the host reboots, as on real hardware."""
    keep, gone = [], []
    for f in read_faults(root):
        hit = (gpu is None or f["gpu"] == gpu) and (fault is None or f["fault"] == fault)
        (gone if hit else keep).append(f)
    write_faults(root, keep)
    return gone


NVIDIA_VERSION_TEXT = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(gpuserve-sim@sandbox)  simulated\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
)


OSRELEASE_FILE = "osrelease"   # beside proc-driver; bound over the host's /proc/sys/kernel/osrelease


def booted_kernel(root: Path) -> str | None:
    """The stand-in kernel a host boots (gpuserve_sandbox.standin_repo, "kernels"): the newest
    /boot/vmlinuz-* of its root, as GRUB would; None when none is installed."""
    from gpuserve.patch import newest
    return newest(p.name[len("vmlinuz-"):] for p in (root / "boot").glob("vmlinuz-*"))


def module_built_for(root: Path, kernel: str) -> bool:
    """Whether the stand-in DKMS built the NVIDIA module for ``kernel`` (the link real DKMS makes)."""
    return (root / f"var/lib/dkms/nvidia/kernel-{kernel}-x86_64").is_symlink()


def on_boot(root: Path, proc_driver: Path) -> None:
    """Rebuild /proc/driver for a boot: load the kernel module that is installed right now. With a
    stand-in kernel installed, the host "runs" the newest one (its release is written to the file
    bound over /proc/sys/kernel/osrelease), and the NVIDIA module loads only if it was built for
    that kernel, as on a real host; without one it runs this machine's kernel."""
    import os

    shutil.rmtree(proc_driver, ignore_errors=True)
    proc_driver.mkdir(parents=True)
    kernel = booted_kernel(root)
    (proc_driver.parent / OSRELEASE_FILE).write_text((kernel or os.uname().release) + "\n")
    # persistence mode does not survive a module reload (nvidia-persistenced sets it again)
    (root / STATE_DIR / "persistence-mode").unlink(missing_ok=True)
    # transient faults end with the boot; persistent ones are the hardware's and stay
    faults = read_faults(root)
    if any(not f.get("persistent", True) for f in faults):
        write_faults(root, [f for f in faults if f.get("persistent", True)])
    try:
        hw = json.loads((root / HARDWARE_FILE).read_text())
    except FileNotFoundError:
        return
    amdgpu = root / AMDGPU_MODULE_VERSION_FILE
    if hw["vendor"] == "amd" and amdgpu.is_file():
        (proc_driver / "gpuserve-sim-amdgpu").mkdir()
        (proc_driver / "gpuserve-sim-amdgpu" / "version").write_text(amdgpu.read_text())
    module = root / NVIDIA_MODULE_VERSION_FILE
    if hw["vendor"] != "nvidia" or not module.is_file():
        return
    if kernel is not None and not module_built_for(root, kernel):
        return   # no module for the kernel it booted: no driver, as on a real host
    version = module.read_text().strip()
    nv = proc_driver / "nvidia"
    (nv / "gpus").mkdir(parents=True)
    (nv / "version").write_text(NVIDIA_VERSION_TEXT.format(version=version))
    for gpu in hw["gpus"]:
        info = nv / "gpus" / gpu["pci_bus_id"][4:].lower() / "information"
        info.parent.mkdir(parents=True)
        info.write_text(f"Model: \t\t {gpu['name']}\nGPU UUID: \t {gpu['uuid']}\n"
                        f"Bus Location: \t {gpu['pci_bus_id'][4:].lower()}\n")
    if hw["nvswitches"]:
        devices = proc_driver / "nvidia-nvswitch" / "devices"
        devices.mkdir(parents=True)
        for bdf in hw["nvswitches"]:
            (devices / bdf).mkdir()
            (devices / bdf / "information").write_text(f"Bus Location: \t {bdf}\nsimulated\n")


if __name__ == "__main__":  # called by nspawn-loop.sh before every boot of a host
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "on-boot":
        sys.exit("usage: python -m gpuserve_sandbox.simgpu on-boot ROOT PROC_DRIVER_DIR")
    on_boot(Path(sys.argv[2]), Path(sys.argv[3]))
