"""The sandbox's simulated kernels for deploys/patch.py (gpuserve_sandbox.standin_repo "kernels",
simgpu.on_boot), checked without a host: the published stand-in security archive, the stand-in
DKMS, and which kernel a host "runs" and whether its driver loads."""

import subprocess

import pytest

from gpuserve import patch
from gpuserve_sandbox import simgpu, standin_repo
from gpuserve_sandbox.simgpu import HostSpec
from gpuserve_sandbox.util import SandboxError

from test_standin_repo import CUDA_URL, ROCM_URL, _packages

K40, K41, K42 = (standin_repo.kernel_release(a) for a, _ in standin_repo.KERNELS)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("standin")
    state = base / "state"
    standin_repo.build(state / "standin-repo/www", base / "standin-gnupg", CUDA_URL, ROCM_URL)
    return base, state


def test_kernels_are_published_one_at_a_time_with_simulated_names(built):
    root, state = built
    repo = state / "standin-repo/www" / standin_repo.KERNEL_REPO
    assert not repo.exists()          # nothing until the archive publishes a kernel
    assert standin_repo.publish_kernel(state, root, "6.1.0-40") == K40
    assert _packages(repo / "Packages") == {(f"linux-image-{K40}", "6.1.153-1"), (f"linux-headers-{K40}", "6.1.153-1"),
                                            ("linux-image-gpuserve-sim", "6.1.153-1"),
                                            ("linux-headers-gpuserve-sim", "6.1.153-1")}
    standin_repo.publish_kernel(state, root, "6.1.0-41")
    pkgs = _packages(repo / "Packages")
    assert (f"linux-image-{K41}", "6.1.158-1") in pkgs and ("linux-image-gpuserve-sim", "6.1.158-1") in pkgs
    assert not any(K42 in name for name, _ in pkgs)
    assert patch.kernel_release(f"linux-image-{K41}") == K41          # what deploys/patch.py reads
    assert patch.kernel_release("linux-image-gpuserve-sim") is None   # a metapackage
    subprocess.run(["gpg", "--homedir", str(root / "standin-gnupg"), "--verify", str(repo / "InRelease")],
                   check=True, capture_output=True)
    with pytest.raises(SandboxError, match="no stand-in kernel 6.1.0-99"):
        standin_repo.publish_kernel(state, root, "6.1.0-99")


def test_the_stand_in_nvidia_module_package_carries_the_dkms_stand_in_and_its_hooks():
    deb = next(d for d in standin_repo.nvidia_driver_debs("580.95.05", b"") if d.name == "nvidia-kernel-open-dkms")
    build = deb.files[standin_repo.DKMS_BUILD]
    assert "V=580.95.05" in build and "/var/lib/dkms/nvidia/kernel-$K-x86_64" in build
    assert "Linux headers are missing" in build
    assert set(standin_repo.DKMS_HOOKS) <= set(deb.files) and standin_repo.DKMS_BUILD in deb.executables
    assert standin_repo.DKMS_BUILD in deb.scripts["postinst"]


def _root(tmp_path, kernels=(), built_for=()):
    root = tmp_path / "root"
    simgpu.install(root, HostSpec.parse("hopper_x8"), "sandbox-1")
    (root / simgpu.NVIDIA_MODULE_VERSION_FILE).write_text("580.95.05\n")
    (root / "boot").mkdir(exist_ok=True)
    for k in kernels:
        (root / f"boot/vmlinuz-{k}").write_text("stand-in\n")
    for k in built_for:
        link = root / f"var/lib/dkms/nvidia/kernel-{k}-x86_64"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f"580.95.05/{k}/x86_64")
    proc = tmp_path / "sim/proc-driver"
    simgpu.on_boot(root, proc)
    return (tmp_path / "sim" / simgpu.OSRELEASE_FILE).read_text().strip(), proc


def test_a_host_runs_the_newest_stand_in_kernel_and_its_driver_loads_only_if_built_for_it(tmp_path):
    running, proc = _root(tmp_path / "a", [K40, K41], built_for=[K40, K41])
    assert running == K41 and (proc / "nvidia/version").is_file()
    running, proc = _root(tmp_path / "b", [K40, K41], built_for=[K40])    # K41's headers were missing
    assert running == K41 and not (proc / "nvidia").exists()


def test_without_a_stand_in_kernel_a_host_runs_this_machines_kernel_as_before(tmp_path):
    import os
    running, proc = _root(tmp_path)
    assert running == os.uname().release and (proc / "nvidia/version").is_file()
