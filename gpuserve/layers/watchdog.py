"""Watchdog layer: gpuserve-watchdog@<deployment>.service on every serving host.

The program (gpuserve/files/gpuserve-watchdog, Python standard library only) restarts a hung
engine, gives up after ``watchdog_max_restarts`` in ``watchdog_window_s`` (host out of rotation,
alert), stands aside while a rollout holds the host, and writes the node-exporter textfile
metrics the monitor's rules read (release, restarts, NVMe free, TLS expiry). Installed with the
monitoring layer (deploys/serve.py when the inventory has monitor hosts, deploys/monitoring.py).
"""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

from pyinfra.api import deploy
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from gpuserve import layout, monitoring, proxy_conf, rollout, templating
from gpuserve.config import DeploymentSettings, HostSettings
from gpuserve.release_files import probe_url, secrets_env_path

PROGRAM_SRC = Path(__file__).resolve().parents[1] / "files" / "gpuserve-watchdog"
PROGRAM = f"{layout.OPT_DIR}/bin/gpuserve-watchdog"
UNIT = layout.WATCHDOG_UNIT_PATH


def unit_name(deployment: str) -> str:
    return f"gpuserve-watchdog@{deployment}.service"


def config_path(deployment: str) -> str:
    return f"{layout.deployment_dir(deployment)}/watchdog.json"


def watchdog_config(s: HostSettings, dep: DeploymentSettings) -> dict:
    m = s.monitor
    return {
        "deployment": dep.name,
        "unit": dep.unit,
        "engine_url": probe_url(dep.serve_host, dep.serve_port, ""),
        "model": dep.served_model_name,
        "secrets": secrets_env_path(dep.name),
        "lock_file": rollout.LOCK_FILE,
        "drain_flag": rollout.drain_flag(dep.name),
        "current": f"{layout.deployment_dir(dep.name)}/current",
        "textfile_dir": monitoring.TEXTFILE_DIR,
        "nvme_path": s.nvme_path,
        "nvme_alert_bytes": int(m.alert_nvme_free_gib * 2**30),
        "tls_cert": f"{proxy_conf.NGINX_DIR}/tls.crt" if s.proxy else None,
        "stall_s": m.watchdog_stall_s,
        "probe_timeout_s": m.watchdog_probe_timeout_s,
        "max_restarts": m.watchdog_max_restarts,
        "window_s": m.watchdog_window_s,
        "enabled": m.watchdog,
    }


def unit_text() -> str:
    """gpuserve-watchdog@.service (templates/gpuserve-watchdog@.service.j2): one instance per deployment."""
    return templating.render("gpuserve-watchdog@.service.j2", program=PROGRAM, etc_dir=layout.ETC_DIR,
                             textfile_dir=monitoring.TEXTFILE_DIR, nginx_dir=proxy_conf.NGINX_DIR)


@deploy("Hang watchdog")
def watchdog(settings: HostSettings) -> None:
    if not settings.serves:
        return
    files.directory(name="gpuserve programs", path=f"{layout.OPT_DIR}/bin", user="root",
                    group="root", mode="755")
    program = files.put(name="Watchdog program", src=str(PROGRAM_SRC), dest=PROGRAM,
                        user="root", group="root", mode="755")
    unit = files.put(name="Watchdog unit (gpuserve-watchdog@.service)", src=StringIO(unit_text()),
                     dest=UNIT, user="root", group="root", mode="644")
    systemd.daemon_reload(name="Reload systemd units (watchdog)", _if=unit.did_change)
    for dep in settings.deployments:
        conf = files.put(name=f"{dep.name}: watchdog settings",
                         src=StringIO(json.dumps(watchdog_config(settings, dep), indent=2,
                                                 sort_keys=True) + "\n"),
                         dest=config_path(dep.name), user="root", group="root", mode="600")
        systemd.service(name=f"{dep.name}: watchdog running", service=unit_name(dep.name),
                        running=True, enabled=True)
        systemd.service(name=f"{dep.name}: watchdog restarted (its program or settings changed)",
                        service=unit_name(dep.name), restarted=True,
                        _if=any_changed(program, unit, conf))
