"""Weights fan-out layer (``weights_fanout = "hosts"``): hosts feed hosts, shard by shard.

Two halves, so the copy overlaps a fresh host's slow steps (docs/weights.md, "Host-to-host fan-out"):

* :func:`fanout_start`, at the beginning of a converge: on every host of the fan-out, the serving
  side (a system user whose only key is the fleet key, forced to ``fanout_agent.py serve``: a
  read-only rsync below the models directory and a "have you verified X" question; ``from=`` the
  fleet's addresses); on each host that lacks the revision, the fleet key (0600, never shown), the
  peers' host keys, the job and the ``gpuserve-weights-fetch`` unit, started after staging
  ``<sha>.partial/``. Then, once per fleet, the control node's pusher (``gpuserve.fanout_push``)
  starts in the background.
* :func:`fanout_wait`, where the weights step was: waits for the host's unit to finish, printing
  a line per host (bytes done and total, rate, ETA) and one for the fleet every
  ``weights_progress_s``, and what fell back to which source. Then the unit is disabled and its job
  removed: nothing of the copy is left running.

Who takes which shard from whom is ``gpuserve.fanout`` (pure); what runs on the host is
``gpuserve.fanout_agent`` (standard library, installed beside ``weights.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, deploy, operation
from pyinfra.context import ctx_state
from pyinfra.operations import apt, files, server, systemd

from gpuserve import checkpoints, fanout, layout, templating
from gpuserve import fanout_agent as agent_mod
from gpuserve import weights as w
from gpuserve.config import HostSettings
from gpuserve.layers.context import all_settings
from gpuserve.operations.secrets import secret_file
from gpuserve.operations.weights import (Target, _call, _die_with_parent, _state, _todo, checkpoint_space,
                                         connector_args, planned_state, rsync_path_args, ssh_command)

STALL_S = 900       # no byte moved on a host for this long: the wait fails, naming what is stuck
POLL_S = 2


class SshHostKey(FactBase):
    """The host's ed25519 SSH host key (``type base64``), what its peers pin in known_hosts."""

    def command(self) -> str:
        return "cat /etc/ssh/ssh_host_ed25519_key.pub 2>/dev/null || true"

    def process(self, output: list[str]) -> str:
        parts = " ".join(output).split()
        return " ".join(parts[:2]) if len(parts) >= 2 else ""


# --------------------------------------------------------------------------------------------------
# The fleet, as this run sees it (plan time)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fleet:
    hosts: tuple[str, ...]
    addresses: dict[str, str]
    plan: fanout.FanoutPlan
    manifest: w.Manifest
    key: str              # the fleet's private key file on the control node
    cache: str

    def sources(self, name: str) -> list[list[dict[str, str]]]:
        return [[{"name": h, "address": self.addresses[h]} for h in chain]
                for chain in self.plan.sources(name)]

    def roots(self, name: str) -> list[int]:
        return [j for j in range(len(self.plan.stripes)) if self.plan.root(j) == name]


_fleets: dict[tuple[int, str, str], Fleet] = {}


def fanout_unit_vars(label: str, repo_dir: str) -> dict[str, str]:
    """The variables of the fan-out fetch unit (gpuserve-weights-fetch.service.j2): pure."""
    return dict(label=label, agent=f"{layout.AGENT_DIR}/fanout_agent.py", job=layout.FANOUT_JOB,
                repo_dir=repo_dir)


def fanout_unit(label: str, repo_dir: str) -> str:
    """The fan-out fetch unit (templates/gpuserve-weights-fetch.service.j2), as fanout_start writes it."""
    return templating.render("gpuserve-weights-fetch.service.j2", **fanout_unit_vars(label, repo_dir))


def address_of(name: str, s: HostSettings) -> str:
    """Where the other hosts reach this host's sshd for weights."""
    data = ctx_state.get().inventory.get_host(name).data
    return s.weights_fanout_address or data.get("ssh_hostname") or name


