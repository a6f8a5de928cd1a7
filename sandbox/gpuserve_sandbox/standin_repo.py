"""Stand-in NVIDIA and AMD apt repositories for sandbox hosts, served on the instance's bridge.

Sandbox hosts cannot reach NVIDIA's or AMD's repositories, so the sandbox serves its own: laid
out like the real ones, signed with a key generated here, holding stand-in packages with the
real names and versions (Description: "gpuserve sandbox stand-in ..."). Their maintainer scripts
drive the simulated GPU (see simgpu): the kernel module packages record the module version that
"loads" at the next boot, nvidia-smi / amd-smi are linked to the simulated tools, libcuda.so.1 is
a small C library (files/standin/libcuda.c) answering cuInit/cuDeviceGetCount from the simulated
state, and the daemons (fabric manager, persistenced, DCGM) refuse to start when the real ones
would, e.g. a fabric manager whose version differs from the loaded driver's.

    http://<bridge>:8081/cuda/repos/debian12/x86_64/          flat repository, as NVIDIA's CUDA one
        cuda-keyring_1.1-1_all.deb                            keyring + sources entry for this URL
    http://<bridge>:8081/radeon/rocm/rocm.gpg.key             AMD's key location
    http://<bridge>:8081/radeon/rocm/apt/<release> jammy main
    http://<bridge>:8081/radeon/amdgpu/<release>/ubuntu jammy main

group_data/sandbox.py points cuda_repo_url / rocm_repo_url here; the deploy code is the one
production runs. Built under <state dir>/standin-repo (rebuilt when its inputs change) and served
by `gpuserve sandbox up` until `down`. Needs gcc, dpkg-deb, dpkg-scanpackages and gpg.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

from gpuserve import stack
from gpuserve_sandbox import network
from gpuserve_sandbox.util import SandboxError, file_lock, log, run

PORT = 8081
STANDIN = Path(__file__).parent / "files" / "standin"
MAINTAINER = "gpuserve sandbox <stand-in@gpuserve.invalid>"
# Two branches, and two releases in the first, so tests can bump a branch and check that a
# pinned host does not drift to the newest release of its branch.
NVIDIA_DRIVERS = ("580.95.05", "580.105.08", "590.48.01")
CUDA_OS = "debian12"
CUDA_ARCH = "x86_64"
TOOLKIT_VERSION = "13.0.2-1"
NVLSM_VERSION = "2025.06.6-1"
DCGM_VERSION = "1:4.4.1-1"
DCGM_EXPORTER_VERSION = "4.4.1-4.6.0-1"
# ROCm release -> (rocm package version, amdgpu-dkms version), jammy builds (Debian 12 uses jammy)
ROCM_RELEASES = {
    "7.1": ("7.1.1.70101-38~22.04", "1:6.14.14.30100100-2212064.22.04"),
    "7.2": ("7.2.0.70200-43~22.04", "1:6.16.6.30200000-2238411.22.04"),
}
ROCM_SUITE = "jammy"
SIM_BIN = "/usr/local/lib/gpuserve-sim/bin"
SIM_STATE = "/var/lib/gpuserve-sim"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def cuda_repo_url(instance: int | None = None) -> str:
    """cuda_repo_url for sandbox hosts of an instance (default: $GPUSERVE_SANDBOX_INSTANCE)."""
    return f"http://{network.bridge_ip(_instance(instance))}:{PORT}/cuda/repos"


def rocm_repo_url(instance: int | None = None) -> str:
    return f"http://{network.bridge_ip(_instance(instance))}:{PORT}/radeon"


def _instance(instance: int | None) -> int:
    return int(os.environ.get("GPUSERVE_SANDBOX_INSTANCE", "0")) if instance is None else instance


# --- packages -----------------------------------------------------------------------------------
@dataclass
class Deb:
    name: str
    version: str
    summary: str                      # what the real package is
    arch: str = "amd64"
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    files: dict[str, bytes | str] = field(default_factory=dict)   # path -> content
    executables: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)           # path -> target
    scripts: dict[str, str] = field(default_factory=dict)         # postinst, postrm
    conffiles: list[str] = field(default_factory=list)

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_{self.arch}.deb"

    def control(self) -> str:
        lines = [f"Package: {self.name}", f"Version: {self.version}", f"Architecture: {self.arch}",
                 f"Maintainer: {MAINTAINER}", "Section: gpuserve-sandbox", "Priority: optional"]
        if self.depends:
            lines.append(f"Depends: {', '.join(self.depends)}")
        if self.conflicts:
            lines.append(f"Conflicts: {', '.join(self.conflicts)}")
        lines.append(f"Description: gpuserve sandbox stand-in for {self.summary}\n"
                     " Not the vendor's package: the real name and version with stand-in contents,\n"
                     " for gpuserve's sandbox hosts, where the GPUs are simulated.")
        return "\n".join(lines) + "\n"


def build_deb(deb: Deb, out_dir: Path, work: Path) -> Path:
    root = work / deb.name / deb.version.replace(":", "_")
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(deb.control())
    for name, text in deb.scripts.items():
        (root / "DEBIAN" / name).write_text("#!/bin/sh\nset -e\n" + text)
        (root / "DEBIAN" / name).chmod(0o755)
    if deb.conffiles:
        (root / "DEBIAN/conffiles").write_text("".join(f"{c}\n" for c in deb.conffiles))
    for path, content in deb.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        target.chmod(0o755 if path in deb.executables else 0o644)
    for path, dest in deb.links.items():
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dest)
    out = out_dir / deb.filename
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out)])
    return out


def _daemon(what: str, version: str, pidfile: str, checks: str = "") -> str:
    text = (STANDIN / "daemon.sh").read_text()
    return (text.replace("@WHAT@", what).replace("@VERSION@", version)
            .replace("@PIDFILE@", pidfile).replace("@CHECKS@", checks.strip()))


def _unit(description: str, exec_start: str, pidfile: str) -> str:
    return (f"[Unit]\nDescription={description} (gpuserve sandbox stand-in)\n\n"
            f"[Service]\nType=forking\nPIDFile={pidfile}\nExecStart={exec_start}\n"
            f"ExecStopPost=/bin/rm -f {pidfile}\n\n[Install]\nWantedBy=multi-user.target\n")


RELOAD_UNITS = "if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\n"

FM_CHECKS = """
if [ "$loaded" != "$VERSION" ]; then
  echo "fabric manager NVIDIA GPU driver interface version $VERSION don't match with driver version $loaded. Please update with matching NVIDIA driver package." >&2
  exit 1
