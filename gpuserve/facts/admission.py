"""Admission facts: everything gpuserve.admission checks, gathered in one SSH round trip.

Each source prints under its own `--- gpuserve-admission <name>` header and always prints
something (a missing tool is reported, not a fact failure), so the pure parsers in
gpuserve.admission can name what is missing.

The kernel log: `journalctl -b SYSLOG_IDENTIFIER=kernel` (what `journalctl -k -b` shows on a
host, since journald files every /dev/kmsg record under the identifier `kernel`), falling back
to `dmesg` where there is no journal. Sandbox hosts (systemd-nspawn) have no /dev/kmsg; their
simulated driver logs its XID lines with that identifier, so the same command reads them.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from gpuserve import admission

H = admission.SECTION

KERNEL_LOG = ("if command -v journalctl >/dev/null 2>&1; then "
              "journalctl -b SYSLOG_IDENTIFIER=kernel -o cat --no-pager 2>/dev/null; "
              "else dmesg 2>/dev/null; fi | grep -F 'NVRM: Xid' || true")


class NvidiaAdmission(FactBase[admission.NvidiaHealth]):
    """nvidia-smi's health fields and NVLink states, XIDs since boot, the GPUs the driver probed,
    (NVSwitch hosts) the fabric manager's state, and (dcgm) DCGM's quick diagnostic."""

    def command(self, nvswitch: bool = False, dcgm: bool = False) -> str:
        smi = "command -v nvidia-smi >/dev/null 2>&1"
        parts = [
            f"echo '{H}query'",
            f"if {smi}; then nvidia-smi --query-gpu={admission.QUERY} --format=csv,noheader,nounits 2>&1 "
            "|| echo \"nvidia-smi exited $?\"; else echo 'nvidia-smi: command not found'; fi",
            f"echo '{H}nvlink'",
            f"if {smi}; then nvidia-smi nvlink -s 2>&1 || echo \"nvidia-smi nvlink exited $?\"; fi",
            f"echo '{H}driver'",
            "ls -1 /proc/driver/nvidia/gpus 2>/dev/null",
            f"echo '{H}kernel'",
            KERNEL_LOG,
        ]
        if nvswitch:
            parts += [f"echo '{H}fabric'", "systemctl is-active nvidia-fabricmanager 2>/dev/null"]
        if dcgm:   # DCGM's quick diagnostic (seconds), only where dcgmi is installed
            parts += [f"echo '{H}dcgm'", "if command -v dcgmi >/dev/null 2>&1; then dcgmi diag -r 1 -j 2>&1; fi"]
        return "; ".join(parts) + "; true"

    @staticmethod
    def default() -> admission.NvidiaHealth:
        return admission.parse_nvidia([])

    def process(self, output: list[str]) -> admission.NvidiaHealth:
        return admission.parse_nvidia(output)


class AmdAdmission(FactBase[admission.AmdHealth]):
    """amd-smi's ECC counts and PCIe link state, and the GPUs' maximum link."""

    def command(self) -> str:
        return ("if command -v amd-smi >/dev/null 2>&1; then amd-smi metric --ecc --pcie 2>&1 "
                "|| echo \"amd-smi metric exited $?\"; amd-smi static --bus 2>&1 || echo \"amd-smi static exited $?\"; "
                "else echo 'amd-smi: command not found'; fi")

    @staticmethod
    def default() -> admission.AmdHealth:
        return admission.AmdHealth(error="no output")

    def process(self, output: list[str]) -> admission.AmdHealth:
        return admission.parse_amd_smi_blocks(output)
