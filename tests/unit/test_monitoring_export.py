"""For a Prometheus of your own (issue 29): the inventory's targets as file_sd files and the
rules, accepted by promtool as a config that reads them."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from gpuserve import monitoring
from gpuserve.monitoring_export import export_files, prometheus_job

from .helpers import key_file, make_inventory, settings_of


def test_file_sd_holds_the_targets_and_labels_the_monitor_host_would_scrape(tmp_path):
    inv = make_inventory(host_data={"proxy": True, "api_keys_file": str(key_file(tmp_path)),
                                    "ssh_hostname": "10.0.0.5"})
    s = settings_of(inv)
    files, skipped = export_files({"h1": s}, {"h1": "10.0.0.5"}, s.monitor)
    assert skipped == ()
    engine = json.loads(files["gpuserve-engine.json"])
    assert engine == [{"targets": ["10.0.0.5:8443"],
                       "labels": {"host": "h1", "deployment": "minimax", "__scheme__": "https",
                                  "__metrics_path__": "/metrics"}}]
    node = json.loads(files["node.json"])
    assert node == [{"targets": ["10.0.0.5:9101"], "labels": {"host": "h1", "__scheme__": "https",
                                                             "__metrics_path__": "/metrics"}}]
    assert files["gpuserve-rules.yml"] == monitoring.rules_yml(s.monitor)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) missing")
def test_promtool_accepts_a_config_that_reads_the_exported_files(tmp_path):
    inv = make_inventory(host_data={"proxy": True, "api_keys_file": str(key_file(tmp_path))})
    s = settings_of(inv)
    files, _ = export_files({"h1": s}, {"h1": "10.0.0.5"}, s.monitor)
    out = tmp_path / "export"
    out.mkdir()
    for name, content in files.items():
        (out / name).write_text(content)
    jobs = sorted(n[:-5] for n in files if n.endswith(".json"))
    (tmp_path / "prometheus.yml").write_text(prometheus_job(str(out), jobs) + "\n")
    done = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_external_prometheus_is_a_monitor_setting():
    assert settings_of(make_inventory()).monitor.external_prometheus is False
    assert settings_of(make_inventory(host_data={"external_prometheus": True})).monitor.external_prometheus