fi
if [ -z "$(ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null)" ]; then
  echo "fabric manager: no NVSwitch devices found (this is not an NVSwitch system)" >&2
  exit 1
fi
if grep -q '"nvlink_gen": 5' /etc/gpuserve-sim/hardware.json && ! command -v nvlsm >/dev/null; then
  echo "fabric manager: an NVLink 5 fabric needs the NVLink subnet manager (nvlsm)" >&2
  exit 1
fi
"""


def nvidia_driver_debs(version: str, libcuda: bytes) -> list[Deb]:
    """The packages of one driver release, with the real ones' names and '>=' dependencies."""
    v, full = version, f"{version}-1"
    module_state = (f"echo {v} > {SIM_STATE}/nvidia-module-version\n", f"rm -f {SIM_STATE}/nvidia-module-version\n")

    def kernel(name: str, other: str, what: str) -> Deb:
        return Deb(name, full, f"the NVIDIA {what} kernel module sources (DKMS)", conflicts=[other],
                   files={f"/usr/share/doc/{name}/gpuserve-sandbox": f"stand-in kernel module {v}\n",
                          **sim_dkms_files(v)},
                   executables=set(sim_dkms_files(v)),
                   scripts={"postinst": f"mkdir -p {SIM_STATE}\n" + module_state[0] + SIM_DKMS_POSTINST,
                            "postrm": f'if [ "$1" = remove ] || [ "$1" = purge ]; then {module_state[1].strip()}; '
                                      f"{SIM_DKMS_REMOVE}; fi\n"})

    fm_pid = "/run/nvidia-fabricmanager/nv-fabricmanager.pid"
    pd_pid = "/run/nvidia-persistenced/nvidia-persistenced.pid"
    return [
        kernel("nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "open"),
        kernel("nvidia-kernel-dkms", "nvidia-kernel-open-dkms", "proprietary"),
        Deb("libcuda1", full, "the NVIDIA CUDA driver library",
            files={f"{LIBDIR}/libcuda.so.{v}": libcuda}, links={f"{LIBDIR}/libcuda.so.1": f"libcuda.so.{v}"}),
        Deb("nvidia-smi", full, "the NVIDIA System Management Interface",
            links={"/usr/bin/nvidia-smi": f"{SIM_BIN}/nvidia-smi"}),
        Deb("nvidia-persistenced", full, "the NVIDIA persistence daemon",
            files={"/usr/bin/nvidia-persistenced": _daemon(
                       "nvidia-persistenced", v, pd_pid, f"{SIM_BIN}/nvidia-smi -pm 1 >/dev/null"),
                   "/lib/systemd/system/nvidia-persistenced.service": _unit(
                       "NVIDIA Persistence Daemon", "/usr/bin/nvidia-persistenced", pd_pid)},
            executables={"/usr/bin/nvidia-persistenced"}, scripts={"postinst": RELOAD_UNITS}),
        Deb("nvidia-driver", full, "the NVIDIA driver metapackage",
            depends=[f"libcuda1 (>= {v})", f"nvidia-smi (>= {v})"]),
        Deb("nvidia-open", full, "the NVIDIA driver with open kernel modules (metapackage)",
            depends=[f"nvidia-driver (>= {v})", f"nvidia-kernel-open-dkms (>= {v})"]),
        Deb("cuda-drivers", full, "the NVIDIA driver with proprietary kernel modules (metapackage)",
            depends=[f"nvidia-driver (>= {v})", f"nvidia-kernel-dkms (>= {v})"]),
        Deb("nvidia-fabricmanager", full, "NVIDIA Fabric Manager (NVSwitch systems)",
            files={"/usr/bin/nv-fabricmanager": _daemon("nv-fabricmanager", v, fm_pid, FM_CHECKS),
                   "/lib/systemd/system/nvidia-fabricmanager.service": _unit(
                       "NVIDIA fabric manager service", "/usr/bin/nv-fabricmanager", fm_pid)},
            executables={"/usr/bin/nv-fabricmanager"}, scripts={"postinst": RELOAD_UNITS}),
        Deb("libnvidia-nscq", full, "the NVSwitch configuration and query library",
            files={f"{LIBDIR}/libnvidia-nscq.so.{v}": "stand-in\n"}),
    ]


def nvidia_debs(libcuda: bytes, keyring: bytes, sources: tuple[str, str]) -> list[Deb]:
    debs = [d for v in NVIDIA_DRIVERS for d in nvidia_driver_debs(v, libcuda)]
    for branch in sorted({v.split(".")[0] for v in NVIDIA_DRIVERS}):
        prefs = ("Package: *nvidia* libcuda* libnv*\n"
                 f"Pin: version {branch}.*\nPin-Priority: 1000\n")
        debs.append(Deb(f"nvidia-driver-pinning-{branch}", "1.0-1", f"NVIDIA's driver branch {branch} lock",
                        arch="all", conflicts=[f"nvidia-driver-pinning-{b}" for b in ("580", "590") if b != branch],
                        files={f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}": prefs}))
    hostengine_pid = "/run/nvidia-dcgm/nv-hostengine.pid"
    debs += [
        Deb("cuda-toolkit-13-0", TOOLKIT_VERSION, "the CUDA 13.0 toolkit (metapackage)",
            files={"/usr/local/cuda-13.0/version.json": '{"cuda": {"version": "13.0.2"}}\n'}),
        Deb("nvlsm", NVLSM_VERSION, "the NVLink subnet manager (NVLink 5 fabrics)",
            files={"/usr/sbin/nvlsm": "#!/bin/sh\necho 'nvlsm: gpuserve sandbox stand-in'\n"},
            executables={"/usr/sbin/nvlsm"}),
        Deb("datacenter-gpu-manager-4-core", DCGM_VERSION, "NVIDIA DCGM 4 (core: nv-hostengine, dcgmi)",
            files={"/usr/bin/nv-hostengine": _daemon("nv-hostengine", "4.4.1", hostengine_pid),
                   "/lib/systemd/system/nvidia-dcgm.service": _unit(
                       "NVIDIA DCGM service", "/usr/bin/nv-hostengine", hostengine_pid)},
            links={"/usr/bin/dcgmi": f"{SIM_BIN}/dcgmi"},
            executables={"/usr/bin/nv-hostengine"}, scripts={"postinst": RELOAD_UNITS}),
        Deb("datacenter-gpu-manager-4-cuda13", DCGM_VERSION, "NVIDIA DCGM 4 for CUDA 13",
            depends=[f"datacenter-gpu-manager-4-core (= {DCGM_VERSION})"],
            files={"/usr/share/doc/datacenter-gpu-manager-4-cuda13/gpuserve-sandbox": "stand-in\n"}),
        Deb("datacenter-gpu-manager-exporter", DCGM_EXPORTER_VERSION, "NVIDIA DCGM exporter (Prometheus, :9400)",
            depends=["datacenter-gpu-manager-4-core"],
            links={"/usr/bin/dcgm-exporter": f"{SIM_BIN}/dcgm-exporter"},
            files={"/lib/systemd/system/nvidia-dcgm-exporter.service": (
                "[Unit]\nDescription=NVIDIA DCGM exporter (gpuserve sandbox stand-in)\nAfter=nvidia-dcgm.service\n\n"
                "[Service]\nExecStart=/usr/bin/dcgm-exporter\nRestart=on-failure\n\n"
                "[Install]\nWantedBy=multi-user.target\n")},
            scripts={"postinst": RELOAD_UNITS}),
        Deb("cuda-keyring", "1.1-1", "the CUDA repository keyring and sources entry", arch="all",
            files={stack.CUDA_KEYRING: keyring, sources[0]: sources[1]}, conffiles=[sources[0]]),
    ]
    return debs


def rocm_debs(release: str) -> tuple[list[Deb], list[Deb]]:
    """(amdgpu repository, rocm repository) packages of one ROCm release."""
    rocm_version, dkms_version = ROCM_RELEASES[release]
    module = stack.upstream(dkms_version)
    amdgpu = [Deb("amdgpu-dkms", dkms_version, "the amdgpu kernel driver (DKMS)",
                  files={"/usr/share/doc/amdgpu-dkms/gpuserve-sandbox": f"stand-in amdgpu {module}\n"},
                  scripts={"postinst": f"mkdir -p {SIM_STATE}\necho {module} > {SIM_STATE}/amdgpu-module-version\n",
                           "postrm": f'if [ "$1" = remove ] || [ "$1" = purge ]; then '
                                     f"rm -f {SIM_STATE}/amdgpu-module-version; fi\n"})]
    rocm = [
        Deb("rocm-core", rocm_version, f"ROCm {release} core",
            files={"/opt/rocm/.info/version": stack.upstream(rocm_version).rsplit(".", 1)[0] + "\n"}),
        Deb("amd-smi-lib", rocm_version, "the AMD System Management Interface",
            links={"/usr/bin/amd-smi": f"{SIM_BIN}/amd-smi"}),
        Deb("rocm", rocm_version, f"ROCm {release} (metapackage)",
            depends=[f"rocm-core (= {rocm_version})", f"amd-smi-lib (= {rocm_version})"]),
    ]
    return amdgpu, rocm


# --- kernels (deploys/patch.py) ------------------------------------------------------------------
# Stand-ins of Debian's kernel packages, flavour "gpuserve-sim": linux-image-<abi>-gpuserve-sim
# (a /boot/vmlinuz-<release> that nothing boots: sandbox hosts share this machine's kernel),
# linux-headers-<abi>-gpuserve-sim (what DKMS needs to build a module for that kernel) and the
# metapackages linux-image-gpuserve-sim / linux-headers-gpuserve-sim that follow the newest ABI,
# as linux-image-amd64 does. A sandbox host "runs" the newest stand-in kernel installed when it
# booted: gpuserve_sandbox.simgpu.on_boot writes that release into the file bound over the host's
# /proc/sys/kernel/osrelease, and loads the stand-in NVIDIA module only if the stand-in DKMS below
# built it for that kernel. Served as a stand-in of the Debian security archive; kernels are
# published one at a time (publish_kernel), as the archive publishes them.
KERNEL_FLAVOUR = "gpuserve-sim"
KERNELS = (("6.1.0-40", "6.1.153-1"), ("6.1.0-41", "6.1.158-1"), ("6.1.0-42", "6.1.162-1"))
KERNEL_REPO = "debian-security-sim"
KERNEL_SOURCE = "/etc/apt/sources.list.d/gpuserve-sim-debian-security.list"
DKMS_BUILD = "/usr/lib/gpuserve-sim/dkms-build"
DKMS_HOOKS = ("/etc/kernel/postinst.d/gpuserve-sim-dkms", "/etc/kernel/header_postinst.d/gpuserve-sim-dkms")


def kernel_release(abi: str) -> str:
    return f"{abi}-{KERNEL_FLAVOUR}"


def sim_dkms_files(version: str) -> dict[str, str]:
    """The stand-in of DKMS that the stand-in NVIDIA module packages carry: `dkms-build <release>`
    "builds" the module for a kernel whose headers are installed (the link
    /lib/modules/<release>/build), recording it where real DKMS does (/var/lib/dkms/nvidia/
    kernel-<release>-x86_64 -> <version>/<release>/x86_64); without headers it says what real
    DKMS says and builds nothing. Kernel and headers packages call it through the hooks."""
    build = f"""#!/bin/sh
# gpuserve sandbox stand-in of `dkms autoinstall -k RELEASE` for the NVIDIA module {version}
K=$1; V={version}
[ -e /boot/vmlinuz-$K ] || exit 0
if [ ! -e /lib/modules/$K/build ]; then
  echo "Error! Your kernel headers for kernel $K cannot be found at /lib/modules/$K/build or /lib/modules/$K/source. (gpuserve sandbox stand-in of DKMS)" >&2
  echo "dkms: WARNING: Linux headers are missing, which may explain the above failures. please install the linux-headers-$K package to fix this" >&2
  exit 0
fi
d=/var/lib/dkms/nvidia/$V/$K/x86_64/module
mkdir -p $d /lib/modules/$K/updates/dkms
echo "gpuserve sandbox stand-in of nvidia.ko $V for $K" > $d/nvidia.ko
cp $d/nvidia.ko /lib/modules/$K/updates/dkms/nvidia.ko
ln -sfn $V/$K/x86_64 /var/lib/dkms/nvidia/kernel-$K-x86_64
echo "nvidia/$V, $K, x86_64: installed (gpuserve sandbox stand-in)"
"""
    hook = f'#!/bin/sh\n# gpuserve sandbox stand-in of the dkms kernel hook\nexec {DKMS_BUILD} "$1"\n'
    return {DKMS_BUILD: build, **{h: hook for h in DKMS_HOOKS}}


# on (re)install: the old version's builds go, every installed stand-in kernel gets this one
SIM_DKMS_POSTINST = (f"rm -rf /var/lib/dkms/nvidia /lib/modules/*/updates/dkms/nvidia.ko\n"
                     f"for f in /boot/vmlinuz-*; do [ -e \"$f\" ] && {DKMS_BUILD} \"${{f#/boot/vmlinuz-}}\"; done; true\n")
SIM_DKMS_REMOVE = "rm -rf /var/lib/dkms/nvidia /lib/modules/*/updates/dkms/nvidia.ko"


def kernel_debs(abi: str, version: str) -> list[Deb]:
    """One kernel ABI: image, headers and the two metapackages at its version."""
    rel = kernel_release(abi)
    hook = f'for h in /etc/kernel/{{d}}/gpuserve-sim-*; do [ -x "$h" ] && "$h" {rel} /boot/vmlinuz-{rel}; done; true\n'
    return [
        Deb(f"linux-image-{rel}", version, f"the Linux kernel {rel} image (simulated: nothing boots it)",
            files={f"/boot/vmlinuz-{rel}": f"gpuserve sandbox stand-in kernel {rel}\n",
                   f"/lib/modules/{rel}/modules.order": ""},
            scripts={"postinst": hook.format(d="postinst.d"),
                     "postrm": f'if [ "$1" = remove ] || [ "$1" = purge ]; then '
                               f"rm -rf /lib/modules/{rel}/updates /var/lib/dkms/*/kernel-{rel}-*; fi\n"}),
        Deb(f"linux-headers-{rel}", version, f"the Linux kernel {rel} headers (simulated)",
            files={f"/usr/src/linux-headers-{rel}/Makefile": f"# gpuserve sandbox stand-in headers {rel}\n"},
            links={f"/lib/modules/{rel}/build": f"/usr/src/linux-headers-{rel}"},
            scripts={"postinst": hook.format(d="header_postinst.d")}),
        Deb(f"linux-image-{KERNEL_FLAVOUR}", version, "the newest Linux kernel image (simulated, metapackage)",
            depends=[f"linux-image-{rel} (= {version})"]),
        Deb(f"linux-headers-{KERNEL_FLAVOUR}", version, "the newest Linux kernel headers (simulated, metapackage)",
            depends=[f"linux-headers-{rel} (= {version})"]),
    ]


def kernel_source(instance: int | None = None) -> tuple[str, str]:
    """The apt source line of the stand-in security archive for a sandbox host: path, content.
    Signed with the stand-in key that cuda-keyring installs (the GPU stack converge puts it there)."""
    url = f"http://{network.bridge_ip(_instance(instance))}:{PORT}/{KERNEL_REPO}"
    return KERNEL_SOURCE, f"deb [signed-by={stack.CUDA_KEYRING}] {url}/ /\n"


def publish_kernel(state_dir: Path, root: Path, abi: str) -> str:
    """Publish the stand-in kernel ``abi`` (and those before it) in the instance's stand-in
    security archive, as a distribution publishes a kernel security update. Returns its release."""
    abis = [a for a, _ in KERNELS]
    if abi not in abis:
        raise SandboxError(f"no stand-in kernel {abi}; known: {', '.join(abis)}")
    base = state_dir / "standin-repo"
    pool, repo = base / "kernels", base / "www" / KERNEL_REPO
    gnupg = root / "standin-gnupg"
    with file_lock(gnupg.parent / "standin-gnupg.lock"):
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir(parents=True)
        for a, _ in KERNELS[:abis.index(abi) + 1]:
            for deb in pool.glob(f"*{kernel_release(a)}_*.deb"):
                shutil.copy(deb, repo)
        for a, version in KERNELS[:abis.index(abi) + 1]:
            for meta in (f"linux-image-{KERNEL_FLAVOUR}", f"linux-headers-{KERNEL_FLAVOUR}"):
                shutil.copy(pool / f"{meta}_{version}_amd64.deb", repo)
        try:
            _write_index(repo, ".", repo, repo, {
                "Origin": "Debian", "Label": "gpuserve sandbox stand-in of the Debian security archive "
                "(kernels)", "Architectures": "amd64"}, gnupg)
        finally:
            run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], check=False)
    return kernel_release(abi)


def _build_kernels(pool: Path, work: Path) -> None:
    shutil.rmtree(pool, ignore_errors=True)
    pool.mkdir(parents=True)
    for abi, version in KERNELS:
        for deb in kernel_debs(abi, version):
            build_deb(deb, pool, work)


# --- repositories -------------------------------------------------------------------------------
def _sign(gnupg: Path, release: Path) -> None:
    base = ["gpg", "--homedir", str(gnupg), "--batch", "--yes"]
    run([*base, "--clearsign", "-o", str(release.with_name("InRelease")), str(release)])
    run([*base, "--armor", "--detach-sign", "-o", str(release.with_name("Release.gpg")), str(release)])


def _write_index(repo: Path, scan_dir: str, index_dir: Path, release_dir: Path, fields: dict,
                 gnupg: Path) -> None:
    """Packages(.gz) of the .debs under repo/scan_dir into index_dir; a signed Release in release_dir."""
    packages = run(["dpkg-scanpackages", "--multiversion", scan_dir, "/dev/null"], cwd=repo).stdout
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / "Packages").write_text(packages)
    (index_dir / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
    entries = [p for p in sorted(index_dir.iterdir()) if p.name.startswith("Packages")]
    lines = [f"{k}: {v}" for k, v in fields.items()]
    lines.append(f"Date: {formatdate(usegmt=True)}")
    for algo, title in (("md5", "MD5Sum"), ("sha256", "SHA256")):
        lines.append(f"{title}:")
        for p in entries:
            data = p.read_bytes()
            rel = p.relative_to(release_dir)
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data)} {rel}")
    (release_dir / "Release").write_text("\n".join(lines) + "\n")
    _sign(gnupg, release_dir / "Release")


