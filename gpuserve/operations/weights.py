"""The weights layer's operations: the pinned checkpoint revision, complete and verified, on a host.

    <nvme_path>/gpuserve/models/<org>--<name>/<sha>/      what the service layer serves (complete only)

``checkpoint_space`` refuses the host before a byte is downloaded when the files it still needs do
not fit; ``checkpoint`` stages ``<sha>.partial/`` (hardlinks, rsync from the control node's cache
over the host's own SSH settings, or a direct download from the hub), verifies every new file and
renames it to ``<sha>/``. The weights layer (gpuserve.layers.weights) says when and why; the
fan-out's operations (gpuserve.operations.fanout) share the plan-time state and the host calls.
"""

from __future__ import annotations

import ctypes
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

from gpuserve import checkpoints
from gpuserve import weights as w
from gpuserve.config import HostSettings
from gpuserve.facts.checkpoints import CheckpointState, host_command, parse_output

GIB = 1 << 30


@dataclass(frozen=True)
class Target:
    """Everything the operations need, from one host's settings."""

    host: str
    source: checkpoints.Source
    sha: str
    repo_dir: str  # on the host
    verify: str
    margin: int  # bytes
    fanout: str
    cache: str  # on the control node
    bwlimit_kib: int | None

    @classmethod
    def of(cls, s: HostSettings) -> Target:
        """One revision path (issue 11): the staging fills ``s.checkpoint_dir``, the directory
        the release serves; its parent is the repository's directory and its name the sha."""
        assert s.model_revision is not None
        repo_dir, sha = posixpath.split(s.checkpoint_dir)
        return cls(s.host, checkpoints.Source.of(s), sha, repo_dir, s.weights_verify,
                   int(s.weights_free_margin_gib * GIB), s.weights_fanout, s.weights_cache,
                   s.weights_bwlimit_kib)

    @property
    def label(self) -> str:
        return f"{self.source.repo}@{self.sha[:12]}"

    @property
    def final(self) -> str:
        return w.final_dir(self.repo_dir, self.sha)


# --------------------------------------------------------------------------------------------------
# Plan-time state (one fact call per host and run)
# --------------------------------------------------------------------------------------------------

_states: dict[tuple[int, str, str, str], dict[str, Any]] = {}


def _state_key(state: Any, name: str, t: Target) -> tuple[int, str, str, str]:
    return (id(state), name, t.repo_dir, t.sha)


def planned_state(state: Any, name: str, t: Target) -> dict[str, Any]:
    """Another host's plan-time state of the revision, as its own deploy read it ({} if none)."""
    return _states.get(_state_key(state, name, t), {})


def connector_args() -> dict[str, Any]:
    """The current operation's connection arguments (``_sudo`` ...), for commands run from a
    FunctionCommand; ``_stdin`` is the command's own."""
    return {k: v for k, v in (host.current_op_global_arguments or {}).items()
            if k in CONNECTOR_ARGUMENT_KEYS and k != "_stdin"}


def _state(t: Target) -> dict[str, Any]:
    key = _state_key(host.state, host.name, t)
    if key not in _states:
        found = host.get_fact(CheckpointState, repo_dir=t.repo_dir, sha=t.sha, verify=t.verify)
        _states[key] = found if isinstance(found, dict) else {
            "error": "could not read the checkpoint directory (is python3 installed on the host?)"}
    return _states[key]


def _todo(st: dict[str, Any]) -> bool:
    """Whether the revision needs any work on this host."""
    if st.get("error"):
        return True
    return not (st["status"] == "complete" and not st["broken"] and not st["refresh"]
                and st["revision"] not in st["partials"])


def _fail(message: str) -> FunctionCommand:
    def fail(state: Any, host: Any) -> bool:
        host.log_styled(message, fg="red", log_func=logger.error)
        return False

    return FunctionCommand(fail, (), {})


def needed_bytes(st: dict[str, Any], manifest: w.Manifest) -> int:
    """New bytes the host needs for the revision, from the plan-time state (0 when complete)."""
    if st["status"] == "complete":
        return sum(manifest.files[p].size for p in st["broken"] if p in manifest.files)
    links = {h: os.path.join(st["repo_dir"], p) for h, p in st["links"].items()}
    return w.plan_fetch(manifest, st["have"], links, st["incoming"]).need_bytes


