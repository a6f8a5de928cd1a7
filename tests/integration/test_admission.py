"""Admission checks end to end: a converged hopper_x8 host (NVSwitch) is admitted; each simulated
hardware fault on one GPU makes deploys/gpu_stack.py refuse it, naming host, GPU, check, value
and threshold; cleared, the host is admitted again. XIDs count since boot, and faults set
persistent outlive a reboot while transient ones do not. A blackwell_x4 (NVLink 5) and an
mi355x_x4 host (amd-smi) show the same for their own sources.

One set of hosts for the module; the tests build on each other in order.
"""

import pytest

INVENTORY, DEPLOY = "inventories/sandbox.py", "deploys/gpu_stack.py"
GPU3 = "GPU 3 (00000000:48:00.0)"


@pytest.fixture(scope="module")
def hosts(make_hosts):
    return make_hosts(["hopper_x8", "blackwell_x4", "mi355x_x4"])


@pytest.fixture(scope="module")
def host(hosts):
    return hosts[0]


def refused(pyinfra, host):
    run = pyinfra(INVENTORY, DEPLOY, "--limit", host.name)
    assert run.returncode != 0, run.output[-3000:]
    assert f"{host.name}: GPU admission failed" in run.output, run.output[-3000:]
    assert "verification failed" not in run.output
    return run.output


def admitted(pyinfra, host):
    run = pyinfra(INVENTORY, DEPLOY, "--limit", host.name).check()
    assert "admission failed" not in run.output
    return run