def _ensure_key(gnupg: Path) -> None:
    """A signing key for the stand-in repositories (made once, shared by all instances)."""
    if (gnupg / "pubring.kbx").is_file() and run(
            ["gpg", "--homedir", str(gnupg), "--batch", "--list-secret-keys"]).stdout.strip():
        return
    shutil.rmtree(gnupg, ignore_errors=True)
    gnupg.mkdir(mode=0o700, parents=True)
    run(["gpg", "--homedir", str(gnupg), "--batch", "--passphrase", "", "--quick-gen-key",
         "gpuserve sandbox stand-in repositories <stand-in@gpuserve.invalid>", "ed25519", "sign", "never"])


def build(www: Path, gnupg: Path, cuda_url: str, rocm_url: str) -> None:
    """Build both repositories into www (replaced). Instances share the key (and its gpg-agent,
    stopped at the end), so builds take turns."""
    gnupg.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(gnupg.parent / "standin-gnupg.lock"):
        _build(www, gnupg, cuda_url, rocm_url)


def _build(www: Path, gnupg: Path, cuda_url: str, rocm_url: str) -> None:
    t0 = time.monotonic()
    _ensure_key(gnupg)
    shutil.rmtree(www, ignore_errors=True)
    work = www.with_name(www.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        libcuda = work / "libcuda.so"
        run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(libcuda), str(STANDIN / "libcuda.c")])
        keyring = run(["gpg", "--homedir", str(gnupg), "--batch", "--export"], text=False).stdout
        settings = stack.settings_from({"cuda_repo_url": cuda_url})
        cuda = www / "cuda/repos" / CUDA_OS / CUDA_ARCH
        cuda.mkdir(parents=True)
        for deb in nvidia_debs(libcuda.read_bytes(), keyring, stack.cuda_sources(settings, CUDA_OS, CUDA_ARCH)):
            build_deb(deb, cuda, work)
        _write_index(cuda, ".", cuda, cuda, {
            "Origin": "NVIDIA", "Label": "gpuserve sandbox stand-in of the NVIDIA CUDA repository",
            "Architectures": "amd64"}, gnupg)
        radeon = www / "radeon"
        (radeon / "rocm").mkdir(parents=True)
        (radeon / "rocm/rocm.gpg.key").write_bytes(
            run(["gpg", "--homedir", str(gnupg), "--batch", "--armor", "--export"], text=False).stdout)
        _build_kernels(www.parent / "kernels", work)
        for release in ROCM_RELEASES:
            for repo, debs in zip((radeon / "amdgpu" / release / "ubuntu", radeon / "rocm/apt" / release),
                                  rocm_debs(release)):
                pool = repo / "pool/main"
                pool.mkdir(parents=True)
                for deb in debs:
                    build_deb(deb, pool, work)
                dist = repo / "dists" / ROCM_SUITE
                _write_index(repo, "pool", dist / "main/binary-amd64", dist, {
                    "Origin": "repo.radeon.com", "Label": "gpuserve sandbox stand-in of repo.radeon.com",
                    "Suite": ROCM_SUITE, "Codename": ROCM_SUITE, "Architectures": "amd64",
                    "Components": "main"}, gnupg)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"], check=False)
    log(f"stand-in repositories built in {time.monotonic() - t0:.1f} s ({www})")


