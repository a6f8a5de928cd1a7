"""The sandbox's stand-in vendor repositories and simulated tools, checked without a host."""

import json
import os
import subprocess
import sys

import pytest

from gpuserve import stack
from gpuserve.facts.amd import parse_amd_versions
from gpuserve.facts.gpus import parse_amd_smi
from gpuserve.facts.nvidia import CUDA_CHECK, parse_cuda_check
from gpuserve_sandbox import simgpu, standin_repo
from gpuserve_sandbox.simgpu import HostSpec

CUDA_URL = "http://10.231.250.1:8081/cuda/repos"
ROCM_URL = "http://10.231.250.1:8081/radeon"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("standin")
    standin_repo.build(base / "www", base / "gnupg", CUDA_URL, ROCM_URL)
    return base


def _packages(index):
    found = set()
    for block in index.read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line[0].isspace())
        if fields:
            found.add((fields["Package"], fields["Version"]))
            assert fields["Description"].startswith("gpuserve sandbox stand-in for ")
    return found


def test_cuda_repository_has_the_real_names_and_versions(repo):
    cuda = repo / "www/cuda/repos/debian12/x86_64"
    pkgs = _packages(cuda / "Packages")
    for v in ("580.95.05", "580.105.08", "590.48.01"):
        for name in ("nvidia-open", "nvidia-kernel-open-dkms", "nvidia-fabricmanager", "libnvidia-nscq",
                     "nvidia-persistenced", "libcuda1", "cuda-drivers"):
            assert (name, f"{v}-1") in pkgs
    assert {("nvidia-driver-pinning-580", "1.0-1"), ("nvidia-driver-pinning-590", "1.0-1"),
            ("cuda-toolkit-13-0", "13.0.2-1"), ("nvlsm", "2025.06.6-1"), ("cuda-keyring", "1.1-1"),
            ("datacenter-gpu-manager-4-cuda13", "1:4.4.1-1"), ("datacenter-gpu-manager-4-core", "1:4.4.1-1"),
            ("datacenter-gpu-manager-exporter", "4.4.1-4.6.0-1")} <= pkgs
    # signed by the key the keyring package installs, as apt will check it
    keyring = repo / "keyring.gpg"
    deb = cuda / "cuda-keyring_1.1-1_all.deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(repo / "keyring")], check=True)
    keyring.write_bytes((repo / "keyring" / stack.CUDA_KEYRING.lstrip("/")).read_bytes())
    subprocess.run(["gpgv", "--keyring", str(keyring), str(cuda / "InRelease")], check=True, capture_output=True)
    # the sources entry it writes is exactly the one the deploy writes for that URL
    path, line = stack.cuda_sources(stack.settings_from({"cuda_repo_url": CUDA_URL}), "debian12", "x86_64")
    assert (repo / "keyring" / path.lstrip("/")).read_text() == line


def test_rocm_repositories_per_release(repo):
    for release, (rocm, dkms) in standin_repo.ROCM_RELEASES.items():
        rocm_dist = repo / f"www/radeon/rocm/apt/{release}/dists/jammy"
        assert ("rocm", rocm) in _packages(rocm_dist / "main/binary-amd64/Packages")
        assert "Origin: repo.radeon.com" in (rocm_dist / "Release").read_text()
        amdgpu = repo / f"www/radeon/amdgpu/{release}/ubuntu/dists/jammy/main/binary-amd64/Packages"
        assert ("amdgpu-dkms", dkms) in _packages(amdgpu)
    assert (repo / "www/radeon/rocm/rocm.gpg.key").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def _cuda(tmp_path, lib, version, hardware, proc, fm_pidfile):
    libdir = tmp_path / f"lib-{version}"
    libdir.mkdir(exist_ok=True)
    (libdir / f"libcuda.so.{version}").write_bytes(lib)
    if not (libdir / "libcuda.so.1").exists():
        (libdir / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir), "GPUSERVE_SIM_HARDWARE": str(hardware),
           "GPUSERVE_SIM_PROC_DRIVER": str(proc), "GPUSERVE_SIM_FM_PIDFILE": str(fm_pidfile)}
    out = subprocess.run([sys.executable, "-c", CUDA_CHECK], env=env, capture_output=True, text=True)
    return parse_cuda_check((out.stdout + out.stderr).splitlines())


def test_standin_libcuda_answers_like_the_real_one(tmp_path):
    lib = tmp_path / "libcuda.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(standin_repo.STANDIN / "libcuda.c")],
                   check=True)
    root, proc = tmp_path / "root", tmp_path / "proc"
    simgpu.install(root, HostSpec.parse("hopper_x8"), "sandbox-1")
    hardware, fm = root / simgpu.HARDWARE_FILE, tmp_path / "fm.pid"
    simgpu.on_boot(root, proc)
    assert _cuda(tmp_path, lib.read_bytes(), "580.95.05", hardware, proc, fm).error_code == 100  # no driver
    (root / simgpu.NVIDIA_MODULE_VERSION_FILE).write_text("580.95.05\n")
    simgpu.on_boot(root, proc)
    assert _cuda(tmp_path, lib.read_bytes(), "580.95.05", hardware, proc, fm).error_code == 802  # no FM
    fm.write_text(f"{os.getpid()}\n")
    assert _cuda(tmp_path, lib.read_bytes(), "580.95.05", hardware, proc, fm).count == 8
    assert _cuda(tmp_path, lib.read_bytes(), "590.48.01", hardware, proc, fm).error_code == 803  # mismatch


def test_sim_amd_smi_and_amdgpu_boot(tmp_path):
    root, proc = tmp_path / "root", tmp_path / "proc"
    simgpu.install(root, HostSpec.parse("mi355x_x4"), "sandbox-4")
    rocm_info = tmp_path / "rocm-version"
    rocm_info.write_text("7.2.0\n")
    env = {**os.environ, "GPUSERVE_SIM_HARDWARE": str(root / simgpu.HARDWARE_FILE),
           "GPUSERVE_SIM_AMDGPU_LOADED": str(proc / "gpuserve-sim-amdgpu/version"),
           "GPUSERVE_SIM_ROCM_INFO": str(rocm_info)}

    def smi(*args):
        out = subprocess.run([sys.executable, str(simgpu.FILES / "sim-amd-smi"), *args], env=env,
                             capture_output=True, text=True)
        return (out.stdout + out.stderr).splitlines(), out.returncode

    simgpu.on_boot(root, proc)
    lines, rc = smi("static", "--asic", "--vram")
    assert rc == 1 and parse_amd_smi("\n".join(lines)).error
    assert parse_amd_versions(smi("version")[0]).loaded is None
    (root / simgpu.AMDGPU_MODULE_VERSION_FILE).write_text("6.16.6.30200000\n")
    simgpu.on_boot(root, proc)
    lines, rc = smi("static", "--asic", "--vram")
    assert rc == 0
    assert [(g.name, g.memory_mib) for g in parse_amd_smi("\n".join(lines)).gpus] == [("AMD Instinct MI355X", 294896)] * 4
    versions = parse_amd_versions(smi("version")[0])
    assert (versions.rocm, versions.loaded) == ("7.2.0", "6.16.6.30200000")
    assert json.loads((root / simgpu.HARDWARE_FILE).read_text())["gpus"][0]["gfx"] == "gfx950"
