"""Keep test runs from passing on state that an earlier run left behind.

A test instance (tests/conftest.py, instance 99 unless GPUSERVE_TEST_INSTANCE says otherwise) is
reset when a test session starts: its hosts, daemons and bridge are stopped, and its state
directory is removed but for the caches listed in ``TRUSTED_CACHES``. Each integration module
then starts with an empty control-node checkpoint cache and checks that nothing it did not ask
for is listening on the instance's addresses.

What is kept, and why that is safe:
    <root>/base-*, <root>/debs     the base image, rebuilt whenever its IMAGE_REVISION changes;
                                   it holds no test's output (hosts write to their own overlay)
    <root>/wheelhouse              the engine's wheels, named by pin and checked against their
                                   SHA256SUMS on every push to a host
    <instance>/acng/cache          apt-cacher-ng's .deb cache: hosts verify every package with
                                   apt's signatures, so a cached .deb is the mirror's .deb
Nothing a test produces (checkpoints, releases, keys, hosts) survives the reset.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from gpuserve_sandbox import network

if TYPE_CHECKING:
    from gpuserve_sandbox.hosts import Sandbox

# relative to the instance's state directory
TRUSTED_CACHES = ("acng/cache",)
_USERS = re.compile(r'users:\(\("([^"]*)",pid=(\d+)')


def listeners(prefix: str) -> list[tuple[str, int, str]]:
    """TCP sockets listening on an address that starts with ``prefix`` (e.g. ``10.231.99.``):
    (address:port, port, "command pid N")."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return parse_ss(out, prefix)


def parse_ss(out: str, prefix: str) -> list[tuple[str, int, str]]:
    """``ss -Hltnp``'s lines -> the listeners on addresses starting with ``prefix``."""
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        addr, _, port = local.rpartition(":")
        if not addr.startswith(prefix):
            continue
        m = _USERS.search(line)
        who = f"{m.group(1)} pid {m.group(2)}" if m else "unknown process"
        found.append((local, int(port), who))
    return found


def foreign_listeners(box: "Sandbox", allowed: set[int]) -> list[str]:
    """What listens on the instance's subnet on a port not in ``allowed``, as readable lines."""
    prefix = network.subnet_prefix(box.instance) + "."
    return [f"{local} ({who})" for local, port, who in listeners(prefix) if port not in allowed]


def session_ports() -> set[int]:
    """The instance daemons a test session starts itself through ``Sandbox.up`` (the apt cache
    and the stand-in vendor repositories); the hub is each module's own (sandbox_hub)."""
    from gpuserve_sandbox import standin_repo

    return {network.APT_CACHE_PORT, standin_repo.PORT}


def reset_instance(box: "Sandbox") -> list[str]:
    """Stop and remove what an earlier run left of this instance; return what was done.
    Raises RuntimeError when something still listens on the instance's addresses afterwards."""
    done: list[str] = []
    before, hosts = foreign_listeners(box, allowed=set()), box.hosts()
    if hosts or before or box.state_dir.exists():
        box.down()
        done.append(f"instance {box.instance}: stopped what an earlier run left "
                    f"({len(hosts)} host(s); listening: {', '.join(before) or 'nothing'})")
    if box.state_dir.exists():
        kept = []
        for entry in sorted(box.state_dir.iterdir()):
            if entry.name == "acng":
                for sub in entry.iterdir():
                    if str(sub.relative_to(box.state_dir)) not in TRUSTED_CACHES:
                        _remove(sub)
                kept.append("acng/cache")
                continue
            _remove(entry)
        done.append(f"instance {box.instance}: removed {box.state_dir} but the trusted caches "
                    f"({', '.join(kept) or 'none'})")
    stray = foreign_listeners(box, allowed=set())
    if stray:
        raise RuntimeError(f"after stopping sandbox instance {box.instance}, these still listen on its "
                           f"addresses and would answer the tests: {'; '.join(stray)}; stop them first")
    return done


def empty_checkpoint_cache(box: "Sandbox") -> None:
    """The control node's checkpoint cache of this instance (group_data/sandbox.py's
    weights_cache), emptied: a converge must fetch from a hub the test started."""
    _remove(box.state_dir / "checkpoints")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
