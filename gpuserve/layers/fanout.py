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

The operations that start and wait (``begin``, ``push``, ``wait``) are ``gpuserve.operations.fanout``.
Who takes which shard from whom is ``gpuserve.fanout`` (pure); what runs on the host is
``gpuserve.fanout_agent`` (standard library, installed beside ``weights.py`` and ``weights_manifest.py``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.context import ctx_state
from pyinfra.operations import apt, files, server, systemd

from gpuserve import checkpoints, fanout, layout, templating
from gpuserve import fanout_agent as agent_mod
from gpuserve import weights as w
from gpuserve.config import HostSettings
from gpuserve.facts.checkpoints import HOST_MODULES
from gpuserve.facts.ssh import SshHostKey
from gpuserve.layers.context import all_settings
from gpuserve.operations.fanout import Fleet, begin, push, wait
from gpuserve.operations.secrets import encrypted_credential
from gpuserve.operations.weights import Target, _state, _todo, checkpoint_space


# --------------------------------------------------------------------------------------------------
# The fleet, as this run sees it (plan time)
# --------------------------------------------------------------------------------------------------


_fleets: dict[tuple[int, str, str], Fleet] = {}


def fanout_unit_vars(label: str, repo_dir: str) -> dict[str, str]:
    """The variables of the fan-out fetch unit (gpuserve-weights-fetch.service.j2): pure."""
    return dict(label=label, agent=f"{layout.AGENT_DIR}/fanout_agent.py", job=layout.FANOUT_JOB,
                repo_dir=repo_dir, credential=layout.FANOUT_KEY_CREDENTIAL, credential_file=layout.FANOUT_KEY_CRED)


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
        peers = [n for n, s in everyone.items() if s.serves
                 and s.weights_fanout == "hosts" and s.model_repo == settings.model_repo
                 and s.model_revision == settings.model_revision]
        names = [n for n in peers if n in active]
        target = Target.of(settings)
        manifest = checkpoints.fleet_manifest(target.source, target.sha, target.cache)
        degree = everyone[names[0]].weights_fanout_degree
        plan = fanout.plan(names, {p: f.size for p, f in manifest.files.items()}, degree)
        _fleets[key] = Fleet(tuple(names), {n: address_of(n, everyone[n]) for n in names}, plan,
                             manifest, fleet_key(target.cache), target.cache,
                             peers=tuple(sorted({address_of(n, everyone[n]) for n in peers})))
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
    # the inventory's peers, not only the run's hosts: the same line whatever --limit says
    sources = ",".join(fleet.peers or sorted(set(fleet.addresses.values())))
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
        "ssh": {"user": layout.FANOUT_USER, "key": layout.FANOUT_KEY_CREDENTIAL,   # in $CREDENTIALS_DIRECTORY
                "known_hosts": layout.FANOUT_KNOWN_HOSTS, "control_dir": layout.FANOUT_RUN_DIR},
    }


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
    for module in (*HOST_MODULES, agent_mod):   # the agent imports weights from beside itself
        files.put(name=f"Fan-out agent: {Path(module.__file__).name}", src=module.__file__,
                  dest=f"{layout.AGENT_DIR}/{Path(module.__file__).name}", user="root", group="root",
                  mode="644")
    st = _state(target)
    if not _todo(st):
        return
    checkpoint_space(name=f"Free space for checkpoint {target.label}", target=target)
    files.directory(name="Fan-out configuration", path=layout.FANOUT_ETC, user="root", group="root",
                    mode="700")
    # encrypted at rest (issue 29): the fetch unit loads it into its $CREDENTIALS_DIRECTORY
    key = encrypted_credential(name="Fan-out fleet key (encrypted, not shown)", content=Path(fleet.key).read_text(),
                               cred=layout.FANOUT_KEY_CRED, cred_name=layout.FANOUT_KEY_CREDENTIAL)
    if host.get_fact(File, path=layout.FANOUT_KEY):
        server.shell(name="No fan-out fleet key in plaintext (it was before issue 29)",
                     commands=[f"shred -u {layout.FANOUT_KEY}"])
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
          restart=bool(job.will_change or unit.will_change or key.will_change))
    push(name="Control node: send each stripe once", settings=settings, fleet=fleet,
         everyone=all_settings())


@deploy("Weights fan-out: wait")
def fanout_wait(settings: HostSettings) -> None:
    """Wait for this host's copy (started by :func:`fanout_start`) to be complete and verified."""
    target = Target.of(settings)
    if not _todo(_state(target)):
        return
    wait(name=f"Checkpoint {target.label} (fan-out)", settings=settings, target=target,
         fleet=fleet_of(settings))


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
