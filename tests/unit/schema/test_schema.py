"""One schema (issue 11): gpuserve.schema is the one place for defaults and bounds; the views,
the dataclasses, the checks and docs/configuration.md all follow it."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from gpuserve import admission, config, monitoring, schema, stack
from gpuserve.config import ConfigError, validate_inventory

from tests.unit.helpers import REPO, make_inventory

DOC = REPO / "docs" / "configuration.md"


def test_the_configuration_doc_is_generated_from_the_schema():
    """Stale when a default, a bound or a doc line changed in the schema and the doc was not
    regenerated: run `python -m gpuserve.schema docs/configuration.md`."""
    text = DOC.read_text()
    assert schema.render_doc(text) == text, "run: python -m gpuserve.schema docs/configuration.md"


def test_every_key_is_in_exactly_one_generated_table():
    text = DOC.read_text()
    for k in schema.KEYS:
        assert text.count(f"| `{k.name}` |") == 1, k.name
    assert len(schema.BY_NAME) == len(schema.KEYS), "a key is listed twice"


def test_a_stale_table_is_caught_and_the_prose_kept():
    text = DOC.read_text()
    stale = text.replace("| `serve_port` | `8000` |", "| `serve_port` | `8001` |")
    assert stale != text and schema.render_doc(stale) == text
    with pytest.raises(ValueError, match="markers missing"):
        schema.render_doc(text.replace("<!-- schema:weights -->", ""))


def test_the_defaults_views_are_the_schema():
    by_scope = {s: {k.name: k.default for k in schema.KEYS if k.scope == s} for s in schema.SCOPES}
    assert config.DEPLOYMENT_DEFAULTS == by_scope["deployment"]
    assert config.MONITOR_DEFAULTS == by_scope["monitor"]
    assert config.GATEWAY_DEFAULTS == by_scope["gateway"]
    assert config.HOST_DEFAULTS == {**by_scope["host"], **by_scope["monitor"], **by_scope["gateway"]}
    shared = {"gpu_model", "gpu_count", "nvswitch", "reboot"}
    assert stack.DEFAULTS == {**by_scope["gpu stack"], **{k: schema.default(k) for k in shared}}
    # config's KEYS (what is no typo) are every key of the schema
    assert config.KEYS == set(schema.BY_NAME)
    # gpu_count had two defaults (config None, stack 0); now one: unset, required on serving hosts
    assert stack.DEFAULTS["gpu_count"] is None is config.HOST_DEFAULTS["gpu_count"]


def test_a_host_without_gpu_count_gets_a_stack_without_gpus():
    """stack's 0 for an unset gpu_count stays (a role host), though the default is now None."""
    assert stack.settings_from({}).gpu_count == 0
    with pytest.raises(stack.StackConfigError, match="from 1 to 16"):
        stack.settings_from({"gpu_model": "H200"})


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_the_dataclass_defaults_are_the_schema():
    mon = _defaults(monitoring.MonitorSettings)
    names = {"retention": "monitor_retention", "storage_path": "monitor_storage_path",
             "scrape_interval_s": "monitor_scrape_interval_s"}
    assert len(mon) == len(config.MONITOR_DEFAULTS)
    for field, value in mon.items():
        want = schema.default(names.get(field, field))
        assert value == (tuple(want) if isinstance(want, list) else want), field
    host = _defaults(config.HostSettings)
    for field, value in host.items():
        if field in schema.BY_NAME:
            want = schema.default(field)
            assert value == (tuple(want) if isinstance(want, list) else want), field
    adm = _defaults(admission.AdmissionSettings)
    assert adm == {"enabled": schema.default("admission"),
                   "max_uncorrectable_ecc": schema.default("admission_max_uncorrectable_ecc"),
                   "allow_pending_retired_pages": schema.default("admission_allow_pending_retired_pages"),
                   "xid_fatal": tuple(schema.default("admission_xid_fatal")),
                   "pcie_min_gen": None, "pcie_min_width": None}
    assert _defaults(stack.StackSettings)["dcgm_version"] == schema.default("dcgm_version")


