import pytest

from gpuserve.layers.proxy import keys_map
from gpuserve.status import Row, UnitResult, engine_health, proxy_state, render_table, staging_line


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


def test_status_shows_a_running_fan_out_copy_below_the_table_and_a_failed_one():
    running = {"repo": "org/m", "revision": "a" * 40, "state": "running", "total_bytes": 4 << 30,
               "done_bytes": 1 << 30, "rate_bps": 64 << 20, "started": 0.0}
    done = {**running, "revision": "b" * 40, "state": "complete", "done_bytes": 4 << 30}
    line = staging_line([running, done], 100.0)
    assert line == "org/m@aaaaaaaaaaaa: 1.0 GiB / 4.0 GiB (25%), 64.0 MiB/s, ETA 48 s"
    assert staging_line([done], 100.0) == ""                 # nothing staging: no line
    assert staging_line([{**running, "state": "failed", "error": "no space"}], 1.0) == \
        "org/m@aaaaaaaaaaaa: failed: no space"
    rows = [Row("sandbox-1", "minimax", "r-1", "-", "active, /health 200", "tiny", "none", "active", line),
            Row("sandbox-2", "minimax", "r-1", "-", "active, /health 200", "tiny", "none", "active")]
    text = render_table(rows)
    table, below = text.split("\n\n")
    assert len(table.splitlines()) == 3 and "GiB" not in table   # not a column of the table
    assert below.splitlines() == ["weights staging (fan-out):", f"  sandbox-1  {line}"]


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
