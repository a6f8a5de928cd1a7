"""The simulated GPU side of sandbox hosts, checked without booting anything."""

import os
import subprocess
import sys

import pytest

from gpuserve_sandbox import simgpu
from gpuserve_sandbox.simgpu import HostSpec
from gpuserve_sandbox.util import SandboxError

SIM_SMI = simgpu.FILES / "sim-nvidia-smi"


def test_host_spec_parsing():
    assert HostSpec.parse("hopper_x8") == HostSpec("hopper_x8", True)
    assert HostSpec.parse("hopper_x8:no-nvswitch") == HostSpec("hopper_x8", False)
    assert str(HostSpec.parse("hopper_x8:no-nvswitch")) == "hopper_x8:no-nvswitch"
    # a profile without NVSwitches never claims any, and prints no variant
    assert HostSpec.parse("mi355x_x4") == HostSpec("mi355x_x4", False)
    assert str(HostSpec.parse("mi355x_x4")) == "mi355x_x4"
    with pytest.raises(SandboxError, match="unknown sandbox profile 'h100'"):
        HostSpec.parse("h100")
    with pytest.raises(SandboxError, match="unknown variant 'pcie'"):
        HostSpec.parse("hopper_x8:pcie")


def test_hardware_is_deterministic_and_distinct_per_host():
    spec = HostSpec.parse("blackwell_x4")
    a, b = simgpu.hardware(spec, "sandbox-1"), simgpu.hardware(spec, "sandbox-2")
    assert a == simgpu.hardware(spec, "sandbox-1")
    assert [g["name"] for g in a["gpus"]] == ["NVIDIA GB200"] * 4
    assert {g["uuid"] for g in a["gpus"]}.isdisjoint({g["uuid"] for g in b["gpus"]})
    assert len(a["nvswitches"]) == 2 and a["nvlink_gen"] == 5
    assert simgpu.hardware(HostSpec.parse("blackwell_x4:no-nvswitch"), "x")["nvswitches"] == []


def _host_root(tmp_path, spec="hopper_x8", module_version=None):
    root = tmp_path / "root"
    simgpu.install(root, HostSpec.parse(spec), "sandbox-1")
    if module_version:
        (root / simgpu.NVIDIA_MODULE_VERSION_FILE).write_text(module_version + "\n")
    proc = tmp_path / "proc-driver"
    simgpu.on_boot(root, proc)
    return root, proc


def test_boot_without_installed_module_loads_nothing(tmp_path):
    _, proc = _host_root(tmp_path)
    assert list(proc.iterdir()) == []


def test_boot_loads_the_installed_module_and_shows_nvswitches(tmp_path):
    _, proc = _host_root(tmp_path, module_version="580.95.05")
    assert "  580.95.05  " in (proc / "nvidia/version").read_text()
    assert sorted(p.name for p in (proc / "nvidia-nvswitch/devices").iterdir()) == [
        "0000:a0:00.0", "0000:a1:00.0", "0000:a2:00.0", "0000:a3:00.0"]
    assert len(list((proc / "nvidia/gpus").iterdir())) == 8


def test_boot_without_nvswitch_variant_has_no_nvswitch_entries(tmp_path):
    _, proc = _host_root(tmp_path, "hopper_x8:no-nvswitch", module_version="580.95.05")
    assert (proc / "nvidia/version").exists()
    assert not (proc / "nvidia-nvswitch").exists()


def _smi(root, proc, *args, state=None):
    env = {**os.environ, "GPUSERVE_SIM_HARDWARE": str(root / simgpu.HARDWARE_FILE),
           "GPUSERVE_SIM_PROC_VERSION": str(proc / "nvidia/version"),
           "GPUSERVE_SIM_STATE": str(state or root / simgpu.STATE_DIR),
           "GPUSERVE_SIM_FAULTS": str(root / simgpu.FAULTS_FILE)}
    return subprocess.run([sys.executable, str(SIM_SMI), *args], capture_output=True, text=True, env=env)


def test_sim_nvidia_smi_fails_like_the_real_one_without_a_loaded_driver(tmp_path):
    root, proc = _host_root(tmp_path)
    out = _smi(root, proc, "--query-gpu=name", "--format=csv,noheader")
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


