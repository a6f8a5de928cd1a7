import pytest

from gpuserve.layers.proxy import keys_map
from gpuserve import status
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
                              "GPUS", "UNITS", "PROXY"]
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
    rows = [Row("sandbox-1", "minimax", "r-1", "-", "active, /health 200", "tiny", "none", "active", staging=line),
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


def test_status_lists_every_unit_gpuserve_runs_on_each_kind_of_host(tmp_path):
    """Issue 26 (3/4): with smg stopped the gateway answered 502 and status exited 0: it asked
    only the engines and the serving proxy."""
    from gpuserve.config import validate_inventory
    from tests.unit.test_monitoring import fleet_inventory

    settings = validate_inventory(fleet_inventory(tmp_path))
    gpu, cpu, mon = settings["gpu-1"], settings["cpu-1"], settings["mon-1"]
    assert status.host_units(gpu, monitored=True) == [
        "gpuserve-engine-guard.service", "prometheus-node-exporter.service",
        "gpuserve-watchdog@minimax.service", "nvidia-dcgm-exporter.service"]
    assert status.host_units(cpu, monitored=True) == [
        "gpuserve-engine-guard.service", "nginx.service", "prometheus-node-exporter.service",
        "gpuserve-watchdog@minimax.service"]
    assert status.host_units(mon, monitored=True) == [
        "nginx.service", "prometheus-node-exporter.service", "gpuserve-monitor-guard.service",
        "prometheus.service", "prometheus-alertmanager.service"]
    assert status.host_units(gpu, monitored=False) == ["gpuserve-engine-guard.service"]


def test_a_unit_that_is_down_fails_status_and_is_named():
    shown = status.UnitStates().process([
        "Id=gpuserve-gateway.service", "LoadState=loaded", "ActiveState=inactive", "Result=success", "",
        "Id=nginx.service", "LoadState=loaded", "ActiveState=active", "Result=success", "",
        "Id=prometheus.service", "LoadState=not-found", "ActiveState=inactive", "Result=success"])
    assert shown == {"gpuserve-gateway.service": ("inactive", "success"),
                     "nginx.service": ("active", "success"),
                     "prometheus.service": ("not-found", "success")}
    units = ["gpuserve-gateway.service", "nginx.service", "prometheus.service"]
    text = status.units_state(shown, units)
    assert text == "down: gpuserve-gateway.service inactive; prometheus.service not installed"
    role = Row("gw-1", "-", "-", "-", status.ROLE_HOST, "-", "none", "-", text)
    assert status.failing(role)
    ok = Row("gw-1", "-", "-", "-", status.ROLE_HOST, "-", "none", "-",
             status.units_state({u: ("active", "success") for u in units}, units))
    assert ok.units == "ok (3)" and not status.failing(ok)


def test_status_says_when_the_watchdog_restarted_the_engine_or_gave_up():
    text = ['gpuserve_watchdog_restarts_total{deployment="minimax"} 2',
            'gpuserve_watchdog_gave_up{deployment="minimax"} 0']
    assert status.WatchdogCounts().process(text) == (2, False)
    assert status.watchdog_note(2, False) == ", watchdog restarted it 2x"
    row = Row("h", "minimax", "r", "-", "active, /health 200" + status.watchdog_note(0, True), "m", "none",
              "active", "ok (3)")
    assert status.failing(row)
