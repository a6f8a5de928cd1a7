"""The pure part of removal (gpuserve.removal): what is gpuserve's on a host, what goes, in what
order, and that nothing gpuserve did not make is ever listed. The footprint command itself runs
against a fake root here (sh, with the paths redirected), so the parser reads real output."""

from __future__ import annotations

import posixpath
import subprocess
from pathlib import Path

import pytest

from gpuserve import layout, proxy_conf, removal, rollout
from gpuserve.releases import Release, unreferenced

from .helpers import make_inventory, settings_of

NVME = "/srv/nvme"


def _lines(*lines: str) -> list[str]:
    return list(lines)


def test_a_deployment_is_found_by_its_ledger_or_its_unit_and_nothing_else():
    fp = removal.parse_footprint(_lines(
        "ledger minimax", "state minimax active enabled", "url minimax http://127.0.0.1:8000/health",
        "unit oldone", "state oldone failed disabled",
        # state and paths of a name with neither ledger nor unit: not gpuserve's, ignored
        "state stranger active enabled", "path stranger /etc/gpuserve/stranger",
        "ledger Bad.Name", "nginx active",
    ), NVME)
    assert sorted(fp.deployments) == ["minimax", "oldone"]
    assert fp.deployments["minimax"].running and fp.deployments["minimax"].is_enabled
    assert fp.deployments["minimax"].engine_address() == ("127.0.0.1", 8000)
    assert not fp.deployments["oldone"].running and not fp.deployments["oldone"].is_enabled
    assert fp.nginx_active


def test_only_the_deployments_own_paths_are_kept_and_the_ledger_goes_last():
    name = "minimax"
    own = removal.deployment_paths(name, NVME)
    fp = removal.parse_footprint(_lines(
        "ledger minimax",
        *(f"path minimax {p}" for p in reversed(own)),
        "path minimax /etc/passwd",                         # not one of its paths: ignored
        f"path minimax {removal.deployment_paths('other', NVME)[0]}",
    ), NVME)
    paths = fp.deployments[name].paths
    assert paths == own
    assert paths[-1] == layout.deployment_dir(name) and paths[-2] == removal.unit_path(name)
    assert "/etc/passwd" not in paths


def test_deployment_paths_name_the_layout_and_the_proxy_files():
    paths = removal.deployment_paths("fast", NVME)
    assert paths == (
        "/etc/nginx/conf.d/gpuserve-fast.conf",
        # the keys: systemd credentials, the file a link to their /run copy (issue 29)
        "/etc/nginx/gpuserve/fast.keys", "/etc/nginx/gpuserve/fast.keys.cred",
        "/etc/nginx/gpuserve/fast.operator-keys", "/etc/nginx/gpuserve/fast.operator-keys.cred",
        "/etc/nginx/gpuserve/fast.upstream-auth", "/etc/nginx/gpuserve/fast.upstream-auth.cred",
        "/etc/nginx/gpuserve/fast.drain",
        "/srv/nvme/gpuserve/cache/fast",
        "/var/lib/prometheus/node-exporter/gpuserve-fast.prom",        # the watchdog's textfile
        "/var/lib/prometheus/node-exporter/gpuserve-fast.prom.tmp",
        # the decrypted copies in /run (gone at a reboot anyway)
        "/run/gpuserve/secrets/fast.keys", "/run/gpuserve/secrets/fast.operator-keys",
        "/run/gpuserve/secrets/fast.upstream-auth", "/run/gpuserve/secrets/fast.secrets.env",
        "/etc/systemd/system/gpuserve-fast.service", "/etc/gpuserve/fast",
    )
    # the proxy's shared files are never a deployment's
    assert all("gpuserve-common.conf" not in p for p in removal.deployment_paths("common", NVME))
    with pytest.raises(ValueError):
        removal.deployment_paths("../etc", NVME)