def test_a_healthy_converged_host_is_admitted(sandbox, hosts, host, pyinfra):
    first = pyinfra(INVENTORY, DEPLOY, "--data", "reboot=allowed").check()   # all three hosts
    assert "Admission checks" in first.output and "admission failed" not in first.output
    # the checks really ran against the host's tools: nvidia-smi answers every field they query
    from gpuserve.admission import QUERY
    rows = sandbox.ssh(host, f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits").stdout.splitlines()
    assert len(rows) == 8 and all(r.split(", ")[3] == "Enabled" for r in rows)   # persistence on


FAULTS = [
    ("ecc-uncorrectable", "ecc_uncorrectable is 1 (volatile) (allowed: <= 0 (admission_max_uncorrectable_ecc))"),
    ("retired-pages", "retired_pages_pending is Yes (allowed: No or [N/A] (admission_allow_pending_retired_pages: False))"),
    ("row-remap-failure", "row_remap_failure is 1 (allowed: No, 0 or [N/A])"),
    ("pcie-gen", "pcie_gen is Gen 3 (max Gen 5) (allowed: >= Gen 5 (the GPU's maximum))"),
    ("pcie-width", "pcie_width is x8 (max x16) (allowed: >= x16 (the GPU's maximum))"),
    ("nvlink-down", "nvlink is 17/18 links active (down: link 0) (allowed: every link active)"),
]


def test_each_fault_refuses_the_host_naming_gpu_check_value_and_threshold(sandbox, host, pyinfra):
    previous = None
    for fault, expected in FAULTS:
        sandbox.clear_faults(host)
        sandbox.set_fault(host, gpu=3, fault=fault)
        out = refused(pyinfra, host)
        assert f"{host.name}: {GPU3}: {expected}" in out, (fault, out[-3000:])
        assert "GPU admission failed (1 check(s))" in out, (fault, out[-3000:])   # the previous one is cleared
        if previous:
            assert previous not in out
        previous = expected.split(" is ")[0]
    sandbox.clear_faults(host)
    admitted(pyinfra, host)


def test_a_missing_gpu_is_refused_by_verification(sandbox, host, pyinfra):
    sandbox.set_fault(host, gpu=3, fault="missing")
    run = pyinfra(INVENTORY, DEPLOY, "--limit", host.name)
    assert run.returncode != 0
    # verification runs first and already names the GPU by the bus ID the driver probed
    assert ("gpu_count: declared 8 x H200, nvidia-smi found 7 (1 x H200 missing; the driver probed "
            "0000:48:00.0 but nvidia-smi does not list it") in run.output
    sandbox.clear_faults(host)
    admitted(pyinfra, host)


def test_xids_count_since_boot_and_persistent_faults_outlive_a_reboot(sandbox, host, pyinfra):
    sandbox.set_fault(host, gpu=3, fault="xid")                          # persistent: the GPU fails again
    sandbox.set_fault(host, gpu=5, fault="pcie-width", value=4, persistent=False)
    out = refused(pyinfra, host)
    assert (f"{host.name}: {GPU3}: xid is Xid 79 since boot: NVRM: Xid (PCI:0000:48:00): 79, pid=0, "
            "name=gpuserve-sim, GPU has fallen off the bus. (allowed: no Xid in admission_xid_fatal)") in out
    assert f"{host.name}: GPU 5 (00000000:68:00.0): pcie_width is x4 (max x16)" in out

    sandbox.reboot(host)      # the transient link fault ends; the persistent XID is logged again
    out = refused(pyinfra, host)
    assert f"{host.name}: {GPU3}: xid is Xid 79 since boot" in out and "pcie_width" not in out
    assert "GPU admission failed (1 check(s))" in out

    sandbox.clear_faults(host)
    out = refused(pyinfra, host)   # switched off, but the XID of this boot is still in the log
    assert f"{GPU3}: xid is Xid 79 since boot" in out
    sandbox.reboot(host)
    admitted(pyinfra, host)


def test_admission_false_skips_the_checks(sandbox, host, pyinfra):
    sandbox.set_fault(host, gpu=0, fault="ecc-uncorrectable", value=7)
    run = pyinfra(INVENTORY, DEPLOY, "--limit", host.name, "--data", "admission=False").check()
    assert "admission failed" not in run.output
    sandbox.clear_faults(host)


def test_with_dcgm_its_quick_diagnostic_is_one_more_check_and_the_exporter_serves_metrics(sandbox, host, pyinfra):
    dcgm = ("--limit", host.name, "--data", "dcgm=True")
    run = pyinfra(INVENTORY, DEPLOY, *dcgm).check()
    assert "admission failed" not in run.output
    held = sandbox.ssh(host, "apt-mark showhold").stdout.split()
    assert {"datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13",
            "datacenter-gpu-manager-exporter"} <= set(held)
    metrics = sandbox.ssh(host, "python3 -c \"import urllib.request as u; "
                                "print(u.urlopen('http://127.0.0.1:9400/metrics').read().decode())\"").stdout
    assert 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="3",' in metrics and "DCGM_FI_DEV_XID_ERRORS" in metrics
    # on loopback only: from the host's own network address the port is closed
    refused = sandbox.ssh(host, "python3 -c \"import socket; s = socket.socket(); s.settimeout(5); "
                                f"print(s.connect_ex(('{host.ip}', 9400)))\"").stdout.strip()
    assert refused != "0", f"the DCGM exporter answers on {host.ip}:9400"

    sandbox.set_fault(host, gpu=3, fault="row-remap-failure")
    run = pyinfra(INVENTORY, DEPLOY, *dcgm)
    assert run.returncode != 0
    assert (f"{host.name}: {GPU3}: dcgm_diag is Fail (software: GPU 3 had a row remapping failure: the GPU "
            "needs service.) (allowed: Pass (dcgmi diag -r 1))") in run.output
    assert f"{host.name}: {GPU3}: row_remap_failure is 1" in run.output
    sandbox.clear_faults(host)
    admitted(pyinfra, host)


def test_blackwell_nvlink_down_and_amd_ecc_and_pcie_faults_are_refused(sandbox, hosts, pyinfra):
    _, blackwell, amd = hosts
    sandbox.set_fault(blackwell, gpu=1, fault="nvlink-down", value=17)
    out = refused(pyinfra, blackwell)
    assert (f"{blackwell.name}: GPU 1 (00000000:28:00.0): nvlink is 17/18 links active (down: link 17) "
            "(allowed: every link active)") in out
    sandbox.clear_faults(blackwell)
    admitted(pyinfra, blackwell)

    sandbox.set_fault(amd, gpu=2, fault="ecc-uncorrectable", value=3)
    sandbox.set_fault(amd, gpu=0, fault="pcie-gen", value=4)
    out = refused(pyinfra, amd)
    assert "GPU admission failed (2 check(s))" in out
    assert (f"{amd.name}: GPU 2 (0000:38:00.0): ecc_uncorrectable is 3 (allowed: <= 0 "
            "(admission_max_uncorrectable_ecc))") in out
    assert (f"{amd.name}: GPU 0 (0000:18:00.0): pcie_gen is 16.0 GT/s (max 32.0 GT/s) "
            "(allowed: >= 32.0 GT/s (the GPU maximum))") in out
    sandbox.clear_faults(amd)
    admitted(pyinfra, amd)
