"""Test deploy: one move's rotation steps on each host of the run, without the move itself.

    GPUSERVE_TEST_ROTATE=out|in pyinfra -y inventories/sandbox.py tests/integration/deploys/rotate.py --limit HOST

out: take_out + wait_drained (gpuserve.layers.rotation); in: back_in. The real functions the
rollout calls, so a test can hold a request in flight across them.
"""

import os

from pyinfra.operations import python

from gpuserve.layers import rotation
from gpuserve.layers.context import host_settings

settings = host_settings()
step = os.environ.get("GPUSERVE_TEST_ROTATE", "out")


def _rotate(state, host) -> bool:
    for dep in settings.deployments:
        if step == "out":
            rotation.take_out(host, settings, dep.name)
            rotation.wait_drained(host, settings, dep.name)
        else:
            rotation.back_in(host, settings, dep.name)
    return True


if settings.serves:
    python.call(name=f"rotation: {step}", function=_rotate)
