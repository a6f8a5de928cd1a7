"""Looking at a served sandbox fleet from this machine, as its clients and operators would:
release pointers, the engine's PID, requests through each host's proxy (TLS pinned to the host's
own certificate). Used by the end-to-end tests, the fault suite and the benches."""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

from gpuserve import layout
from gpuserve_sandbox.hosts import Sandbox, SandboxHost
from gpuserve_sandbox.services import api_keys_path

PROXY_PORT = 8443   # group_data/all.py's proxy_port


def client_key(sandbox: Sandbox) -> str:
    """The first client API key the sandbox's proxies accept."""
    return api_keys_path(sandbox.state_dir).read_text().split()[0]


def operator_keys_file(directory: Path, key: str) -> Path:
    """An operator key file (``operator_keys_file``) holding ``key``, 0600: the plan refuses a key
    file others can read."""
    path = directory / "operator-keys"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def scrape_keys_file(directory: Path, key: str) -> Path:
    """A scrape key file (``scrape_keys_file``: the monitor's credential) holding ``key``, 0600."""
    path = directory / "scrape-keys"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def pointers(sandbox: Sandbox, host: SandboxHost, deployment: str) -> tuple[str, str]:
    """(current, previous) release ids of a deployment; "" where a pointer is missing."""
    out = sandbox.ssh(host, f"readlink {layout.current_link(deployment)}; "
                            f"readlink {layout.previous_link(deployment)} || true").stdout.split()
    ids = [p.rsplit("/", 1)[-1] for p in out]
    return (ids + ["", ""])[0], (ids + ["", ""])[1]


def checkpoint_sums(sandbox: Sandbox, host: SandboxHost, revision_dir: str) -> dict[str, str]:
    """{relative path: sha256} of every file of a staged revision on the host ({} when absent)."""
    out = sandbox.ssh(host, f"cd {revision_dir} 2>/dev/null && sha256sum $(find . -type f ! -name '.*' | sort)",
                      check=False, timeout=300)
    return {line.split()[1][2:]: line.split()[0] for line in out.stdout.splitlines()}


def fanout_progress(sandbox: Sandbox, host: SandboxHost, repo_dir: str, sha: str) -> dict:
    """The host's weights fan-out progress document for one revision ({} when there is none)."""
    out = sandbox.ssh(host, f"cat {layout.fanout_progress(repo_dir, sha)} 2>/dev/null || true",
                      check=False).stdout.strip()
    return json.loads(out) if out.startswith("{") else {}


def main_pid(sandbox: Sandbox, host: SandboxHost, deployment: str) -> str:
    unit = layout.unit_name(deployment)
    return sandbox.ssh(host, f"systemctl show -p MainPID --value {unit}").stdout.strip()


def host_ca(sandbox: Sandbox, host: SandboxHost, certs: Path) -> Path:
    """The host's proxy certificate (self-signed on sandbox hosts), fetched once over SSH."""
    ca = certs / f"{host.name}.crt"
    if not ca.exists():
        ca.write_text(sandbox.ssh(host, "cat /etc/nginx/gpuserve/tls.crt").stdout)
    return ca


def proxy_request(sandbox: Sandbox, host: SandboxHost, certs: Path, path: str, key: str | None = None,
                  body: dict | None = None, timeout: float = 120,
                  port: int = PROXY_PORT) -> tuple[int, str]:
    """(HTTP status, body) of one request to the host's proxy (or, with ``port``, another of
    its TLS fronts: a gateway's, docs/gateway.md)."""
    ctx = ssl.create_default_context(cafile=str(host_ca(sandbox, host, certs)))
    ctx.check_hostname = False   # pinned to the host's own certificate instead of a name
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"https://{host.ip}:{port}{path}", headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def chat(sandbox: Sandbox, host: SandboxHost, certs: Path, key: str, model: str) -> tuple[int, str]:
    return proxy_request(sandbox, host, certs, "/v1/chat/completions", key, {
        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})


def endpoints(sandbox: Sandbox, hosts: list[SandboxHost], certs: Path) -> dict[str, tuple[str, str]]:
    """What gpuserve_sandbox.loadloop.LoadLoop takes: host name -> (proxy URL, CA file)."""
    return {h.name: (f"https://{h.ip}:{PROXY_PORT}", str(host_ca(sandbox, h, certs))) for h in hosts}


_WIRE = re.compile(r"\[(sandbox-\d+)\] checkpoint \S+ (verified|repaired|re-verified) in \S+: (\d+) file\(s\) "
                   r"received \((\d+) bytes over the wire\), (\d+) hardlinked")


def wire(output: str) -> dict[str, dict[str, int | str]]:
    """What the weights layer reported moving, per host, from a pyinfra run's output."""
    return {m[0]: {"how": m[1], "files": int(m[2]), "bytes": int(m[3]), "linked": int(m[4])}
            for m in _WIRE.findall(output)}


def rx_bytes(sandbox: Sandbox, host: SandboxHost) -> int:
    """Bytes the host's eth0 received (/proc/net/dev is per network namespace; /sys here is not)."""
    return int(sandbox.ssh(host, r"sed -n 's/^ *eth0: *\([0-9]*\).*/\1/p' /proc/net/dev").stdout)


def prompt_head(ip: str, ctx: ssl.SSLContext, key: str, length: int = 1000) -> tuple[ssl.SSLSocket, bytes]:
    """A chat request's headers (``Content-Length: length``, ``Expect: 100-continue``) and the
    proxy's first answer to them: "100 Continue" once it reads the body, or its refusal."""
    sock = ctx.wrap_socket(socket.create_connection((ip, PROXY_PORT), 10))
    sock.settimeout(30)
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {ip}\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
                  ).encode())
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def held_prompt(ip: str, ctx: ssl.SSLContext, key: str, length: int = 1000) -> ssl.SSLSocket:
    """A chat request left in flight at the proxy until the caller closes the socket: its
    headers (with ``Expect: 100-continue``) and the first byte of a ``length``-byte body, never
    the rest. nginx answers "100 Continue" when it starts to read the body, in the content phase,
    so past the preaccess phase where limit_conn counted the request in the key's limits: it
    holds one of the key's slots from then on, whatever the engine's speed (a streamed answer
    frees its slot as soon as the engine ends it and nginx has written it into the socket's
    buffers). Raises if the proxy answers anything else."""
    sock, head = prompt_head(ip, ctx, key, length)
    if not head.startswith(b"HTTP/1.1 100"):
        sock.close()
        raise AssertionError(f"the proxy did not start to read the held request's body: {head[:300]!r}")
    sock.sendall(b"{")
    return sock


def slow_client(ip: str, ctx: ssl.SSLContext, key: str, kind: str, every_s: float = 12,
                bound_s: float = 45) -> float | None:
    """Seconds until the proxy cut off a client that trickles its body (``kind`` "body": one
    byte every ``every_s``) or never ends its headers ("header"); None if still open after
    ``bound_s``."""
    sock = ctx.wrap_socket(socket.create_connection((ip, PROXY_PORT), 10))
    sock.settimeout(1)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {ip}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\n")
    t0 = last = time.monotonic()
    try:
        sock.sendall((head + "Content-Length: 1000\r\n\r\n{").encode() if kind == "body" else head.encode())
        while time.monotonic() - t0 < bound_s:
            try:
                sock.recv(4096)
                return time.monotonic() - t0
            except (TimeoutError, socket.timeout):
                pass
            if kind == "body" and time.monotonic() - last >= every_s:
                sock.sendall(b" ")
                last = time.monotonic()
    except (OSError, ssl.SSLError):
        return time.monotonic() - t0
    finally:
        sock.close()
    return None
