"""The weights fan-out's operations (``weights_fanout = "hosts"``): start a host's fetch, start the
control node's pusher, wait for a host's copy.

* ``begin`` stages ``<sha>.partial/`` on the host (hardlinks, space) and starts its
  ``gpuserve-weights-fetch`` unit;
* ``push`` starts the control node's pusher (``gpuserve.fanout_push``) once per fleet and run;
* ``wait`` waits for the host's unit to finish, printing a line per host (bytes done and total,
  rate, ETA) and one for the fleet every ``weights_progress_s``, then disables the unit and
  removes its job.

The fan-out layer (gpuserve.layers.fanout) installs what they start and hands them the fleet
(``Fleet``, made once per run from every host's settings); docs/weights.md, "Host-to-host fan-out".
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api import FunctionCommand, operation

from gpuserve import checkpoints, fanout, layout
from gpuserve import weights as w
from gpuserve.config import HostSettings
from gpuserve.operations.weights import (Target, _call, _die_with_parent, connector_args, planned_state,
                                         rsync_path_args, ssh_command)

STALL_S = 900       # no byte moved on a host for this long: the wait fails, naming what is stuck
POLL_S = 2


@dataclasses.dataclass(frozen=True)
class Fleet:
    hosts: tuple[str, ...]
    addresses: dict[str, str]
    plan: fanout.FanoutPlan
    manifest: w.Manifest
    key: str              # the fleet's private key file on the control node
    cache: str
    # every inventory host that stages this revision by fan-out, in the run or not: the
    # addresses a host lets fetch from it (a run with --limit rewrites no host's authorized_keys)
    peers: tuple[str, ...] = ()

    def sources(self, name: str) -> list[list[dict[str, str]]]:
        return [[{"name": h, "address": self.addresses[h]} for h in chain]
                for chain in self.plan.sources(name)]

    def roots(self, name: str) -> list[int]:
        return [j for j in range(len(self.plan.stripes)) if self.plan.root(j) == name]


# --------------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------------


@operation()
def begin(target: Target, restart: bool):
    """Stage ``<sha>.partial/`` (hardlinks, space) and start the host's fetch unit."""
    conn = connector_args()

    def go(state: Any, host: Any) -> bool:
        manifest = _fleet_manifest(target)
        try:
            prep = _call(host, "prepare", {"repo_dir": target.repo_dir,
                                           "manifest": manifest.to_json(records=False),
                                           "margin": target.margin, "where": target.host},
                         conn)
        except w.WeightsError as exc:
            host.log_styled(str(exc), fg="red", log_func=logger.error)
            return False
        verb = "restart" if restart else "start"
        ok, out = host.run_shell_command(f"systemctl enable {layout.FANOUT_UNIT} >/dev/null 2>&1; "
                                         f"systemctl {verb} {layout.FANOUT_UNIT}", **conn)
        host.log_styled(f"weights fan-out: {len(prep['transfer'])} file(s) to fetch "
                        f"({w.human(prep['need_bytes'])}), {prep['link']} hardlinked; "
                        f"{layout.FANOUT_UNIT} started", log_func=logger.info)
        return ok

    yield FunctionCommand(go, (), {})


def _fleet_manifest(target: Target) -> w.Manifest:
    return checkpoints.fleet_manifest(target.source, target.sha, target.cache)


@operation()
def push(settings: HostSettings, fleet: Fleet, everyone: dict[str, HostSettings]):
    """Start the control node's pusher for this host's fleet (once per fleet and run);
    ``everyone``: every host's settings (gpuserve.layers.context.all_settings)."""

    def go(state: Any, host: Any) -> bool:
        start_pusher(state, fleet, settings, everyone)
        return True

    yield FunctionCommand(go, (), {})


_pushers: dict[tuple[int, str], tuple[subprocess.Popen | None, str]] = {}