def test_leftovers_are_what_the_plan_does_not_keep():
    fp = removal.parse_footprint(_lines(
        "ledger minimax", "state minimax active enabled", "url minimax http://[::1]:8001/health",
        "path minimax /etc/gpuserve/minimax", "path minimax /etc/systemd/system/gpuserve-minimax.service",
        "path minimax /etc/nginx/conf.d/gpuserve-minimax.conf",
        "ledger fast", "state fast active enabled",
    ), NVME)
    gone = removal.leftovers(fp, ["fast"])
    assert [r.name for r in gone] == ["minimax"]
    r = gone[0]
    assert r.drain and r.stop and r.disable and r.nginx_changed
    assert r.engine_address == ("::1", 8001)
    # the drain makes its flag during the run (the footprint cannot list it): removed by name
    assert r.drain_flag == "/etc/nginx/gpuserve/minimax.drain" == rollout.drain_flag("minimax")
    assert r.describe() == [
        "out of rotation, drained", "gpuserve-minimax.service stopped", "disabled",
        "remove /etc/nginx/gpuserve/minimax.drain",
        "remove /etc/nginx/conf.d/gpuserve-minimax.conf",
        "remove /etc/systemd/system/gpuserve-minimax.service", "remove /etc/gpuserve/minimax"]
    assert removal.leftovers(fp, ["fast", "minimax"]) == []
    # a flag left by a killed run is in the footprint: removed once, by name, after the stop
    flagged = removal.parse_footprint(["ledger x", "state x active enabled",
                                       "path x /etc/nginx/conf.d/gpuserve-x.conf",
                                       "path x /etc/nginx/gpuserve/x.drain"], NVME)
    (x,) = removal.leftovers(flagged, [])
    assert x.drain_flag == "/etc/nginx/gpuserve/x.drain" and x.drain_flag not in x.files


def test_a_stopped_leftover_is_not_drained_and_a_failed_one_not_stopped():
    fp = removal.parse_footprint(_lines("ledger a", "state a inactive disabled",
                                        "ledger b", "state b activating enabled"), NVME)
    a, b = removal.leftovers(fp, [])
    assert (a.drain, a.stop, a.disable) == (False, False, False)
    assert a.drain_flag is None and b.drain_flag is None   # no drain, or no proxy site: no flag
    # still loading: stopped (nothing is in flight on an engine that is not ready) but not drained
    assert (b.drain, b.stop, b.disable) == (False, True, True)


def test_the_service_user_goes_only_when_it_is_gpuserves():
    ours = removal.parse_footprint(_lines("user gpuserve", "group gpuserve"), NVME)
    assert ours.user and ours.group
    # a user of that name that gpuserve did not make: neither it nor its group is removed
    theirs = removal.parse_footprint(_lines("group gpuserve"), NVME)
    assert not theirs.user and not theirs.group
    # a rerun after the user went: the group goes too
    rerun = removal.parse_footprint(_lines("nouser", "group gpuserve"), NVME)
    assert rerun.group and not rerun.user
    assert removal.USER_COMMENT in Path("gpuserve/layers/base.py").read_text()


def test_decommission_removes_top_directories_once():
    fp = removal.parse_footprint(_lines(*(f"host {p}" for p in removal.host_paths(NVME)),
                                        "host /etc/shadow"), NVME)
    paths = removal.decommission_paths(fp)
    assert "/etc/shadow" not in paths
    assert set(paths) == set(removal.host_paths(NVME))
    assert layout.OPT_DIR in paths and layout.gpuserve_root(NVME) in paths
    # removed as a file exactly when its name has an extension (.conf, .yml, .cred, .log, .nft;
    # a unit's drop-in directory, .d, is a directory): the token meter's usage log was taken
    # for a directory, and decommission failed on it
    files = {p for p in paths if posixpath.splitext(p)[1] not in ("", ".d")}
    assert [p for p in paths if removal.is_file(p) != (p in files)] == []


def test_decommission_is_refused_naming_every_host_without_the_opt_in():
    assert removal.refused_hosts({"a": True, "b": True}) is None
    msg = removal.refused_hosts({"a": True, "b": False, "c": False})
    assert msg.startswith("decommission refused: b, c do not set decommission = True.")
    assert removal.refused_hosts({"a": False}).startswith("decommission refused: a does not set")
    assert "nothing was touched" in msg


