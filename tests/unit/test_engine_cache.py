"""gpuserve.engine_cache: seed names, retention, and the pack and unpack commands run for real."""

from __future__ import annotations

import getpass
import os
import subprocess
import tarfile

import pytest

from gpuserve import engine_cache


def test_a_seed_stands_for_one_release_on_one_kind_of_hardware():
    a = engine_cache.seed_key("r-abc", "H100-SXM5-80GB", 8)
    assert a == "r-abc--8xH100-SXM5-80GB"
    assert engine_cache.seed_key("r-abc", "H100-SXM5-80GB", 4) != a
    assert engine_cache.seed_key("r-abd", "H100-SXM5-80GB", 8) != a
    assert engine_cache.seed_key("r", "odd/model name", 1) == "r--1xodd_model_name"   # a file name
    assert engine_cache.hardware_of(a) == "8xH100-SXM5-80GB"


def test_the_store_is_beside_the_weights_cache(tmp_path):
    path = engine_cache.seed_file(str(tmp_path), "chat", "r1--1xcpu")
    assert path == f"{tmp_path}/.engine-caches/chat/r1--1xcpu.tar.gz"


def test_a_publish_keeps_the_newest_two_seeds_of_its_hardware_only():
    names = [("r1--8xH100.tar.gz", 1.0), ("r2--8xH100.tar.gz", 2.0), ("r3--8xH100.tar.gz", 3.0),
             ("r1--4xB200.tar.gz", 0.5), ("r4--8xH100.tar.gz.123.part", 9.0)]
    assert engine_cache.stale_seeds(names, "r3--8xH100") == ["r1--8xH100.tar.gz"]
    # the seed just published is never removed, even with an older mtime than the others
    names = [("r9--8xH100.tar.gz", 0.1), ("r2--8xH100.tar.gz", 2.0), ("r3--8xH100.tar.gz", 3.0)]
    assert engine_cache.stale_seeds(names, "r9--8xH100") == ["r2--8xH100.tar.gz"]
    assert engine_cache.stale_seeds(names[:2], "r9--8xH100") == []


def test_a_transfer_may_take_longer_the_bigger_the_seed():
    assert engine_cache.transfer_timeout_s(0) == 60
    assert engine_cache.transfer_timeout_s(10 * 2**30) > engine_cache.transfer_timeout_s(2**20) > 60


def _sh(command: str) -> str:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the unpack command runs tar as the service user (runuser)")
def test_pack_then_unpack_adds_only_what_the_host_lacks_and_once(tmp_path):
    first, second, tar = tmp_path / "first", tmp_path / "second", tmp_path / "seed.tar.gz"
    (first / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (first / "vllm" / "torch_compile_cache" / "graph.py").write_text("compiled\n")
    (first / "inductor").mkdir()
    (first / "inductor" / "kernel.so").write_bytes(b"\x7fELF")
    (first / engine_cache.MARKER).write_text("an-earlier-seed\n")
    size = int(_sh(engine_cache.pack_command(str(first), str(tar))).split()[-1])
    assert size == tar.stat().st_size and oct(tar.stat().st_mode & 0o777) == "0o600"
    with tarfile.open(tar) as t:
        members = {m.name for m in t.getmembers()}
    assert "./inductor/kernel.so" in members and f"./{engine_cache.MARKER}" not in members

    (second / "inductor").mkdir(parents=True)
    (second / "inductor" / "kernel.so").write_bytes(b"the host's own")
    user = getpass.getuser()
    command = engine_cache.unpack_command(str(second), str(tar), "r1--1xcpu", user)
    assert _sh(command).strip() == "seeded"
    assert not tar.exists()   # the upload is removed
    assert (second / "vllm" / "torch_compile_cache" / "graph.py").read_text() == "compiled\n"
    assert (second / "inductor" / "kernel.so").read_bytes() == b"the host's own"   # never replaced
    assert (second / engine_cache.MARKER).read_text() == "r1--1xcpu\n"

    _sh(engine_cache.pack_command(str(first), str(tar)))
    assert _sh(command).strip() == "already" and not tar.exists()
    assert (second / engine_cache.MARKER).read_text() == "r1--1xcpu\n"