def fleet_of(settings: HostSettings) -> Fleet:
    """The fan-out of this host's revision over the run's hosts that stage it the same way."""
    state = ctx_state.get()
    key = (id(state), settings.model_repo, settings.model_revision or "")
    if key not in _fleets:
        everyone = all_settings()
        active = {h.name for h in state.inventory.iter_activated_hosts()}
        names = [n for n, s in everyone.items() if n in active and s.serves
                 and s.weights_fanout == "hosts" and s.model_repo == settings.model_repo
                 and s.model_revision == settings.model_revision]
        target = Target.of(settings)
        manifest = checkpoints.fleet_manifest(target.source, target.sha, target.cache)
        degree = everyone[names[0]].weights_fanout_degree
        plan = fanout.plan(names, {p: f.size for p, f in manifest.files.items()}, degree)
        _fleets[key] = Fleet(tuple(names), {n: address_of(n, everyone[n]) for n in names}, plan,
                             manifest, fleet_key(target.cache), target.cache)
    return _fleets[key]


def fleet_key(cache: str) -> str:
    """The fleet's SSH key on the control node (made once, 0600, beside the checkpoint cache)."""
    path = os.path.join(checkpoints.cache_root(cache), "fanout", "id_ed25519")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # pyinfra prepares hosts in parallel greenlets of one process: each call makes its key in
        # a private directory (a shared name made ssh-keygen ask "Overwrite?" and fail), and the
        # first to finish wins; no greenlet switch happens between the check and the renames
        tmpdir = tempfile.mkdtemp(prefix=".keygen-", dir=os.path.dirname(path))
        try:
            made = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                                   "gpuserve weights fan-out", "-f", os.path.join(tmpdir, "k")],
                                  capture_output=True, stdin=subprocess.DEVNULL, check=False)
            if made.returncode != 0:
                raise w.WeightsError(f"ssh-keygen could not make the fleet's fan-out key {path}: "
                                     f"{made.stderr.decode(errors='replace').strip()}")
            if not os.path.isfile(path):
                os.replace(os.path.join(tmpdir, "k.pub"), path + ".pub")
                os.replace(os.path.join(tmpdir, "k"), path)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
    return path


def authorized_line(fleet: Fleet, models_dir: str) -> str:
    public = Path(fleet.key + ".pub").read_text().split()
    sources = ",".join(sorted(set(fleet.addresses.values())))
    command = f"/usr/bin/python3 {layout.AGENT_DIR}/fanout_agent.py serve {shlex.quote(models_dir)}"
    return f'restrict,from="{sources}",command="{command}" {public[0]} {public[1]} gpuserve-fanout\n'


def job_for(fleet: Fleet, settings: HostSettings, target: Target) -> dict[str, Any]:
    return {
        "self": settings.host, "repo_dir": target.repo_dir,
        "models_dir": layout.models_dir(settings.nvme_path),
        "manifest": fleet.manifest.to_json(records=False),
        "stripes": [list(s) for s in fleet.plan.stripes], "sources": fleet.sources(settings.host),
        "roots": fleet.roots(settings.host), "margin": target.margin,
        "bwlimit_kib": target.bwlimit_kib,
        "progress": layout.fanout_progress(target.repo_dir, target.sha),
        "ssh": {"user": layout.FANOUT_USER, "key": layout.FANOUT_KEY,
                "known_hosts": layout.FANOUT_KNOWN_HOSTS, "control_dir": layout.FANOUT_RUN_DIR},
    }


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
def push(settings: HostSettings):
    """Start the control node's pusher for this host's fleet (once per fleet and run)."""
    fleet = fleet_of(settings)

    def go(state: Any, host: Any) -> bool:
        start_pusher(state, fleet, settings)
        return True

    yield FunctionCommand(go, (), {})


_pushers: dict[tuple[int, str], tuple[subprocess.Popen | None, str]] = {}


def start_pusher(state: Any, fleet: Fleet, settings: HostSettings) -> str:
    """The pusher's state file; starts it the first time this run asks."""
    key = (id(state), fleet.manifest.revision)
    if key in _pushers:
        return _pushers[key][1]
    workdir = os.path.join(checkpoints.cache_root(fleet.cache), "fanout")
    state_path = os.path.join(workdir, f"push-{fleet.manifest.revision}.state.json")
    # claimed before anything that yields (subprocess, ssh facts): every host's greenlet runs this
    # op, and a second pusher would send (and download) the checkpoint again
    _pushers[key] = (None, state_path)
    everyone = all_settings()
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
def wait(settings: HostSettings, target: Target):
    """Wait for the host's fetch unit: progress lines while it runs; disable it when done."""
    conn = connector_args()
    fleet = fleet_of(settings)

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


