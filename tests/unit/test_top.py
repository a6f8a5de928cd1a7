"""``gpuserve top`` (gpuserve/top.py, the ``top`` command in gpuserve/cli.py).

The pure parts are checked on answers shaped as Prometheus gives them. The whole path is checked
against a real Prometheus (Debian's ``prometheus``, started here on loopback with a temporary
storage directory) scraping a small HTTP server on loopback that serves vLLM's and SGLang's
metric names, the watchdog's textfile and DCGM's fields, with the scrape jobs and labels
gpuserve.monitoring generates. Nothing leaves loopback; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuserve import monitoring, top
from gpuserve.cli import main
from gpuserve.monitoring import EngineTarget, NodeTarget, Plan

REPO = Path(__file__).resolve().parents[2]
GPUSERVE = REPO / ".venv" / "bin" / "gpuserve"
PROMETHEUS = shutil.which("prometheus")
TARGETS = [("gpu-1", "minimax"), ("gpu-2", "minimax"), ("gpu-3", "minimax")]


def vec(*samples: tuple[dict, float]) -> list[top.Sample]:
    return [top.Sample(labels, value) for labels, value in samples]


def hd(host: str, **extra) -> dict:
    return {"host": host, "deployment": "minimax", **extra}


ANSWERS = {
    "release": vec((hd("gpu-1", release="r-new", job="node"), 1), (hd("gpu-2", release="r-old"), 1)),
    "up": vec((hd("gpu-1", job="gpuserve-engine"), 1), (hd("gpu-2"), 1), (hd("gpu-3"), 0)),
    "gave_up": vec((hd("gpu-2"), 1)),
    "running": vec((hd("gpu-1"), 3), (hd("gpu-2"), 5)),
    "waiting": vec((hd("gpu-1"), 1), (hd("gpu-2"), 0)),
    "tokens": vec((hd("gpu-1"), 251.3), (hd("gpu-2"), 4.25)),
    "ttft_p50": vec((hd("gpu-1"), 0.15), (hd("gpu-2"), float("nan"))),
    "ttft_p95": vec((hd("gpu-1"), 0.195), (hd("gpu-2"), 2.5)),
    "kv": vec((hd("gpu-1"), 0.42), (hd("gpu-2"), 0.9)),
    "prefix": vec((hd("gpu-1"), 0.75)),
    "gpus": vec(({"host": "gpu-1"}, 2), ({"host": "gpu-2"}, 2)),
    "dcgm_up": vec(({"host": "gpu-1"}, 1), ({"host": "gpu-2"}, 1)),
    "xid": vec(({"host": "gpu-1"}, 0), ({"host": "gpu-2"}, 79)),
    "ecc": vec(({"host": "gpu-1"}, 0), ({"host": "gpu-2"}, 0)),
    "remap": ValueError("Prometheus: bad_data: parse error"),
}


def test_rows_show_each_host_from_the_answers():
    r = {row.host: row for row in top.rows(TARGETS, ANSWERS)}
    assert (r["gpu-1"].release, r["gpu-1"].engine, r["gpu-1"].running, r["gpu-1"].waiting) == \
        ("r-new", "up", "3", "1")
    assert (r["gpu-1"].tokens, r["gpu-1"].ttft_p50, r["gpu-1"].ttft_p95) == ("251", "150ms", "195ms")
    assert (r["gpu-1"].kv, r["gpu-1"].prefix, r["gpu-1"].gpu) == ("42%", "75%", "ok x2")
    assert r["gpu-2"].engine == "up, watchdog gave up"
    assert (r["gpu-2"].tokens, r["gpu-2"].ttft_p50, r["gpu-2"].ttft_p95) == ("4.2", "-", "2.50s")
    assert (r["gpu-2"].prefix, r["gpu-2"].gpu) == ("-", "XID 79")
    assert (r["gpu-3"].release, r["gpu-3"].engine, r["gpu-3"].running, r["gpu-3"].gpu) == \
        ("-", "DOWN", "-", "-")


def test_gpu_health_names_each_fault_and_a_silent_exporter():
    a = {"gpus": vec(({"host": "h"}, 8)), "dcgm_up": vec(({"host": "h"}, 1)),
         "xid": vec(({"host": "h"}, 0)), "ecc": vec(({"host": "h"}, 1)),
         "remap": vec(({"host": "h"}, 1))}
    assert top.gpu_health("h", a) == "ECC uncorrectable, row remap failed"
    assert top.gpu_health("h", {**a, "ecc": [], "remap": []}) == "ok x8"
    assert top.gpu_health("h", {**a, "dcgm_up": vec(({"host": "h"}, 0))}) == "DCGM DOWN"
    assert top.gpu_health("other", a) == "-"


def test_the_frame_has_a_title_a_summary_the_table_and_what_failed():
    text = top.frame(TARGETS, ANSWERS, source="Prometheus on mon-1",
                     now=datetime(2026, 12, 4, 22, 0, tzinfo=timezone.utc), interval=5)
    lines = text.splitlines()
    assert lines[0] == "gpuserve top: Prometheus on mon-1, 2026-12-04 22:00:00 UTC, every 5 s (Ctrl-C quits)"
    assert lines[1] == "engines up 2/3, requests running 8, waiting 1, tokens/s 255.6"
    assert lines[3].split() == ["HOST", "DEPLOYMENT", "RELEASE", "ENGINE", "RUN", "WAIT", "TOK/S",
                                "TTFT50", "TTFT95", "KV", "PREFIX", "GPU"]
    assert [ln.split()[0] for ln in lines[4:7]] == ["gpu-1", "gpu-2", "gpu-3"]
    assert lines[-2:] == ["queries that failed:", "  remap: Prometheus: bad_data: parse error"]


def test_the_loop_redraws_in_place_and_stops_after_its_iterations():
    frames, sleeps, out = iter(["one\n", "two\n", "three\n"]), [], []
    drawn = top.loop(lambda: next(frames), out.append, interval=2.5, iterations=3, sleep=sleeps.append)
    assert drawn == 3 and sleeps == [2.5, 2.5]
    assert out == [top.CLEAR + "one\n", top.CLEAR + "two\n", top.CLEAR + "three\n"]
    assert top.loop(lambda: "x\n", out.append, interval=1, iterations=1, clear=False,
                    sleep=sleeps.append) == 1 and out[-1] == "x\n" and len(sleeps) == 2


def test_parse_vector_reads_vectors_and_scalars_and_refuses_errors():
    ok = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"host": "a"}, "value": [1.0, "NaN"]}, {"metric": {"host": "b"}, "value": [1.0, "3"]}]}})
    got = top.parse_vector(ok)
    assert [s.labels["host"] for s in got] == ["a", "b"] and got[1].value == 3
    assert top.parse_vector(json.dumps({"status": "success", "data": {
        "resultType": "scalar", "result": [1.0, "2"]}}))[0].value == 2
    with pytest.raises(ValueError, match="bad_data"):
        top.parse_vector(json.dumps({"status": "error", "errorType": "bad_data", "error": "bad_data: x"}))
    with pytest.raises(ValueError, match="not an answer"):
        top.parse_vector("<html>")


def test_the_window_covers_a_minute_and_four_scrapes():
    assert top.window(15) == "60s" and top.window(60) == "240s"
    assert "[240s]" in top.queries(60)["ttft_p95"]


# --- the command's refusals ---------------------------------------------------------------------

def write_inventory(tmp_path: Path, monitor: bool = False) -> Path:
    inv = tmp_path / "inv.py"
    inv.write_text('cpu = ["gpu-1", "gpu-2", "gpu-3"]\n' + ('monitor = ["mon-1"]\n' if monitor else ""))
    return inv


def test_top_without_a_monitor_host_or_url_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)   # group_data/ of the repo, as a user runs it
    result = CliRunner().invoke(main, ["top", "--once", str(write_inventory(tmp_path))])
    assert result.exit_code == 1
    assert "no host in group 'monitor'" in result.output
    assert "--prometheus URL (http:// or https://)" in result.output


def test_top_refuses_a_url_that_is_not_http(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, ["top", "--once", "--prometheus", "127.0.0.1:9090",
                                       str(write_inventory(tmp_path))])
    assert result.exit_code == 2 and "http:// or https:// URL" in result.output


def test_top_says_when_it_cannot_reach_the_monitor_host(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    inv = tmp_path / "inv.py"   # a monitor host on a loopback port nothing listens on
    inv.write_text('cpu = ["gpu-1"]\n'
                   f'monitor = [("mon-x", {{"ssh_hostname": "127.0.0.1", "ssh_port": {free_port()}}})]\n')
    result = CliRunner().invoke(main, ["top", "--once", str(inv)])
    assert result.exit_code == 1, result.output
    assert "cannot connect to the monitor host mon-x over SSH" in result.output
    assert "--prometheus URL" in result.output


# --- a real Prometheus on loopback ----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


T0 = time.time()
TOKENS_PER_S = 250
TTFT_BUCKETS = ("0.05", "0.1", "0.2", "+Inf")   # every request lands in (0.1, 0.2]: p50 150 ms, p95 195 ms


def engine_text(host: str) -> str:
    """vLLM's names on gpu-1, SGLang's on gpu-2; counters grow with the clock."""
    now = time.time()
    t = now - T0 + 10
    # the token counter carries its own timestamp, so its rate is exactly TOKENS_PER_S however
    # late this busy machine serves the scrape
    stamp = f" {int(now * 1000)}"
    d = f'model_name="tiny",engine="0"'
    vllm = host == "gpu-1"
    name = {"running": "vllm:num_requests_running" if vllm else "sglang:num_running_reqs",
            "waiting": "vllm:num_requests_waiting" if vllm else "sglang:num_queue_reqs",
            "tokens": "vllm:generation_tokens_total" if vllm else "sglang:generation_tokens_total",
            "kv": "vllm:kv_cache_usage_perc" if vllm else "sglang:token_usage",
            "ttft": "vllm:time_to_first_token_seconds" if vllm else "sglang:time_to_first_token_seconds"}
    lines = [f"# TYPE {name['running']} gauge", f"{name['running']}{{{d}}} {3 if vllm else 5}",
             f"# TYPE {name['waiting']} gauge", f"{name['waiting']}{{{d}}} {1 if vllm else 0}",
             f"# TYPE {name['tokens']} counter", f"{name['tokens']}{{{d}}} {TOKENS_PER_S * (int(now * 1000) / 1000 - T0):.3f}{stamp}",
             f"# TYPE {name['kv']} gauge", f"{name['kv']}{{{d}}} {0.42 if vllm else 0.9}",
             f"# TYPE {name['ttft']} histogram"]
    for le in TTFT_BUCKETS:
        lines.append(f'{name["ttft"]}_bucket{{{d},le="{le}"}} {0 if le in ("0.05", "0.1") else 10 * t:.3f}')
    lines += [f"{name['ttft']}_sum{{{d}}} {1.5 * t:.3f}", f"{name['ttft']}_count{{{d}}} {10 * t:.3f}"]
    if vllm:
        lines += ["# TYPE vllm:prefix_cache_hits_total counter",
                  f"vllm:prefix_cache_hits_total{{{d}}} {300 * t:.3f}",
                  "# TYPE vllm:prefix_cache_queries_total counter",
                  f"vllm:prefix_cache_queries_total{{{d}}} {400 * t:.3f}"]
    return "\n".join(lines) + "\n"


def node_text(host: str) -> str:
    """The watchdog's textfile as node-exporter serves it (deployment and release from the file)."""
    release = {"gpu-1": "r-new", "gpu-2": "r-old"}[host]
    return (f'gpuserve_release_info{{deployment="minimax",release="{release}"}} 1\n'
            f'gpuserve_watchdog_gave_up{{deployment="minimax"}} 0\n')