def test_the_unit_marker_is_the_units_first_line():
    from gpuserve.host_plan import plan_host
    from gpuserve.layers.units import engine_unit

    plan = plan_host(settings_of(make_inventory(group="cpu")))
    first = engine_unit(plan, plan.settings.deployments[0]).splitlines()[0]
    assert first == removal.UNIT_MARKER


def _fake_root(tmp_path: Path) -> Path:
    """A host's files under tmp_path: two deployments of gpuserve's, and things that are not."""
    root = tmp_path / "root"
    for d in ("etc/gpuserve/minimax/releases/r1", "etc/gpuserve/fast/releases",
              "etc/gpuserve/.staging", "etc/gpuserve/notadeployment", "etc/systemd/system",
              "etc/nginx/conf.d", "etc/nginx/gpuserve", "srv/nvme/gpuserve/cache/minimax", "opt/gpuserve/envs"):
        (root / d).mkdir(parents=True)
    unit = f"{removal.UNIT_MARKER}\nExecStart={root}/etc/gpuserve/minimax/current/launch\n"
    (root / "etc/systemd/system/gpuserve-minimax.service").write_text(unit)
    # a unit of the same name pattern that is not a deployment's (a gateway, the operator's own)
    (root / "etc/systemd/system/gpuserve-smg.service").write_text("[Unit]\nDescription=not ours\n")
    (root / "etc/nginx/conf.d/gpuserve-minimax.conf").write_text("server {}\n")
    (root / "etc/nginx/conf.d/gpuserve-common.conf").write_text("\n")
    (root / "etc/nginx/gpuserve/minimax.keys").write_text("x\n")
    (root / "etc/gpuserve/minimax/current").symlink_to("releases/r1")
    (root / "etc/gpuserve/minimax/releases/r1/wait-ready").write_text(
        "#!/bin/sh\nurl=http://127.0.0.1:8000/health\n")
    return root


def test_the_footprint_command_finds_only_gpuserves_deployments(tmp_path):
    root = _fake_root(tmp_path)
    nvme = f"{root}/srv/nvme"
    command = removal.footprint_command(nvme)
    for path in ("/etc/gpuserve", "/etc/systemd/system", "/etc/nginx", "/opt/gpuserve"):
        command = command.replace(path, f"{root}{path}")
    # systemctl and getent answer for an empty host here
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    lines = out.splitlines()
    assert "ledger minimax" in lines and "ledger fast" in lines and "unit minimax" in lines
    assert not any("smg" in line or "notadeployment" in line or ".staging" in line for line in lines)
    assert f"url minimax http://127.0.0.1:8000/health" in lines
    # parse against the redirected paths: rewrite them back, as on a real host
    real = [line.replace(str(root), "") for line in lines]
    fp = removal.parse_footprint(real, "/srv/nvme")
    assert sorted(fp.deployments) == ["fast", "minimax"]
    assert fp.deployments["minimax"].paths == (
        "/etc/nginx/conf.d/gpuserve-minimax.conf", "/etc/nginx/gpuserve/minimax.keys",
        "/srv/nvme/gpuserve/cache/minimax", "/etc/systemd/system/gpuserve-minimax.service",
        "/etc/gpuserve/minimax")
    assert fp.deployments["fast"].paths == ("/etc/gpuserve/fast",)
    assert "/etc/nginx/conf.d/gpuserve-common.conf" in fp.host_paths
    assert "/opt/gpuserve" in fp.host_paths


