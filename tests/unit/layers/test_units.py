"""Whether a host serves on GPUs comes from its recipe (Recipe.uses_gpus), not from comparing the
recipe's name with "cpu": the unit's devices, groups and ordering and the release's GPU stack
follow it."""

from __future__ import annotations

import pytest
from pyinfra.api import Inventory

from gpuserve import recipes
from gpuserve.config import validate_inventory
from gpuserve.layers.units import _after, _devices, _groups

from tests.unit.helpers import make_inventory, settings_of


@pytest.mark.parametrize("group, gpus", [("hopper_x8", True), ("blackwell_x4", True),
                                         ("mi355x_x4", True), ("cpu", False)])
def test_a_host_uses_gpus_as_its_recipe_does(group, gpus):
    s = settings_of(make_inventory(group=group))
    assert s.uses_gpus is gpus is recipes.RECIPES[s.recipe].uses_gpus


def test_a_role_host_uses_no_gpus():
    s = validate_inventory(Inventory(([("mon-1", {})], {}), monitor=(["mon-1"], {})))["mon-1"]
    assert s.recipe == "" and s.uses_gpus is False


@pytest.mark.parametrize("group, devices, groups, after", [
    ("hopper_x8", "char-nvidia-frontend", [], ["nvidia-persistenced.service",
                                               "nvidia-fabricmanager.service"]),
    ("mi355x_x4", "/dev/kfd", ["render", "video"], []),
    ("cpu", None, [], []),
])
def test_the_unit_follows_the_recipe(group, devices, groups, after):
    s = settings_of(make_inventory(group=group))
    assert (_devices(s)[0] if _devices(s) else None) == devices
    assert _groups(s) == groups
    assert _after(s) == after
