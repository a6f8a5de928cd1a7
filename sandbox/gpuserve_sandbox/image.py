"""The pristine Debian root every sandbox host boots from (copy-on-write via overlayfs).

Built once with debootstrap (the .debs are cached in a tarball), customised so that no two hosts
share an identity and nothing in a host talks to the outside on its own. Rebuilt only when
IMAGE_REVISION or the package list changes.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gpuserve_sandbox.util import SandboxError, file_lock, log, run

SUITE = "bookworm"
INCLUDE = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "ca-certificates",
    "curl", "sudo", "iproute2",
)
# bump when customise() changes: hosts then boot from a rebuilt image
IMAGE_REVISION = 2

# units that would reach out on their own, or that make no sense in a container
MASKED_UNITS = (
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "e2scrub_all.timer",
    "fstrim.timer", "e2scrub_reap.service", "systemd-pstore.service", "getty@tty1.service",
    "systemd-timesyncd.service", "systemd-networkd.service",
    "systemd-networkd-wait-online.service",
    # nspawn mounts the root itself; on this kind of machine the unit, the first one systemd
    # spawns, sometimes failed "at step CGROUP" and left the host "degraded"
    "systemd-remount-fs.service",
)


def image_stamp() -> str:
    return f"{SUITE} {','.join(INCLUDE)} revision={IMAGE_REVISION}\n"


def base_dir(root: Path) -> Path:
    return root / "image" / "base"


def image_is_current(root: Path) -> bool:
    stamp = base_dir(root) / ".gpuserve-image"
    return stamp.is_file() and stamp.read_text() == image_stamp()


def ensure_image(root: Path, mirror: str, *, in_use: bool = False) -> Path:
    """Return the base root, building it first if it is missing or outdated."""
    base = base_dir(root)
    with file_lock(root / "image.lock"):
        if image_is_current(root):
            return base
        if in_use and base.exists():
            raise SandboxError(
                f"the sandbox image at {base} is outdated but hosts still run on it: "
                "run `gpuserve sandbox down --all` first"
            )
        image = root / "image"
        image.mkdir(parents=True, exist_ok=True)
        tarball = image / f"debs-{SUITE}.tgz"
        t0 = time.monotonic()
        if not tarball.is_file():
            log(f"image: downloading the {SUITE} packages once (cached in {tarball})")
            work = image / "tmp-download"
            shutil.rmtree(work, ignore_errors=True)
            partial = tarball.with_suffix(".partial.tgz")
            run(["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}",
                 f"--make-tarball={partial}", SUITE, str(work), mirror])
            shutil.rmtree(work, ignore_errors=True)
            partial.rename(tarball)
        log(f"image: unpacking the base root into {base}")
        staging = image / "base.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        run(["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}",
             f"--unpack-tarball={tarball}", SUITE, str(staging), mirror])
        customise(staging, mirror)
        (staging / ".gpuserve-image").write_text(image_stamp())
        shutil.rmtree(base, ignore_errors=True)
        staging.rename(base)
        log(f"image: ready in {time.monotonic() - t0:.0f} s")
        return base


def customise(base: Path, mirror: str) -> None:
    """No shared identity (each host gets its own keys and machine-id at boot), nothing phoning out."""
    for key in (base / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (base / "etc/machine-id").write_text("")
    (base / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    (base / "etc/ssh/sshd_config.d/gpuserve-sandbox.conf").write_text(
        "# gpuserve sandbox: one ed25519 host key per host (RSA keygen is slow), key-only root login\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "UseDNS no\n"
        "MaxSessions 50\n"
        "MaxStartups 50:30:100\n"
    )
    for unit in MASKED_UNITS:
        link = base / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (base / "etc/apt/sources.list").write_text(
        f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\n"
    )
    (base / "etc/apt/apt.conf.d/90gpuserve-sandbox").write_text(
        'Acquire::Languages "none";\nAcquire::GzipIndexes "true";\nAPT::Install-Recommends "false";\n'
    )
    # resolv.conf, hostname, hosts and the apt proxy are written per host
    (base / "etc/resolv.conf").unlink(missing_ok=True)
    run(["chroot", str(base), "apt-get", "clean"])
    os.sync()