def test_the_schema_is_a_leaf():
    trees = [ast.parse(p.read_text()) for p in (REPO / "gpuserve" / "schema").glob("*.py")]
    imported = {n.module for tree in trees for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("gpuserve") and not m.startswith("gpuserve.schema")} == \
        {"gpuserve.hardware"}


def test_every_key_says_what_it_allows_and_means():
    for k in schema.KEYS:
        assert k.scope in schema.SCOPES and k.section in schema.SECTIONS, k.name
        assert k.doc and k.allowed_text() and k.default_text(), k.name
        assert "|" not in k.doc + k.allowed_text() + k.default_text(), k.name
        if isinstance(k.allowed, schema.Choice) and k.default is not None:
            assert k.default in k.allowed.values, k.name


# --- the checks read the schema's bounds: the edge is allowed, one past it is refused ----------------

def _problem_keys(inventory) -> set[str]:
    try:
        validate_inventory(inventory)
    except ConfigError as exc:
        return {p.key for p in exc.problems}
    return set()


# keys whose range also depends on another key's value: that one at its maximum, so that the
# schema's own bounds are what is checked (tests/unit/test_hardening.py checks the dependence)
BOUNDED_BY = {"proxy_large_prompt_kib": {"proxy_prompt_body_kib": 1024 * 1024},
              "proxy_large_prompts_per_key": {"proxy_prompt_conn_per_key": 100000}}


def _inventory(key: schema.Key, value):
    if key.scope == "gateway":
        return make_inventory(group="gateway", group_data={key.name: value})
    return make_inventory({key.name: value, **BOUNDED_BY.get(key.name, {})})


RANGED = [k for k in schema.KEYS if isinstance(k.allowed, (schema.Int, schema.Number))
          and k.scope != "gpu stack" and k.name not in ("gpu_count",)]   # gpu_count: _hardware's


@pytest.mark.parametrize("key", RANGED, ids=[k.name for k in RANGED])
def test_config_checks_the_schema_bounds(key):
    spec = key.allowed
    step = 1 if isinstance(spec, schema.Int) else 0.5
    assert key.name in _problem_keys(_inventory(key, spec.lo - step)), "below the minimum"
    assert key.name not in _problem_keys(_inventory(key, spec.lo))
    if spec.hi is not None:
        assert key.name not in _problem_keys(_inventory(key, spec.hi))
        assert key.name in _problem_keys(_inventory(key, spec.hi + step)), "above the maximum"


STACK_RANGED = [k for k in schema.KEYS if isinstance(k.allowed, schema.Int) and k.scope == "gpu stack"]


@pytest.mark.parametrize("key", STACK_RANGED, ids=[k.name for k in STACK_RANGED])
def test_the_stack_checks_the_schema_bounds(key):
    spec = key.allowed
    for bad in (spec.lo - 1, spec.hi + 1):
        with pytest.raises(stack.StackConfigError) as caught:
            stack.settings_from({key.name: bad})
        assert caught.value.key == key.name
    for good in (spec.lo, spec.hi):
        stack.settings_from({key.name: good})


CHOICES = [k for k in schema.KEYS if isinstance(k.allowed, schema.Choice) and k.allowed is not schema.BOOL
           and k.name not in ("gpu_model",)]   # gpu_model: _hardware's


@pytest.mark.parametrize("key", CHOICES, ids=[k.name for k in CHOICES])
def test_the_checks_take_their_choices_from_the_schema(key):
    if key.scope == "gpu stack":
        with pytest.raises(stack.StackConfigError):
            stack.settings_from({key.name: "nope"})
        return
    assert key.name in _problem_keys(_inventory(key, "nope"))
    for value in key.allowed.values:
        assert key.name not in _problem_keys(_inventory(key, value)), value


def test_the_recipe_row_names_the_recipes_the_code_has():
    """recipe's allowed is prose (the schema cannot import the recipe catalogue): it must still
    name every recipe and no other."""
    from gpuserve.recipes import RECIPES

    named = [n.strip() for n in schema.key("recipe").allowed.split("(")[0].replace("`", "").split(", ")]
    assert sorted(named) == sorted(RECIPES)