def _inputs_stamp(*urls: str) -> str:
    h = hashlib.sha256()
    stack_files = sorted(Path(stack.__file__).parent.glob("*.py"))  # gpuserve.stack is a package
    for path in [Path(__file__), *stack_files, *sorted(STANDIN.iterdir())]:
        h.update(path.read_bytes())
    h.update(repr((NVIDIA_DRIVERS, ROCM_RELEASES, KERNELS, urls)).encode())
    return h.hexdigest()


def ensure(root: Path, state_dir: Path, instance: int) -> str:
    """Build (if its inputs changed) and serve this instance's stand-in repositories; return the
    base URL. The server binds the bridge address only, so the bridge must exist."""
    urls = (cuda_repo_url(instance), rocm_repo_url(instance))
    base = state_dir / "standin-repo"
    www = base / "www"
    stamp = _inputs_stamp(*urls)
    if not (base / "stamp").is_file() or (base / "stamp").read_text() != stamp:
        stop(state_dir)
        build(www, root / "standin-gnupg", *urls)
        (base / "stamp").write_text(stamp)
    _serve(base, network.bridge_ip(instance))
    return f"http://{network.bridge_ip(instance)}:{PORT}"


def _serve(base: Path, addr: str) -> None:
    if network.pid_alive(base / "server.pid") and network.port_open(addr, PORT):
        return
    out = open(base / "server.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(PORT), "--bind", addr, "--directory", str(base / "www")],
        stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    (base / "server.pid").write_text(str(proc.pid))
    for _ in range(100):
        if network.port_open(addr, PORT):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SandboxError(f"the stand-in repository server did not start on {addr}:{PORT}; see {base / 'server.log'}")


def stop(state_dir: Path) -> None:
    pidfile = state_dir / "standin-repo" / "server.pid"
    network.signal_pidfile(pidfile, signal.SIGTERM)
    pidfile.unlink(missing_ok=True)