def dcgm_text(host: str) -> str:
    out = []
    for gpu in ("0", "1"):
        labels = f'gpu="{gpu}",UUID="GPU-{host}-{gpu}",modelName="NVIDIA H200",Hostname="{host}"'
        xid = 79 if (host, gpu) == ("gpu-2", "1") else 0
        out += [f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}",
                f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{labels}}} 0",
                f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{labels}}} 0"]
    return "\n".join(out) + "\n"


def serve(host: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            text = {"/metrics": engine_text, "/node/metrics": node_text,
                    "/dcgm/metrics": dcgm_text}.get(self.path)
            if text is None:
                self.send_error(404)
                return
            body = text(host).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):   # Prometheus hung up: not our concern
            pass

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def scrape_jobs(ports: dict[str, int], closed_port: int) -> list[dict]:
    """gpuserve.monitoring's jobs (labels, job names, relabelling) pointed at the loopback
    servers over plain http; gpu-3's engine target is a port nothing listens on."""
    engines = [EngineTarget(h, "127.0.0.1", "minimax", "http", p) for h, p in ports.items()]
    engines.append(EngineTarget("gpu-3", "127.0.0.1", "minimax", "http", closed_port))
    nodes = [NodeTarget(h, "127.0.0.1", dcgm=True) for h in ports]
    jobs = monitoring.scrape_configs(Plan(tuple(engines), tuple(nodes)))
    for job in jobs:
        host = job["static_configs"][0]["labels"]["host"]
        if not job["job_name"].startswith(monitoring.ENGINE_JOB):
            job["scheme"] = "http"
            job.pop("tls_config", None)
            job["static_configs"][0]["targets"] = [f"127.0.0.1:{ports[host]}"]
            job.setdefault("metrics_path", "/node/metrics")
    return jobs


