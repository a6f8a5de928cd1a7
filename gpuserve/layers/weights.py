"""Weights layer: the pinned checkpoint revision, complete and verified, on every host's NVMe.

    <nvme_path>/gpuserve/models/<org>--<name>/<sha>/      what the service layer serves (complete only)

Three operations (the first and last are gpuserve.operations.weights), each "No Change" when there
is nothing to do (a second converge changes nothing and asks the hub for nothing):

1. *Free space*: refuses the host before a byte is downloaded when the files it still needs do not
   fit on the NVMe filesystem with ``weights_free_margin_gib`` to spare (names host, path, need, free).
2. *rsync* on the host (``weights_fanout = "control-node"``, the default).
3. *Checkpoint*: the control node resolves the files once per run (metadata), downloads them once
   into its cache (``weights_cache``) and verifies each sha256 itself; each host then stages
   ``<sha>.partial/`` (hardlinks for files an earlier revision has, resumable rsync over SSH for the
   rest, or a direct download with ``weights_fanout = "hub"``), verifies every new file against the
   manifest and renames it to ``<sha>/``. A complete revision whose files changed on disk is repaired
   file by file. Nothing here deletes a complete revision: retention is the service layer's job.

State that this layer changes is read with the ``CheckpointState`` fact once per host at plan time
(the execute pass reuses it: nothing else in a converge writes under the repository directory), and
every host-side step re-checks the disk itself when it runs.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Which
from pyinfra.operations import apt

from gpuserve.config import HostSettings
from gpuserve.operations.weights import Target, checkpoint, checkpoint_space


# --------------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------------


@deploy("Weights")
def weights(settings: HostSettings):
    """Converge the pinned checkpoint on this host. Returns the checkpoint operation's meta
    (``did_change()`` after execution: the revision was staged or repaired in this run)."""
    target = Target.of(settings)
    checkpoint_space(name=f"Free space for checkpoint {target.label}", target=target)
    if target.fanout == "control-node":
        have_rsync = host.get_fact(Which, "rsync")
        apt.packages(name="rsync (checkpoint copies from the control node)", packages=["rsync"],
                     update=not have_rsync)
    return checkpoint(name=f"Checkpoint {target.label}", target=target)
