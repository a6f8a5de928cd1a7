"""Facts for OS and kernel updates (gpuserve.patch): the kernels, the DKMS builds, what apt
would upgrade, and the held packages' versions."""

from __future__ import annotations

from pyinfra.api import FactBase

from gpuserve import patch


class KernelState(FactBase[patch.KernelState]):
    """The running kernel (/proc/sys/kernel/osrelease), the installed ones (/boot/vmlinuz-*) and
    the DKMS modules built for each (/var/lib/dkms/<module>/kernel-<release>-<arch>)."""

    def command(self) -> str:
        return patch.kernel_state_command()

    @staticmethod
    def default() -> patch.KernelState:
        return patch.KernelState(None, ())

    def process(self, output: list[str]) -> patch.KernelState:
        return patch.parse_kernel_state(output)


class PendingUpgrades(FactBase[list]):
    """What `apt-get --with-new-pkgs upgrade` would install now, held packages kept back. The apt
    lists are refreshed first (a cache: nothing installed changes), so a plan and --dry show the
    updates the archive offers at this moment."""

    def command(self) -> str:
        return f"{patch.APT_UPDATE} >/dev/null 2>&1; {patch.APT_SIMULATE}"

    def requires_command(self) -> str:
        return "apt-get"

    default = list

    def process(self, output: list[str]) -> list[patch.Upgrade]:
        return patch.parse_simulation(output)


class HeldVersions(FactBase[dict]):
    """Held packages and their installed versions (the GPU stack's set): name -> version."""

    def command(self) -> str:
        return ("for p in $(apt-mark showhold); do "
                "echo \"$p $(dpkg-query -W -f='${Version}' \"$p\" 2>/dev/null)\"; done")

    def requires_command(self) -> str:
        return "apt-mark"

    default = dict

    def process(self, output: list[str]) -> dict[str, str]:
        out = {}
        for line in output:
            parts = line.split()
            if parts:
                out[parts[0]] = parts[1] if len(parts) > 1 else ""
        return out
