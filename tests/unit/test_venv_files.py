"""gpuserve.venv_files: files two installed distributions both own, from synthetic dist-info
folders (RECORD as installers write it: path, sha256=..., size)."""

from __future__ import annotations

from pathlib import Path

from gpuserve import venv_files


def dist(site: Path, name: str, version: str, files: dict[str, str], record: bool = True) -> None:
    """A distribution ``name``: writes ``files`` (path -> content) and its RECORD."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    rows = []
    for rel, content in files.items():
        path = (site / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        rows.append(f"{rel},sha256={abs(hash(content))},{len(content)}")
    rows.append(f"{info.name}/RECORD,,")
    if record:
        (info / "RECORD").write_text("\n".join(rows) + "\n")


def test_a_clean_venv_has_no_shared_file(tmp_path):
    dist(tmp_path, "cuda_bindings", "13.4.4", {"cuda/bindings/runtime.so": "new"})
    dist(tmp_path, "cuda_python", "13.4.4", {})  # the metapackage: no files of its own
    assert venv_files.shared_files(str(tmp_path)) == []
    assert venv_files.report(str(tmp_path)) == []


def test_the_cuda_python_clash_is_found_with_both_owners(tmp_path):
    dist(tmp_path, "cuda_bindings", "13.5.0", {"cuda/bindings/runtime.so": "new",
                                               "cuda/bindings/__init__.pxd": "same"})
    dist(tmp_path, "cuda_python", "12.6.2.post1", {"cuda/bindings/runtime.so": "old",
                                                   "cuda/bindings/__init__.pxd": "same"})
    found = venv_files.shared_files(str(tmp_path))
    assert [s.path for s in found] == ["cuda/bindings/__init__.pxd", "cuda/bindings/runtime.so"]
    pxd, so = found
    assert [d for d, _ in so.owners] == ["cuda_bindings-13.5.0", "cuda_python-12.6.2.post1"]
    assert not so.same_bytes and pxd.same_bytes
    assert "different bytes: the last one written wins" in so.describe()
    # same bytes still counts: the brief is "any file two distributions own"
    assert len(venv_files.report(str(tmp_path))) == 2


def test_a_shared_path_removed_from_disk_is_not_reported(tmp_path):
    """gpuserve.engine.STRAY_FILES: the build deletes build_backend.py, which two wheels ship."""
    dist(tmp_path, "flashinfer_python", "0.7.2.post1", {"build_backend.py": "a"})
    dist(tmp_path, "torch_c_dlpack_ext", "0.1.5", {"build_backend.py": "b"})
    assert [s.path for s in venv_files.shared_files(str(tmp_path))] == ["build_backend.py"]
    (tmp_path / "build_backend.py").unlink()
    assert venv_files.shared_files(str(tmp_path)) == []


def test_paths_outside_site_packages_are_normalized(tmp_path):
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    dist(site, "a", "1", {"../../../bin/tool": "x"})
    dist(site, "b", "2", {"../../../bin/./tool": "y"})
    assert [s.path for s in venv_files.shared_files(str(site))] == ["../../../bin/tool"]


def test_a_distribution_without_record_is_named(tmp_path):
    dist(tmp_path, "a", "1", {"a.py": "x"}, record=False)
    owners, missing = venv_files.records(str(tmp_path))
    assert missing == ["a-1"] and owners == {}


def test_one_distribution_listing_a_path_twice_is_not_a_clash(tmp_path):
    dist(tmp_path, "a", "1", {"a.py": "x"})
    record = tmp_path / "a-1.dist-info" / "RECORD"
    record.write_text(record.read_text() + "a.py,sha256=1,1\n")
    assert venv_files.shared_files(str(tmp_path)) == []