def test_sim_nvidia_smi_query_formats(tmp_path):
    root, proc = _host_root(tmp_path, module_version="580.95.05")
    out = _smi(root, proc, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
    assert out.returncode == 0
    assert out.stdout.splitlines() == ["NVIDIA H200, 143771 MiB, 580.95.05"] * 8
    out = _smi(root, proc, "--query-gpu=index,memory.total", "--format=csv,nounits")
    assert out.stdout.splitlines()[:2] == ["index, memory.total", "0, 143771"]
    out = _smi(root, proc, "--query-gpu=memory.total", "--format=csv")
    assert out.stdout.splitlines()[0] == "memory.total [MiB]"
    out = _smi(root, proc, "--query-gpu=bogus", "--format=csv")
    assert out.returncode == 2 and 'Field "bogus" is not a valid field' in out.stderr
    assert _smi(root, proc, "-L").stdout.startswith("GPU 0: NVIDIA H200 (UUID: GPU-")


@pytest.mark.skipif(os.geteuid() != 0, reason="nvidia-smi -pm needs root, as the real one does")
def test_sim_nvidia_smi_persistence_mode(tmp_path):
    root, proc = _host_root(tmp_path, module_version="580.95.05")
    query = ("--query-gpu=persistence_mode", "--format=csv,noheader")
    assert set(_smi(root, proc, *query).stdout.split()) == {"Disabled"}
    assert _smi(root, proc, "-pm", "1").returncode == 0
    assert set(_smi(root, proc, *query).stdout.split()) == {"Enabled"}
    # a reboot reloads the module: persistence mode is gone until something sets it again
    simgpu.on_boot(root, proc)
    assert set(_smi(root, proc, *query).stdout.split()) == {"Disabled"}


# --- simulated hardware faults -------------------------------------------------------------------
def _admission(root, proc):
    from gpuserve import admission

    query = _smi(root, proc, f"--query-gpu={admission.QUERY}", "--format=csv,noheader,nounits")
    assert query.returncode == 0, query.stderr
    links = _smi(root, proc, "nvlink", "-s")
    return admission.NvidiaHealth(admission.parse_gpu_health(query.stdout.splitlines()),
                                  admission.parse_nvlink_status(links.stdout.splitlines()), [],
                                  [], fabric_manager="active")


def _failed(root, proc, count=8):
    from gpuserve import admission

    seen = _admission(root, proc)
    findings = admission.evaluate_nvidia(admission.AdmissionSettings(), seen, count, nvswitch=True)
    return sorted((f.check, f.gpu.split(" (")[0]) for f in findings if not f.ok and f.check != "persistence")


@pytest.mark.parametrize("fault,check", [
    ("ecc-uncorrectable", "ecc_uncorrectable"), ("retired-pages", "retired_pages_pending"),
    ("row-remap-failure", "row_remap_failure"), ("pcie-gen", "pcie_gen"), ("pcie-width", "pcie_width"),
    ("nvlink-down", "nvlink"),
])
def test_each_sim_fault_shows_in_nvidia_smi_and_fails_its_admission_check(tmp_path, fault, check):
    root, proc = _host_root(tmp_path, module_version="580.95.05")
    assert _failed(root, proc) == []
    simgpu.add_fault(root, 3, fault)
    assert _failed(root, proc) == [(check, "GPU 3")]
    assert [f["fault"] for f in simgpu.clear_faults(root, gpu=3)] == [fault]
    assert _failed(root, proc) == []


def test_a_missing_gpu_is_not_listed_and_the_rest_are_renumbered(tmp_path):
    root, proc = _host_root(tmp_path, module_version="580.95.05")
    simgpu.add_fault(root, 2, "missing")
    seen = _admission(root, proc)
    assert [g.index for g in seen.gpus.gpus] == list(range(7))
    assert "00000000:38:00.0" not in [g.bus_id for g in seen.gpus.gpus]
    assert sorted(seen.nvlinks.links) == list(range(7))
    assert _failed(root, proc) == [("visible", "host")]


def test_faults_survive_a_boot_when_persistent_and_end_with_it_when_transient(tmp_path):
    root, proc = _host_root(tmp_path, module_version="580.95.05")
    simgpu.add_fault(root, 1, "pcie-width", value=4)
    simgpu.add_fault(root, 6, "ecc-uncorrectable", persistent=False)
    entry = simgpu.add_fault(root, 2, "xid", value=48)
    assert entry["line"].startswith("NVRM: Xid (PCI:0000:38:00): 48, ")
    simgpu.on_boot(root, proc)
    assert [(f["gpu"], f["fault"]) for f in simgpu.read_faults(root)] == [(1, "pcie-width"), (2, "xid")]
    assert _failed(root, proc) == [("pcie_width", "GPU 1")]


def test_fault_api_refuses_unknown_faults_and_gpus(tmp_path):
    root, _ = _host_root(tmp_path)
    with pytest.raises(SandboxError, match="unknown fault 'melted'"):
        simgpu.add_fault(root, 0, "melted")
    with pytest.raises(SandboxError, match="no GPU 8 on this host"):
        simgpu.add_fault(root, 8, "xid")
    assert (root / simgpu.XID_UNIT).read_text().count("kmsg replay") == 1


def test_sim_kmsg_replays_the_xid_lines_of_persistent_faults(tmp_path):
    root, _ = _host_root(tmp_path)
    simgpu.add_fault(root, 0, "xid")
    logged = tmp_path / "logged"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "logger").write_text(f"#!/bin/sh\necho \"$@\" >> {logged}\n")
    (fake / "logger").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "GPUSERVE_SIM_FAULTS": str(root / simgpu.FAULTS_FILE)}
    out = subprocess.run([sys.executable, str(simgpu.FILES / "sim-kmsg"), "replay"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert logged.read_text() == ("-p kern.err -t kernel NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=gpuserve-sim, "
                                  "GPU has fallen off the bus.\n")


def test_sim_amd_smi_reports_ecc_and_pcie_faults_for_the_admission_checks(tmp_path):
    from gpuserve import admission

    root, _ = _host_root(tmp_path, spec="mi355x_x4")
    loaded = tmp_path / "amdgpu-loaded"
    loaded.write_text("6.16.6\n")
    env = {**os.environ, "GPUSERVE_SIM_HARDWARE": str(root / simgpu.HARDWARE_FILE),
           "GPUSERVE_SIM_AMDGPU_LOADED": str(loaded), "GPUSERVE_SIM_FAULTS": str(root / simgpu.FAULTS_FILE)}

    def failed():
        out = [subprocess.run([sys.executable, str(simgpu.FILES / "sim-amd-smi"), *args], env=env,
                              capture_output=True, text=True).stdout
               for args in (("metric", "--ecc", "--pcie"), ("static", "--bus"))]
        seen = admission.parse_amd_smi_blocks("".join(out).splitlines())
        return [(f.check, f.gpu) for f in admission.evaluate_amd(admission.AdmissionSettings(), seen, 4) if not f.ok]

    assert failed() == []
    simgpu.add_fault(root, 1, "ecc-uncorrectable", value=2)
    simgpu.add_fault(root, 2, "pcie-gen", value=4)
    simgpu.add_fault(root, 3, "pcie-width")
    assert failed() == [("ecc_uncorrectable", "GPU 1 (0000:28:00.0)"), ("pcie_gen", "GPU 2 (0000:38:00.0)"),
                        ("pcie_width", "GPU 3 (0000:48:00.0)")]
    simgpu.add_fault(root, 0, "missing")
    assert ("visible", "host") in failed()


def test_sim_dcgmi_quick_diag_fails_the_faulty_gpu_and_needs_the_host_engine(tmp_path):
    from gpuserve import admission

    root, _ = _host_root(tmp_path)
    pidfile = tmp_path / "nv-hostengine.pid"
    env = {**os.environ, "GPUSERVE_SIM_HARDWARE": str(root / simgpu.HARDWARE_FILE),
           "GPUSERVE_SIM_FAULTS": str(root / simgpu.FAULTS_FILE), "GPUSERVE_SIM_HOSTENGINE_PID": str(pidfile)}

    def diag():
        return subprocess.run([sys.executable, str(simgpu.FILES / "sim-dcgmi"), "diag", "-r", "1", "-j"],
                              env=env, capture_output=True, text=True)

    down = diag()
    assert down.returncode == 255 and "Unable to connect to host engine" in down.stdout
    pidfile.write_text(f"{os.getpid()}\n")
    ok = diag()
    assert ok.returncode == 0 and admission.parse_dcgm_diag(ok.stdout.splitlines()).results == {i: [
        ("software", "Pass", "")] for i in range(8)}
    simgpu.add_fault(root, 6, "row-remap-failure")
    bad = diag()
    assert bad.returncode == 226
    assert admission.parse_dcgm_diag(bad.stdout.splitlines()).results[6] == [
        ("software", "Fail", "GPU 6 had a row remapping failure: the GPU needs service.")]


@pytest.mark.parametrize("how", ["env", "flag"])
def test_sim_dcgm_exporter_listens_where_it_is_told_like_the_real_one(tmp_path, how):
    """gpuserve's drop-in sets DCGM_EXPORTER_LISTEN=127.0.0.1:9400; the stand-in must honour it
    (and `--address`) the way dcgm-exporter does, or the sandbox would hide an exporter open to all."""
    import socket
    import time
    import urllib.request

    from gpuserve import stack

    root, _ = _host_root(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GPUSERVE_SIM_HARDWARE": str(root / simgpu.HARDWARE_FILE),
           "GPUSERVE_SIM_FAULTS": str(root / simgpu.FAULTS_FILE)}
    listen = stack.DCGM_EXPORTER_LISTEN.replace(str(stack.DCGM_EXPORTER_PORT), str(port))
    argv = [sys.executable, str(simgpu.FILES / "sim-dcgm-exporter")]
    if how == "env":
        env["DCGM_EXPORTER_LISTEN"] = listen
    else:
        argv += ["-a", listen]
    proc = subprocess.Popen(argv, env=env)
    try:
        for _ in range(100):   # bounded: 10 s
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the stand-in exporter never answered")
        assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in body
        listening = [line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]
                     if line.split()[3] == "0A"]            # state LISTEN: local address as hex ip:port
        assert f"0100007F:{port:04X}" in listening and f"00000000:{port:04X}" not in listening
    finally:
        proc.terminate()
        proc.wait(10)