def test_retention_after_a_rename_keeps_what_the_new_deployment_uses():
    """The removed deployment's releases are collected beside the kept ones (layers/units.py):
    a rename to the same engine and checkpoint removes neither."""
    def rel(dep, env, ckpt):
        return Release(dep, {"name": "vllm", "version": "1", "env": env}, {"sha": "0" * 40, "path": ckpt}, "x")
    old = [rel("minimax", "/opt/gpuserve/envs/e1", "/srv/nvme/gpuserve/models/m/a"),
           rel("minimax", "/opt/gpuserve/envs/e0", "/srv/nvme/gpuserve/models/m/0")]
    new = [rel("fast", "/opt/gpuserve/envs/e1", "/srv/nvme/gpuserve/models/m/a")]
    envs, ckpts = unreferenced(old, new)
    assert envs == ["/opt/gpuserve/envs/e0"] and ckpts == ["/srv/nvme/gpuserve/models/m/0"]
    assert proxy_conf.NGINX_DIR == "/etc/nginx/gpuserve"


# --- the fleet tier: watchdog instances, exporters, gateway, monitor, the GPU stack record ------

def test_a_removed_deployments_watchdog_is_stopped_and_disabled_first():
    fp = removal.parse_footprint(_lines(
        "ledger minimax", "state minimax active enabled", "watchdog minimax active enabled",
        "path minimax /var/lib/prometheus/node-exporter/gpuserve-minimax.prom",
        "path minimax /etc/gpuserve/minimax",
        "ledger quiet", "state quiet inactive disabled", "watchdog quiet inactive ",
        # a watchdog line of a name that is not a deployment of gpuserve's: ignored
        "watchdog stranger active enabled",
    ), NVME)
    assert sorted(fp.deployments) == ["minimax", "quiet"]
    minimax, quiet = removal.leftovers(fp, [])
    assert (minimax.watchdog_stop, minimax.watchdog_disable) == (True, True)
    assert minimax.watchdog_unit == "gpuserve-watchdog@minimax.service"
    steps = minimax.describe()
    assert steps[0] == "gpuserve-watchdog@minimax.service stopped and disabled"
    assert steps.index("gpuserve-watchdog@minimax.service stopped and disabled") < steps.index(
        "gpuserve-minimax.service stopped")
    assert "remove /var/lib/prometheus/node-exporter/gpuserve-minimax.prom" in steps
    assert (quiet.watchdog_stop, quiet.watchdog_disable) == (False, False)
    assert not any("watchdog" in step for step in quiet.describe())
    # enabled but stopped (a host rebooting): disabled only
    (half,) = removal.leftovers(removal.parse_footprint(
        ["ledger h", "watchdog h failed enabled"], NVME), [])
    assert (half.watchdog_stop, half.watchdog_disable) == (False, True)
    assert half.describe()[0] == "gpuserve-watchdog@h.service disabled"


def test_the_watchdog_names_match_the_watchdog_layer():
    from gpuserve.layers import watchdog

    assert removal.WATCHDOG_TEMPLATE == watchdog.UNIT
    assert removal.watchdog_unit("fast") == watchdog.unit_name("fast")
    assert watchdog.unit_text().startswith(removal.MANAGED)
    program = Path("gpuserve/files/gpuserve-watchdog").read_text()
    assert 'f"gpuserve-{cfg[\'deployment\']}.prom"' in program and 'path + ".tmp"' in program