def start_pusher(state: Any, fleet: Fleet, settings: HostSettings, everyone: dict[str, HostSettings]) -> str:
    """The pusher's state file; starts it the first time this run asks."""
    key = (id(state), fleet.manifest.revision)
    if key in _pushers:
        return _pushers[key][1]
    workdir = os.path.join(checkpoints.cache_root(fleet.cache), "fanout")
    state_path = os.path.join(workdir, f"push-{fleet.manifest.revision}.state.json")
    # claimed before anything that yields (subprocess, ssh facts): every host's greenlet runs this
    # op, and a second pusher would send (and download) the checkpoint again
    _pushers[key] = (None, state_path)
    targets = []
    for j in range(len(fleet.plan.stripes)):
        row = []
        for name in fanout.push_targets(fleet.plan, j):
            h = state.inventory.get_host(name)
            t = Target.of(everyone[name])
            ssh, address = ssh_command(h)
            st = planned_state(state, name, t)
            row.append({"name": name, "ssh": shlex.join(ssh), "address": address,
                        "incoming": f"{w.partial_dir(t.repo_dir, t.sha)}/{w.INCOMING}",
                        "have": sorted(set(st.get("have", [])) |
                                       (set(fleet.manifest.files) if st.get("status") == "complete"
                                        else set())),
                        # as rsync_to_host does it for the control-node mode
                        "rsync_path": rsync_path_args({k: h.data.get(k) for k in ("_sudo", "_sudo_user")})})
        targets.append(row)
    target = Target.of(settings)
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    job_path = os.path.join(workdir, f"push-{fleet.manifest.revision}.json")
    if os.path.exists(state_path):
        os.unlink(state_path)
    job = {"source": dataclasses.asdict(target.source), "sha": target.sha, "cache": target.cache,
           "stripes": [list(s) for s in fleet.plan.stripes], "targets": targets,
           "bwlimit_kib": target.bwlimit_kib, "state": state_path}
    Path(job_path).write_text(json.dumps(job))
    log = open(os.path.join(workdir, f"push-{fleet.manifest.revision}.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpuserve.fanout_push", job_path], stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    _pushers[key] = (proc, state_path)
    logger.info(f"    weights fan-out: the control node sends {fleet.manifest.repo}@"
                f"{fleet.manifest.revision[:12]} once, in {len(fleet.plan.stripes)} stripe(s), to "
                f"{', '.join(sorted({fleet.plan.root(j) for j in range(len(fleet.plan.stripes))}))}; "
                f"{len(fleet.hosts)} host(s) feed each other")
    return state_path


# --------------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------------


_progress: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
_fleet_line_at: dict[tuple[int, str], float] = {}


@operation()
def wait(settings: HostSettings, target: Target, fleet: Fleet):
    """Wait for the host's fetch unit: progress lines while it runs; disable it when done."""
    conn = connector_args()

    def go(state: Any, host: Any) -> bool:
        return _wait(state, host, fleet, settings, target, conn)

    yield FunctionCommand(go, (), {})


def _read_progress(host: Any, path: str, conn: dict) -> dict[str, Any] | None:
    ok, out = host.run_shell_command(f"cat {shlex.quote(path)} 2>/dev/null || true", **conn)
    text = "".join(out.stdout_lines).strip() if ok else ""
    try:
        return json.loads(text) if text.startswith("{") else None
    except ValueError:
        return None


def _wait(state: Any, host: Any, fleet: Fleet, settings: HostSettings, target: Target,
          conn: dict) -> bool:
    key = (id(state), target.sha)
    docs = _progress.setdefault(key, {})
    path = layout.fanout_progress(target.repo_dir, target.sha)
    every = settings.weights_progress_s
    push_state = _pushers.get(key, (None, ""))[1]
    last_line = last_move_at = time.monotonic()
    last_done, seen_notes, seen_push = -1, 0, 0
    while True:
        doc = _read_progress(host, path, conn)
        now = time.monotonic()
        if doc and doc.get("revision") == target.sha:
            docs[host.name] = doc
            notes = doc.get("notes", [])
            for note in notes[seen_notes:]:
                host.log_styled(f"weights fan-out: {note}", fg="yellow", log_func=logger.warning)
            seen_notes = len(notes)
            if doc.get("done_bytes", 0) != last_done:
                last_done, last_move_at = doc.get("done_bytes", 0), now
            if doc.get("state") == "complete":
                host.log_styled(f"weights fan-out: {target.label} verified in {target.final} "
                                f"({fanout.progress_line(doc, time.time())})", log_func=logger.info)
                host.run_shell_command(f"systemctl disable --now {layout.FANOUT_UNIT} >/dev/null 2>&1; "
                                       f"rm -f {layout.FANOUT_JOB}", **conn)
                return True
            if doc.get("state") == "failed":
                host.log_styled(f"{host.name}: weights fan-out of {target.label} failed: "
                                f"{doc.get('error')}", fg="red", log_func=logger.error)
                return False
            if now - last_line >= every:
                host.log_styled(f"weights: {fanout.progress_line(doc, time.time())}", log_func=logger.info)
                last_line = now
        push = _read_local(push_state)
        if push:
            for note in push.get("notes", [])[seen_push:]:
                logger.warning(f"    weights fan-out (control node): {note}")
            seen_push = len(push.get("notes", []))
            if push.get("state") == "failed" and now - last_move_at > 60:
                host.log_styled(f"{host.name}: the control node's push failed: {push.get('error')}",
                                fg="red", log_func=logger.error)
                return False
        if now - _fleet_line_at.get(key, 0) >= every and docs:
            _fleet_line_at[key] = now
            logger.info(f"    {fanout.fleet_line(docs, len(fleet.hosts), time.time())}")
        if now - last_move_at > STALL_S:
            host.log_styled(f"{host.name}: weights fan-out of {target.label} made no progress for "
                            f"{STALL_S} s (see `journalctl -u {layout.FANOUT_UNIT}` on the host)",
                            fg="red", log_func=logger.error)
            return False
        time.sleep(POLL_S)


def _read_local(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None