def api(url: str, promql: str) -> list:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        return json.load(r)["data"]["result"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    assert PROMETHEUS, "prometheus is missing: run dev/bootstrap.sh (Debian package prometheus)"
    d = tmp_path_factory.mktemp("prometheus")
    servers = {h: serve(h) for h in ("gpu-1", "gpu-2")}
    ports = {h: s.server_address[1] for h, s in servers.items()}
    port = free_port()
    conf = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": scrape_jobs(ports, free_port())}
    (d / "prometheus.yml").write_text(json.dumps(conf))
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={d / 'prometheus.yml'}",
                             f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=(d / "log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    qs = top.queries()
    try:
        deadline = time.monotonic() + 25
        while True:   # bounded: every target scraped, rates and quantiles have two samples
            try:
                ready = (len(api(url, 'up{job="gpuserve-engine"}')) == 3
                         and len(api(url, qs["tokens"])) == 2
                         and len([r for r in api(url, qs["ttft_p50"]) if r["value"][1] != "NaN"]) == 2
                         and len(api(url, qs["release"])) == 2 and len(api(url, qs["gpus"])) == 2)
            except OSError:
                ready = False
            if ready:
                break
            assert proc.poll() is None, (d / "log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus had no samples in 25 s:\n" + \
                (d / "log").read_text()[-2000:]
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for s in servers.values():
            s.shutdown()


def check_frame(text: str) -> None:
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("gpu-")}
    assert set(rows) == {"gpu-1", "gpu-2", "gpu-3"}, text
    g1, g2, g3 = (rows[h].split("  ") for h in ("gpu-1", "gpu-2", "gpu-3"))
    g1, g2, g3 = ([c.strip() for c in r if c.strip()] for r in (g1, g2, g3))
    # HOST DEPLOYMENT RELEASE ENGINE RUN WAIT TOK/S TTFT50 TTFT95 KV PREFIX GPU
    assert g1[:6] == ["gpu-1", "minimax", "r-new", "up", "3", "1"], text
    assert g1[6] == str(TOKENS_PER_S), text
    assert g1[7:] == ["150ms", "195ms", "42%", "75%", "ok x2"], text
    assert g2[:6] == ["gpu-2", "minimax", "r-old", "up", "5", "0"], text   # SGLang's names
    assert g2[6] == str(TOKENS_PER_S), text
    assert g2[7:] == ["150ms", "195ms", "90%", "-", "XID 79"], text
    assert g3 == ["gpu-3", "minimax", "-", "DOWN", "-", "-", "-", "-", "-", "-", "-", "-"], text
    assert f"engines up 2/3, requests running 8, waiting 1, tokens/s {2 * TOKENS_PER_S:.1f}" in text
    assert "queries that failed" not in text


def test_top_once_against_a_real_prometheus(prometheus, tmp_path):
    """The command as a user runs it: a separate process, the repo's group_data."""
    inv = write_inventory(tmp_path)
    result = subprocess.run([str(GPUSERVE), "top", "--prometheus", prometheus, "--once", str(inv)],
                            cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TERM": "dumb"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert top.CLEAR not in result.stdout            # --once prints one frame, no screen control
    assert result.stdout.startswith(f"gpuserve top: Prometheus {prometheus}, ")
    check_frame(result.stdout)


def test_the_ssh_batch_command_asks_a_real_prometheus(prometheus):
    """What the monitor host runs over SSH (curl, one round trip for every query), run here in a
    shell against the loopback Prometheus; its answers draw the same frame."""
    qs = top.queries()
    out = subprocess.run(["bash", "-c", top.batch_command(list(qs.values()), prometheus)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    answers = top.ask_all(lambda q: top.split_batch(out.stdout, len(q)), qs)
    check_frame(top.frame(TARGETS, answers, source="x"))


def test_the_ssh_batch_command_reports_an_unreachable_prometheus():
    qs = {"up": "up"}
    out = subprocess.run(["bash", "-c", top.batch_command(["up"], f"http://127.0.0.1:{free_port()}")],
                         capture_output=True, text=True, timeout=30)
    answers = top.ask_all(lambda q: top.split_batch(out.stdout, len(q)), qs)
    assert isinstance(answers["up"], ValueError) and "curl could not reach" in str(answers["up"])


def test_top_through_the_monitor_hosts_connection(prometheus, tmp_path, monkeypatch):
    """The monitor-host path: pyinfra connects to the inventory's monitor host and runs the curl
    batch there. The monitor here is pyinfra's ``@local`` (this machine, no SSH) and Prometheus
    the loopback one, on its own port instead of 9090."""
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(top, "PROMETHEUS_URL", prometheus)
    inv = tmp_path / "inv.py"
    inv.write_text('cpu = ["gpu-1", "gpu-2", "gpu-3"]\nmonitor = ["@local"]\n')
    result = CliRunner().invoke(main, ["top", "--iterations", "1", "--interval", "1", str(inv)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("gpuserve top: Prometheus on @local, ")
    check_frame(result.output)


def test_split_batch_with_or_without_the_last_newline_and_refuses_a_short_answer():
    text = f'{{"a":1}}\n{top.MARK}\n{{"b":2}}\n{top.MARK}\n'
    assert top.split_batch(text, 2) == ['{"a":1}', '{"b":2}']
    assert top.split_batch(text.rstrip("\n"), 2) == ['{"a":1}', '{"b":2}']
    with pytest.raises(ValueError, match="expected 3 answers"):
        top.split_batch(text, 3)
    with pytest.raises(ValueError, match="unexpected output"):
        top.split_batch(text + "curl: (7) refused", 2)


def test_top_limit_shows_only_the_chosen_hosts(prometheus, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, ["top", "--prometheus", prometheus, "--once", "--limit", "gpu-2",
                                       str(write_inventory(tmp_path))])
    assert result.exit_code == 0, result.output
    hosts = [ln.split()[0] for ln in result.output.splitlines() if ln.startswith("gpu-")]
    assert hosts == ["gpu-2"] and "engines up 1/1, requests running 5, waiting 0" in result.output
