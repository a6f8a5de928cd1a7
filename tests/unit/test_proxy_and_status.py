import pytest

from gpuserve.layers.proxy import keys_map
from gpuserve.status import Row, UnitResult, engine_health, proxy_state, render_table


def test_keys_map_lists_each_accepted_header():
    # exact, case-sensitive regexes (a plain nginx map key compares without regard to case)
    assert keys_map(["k1", "abc.DEF-123"]) == ('"~^Bearer\\ k1$" c1;\n'
                                              '"~^Bearer\\ abc\\.DEF\\-123$" c2;\n')
    with pytest.raises(ValueError):
        keys_map(['bad"key'])          # would break out of the nginx string


def test_status_table_aligns_columns():
    text = render_table([Row("sandbox-1", "minimax", "r-1", "-", "active, /health 200", "tiny", "none",
                             "active")])
    header, row = text.splitlines()
    assert header.split() == ["HOST", "DEPLOYMENT", "RELEASE", "PREVIOUS", "HEALTH", "SERVED", "MODEL",
                              "GPUS", "PROXY"]
    assert row.index("minimax") == header.index("DEPLOYMENT")
    assert row.index("tiny") == header.index("SERVED MODEL")


def test_status_names_a_proxy_that_is_down_and_an_engine_that_gave_up():
    assert proxy_state("active", "success") == "active"
    assert proxy_state("failed", "signal") == "failed (signal)"
    assert proxy_state("inactive", "success") == "inactive"
    assert proxy_state("", "") == "not installed"
    gave_up = engine_health("failed", "start-limit-hit", None, False)
    assert gave_up.startswith("failed (gave up: start-limit-hit") and "/health no answer" in gave_up
    assert engine_health("active", "success", 200, True) == "active, /health 200, drained"


def test_unit_result_reads_properties_by_name_in_any_order():
    assert UnitResult().process(["Result=success", "ActiveState=active"]) == ("active", "success")
    assert UnitResult().process(["ActiveState=failed", "Result=start-limit-hit"]) == (
        "failed", "start-limit-hit")
    assert UnitResult().process([]) == ("", "")