def test_the_fleet_tier_paths_match_the_layers_that_make_them():
    from gpuserve import gateway, monitoring, stack
    from gpuserve.layers import monitoring as monitoring_layer

    host = removal.host_paths(NVME)
    assert stack.STACK_RECORD.rsplit("/", 1)[0] in host and stack.STACK_MOVING.rsplit("/", 1)[0] in host
    assert monitoring_layer.EXPORTERS_CONF in host and monitoring_layer.EXPORTERS_DIR in host
    assert gateway.NGINX_CONF in host and removal.GATEWAY_UNIT == f"/etc/systemd/system/{gateway.UNIT}"
    assert "StateDirectory=gpuserve-gateway" in gateway.unit(
        gateway.GatewaySettings(**_gateway_fields()), "/v") and "/var/lib/gpuserve-gateway" in host
    for path in (monitoring.RULES_YML, monitoring.SCRAPE_SECRETS_DIR, monitoring.SCRAPE_CA_DIR):
        assert path in host
    # never Debian's or the operator's own: packages' directories, the TSDB, the driver stack
    for kept in ("/etc/prometheus", monitoring.TEXTFILE_DIR, "/var/lib/prometheus",
                 "/var/lib/prometheus/metrics2", stack.NVIDIA_PREFERENCES, stack.NOUVEAU_BLACKLIST,
                 "/etc/nginx", "/etc/nginx/conf.d", "/etc/default"):
        assert kept not in host and kept not in removal.marked_paths(), kept
    # what gpuserve writes into other programs' places starts with the marker
    assert monitoring.prometheus_yml(monitoring.plan_targets({}, {}), monitoring.MonitorSettings()
                                     ).startswith(removal.MANAGED)
    assert monitoring.alertmanager_yml().startswith(removal.MANAGED)
    assert gateway.unit(gateway.GatewaySettings(**_gateway_fields()), "/v").startswith(removal.MANAGED)
    layer = Path("gpuserve/layers/monitoring.py").read_text()
    for name, default in (("NODE_EXPORTER_DEFAULTS", "/etc/default/prometheus-node-exporter"),
                          ("PROMETHEUS_DEFAULTS", "/etc/default/prometheus"),
                          ("ALERTMANAGER_DEFAULTS", "/etc/default/prometheus-alertmanager")):
        # the layer writes layout.py's path (the one source of host paths), which is Debian's file
        assert getattr(layout, name) == default and f"dest=layout.{name}" in layer
        assert default in removal.marked_paths()


def _gateway_fields() -> dict:
    from gpuserve import gateway
    return {"bind": "0.0.0.0", "port": 9443, "smg_port": 30000, "metrics_host": "127.0.0.1",
            "metrics_port": 29000, "policy": "round_robin", "balance_abs_threshold": 4,
            "balance_rel_threshold": 1.2, "sticky_header": None, "health_interval_s": 5, "health_failures": 1,
            "smg_version": gateway.SMG_VERSION, "workers_ca_file": None, "addresses": ()}


def test_decommission_stops_the_services_of_its_marked_files_and_keeps_their_packages():
    fp = removal.parse_footprint(_lines(
        "marked /etc/systemd/system/gpuserve-watchdog@.service",
        "marked /etc/systemd/system/gpuserve-gateway.service",
        "marked /etc/default/prometheus-node-exporter",
        "marked /etc/prometheus/prometheus.yml",
        "marked /etc/passwd",                            # not one of MARKED: never listed
        "host /var/lib/gpuserve-gateway", "link /var/lib/gpuserve-gateway",
        "host /var/lib/private/gpuserve-gateway",
        "host /var/lib/gpuserve-stack",
        # smg in a restart loop (pyinfra's running fact says stopped), node-exporter serving,
        # prometheus stopped but enabled, alertmanager (no marked file of it here) serving
        "svc gpuserve-gateway.service activating enabled",
        "svc prometheus-node-exporter.service active enabled",
        "svc prometheus.service inactive enabled",
        "svc prometheus-alertmanager.service active enabled",
        "svc sshd.service active enabled",                # not one of gpuserve's: never listed
    ), NVME)
    assert not fp.empty
    assert removal.decommission_services(fp) == (
        removal.ServiceStop("gpuserve-gateway.service", stop=True, disable=True),
        removal.ServiceStop("prometheus-node-exporter.service", stop=True, disable=True),
        removal.ServiceStop("prometheus.service", stop=False, disable=True))
    # a rerun: stopped and disabled already, nothing to do
    done = removal.parse_footprint(["marked /etc/default/prometheus",
                                    "svc prometheus.service inactive disabled"], NVME)
    assert removal.decommission_services(done) == ()
    paths = removal.decommission_paths(fp)
    assert paths[-4:] == ("/etc/systemd/system/gpuserve-watchdog@.service",
                          "/etc/systemd/system/gpuserve-gateway.service",
                          "/etc/default/prometheus-node-exporter", "/etc/prometheus/prometheus.yml")
    assert "/etc/passwd" not in paths and "/var/lib/gpuserve-stack" in paths
    assert fp.links == ("/var/lib/gpuserve-gateway",)
    assert removal.is_file("/etc/default/prometheus") and not removal.is_file("/var/lib/gpuserve-stack")
    assert all(removal.is_unit_path(p) for p in paths[-4:-2])
    # only markers: an operator's own prometheus.yml (no marker) is not listed, so its service stays
    assert removal.decommission_services(removal.parse_footprint(["host /var/lib/gpuserve-stack"], NVME)) == ()
    assert removal.parse_footprint(["marked /etc/default/prometheus"], NVME).empty is False


