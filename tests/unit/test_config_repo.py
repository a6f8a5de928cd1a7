"""A config repo of its own (docs/config-repo.md): what the package ships, and that no default
lives only in this repository's group_data/all.py."""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

import gpuserve.deploys as packaged
from gpuserve import config, schema
from gpuserve.plan import load_inventory

REPO = Path(__file__).resolve().parents[2]
SANDBOX = REPO / "sandbox"   # the sandbox's own distribution
DEFAULTS = {k.name: k.default for k in schema.KEYS}   # gpuserve.schema: every default, once


def test_every_deploy_of_the_repository_is_packaged():
    shipped = packaged.names()
    assert shipped == sorted(p.stem for p in (REPO / "deploys").glob("*.py") if not p.stem.startswith("_"))
    assert "serve" in shipped and "upgrade" in shipped
    assert packaged.path("serve") == packaged.path("serve.py")
    assert packaged.path("serve").read_text() == (REPO / "deploys" / "serve.py").read_text()


def test_an_unknown_deploy_names_the_shipped_ones():
    with pytest.raises(ValueError, match=r"ships no deploy 'serv'; it ships: decommission, .*serve"):
        packaged.path("serv")


def test_python_m_prints_a_deploy_path(capsys):
    assert packaged.main(["serve"]) == 0
    assert capsys.readouterr().out.strip() == str(packaged.path("serve"))
    assert packaged.main(["nope"]) == 2
    assert packaged.main([]) == 0
    assert "upgrade" in capsys.readouterr().out.split()


def test_the_package_list_holds_every_subpackage():
    """Each distribution lists its packages (gpuserve.deploys lives in deploys/): none may be
    forgotten. The sandbox is a distribution of its own (sandbox/), not a package of gpuserve's."""
    for root, extra in ((REPO, {"gpuserve.deploys", "gpuserve.templates"}), (SANDBOX, set())):
        listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
        code = {p for p in find_namespace_packages(str(root), include=["gpuserve*", "gpuserve_sandbox*"])
                if any((root / p.replace(".", "/")).glob("*.py"))}
        assert code - listed == set(), f"add these to [tool.setuptools] packages in {root}/pyproject.toml"
        assert listed - code == extra
    assert not any(p.startswith("gpuserve_sandbox") for p in find_namespace_packages(str(REPO))), \
        "the sandbox lives in sandbox/gpuserve_sandbox"


def _files(under: str) -> list[str]:
    """What a clean clone holds under a folder: the files git has (tracked, and untracked ones
    that are not ignored)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", under],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [n for n in out.split("\0") if n and (REPO / n).is_file()]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    """Both distributions' wheels, built by their build backend's PEP 517 hook (what pip calls)
    from a copy of the checkout's files; no build isolation, so nothing is downloaded."""
    tmp = tmp_path_factory.mktemp("wheels")
    src, out = tmp / "src", tmp / "dist"
    for name in _files("."):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    built = {}
    for dist, where in (("gpuserve", src), ("gpuserve-sandbox", src / "sandbox")):
        name = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                               "print(b.build_wheel(sys.argv[1]))", str(out)], cwd=where,
                              capture_output=True, text=True, check=True).stdout.split()[-1]
        built[dist] = zipfile.ZipFile(out / name)
    return built