# --------------------------------------------------------------------------------------------------
# The layer's two halves
# --------------------------------------------------------------------------------------------------


@deploy("Weights fan-out")
def fanout_start(settings: HostSettings) -> None:
    """Install the fan-out on this host and, where the revision is missing, start fetching it."""
    target = Target.of(settings)
    fleet = fleet_of(settings)
    models = layout.models_dir(settings.nvme_path)
    apt.packages(name="rsync (weights fan-out)", packages=["rsync"])
    server.user(name="Fan-out user (reads checkpoints for other hosts)", user=layout.FANOUT_USER,
                system=True, shell="/bin/sh", home=layout.FANOUT_HOME, ensure_home=True,
                groups=[layout.SERVICE_GROUP])
    files.directory(name="Fan-out user's .ssh", path=f"{layout.FANOUT_HOME}/.ssh", user="root",
                    group="root", mode="755")
    files.put(name="Fan-out key: read checkpoints only, from the fleet's addresses",
              src=StringIO(authorized_line(fleet, models)),
              dest=f"{layout.FANOUT_HOME}/.ssh/authorized_keys", user="root", group="root", mode="644")
    files.directory(name="Fan-out agent directory", path=layout.AGENT_DIR, user="root", group="root",
                    mode="755")
    for module in (w, agent_mod):
        files.put(name=f"Fan-out agent: {Path(module.__file__).name}", src=module.__file__,
                  dest=f"{layout.AGENT_DIR}/{Path(module.__file__).name}", user="root", group="root",
                  mode="644")
    st = _state(target)
    if not _todo(st):
        return
    checkpoint_space(name=f"Free space for checkpoint {target.label}", target=target)
    files.directory(name="Fan-out configuration", path=layout.FANOUT_ETC, user="root", group="root",
                    mode="700")
    secret_file(name="Fan-out fleet key", content=Path(fleet.key).read_text(), dest=layout.FANOUT_KEY)
    state = ctx_state.get()
    peers = "".join(f"{fleet.addresses[n]} {state.inventory.get_host(n).get_fact(SshHostKey)}\n"
                    for n in fleet.hosts if n != settings.host)
    files.put(name="Fan-out peers' host keys", src=StringIO(peers), dest=layout.FANOUT_KNOWN_HOSTS,
              user="root", group="root", mode="644")
    job = files.put(name=f"Fan-out job for {target.label}",
                    src=StringIO(json.dumps(job_for(fleet, settings, target), indent=1) + "\n"),
                    dest=layout.FANOUT_JOB, user="root", group="root", mode="600")
    unit = files.put(name=f"Fan-out unit {layout.FANOUT_UNIT}",
                     src=StringIO(fanout_unit(target.label, target.repo_dir)),
                     dest=layout.systemd_unit_path(layout.FANOUT_UNIT), user="root", group="root", mode="644")
    systemd.daemon_reload(name="systemd: reload units (fan-out)", _if=unit.did_change)
    begin(name=f"Start fetching {target.label}", target=target,
          restart=bool(job.will_change or unit.will_change))
    push(name="Control node: send each stripe once", settings=settings)


@deploy("Weights fan-out: wait")
def fanout_wait(settings: HostSettings) -> None:
    """Wait for this host's copy (started by :func:`fanout_start`) to be complete and verified."""
    target = Target.of(settings)
    if not _todo(_state(target)):
        return
    wait(name=f"Checkpoint {target.label} (fan-out)", settings=settings, target=target)


def stage_begin(settings: HostSettings) -> None:
    """Start of a converge: with ``weights_fanout = "hosts"`` the copy starts now, in the host's
    unit, and runs while the GPU stack installs (and reboots) and the engine's venv builds."""
    if settings.weights_fanout == "hosts":
        fanout_start(settings)


def stage_end(settings: HostSettings) -> None:
    """The weights step: wait for the fan-out, or stage the revision from the control node or the
    hub (``gpuserve.layers.weights``)."""
    if settings.weights_fanout == "hosts":
        fanout_wait(settings)
    else:
        from gpuserve.layers.weights import weights
        weights(settings)