def test_the_footprint_command_finds_only_gpuserves_fleet_files(tmp_path):
    root = tmp_path / "root"
    for d in ("etc/systemd/system", "etc/default", "etc/prometheus/gpuserve-keys", "var/lib/private/gpuserve-gateway",
              "var/lib/gpuserve-stack", "etc/gpuserve/fast/releases", "var/lib/prometheus/node-exporter"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/gpuserve-gateway").symlink_to("private/gpuserve-gateway")
    (root / "etc/systemd/system/gpuserve-watchdog@.service").write_text(f"{removal.MANAGED}: x\n[Unit]\n")
    (root / "etc/systemd/system/gpuserve-gateway.service").write_text(f"{removal.MANAGED}: smg\n")
    (root / "etc/default/prometheus-node-exporter").write_text(f"{removal.MANAGED}: lo\nARGS=\n")
    # the operator's own (no marker, or the marker not on the first line): never listed
    (root / "etc/default/prometheus").write_text(f'ARGS=""\n{removal.MANAGED}\n')
    (root / "etc/prometheus/prometheus.yml").write_text("global: {}\n")
    (root / "var/lib/prometheus/node-exporter/gpuserve-fast.prom").write_text("x 1\n")
    (root / "var/lib/prometheus/node-exporter/other.prom").write_text("x 1\n")
    command = removal.footprint_command("/srv/nvme")
    for path in ("/etc/gpuserve", "/etc/systemd/system", "/etc/default", "/etc/prometheus", "/var/lib"):
        command = command.replace(path, f"{root}{path}")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    real = [line.replace(str(root), "") for line in out.splitlines()]
    fp = removal.parse_footprint(real, "/srv/nvme")
    assert fp.marked == ("/etc/systemd/system/gpuserve-watchdog@.service",
                         "/etc/systemd/system/gpuserve-gateway.service",
                         "/etc/default/prometheus-node-exporter")
    assert fp.links == ("/var/lib/gpuserve-gateway",)
    assert {"/var/lib/gpuserve-stack", "/var/lib/gpuserve-gateway", "/var/lib/private/gpuserve-gateway",
            "/etc/prometheus/gpuserve-keys"} <= set(fp.host_paths)
    assert fp.deployments["fast"].paths == ("/var/lib/prometheus/node-exporter/gpuserve-fast.prom",
                                            "/etc/gpuserve/fast")
    assert not any("other.prom" in line for line in real)
    # systemd answers for an empty host here: the watchdog neither runs nor is enabled
    assert not fp.deployments["fast"].watchdog_running


def test_a_role_host_can_opt_in_to_decommission():
    from pyinfra.api import Inventory

    from gpuserve.config import validate_inventory

    from .helpers import SHA, problems_of

    inv = Inventory(([("mon-1", {"decommission": True}), ("gw-1", {}), ("mon-2", {"decommission": "yes"})], {}),
                    monitor=(["mon-1", "mon-2"], {}), fleet=(["mon-1", "gw-1", "mon-2"], {"model_revision": SHA}))
    found = problems_of(inv)
    assert any("mon-2" in p and "decommission" in p and "'yes'" in p for p in found), found
    ok = Inventory(([("mon-1", {"decommission": True}), ("mon-3", {})], {}),
                   monitor=(["mon-1", "mon-3"], {}), fleet=(["mon-1", "mon-3"], {"model_revision": SHA}))
    settings = validate_inventory(ok)
    assert settings["mon-1"].serves is False and settings["mon-1"].decommission is True
    assert settings["mon-3"].decommission is False