# --------------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------------


@operation()
def checkpoint_space(target: Target):
    """Refuse the host when the files it still needs do not fit (nothing is downloaded first)."""
    st = _state(target)
    if not _todo(st):
        return
    if st.get("error"):
        yield _fail(f"{target.host}: {target.repo_dir}: {st['error']}")
        return
    try:
        manifest = checkpoints.fleet_manifest(target.source, target.sha, target.cache)
    except checkpoints.CheckpointError as exc:
        yield _fail(f"{target.host}: checkpoint {target.label}: {exc}")
        return
    try:
        w.check_space(target.host, st["free_path"], needed_bytes(st, manifest), st["free_bytes"],
                      target.margin)
    except w.SpaceError as exc:
        yield _fail(str(exc))


@operation()
def checkpoint(target: Target):
    """Stage, verify and atomically publish (or repair) the revision on the host."""
    st = _state(target)
    if not _todo(st):
        return
    yield FunctionCommand(_sync, (target, st, connector_args()), {})


def _sync(state: Any, host: Any, target: Target, st: dict[str, Any], connector_args: dict) -> bool:
    try:
        summary = sync_host(host, target, st, connector_args)
    except (checkpoints.CheckpointError, w.WeightsError) as exc:
        message = str(exc)
        if not message.startswith(target.host):
            message = f"{target.host}: checkpoint {target.label}: {message}"
        host.log_styled(message, fg="red", log_func=logger.error)
        return False
    host.log_styled(summary, log_func=logger.info)
    return True


def sync_host(host: Any, target: Target, st: dict[str, Any], connector_args: dict) -> str:
    """Bring one host's copy of the revision to complete and verified; returns a summary line."""
    if st.get("error"):
        raise w.WeightsError(f"{target.host}: {target.repo_dir}: {st['error']}")
    log = lambda m: host.log_styled(m, log_func=logger.info)  # noqa: E731
    if target.fanout == "control-node":
        src_dir, manifest = checkpoints.fleet_stage(target.source, target.sha, target.cache, log)
    else:
        src_dir, manifest = None, checkpoints.fleet_manifest(target.source, target.sha, target.cache)
    request = {"repo_dir": target.repo_dir, "manifest": manifest.to_json(records=False),
               "margin": target.margin, "where": target.host, "broken": st.get("broken", [])}
    moved = linked = 0
    for attempt in range(1, 4):
        prep = _call(host, "prepare", request, connector_args)
        linked += prep.get("link", 0)
        if prep["transfer"]:
            if src_dir is not None:
                moved += rsync_to_host(host, src_dir, prep["incoming"], prep["transfer"],
                                       target.bwlimit_kib, connector_args)
            else:
                fetched = _call(host, "fetch", {**request, "paths": prep["transfer"],
                                                "url_base": target.source.resolve_url(target.sha),
                                                "bwlimit_kib": target.bwlimit_kib}, connector_args)
                moved += fetched["received"]
        done = _call(host, "commit", request, connector_args)
        if done["complete"]:
            what = ("verified" if done["mode"] == "new" else
                    "repaired" if done["verified"] else "re-verified")
            return (f"checkpoint {target.label} {what} in {target.final}: {len(done['verified'])} "
                    f"file(s) received ({moved} bytes over the wire), {linked} hardlinked"
                    + (f", relinked {', '.join(done['relinked'])}" if done["relinked"] else ""))
        if not done["bad"] and not prep["transfer"]:
            break
        for bad in done["bad"]:
            log(f"{bad['path']} failed verification on the host ({bad['reason']}); fetching it again")
        request["broken"] = []
    missing = ", ".join(done["missing"][:5]) + (" ..." if len(done["missing"]) > 5 else "")
    raise w.WeightsError(f"{target.host}: {target.label} is still incomplete after 3 attempts "
                         f"(missing or unverified: {missing}); {target.final} was not created")


def _call(host: Any, cmd: str, request: dict[str, Any], connector_args: dict) -> dict[str, Any]:
    """Run ``gpuserve.weights.main([cmd])`` on the host with ``request`` on stdin."""
    ok, output = host.run_shell_command(StringCommand(host_command(cmd)), _stdin=json.dumps(request),
                                        **connector_args)
    try:
        result = parse_output(output.stdout_lines)
    except ValueError:
        raise w.WeightsError(f"{host.name}: `{cmd}` on the host failed: "
                             + " | ".join(output.stderr_lines[-5:] or output.stdout_lines[-5:])) from None
    if not ok or "error" in result:
        raise w.WeightsError(result.get("error") if result.get("space") else
                             f"{host.name}: {cmd}: {result.get('error', 'failed')}")
    return result


