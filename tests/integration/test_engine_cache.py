"""Warm engine caches across hosts (issue 24) on two real sandbox hosts of one hardware kind.

A converge of both hosts starts them together: the run's first host publishes its caches as the
seed of that release. A rolling upgrade to a new release then moves the first host (the canary of
its hardware) without a seed for it: after its gate passed, its cache dir becomes the fleet's seed
for (new release, hardware), a tar in the control node's store beside the weights cache. The
second host unpacks that seed into its own cache dir before its engine starts: every file of the
seed is there afterwards, with the seed's content, and the host's marker names the seed. A second
run moves nothing, seeds nothing again.

Slow (two cpu hosts' converge, then a rolling upgrade): `pytest -m slow`. bench/warm_cache.py
measures what a seed saves with compilation on.
"""

from __future__ import annotations

import hashlib
import tarfile

import pytest

from gpuserve import engine_cache, layout
from gpuserve_sandbox import fleet as view
from gpuserve_sandbox.hub import SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint

pytestmark = pytest.mark.slow

INV, SERVE, UPGRADE = "inventories/sandbox.py", "deploys/serve.py", "deploys/upgrade.py"
DEP = "minimax"


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub):
    hosts = make_hosts(["cpu", "cpu"])
    sha1, _ = publish_tiny_checkpoint(sandbox_hub.root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=1,
                                      branch="v1")
    return {"hosts": hosts, "sha1": sha1}


def _cache_files(sandbox, h) -> dict[str, str]:
    """path in the cache dir -> sha256, every regular file but the marker."""
    cache = layout.cache_dir("/srv/nvme", DEP)
    out = sandbox.ssh(h, f"cd {cache} && find . -type f ! -name {engine_cache.MARKER} -exec sha256sum {{}} +",
                      check=False).stdout
    return {line.split(None, 1)[1]: line.split(None, 1)[0] for line in out.splitlines()}


def test_the_first_host_of_a_release_seeds_the_next_one(fleet, sandbox, pyinfra):
    first, second = fleet["hosts"]
    serve = pyinfra(INV, SERVE).check()
    # a converge: the run's first host of this hardware publishes (nothing to seed from yet)
    k0 = engine_cache.seed_key(view.pointers(sandbox, first, DEP)[0], "cpu", 0)
    assert f"[{first.name}] {DEP}: its engine caches are now the fleet's seed for {k0}" in serve.output
    assert f"[{second.name}] {DEP}: its engine caches are now" not in serve.output
    run = pyinfra(INV, UPGRADE, "--data", f"model_revision={fleet['sha1']}").check()
    release = view.pointers(sandbox, first, DEP)[0]
    assert view.pointers(sandbox, second, DEP)[0] == release   # one release, one hardware kind
    key = engine_cache.seed_key(release, "cpu", 0)
    out = run.output
    assert f"[{first.name}] {DEP}: its engine caches are now the fleet's seed for {key}" in out, out[-3000:]
    assert f"[{second.name}] {DEP}: engine caches seeded from the fleet's seed for {key}" in out
    assert out.index(f"[{first.name}] {DEP}: its engine caches are now") < out.index(
        f"[{second.name}] {DEP}: engine caches seeded")
    assert f"[{second.name}] {DEP}: its engine caches are now" not in out   # one seed per key

    seed = engine_cache.seed_file(str(sandbox.state_dir / "checkpoints"), DEP, key)
    with tarfile.open(seed) as t:
        in_seed = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    assert in_seed, "the first host's engine left nothing in its cache dir to share"
    on_second = _cache_files(sandbox, second)
    for name, data in in_seed.items():
        assert on_second.get(name) == hashlib.sha256(data).hexdigest(), name
    marker = sandbox.ssh(second, f"cat {layout.cache_dir('/srv/nvme', DEP)}/{engine_cache.MARKER}").stdout
    assert marker.split() == [key]
    owner = sandbox.ssh(second, f"stat -c %U {layout.cache_dir('/srv/nvme', DEP)}/{engine_cache.MARKER}").stdout
    assert owner.strip() == layout.SERVICE_USER
    assert sandbox.ssh(second, "ls /var/tmp/gpuserve-cache-seed*", check=False).returncode != 0

    again = pyinfra(INV, UPGRADE, "--data", f"model_revision={fleet['sha1']}").check()
    assert again.changed == 0 and "engine caches" not in again.output
