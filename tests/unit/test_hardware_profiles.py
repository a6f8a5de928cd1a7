"""One table of the recipe profiles' hardware (gpuserve.hardware.PROFILES): everything that names a
profile's machine agrees with it, the operator-facing group data included."""

from __future__ import annotations

import pytest

from gpuserve import recipes
from gpuserve.config import validate_inventory
from gpuserve.hardware import GPU_MODELS, PROFILES
from gpuserve.plan import PROFILE_HARDWARE, load_inventory
from gpuserve_sandbox import simgpu

from .helpers import HARDWARE, REPO


def test_every_recipe_has_its_hardware_and_back():
    assert set(PROFILES) == set(recipes.RECIPES) == set(PROFILE_HARDWARE) == set(HARDWARE)
    for name, hw in PROFILES.items():
        assert hw.gpu_model in hw.gpu_models and set(hw.gpu_models) <= set(GPU_MODELS)
        assert recipes.derive_recipe(hw.gpu_model, hw.gpu_count) == name
        assert recipes.RECIPES[name].gpu_count == hw.gpu_count
        assert set(hw.gpu_models) <= set(recipes.RECIPES[name].gpu_models)


def test_the_repos_group_data_declares_each_reference_machine(tmp_path, monkeypatch):
    """group_data/<profile>.py stays plain data an operator copies (docs/config-repo.md); as
    pyinfra's own loader reads it, it declares the table's machine."""
    inventory = tmp_path / "profiles.py"
    inventory.write_text("".join(f"{name} = ['{name}-host']\n" for name in PROFILES))
    monkeypatch.chdir(REPO)
    inv = load_inventory(str(inventory))
    for name, hw in PROFILES.items():
        data = inv.get_host(f"{name}-host").data
        assert {key: data.get(key) for key in hw.group_data()} == hw.group_data(), name


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_bare_profile_plan_is_the_reference_machine(name):
    from gpuserve.plan import profile_inventory

    fleet = {k: v for k, v in HARDWARE[name].items() if k not in PROFILES[name].group_data()}
    s = validate_inventory(profile_inventory(name, fleet), require_revision=False)[name]
    assert (s.hardware.gpu_model, s.hardware.gpu_count, s.hardware.nvswitch) == (
        PROFILES[name].gpu_model, PROFILES[name].gpu_count, PROFILES[name].nvswitch)
    assert s.recipe == name


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_sandbox_simulates_the_reference_machine(name):
    hw, sim = PROFILES[name], simgpu.PROFILES[name]
    spec = simgpu.HostSpec.parse(name)
    found = simgpu.hardware(spec, "x")
    assert len(found["gpus"]) == hw.gpu_count
    assert bool(found["nvswitches"]) == hw.nvswitch == spec.nvswitch
    assert found["vendor"] == (GPU_MODELS[hw.gpu_model].vendor if hw.gpu_count else "none")
    assert found["nvlink_gen"] == (GPU_MODELS[hw.gpu_model].nvlink_gen if hw.nvswitch else 0)
    assert {g["name"] for g in found["gpus"]} == ({sim.gpu_name} if hw.gpu_count else set())