# --------------------------------------------------------------------------------------------------
# rsync over the host's own SSH settings
# --------------------------------------------------------------------------------------------------


def ssh_command(host: Any) -> tuple[list[str], str]:
    """(ssh argv, ``[user@]address``) from the host's pyinfra SSH data, as strict as pyinfra's own
    connection: its key (only that key), known_hosts file and host key checking.

    Not pyinfra's files.rsync: it is alpha, builds a shell string, cannot take a file list on stdin
    and does not pass IdentitiesOnly.
    """
    data = host.data
    if data.get("ssh_password") or data.get("ssh_key_password"):
        raise w.WeightsError(f"{host.name}: rsync over SSH needs key authentication without a "
                             "passphrase (ssh_password / ssh_key_password are set)")
    hostname = data.get("ssh_hostname") or host.name
    args = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15"]
    if data.get("ssh_port"):
        args += ["-p", str(data.get("ssh_port"))]
    if data.get("ssh_key"):
        args += ["-i", os.path.expanduser(str(data.get("ssh_key"))), "-o", "IdentitiesOnly=yes"]
    if data.get("ssh_known_hosts_file"):
        args += ["-o", f"UserKnownHostsFile={os.path.expanduser(str(data.get('ssh_known_hosts_file')))}"]
    args += ["-o", f"StrictHostKeyChecking={data.get('ssh_strict_host_key_checking') or 'accept-new'}"]
    if data.get("ssh_config_file"):
        args += ["-F", os.path.expanduser(str(data.get("ssh_config_file")))]
    if ":" in hostname and not hostname.startswith("["):
        hostname = f"[{hostname}]"
    user = data.get("ssh_user")
    return args, f"{user}@{hostname}" if user else hostname


def _die_with_parent() -> None:
    """Child side of fork: get SIGKILL when the pyinfra process dies, so a killed converge leaves
    no transfer running (the next run resumes it instead)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_SENT = re.compile(r"Total bytes sent:\s*([\d,.]+)")


def rsync_path_args(connector_args: dict) -> list[str]:
    """rsync's ``--rsync-path`` for a host reached as a user that writes through sudo (``_sudo``,
    ``_sudo_user``: the operation's connection arguments, or the host's data of those names)."""
    if not connector_args.get("_sudo"):
        return []
    user = connector_args.get("_sudo_user")
    return [f"--rsync-path=sudo -n {'-u ' + shlex.quote(user) + ' ' if user else ''}rsync"]


def rsync_to_host(host: Any, src_dir: str, dest_dir: str, paths: list[str], bwlimit_kib: int | None,
                  connector_args: dict) -> int:
    """rsync ``paths`` (relative to ``src_dir``) into ``dest_dir`` on the host. ``--append-verify``
    resumes a file an interrupted run left half-received (whole-file checksum afterwards).
    Returns the bytes sent."""
    if not shutil.which("rsync"):
        raise w.WeightsError("rsync is not installed on the control node (dev/bootstrap.sh installs it)")
    ssh, address = ssh_command(host)
    args = ["rsync", "--recursive", "--times", "--chmod=D755,F644", "--append-verify", "--from0",
            "--files-from=-", "--stats", "--timeout=600", "-e", shlex.join(ssh)]
    if bwlimit_kib:
        args.append(f"--bwlimit={bwlimit_kib}")
    args += rsync_path_args(connector_args)
    args += [src_dir.rstrip("/") + "/", f"{address}:{dest_dir.rstrip('/')}/"]
    proc = subprocess.run(args, input=b"\0".join(p.encode() for p in paths), capture_output=True,
                          preexec_fn=_die_with_parent, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise w.WeightsError(f"{host.name}: rsync of {len(paths)} file(s) from {src_dir} failed "
                             f"(exit {proc.returncode}): {' | '.join(err)}")
    m = _SENT.search(proc.stdout.decode(errors="replace"))
    return int(re.sub(r"[,.]", "", m.group(1))) if m else 0
