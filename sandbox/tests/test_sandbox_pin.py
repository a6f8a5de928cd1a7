"""group_data/sandbox.py pins the tiny test checkpoint by commit sha; the sandbox hub publishes it
from code. If the checkpoint generator changes, this fails and prints the sha to pin instead."""

from gpuserve_sandbox.hub import SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint
from gpuserve_sandbox.services import sandbox_group_data


def test_the_published_tiny_checkpoint_is_the_one_group_data_pins(tmp_path):
    sha, info = publish_tiny_checkpoint(tmp_path, SANDBOX_REPO, seed=SANDBOX_SEED, variant=0)
    pinned = sandbox_group_data()
    assert pinned["model_repo"] == SANDBOX_REPO
    assert sha == pinned["model_revision"], f"set model_revision = {sha!r} in group_data/sandbox.py"
    # deterministic: publishing again (elsewhere) gives the same commit
    assert publish_tiny_checkpoint(tmp_path / "again", SANDBOX_REPO, seed=SANDBOX_SEED, variant=0)[0] == sha