def _metadata(wheel: zipfile.ZipFile, name: str) -> str:
    info, = {n.split("/")[0] for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info")}
    return wheel.read(f"{info}/{name}").decode() if f"{info}/{name}" in wheel.namelist() else ""


def test_the_gpuserve_wheel_holds_the_product_with_its_files_and_no_sandbox(wheels):
    """Every file of the package (templates, host programs, dashboards) and every deploy is in the
    wheel; nothing of the sandbox is, and gpuserve adds no command of its own through entry points."""
    names = set(wheels["gpuserve"].namelist())
    want = {*_files("gpuserve"), *("gpuserve/deploys/" + n.split("/", 1)[1] for n in _files("deploys")),
            # the top-level templates/, mapped into the package at build time (pyproject.toml)
            *("gpuserve/templates/" + n.split("/", 1)[1] for n in _files("templates"))}
    assert {"gpuserve/templates/gpuserve.service.j2", "gpuserve/dashboards/host.json",
            "gpuserve/files/gpuserve-gate", "gpuserve/files/gpuserve-watchdog", "gpuserve/deploys/serve.py"} <= want
    assert want - names == set()
    assert [n for n in names if "sandbox" in n.split("/")[0]] == []
    assert "gpuserve.commands" not in _metadata(wheels["gpuserve"], "entry_points.txt")
    requires = [line for line in _metadata(wheels["gpuserve"], "METADATA").splitlines()
                if line.startswith("Requires-Dist:")]
    assert any(r.startswith("Requires-Dist: pyinfra") for r in requires)
    assert not [r for r in requires if "numpy" in r or "sandbox" in r], requires


def test_the_sandbox_wheel_adds_gpuserve_sandbox_and_needs_this_gpuserve(wheels):
    wheel = wheels["gpuserve-sandbox"]
    want = {n.split("/", 1)[1] for n in _files("sandbox/gpuserve_sandbox")}
    assert {"gpuserve_sandbox/cli.py", "gpuserve_sandbox/files/sim-nvidia-smi",
            "gpuserve_sandbox/files/standin/libcuda.c"} <= want
    assert want - set(wheel.namelist()) == set()
    assert "[gpuserve.commands]\nsandbox = gpuserve_sandbox.cli:sandbox" in _metadata(wheel, "entry_points.txt")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    metadata = _metadata(wheel, "METADATA")
    assert f"Version: {version}\n" in metadata and f"Requires-Dist: gpuserve=={version}\n" in metadata
    assert "Requires-Dist: numpy" in metadata


def test_the_files_deploys_read_are_inside_the_package():
    """Host programs and dashboards: one place, in the package (files/, dashboards/); the
    templates: the top-level templates/ of the checkout, which the wheel maps into the package."""
    from gpuserve import grafana, templating
    from gpuserve.layers import units, watchdog

    pkg = Path(schema.__file__).resolve().parents[1]
    dashboards = sorted(grafana.OUT_DIR.glob("*.json"))
    assert [p.stem for p in dashboards] == sorted(grafana.DASHBOARDS)
    for f in (units.GATE_SRC, watchdog.PROGRAM_SRC, *dashboards):
        assert f.is_file() and f.resolve().is_relative_to(pkg), f
    assert templating.TEMPLATES == REPO / "templates" and (templating.TEMPLATES / "gpuserve.service.j2").is_file()


def test_the_installed_wheel_finds_its_templates(wheels, tmp_path):
    """Unpacked as pip installs it, the package renders its units from gpuserve/templates/, not
    from a checkout."""
    site = tmp_path / "site"
    wheels["gpuserve"].extractall(site)
    code = ("import gpuserve.templating as t, sys; print(t.TEMPLATES); "
            "print(t.render('gpuserve-weights-fetch.service.j2', label='L', agent='A', job='J', repo_dir='R', credential='C', credential_file='F'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True).stdout
    where, text = out.split("\n", 1)
    assert where == str(site / "gpuserve" / "templates")
    assert "ExecStart=/usr/bin/python3 A run J\n" in text and "ReadWritePaths=R\n" in text


def test_group_data_all_holds_no_default_of_its_own():
    """Every value this repo's group_data/all.py sets is gpuserve's own default: a config repo
    without it loses nothing."""
    all_py = runpy.run_path(str(REPO / "group_data" / "all.py"))
    for key, value in all_py.items():
        if key.startswith("__"):
            continue
        assert key in DEFAULTS, f"group_data/all.py sets {key}, which is no gpuserve key"
        assert value == DEFAULTS[key], f"group_data/all.py: {key} = {value!r}, the package's is {DEFAULTS[key]!r}"


def _settings(root: Path, monkeypatch) -> dict:
    monkeypatch.chdir(root)
    return config.validate_inventory(load_inventory("inventories/prod.py"))


def test_prod_plans_the_same_without_group_data_all(tmp_path, monkeypatch):
    """The example fleet, planned from a copy of its inventory and group data without all.py,
    gets exactly the settings it gets here (values and, but for 'group all', their sources)."""
    here = _settings(REPO, monkeypatch)
    repo = tmp_path / "fleet"
    shutil.copytree(REPO / "inventories", repo / "inventories")
    shutil.copytree(REPO / "group_data", repo / "group_data")
    (repo / "group_data" / "all.py").unlink()
    there = _settings(repo, monkeypatch)
    assert here.keys() == there.keys() and len(here) == 5
    for name, s in here.items():
        assert _values(there[name]) == _values(s), name


def _values(s: config.HostSettings) -> dict:
    """The settings without where each came from (a key all.py set is a 'gpuserve default' now)."""
    values = {k: v for k, v in vars(s).items() if k not in ("sources", "deployments")}
    values["deployments"] = [replace(d, origins={}) for d in s.deployments]
    return values


def test_group_data_dirs_are_pyinfras():
    """The folders pyinfra's own loader reads, in its order (pyinfra_cli.inventory)."""
    from gpuserve.config_repo import group_data_dirs

    assert group_data_dirs("inventories/prod.py", "/r") == [Path("/r/group_data"),
                                                            Path("/r/inventories/group_data")]
    assert group_data_dirs("prod.py", "/r") == [Path("/r/group_data")]
    assert group_data_dirs("/x/fleet/inventories/prod.py", "/r") == [
        Path("/r/group_data"), Path("/x/fleet/inventories/group_data")]


def test_plan_from_outside_the_config_repo_says_why_every_host_is_refused(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from gpuserve.plan import plan

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(plan, [str(REPO / "inventories" / "prod.py")])
    assert result.exit_code == 1
    assert "gpu_model (from gpuserve default)" in result.output
    assert (f"note: no group data was read: neither {tmp_path}/group_data nor {REPO}/inventories/"
            "group_data exists") in result.output
    monkeypatch.chdir(REPO)   # from the root: group data found, the plan passes, no note
    result = CliRunner().invoke(plan, ["inventories/prod.py"])
    assert result.exit_code == 0 and "note:" not in result.output


def test_plan_imports_the_config_repos_own_modules_as_pyinfra_does(tmp_path, monkeypatch):
    """pyinfra puts the directory it runs in on sys.path; gpuserve plan does the same."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    shutil.copytree(REPO / "inventories", tmp_path / "inventories")
    shutil.copytree(REPO / "group_data", tmp_path / "group_data")
    (tmp_path / "fleet_pins.py").write_text('REVISION = "' + "ab" * 20 + '"\n')
    (tmp_path / "group_data" / "prod.py").write_text(
        "from fleet_pins import REVISION\n\nmodel_revision = REVISION\n"
        'api_keys_file = "secrets/prod-api-keys"\n')
    settings = _settings(tmp_path, monkeypatch)
    assert {s.model_revision for s in settings.values()} == {"ab" * 20}
