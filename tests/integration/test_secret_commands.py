"""Secrets from `age -d` on real sandbox hosts (issue 29).

Three hosts: a cpu host behind the proxy (``A``), a cpu host without the proxy (``B``) and a
monitor host (``M``). ``A`` is converged with ``M`` by deploys/serve.py with its client,
operator and scrape keys and the alert receiver's secret (a webhook URL with a token) given as
``age -d`` commands (no key file at all); ``B`` with ``proxy = False`` and its engine key from an
``age -d`` command. The keys are made in this process and reach age through a pipe, so the only
plaintext copy on this machine is the test's memory. Then deploys/weights.py fans a small
checkpoint out between ``A`` and ``B`` (``weights_fanout = "hosts"``) with the fleet's SSH key.

- the converge (with ``--diff``) serves the age-held client key, refuses another, and prints
  none of the keys;
- no file on the control node holds an age-held key: grep of the test's temporary directories,
  /tmp, the repository, the instance's sandbox directory and $HOME (toolchains aside);
- a rotated key (the same command, a new age file) is live after a converge, the old one refused,
  and the engine was not restarted (nginx reloads);
- no file on a host's disk holds any key of any kind (grep of each host's overlay upper
  directory, i.e. everything the host wrote, the encrypted ``.cred`` files aside): the engine's
  internal key (and its copy for nginx), the user's engine key, the client, operator and scrape
  keys, the receiver's token and the fleet's SSH private key are systemd credentials there;
- the consumers still work: the engine through the proxy, ``B``'s engine with its key,
  Prometheus scraping ``A`` with the scrape key, alertmanager with its configuration, the
  fan-out's copy; and after a reboot of every host (/run empty) they work again.

Slow (two fresh cpu hosts' engine installs and starts, a monitor host, reboots): about 15
minutes on 2 cores.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from gpuserve import layout, monitoring
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.hub import publish_checkpoint, write_sharded_checkpoint

pytestmark = pytest.mark.slow

INV, SERVE = "inventories/sandbox.py", "deploys/serve.py"
REPO = Path(__file__).resolve().parents[2]
# $HOME's toolchains and caches, which nothing of gpuserve or pyinfra writes to
HOME_SKIP = (".pyenv", ".rustup", ".m2", ".cargo", ".npm", ".cache")


def _age_command(directory: Path, name: str, plaintext: str, identity: Path) -> list[str]:
    recipient = subprocess.run(["age-keygen", "-y", str(identity)], check=True, capture_output=True,
                               text=True).stdout.strip()
    subprocess.run(["age", "-r", recipient, "-o", str(directory / name)], input=plaintext.encode(),
                   check=True)
    return ["age", "-d", "-i", str(identity), str(directory / name)]


def _grep(key: str, *roots: Path, exclude: tuple[str, ...] = (), exclude_files: tuple[str, ...] = ()) -> list[str]:
    """Files under ``roots`` that hold ``key`` (binary files too)."""
    args = ["grep", "-rlaF", *(f"--exclude-dir={d}" for d in exclude), *(f"--exclude={f}" for f in exclude_files),
            "--", key, *(str(r) for r in roots if r.exists())]
    done = subprocess.run(args, capture_output=True, text=True)
    # a file that vanished while grep walked (another process's temporary file in /tmp) is
    # no error of ours; any other error is
    errors = [line for line in done.stderr.splitlines() if not line.endswith(": No such file or directory")]
    assert done.returncode in (0, 1) or (done.returncode == 2 and not errors), done.stderr
    return done.stdout.split()


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    if subprocess.run(["which", "age"], capture_output=True).returncode:
        pytest.fail("age is not installed: run dev/bootstrap.sh")
    host, plain, monitor = make_hosts(["cpu", "cpu", "monitor"])
    files = tmp_path_factory.mktemp("age")
    identity = files / "identity.txt"
    subprocess.run(["age-keygen", "-o", str(identity)], check=True, capture_output=True)
    client, operator = (f"age-client-{secrets.token_hex(16)}", f"age-operator-{secrets.token_hex(16)}")
    scrape, engine = (f"age-scrape-{secrets.token_hex(16)}", f"age-engine-{secrets.token_hex(16)}")
    token = f"age-receiver-{secrets.token_hex(16)}"

    def age(name: str, plaintext: str) -> str:
        return _json(_age_command(files, name, plaintext + "\n", identity))

    receivers = [{"type": "webhook", "url_command": json.loads(age("hook.age", f"http://127.0.0.1:9988/{token}"))}]
    data = ["--limit", host.name, "--limit", monitor.name,   # pyinfra splits no commas
            "--data", "api_keys_file=null", "--data", "api_keys_command=" + age("clients.age", client),
            "--data", "operator_keys_command=" + age("operators.age", operator),
            "--data", "scrape_keys_command=" + age("scrape.age", scrape),
            "--data", "alert_receivers=" + _json(receivers)]
    plain_data = ["--limit", plain.name, "--data", "proxy=False", "--data", "api_keys_file=null",
                  "--data", "api_keys_command=" + age("engine.age", engine)]
    return {"host": host, "plain": plain, "monitor": monitor, "client": client, "operator": operator,
            "scrape": scrape, "engine": engine, "token": token, "data": data, "plain_data": plain_data,
            "files": files, "identity": identity, "keys": [client, operator, scrape, engine, token],
            "certs": tmp_path_factory.mktemp("certs"), "tmp": tmp_path_factory.getbasetemp(),
            "cache": str(tmp_path_factory.mktemp("control-node-cache"))}


def _json(value) -> str:
    import json
    return json.dumps(value)


@pytest.fixture(scope="module")
def converged(fleet, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    run = run_pyinfra(INV, SERVE, "--diff", *fleet["data"], instance=sandbox.instance).check()
    plain = run_pyinfra(INV, SERVE, "--diff", *fleet["plain_data"], instance=sandbox.instance).check()
    # each run converged its hosts (a --limit that matches none converges nothing, and succeeds)
    assert run.changed and plain.changed
    assert all(f"[{h.name}]" in run.output for h in (fleet["host"], fleet["monitor"]))
    assert f"[{fleet['plain'].name}]" in plain.output
    for key in fleet["keys"]:
        assert key not in run.output and key not in plain.output
    return run


MODEL = "gpuserve-test/secret-fanout"


@pytest.fixture(scope="module")
def fanned_out(fleet, converged, sandbox, sandbox_hub, tmp_path_factory):
    """A small checkpoint fanned out between the two cpu hosts with the fleet's SSH key; the
    sums it must have there."""
    from gpuserve.layers import fanout as fanout_layer
    from gpuserve_sandbox.runner import run_pyinfra

    src = tmp_path_factory.mktemp("fanout-ckpt")
    sums = write_sharded_checkpoint(src, 4, 256 << 10, secrets.token_bytes)
    sha = publish_checkpoint(sandbox_hub.root, MODEL, src, branch=None)
    run = run_pyinfra(INV, "deploys/weights.py", "--diff", "--limit", fleet["host"].name, "--limit", fleet["plain"].name,
                      "--data", "weights_fanout=hosts", "--data", f"model_repo={MODEL}",
                      "--data", f"model_revision={sha}", "--data", f"weights_cache={fleet['cache']}",
                      instance=sandbox.instance).check()
    key = Path(fanout_layer.fleet_key(fleet["cache"])).read_text()
    # a line of the private key's body: what a plaintext copy of it holds
    fleet["fleet_key_line"] = key.splitlines()[3]
    assert fleet["fleet_key_line"] not in run.output
    return {"sha": sha, "sums": sums, "run": run}


def _consumers_work(fleet, sandbox, *, wait_s: float = 0) -> None:
    """Every consumer of a secret finds it: the engine through the proxy (the client's key), the
    proxy-less engine (the user's key), Prometheus scraping ``A`` (the scrape key), alertmanager
    with its receiver (its configuration). ``wait_s``: how long they may take to come up."""
    host, plain, monitor = fleet["host"], fleet["plain"], fleet["monitor"]
    deadline = time.monotonic() + wait_s
    while True:
        status, body = fleet_view.chat(sandbox, host, fleet["certs"], fleet["client"], "tiny-chat")
        engine = sandbox.ssh(plain, "curl -s -o /dev/null -w '%{http_code}' -H @/dev/stdin "
                                    "http://127.0.0.1:8000/v1/models <<'EOF'\n"
                                    f"Authorization: Bearer {fleet['engine']}\nEOF", check=False).stdout
        targets = sandbox.ssh(monitor, "curl -s http://127.0.0.1:9090/api/v1/targets", check=False).stdout
        up = [t for t in (json.loads(targets)["data"]["activeTargets"] if targets.startswith("{") else [])
              if t["scrapePool"] == f"{monitoring.ENGINE_JOB}/{host.name}/minimax" and t["health"] == "up"]
        am = sandbox.ssh(monitor, "curl -s http://127.0.0.1:9093/api/v2/status", check=False).stdout
        loaded = json.loads(am)["config"]["original"] if am.startswith("{") else ""   # YAML, as loaded
        ok = (status == 200, engine == "200", bool(up), "name: gpuserve" in loaded and "webhook_configs" in loaded)
        if all(ok) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert all(ok), (ok, body, engine, targets[-600:], am[-600:])
    # another key is refused by the proxy and by the proxy-less engine
    assert fleet_view.chat(sandbox, host, fleet["certs"], "x" * 40, "tiny-chat")[0] == 401
    assert sandbox.ssh(plain, "curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "
                              "http://127.0.0.1:8000/v1/models", check=False).stdout == "401"


def test_the_age_held_keys_serve_and_are_never_printed(fleet, converged, sandbox):
    host = fleet["host"]
    status, body = fleet_view.chat(sandbox, host, fleet["certs"], fleet["client"], "tiny-chat")
    assert status == 200, body
    assert fleet_view.chat(sandbox, host, fleet["certs"], "x" * 40, "tiny-chat")[0] == 401
    # the operator key reaches the operator routes
    assert fleet_view.proxy_request(sandbox, host, fleet["certs"], "/metrics", fleet["operator"])[0] == 200
    assert "client API keys (encrypted, not shown)" in converged.output
    for key in (fleet["client"], fleet["operator"]):
        assert key not in converged.output


def test_a_rotated_key_is_live_after_a_converge_without_an_engine_restart(fleet, converged, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    host = fleet["host"]
    pid = fleet_view.main_pid(sandbox, host, "minimax")
    new = f"age-client-{secrets.token_hex(16)}"
    fleet["keys"].append(new)
    _age_command(fleet["files"], "clients.age", new + "\n", fleet["identity"])   # same command
    run = run_pyinfra(INV, SERVE, "--diff", *fleet["data"], instance=sandbox.instance).check()
    assert new not in run.output and fleet["client"] not in run.output
    assert fleet_view.chat(sandbox, host, fleet["certs"], new, "tiny-chat")[0] == 200
    assert fleet_view.chat(sandbox, host, fleet["certs"], fleet["client"], "tiny-chat")[0] == 401
    assert fleet_view.main_pid(sandbox, host, "minimax") == pid
    fleet["client"] = new


def test_the_consumers_and_the_fanout_find_their_secrets(fleet, converged, fanned_out, sandbox):
    _consumers_work(fleet, sandbox, wait_s=90)
    for h in (fleet["host"], fleet["plain"]):
        assert fleet_view.checkpoint_sums(sandbox, h, f"{layout.model_repo_dir('/srv/nvme', MODEL)}/"
                                                      f"{fanned_out['sha']}") == fanned_out["sums"]


def test_after_a_reboot_every_consumer_decrypts_its_secrets_again(fleet, converged, fanned_out, sandbox):
    host = fleet["host"]
    for h in (host, fleet["plain"], fleet["monitor"]):
        sandbox.reboot(h)
    # /run is empty after the reboot: nginx's ExecStartPre=+ decrypted the credentials into it
    for _ in range(60):
        if sandbox.ssh(host, "systemctl is-active nginx", check=False).stdout.strip() == "active":
            break
        time.sleep(1)
    links = sandbox.ssh(host, "readlink /etc/nginx/gpuserve/minimax.keys; "
                              "ls /run/gpuserve/secrets").stdout.split()
    assert links[0] == "/run/gpuserve/secrets/minimax.keys" and "minimax.keys" in links[1:]
    # the engines (their ExecStartPre=+), Prometheus and alertmanager (their drop-ins) too
    _consumers_work(fleet, sandbox, wait_s=300)


def test_no_plaintext_key_on_the_control_nodes_disk(fleet, converged, sandbox):
    roots = (fleet["tmp"], Path("/tmp"), REPO, sandbox.state_dir, Path.home())
    for key in fleet["keys"]:
        # the instance's hosts/ holds the hosts' disks (checked below), $HOME its toolchains
        assert _grep(key, *roots, exclude=("hosts", *HOME_SKIP)) == []


def test_no_plaintext_key_of_any_kind_on_the_hosts_disks(fleet, converged, fanned_out, sandbox):
    host, plain, monitor = fleet["host"], fleet["plain"], fleet["monitor"]
    upper = {h.name: sandbox.host_dir(h) / "upper" for h in (host, plain, monitor)}
    # what the hosts hold instead: the credentials (and the keys' names, not the keys)
    for path in ("etc/nginx/gpuserve/minimax.keys.cred", "etc/nginx/gpuserve/minimax.upstream-auth.cred",
                 "etc/gpuserve/minimax/secrets.env.cred", "etc/gpuserve/fanout/id_ed25519.cred"):
        assert (upper[host.name] / path).is_file(), path
    assert (upper[plain.name] / "etc/gpuserve/minimax/secrets.env.cred").is_file()
    assert (upper[monitor.name] / "etc/prometheus/alertmanager.yml.cred").is_file()
    assert list((upper[monitor.name] / "etc/prometheus/gpuserve-keys").glob("*.key.cred"))
    # the engine's internal key, made on A: from its /run copy, into this test's memory only
    internal = sandbox.ssh(host, "cut -d= -f2- /run/gpuserve/secrets/minimax.secrets.env").stdout.strip()
    assert len(internal) >= 32
    kinds = {"the engine's internal key": internal, "the user's engine key": fleet["engine"],
             "a client key": fleet["client"], "an operator key": fleet["operator"],
             "a scrape key": fleet["scrape"], "a receiver's secret": fleet["token"],
             "the fleet's SSH private key": fleet["fleet_key_line"]}
    for what, key in kinds.items():
        found = _grep(key, *upper.values(), exclude_files=("*.cred",))
        assert found == [], f"{what} in plaintext: {found}"
    for key in fleet["keys"][5:]:   # the rotated client keys
        assert _grep(key, *upper.values(), exclude_files=("*.cred",)) == []


def test_a_receivers_secret_never_reaches_the_monitors_journal(fleet, converged, fanned_out, sandbox):
    """Issue 29: alertmanager 0.25 (Debian 12) logs a webhook it cannot reach with its whole URL
    ('Notify attempt failed ... err="Post \\"http://127.0.0.1:9988/<token>\\": ... connection
    refused"'); nothing listens on :9988 here, so it tried. alertmanager.yml names the alert relay
    instead (gpuserve.receivers), which holds the URL in its credential and never logs it."""
    monitor = fleet["monitor"]
    journal = sandbox.host_dir(monitor) / "upper" / "var" / "log" / "journal"
    logged = sandbox.ssh(monitor, "journalctl -o cat -u prometheus-alertmanager -u gpuserve-alert-relay",
                         check=False).stdout
    assert "127.0.0.1:9095/0" in logged or "receiver 0: not delivered" in logged, logged[-2000:]
    assert _grep(fleet["token"], journal) == []
