"""Commands a rollout runs on other hosts, from inside its one operation, each bounded in time.

The rollout (gpuserve.layers.rollout) runs as one pyinfra operation that drives every host of the
run; its steps reach the hosts through these two functions, never through an unbounded call.
"""

from __future__ import annotations

import gevent
from pyinfra.api import StringCommand

COMMAND_TIMEOUT_S = 60   # a step of a move other than stop and the gate; bounds an unreachable host


class MoveFailed(Exception):
    """A step of a move failed; the message names the host and the step."""


def shell(h, command: str, timeout: float):
    """run_shell_command bounded as a whole: pyinfra's _timeout covers reading the output only,
    and opening a channel to a host that vanished can wait for an hour."""
    try:
        with gevent.Timeout(timeout):
            return h.run_shell_command(StringCommand(command), _sudo=bool(h.data.get("_sudo")),
                                       _timeout=timeout)
    except (gevent.Timeout, TimeoutError):
        raise MoveFailed(f"{h.name}: `{command}` got no answer in {timeout:.0f} s; is the host "
                         "reachable?") from None
    except Exception as exc:   # the connection itself failed: reset, closed, ...
        raise MoveFailed(f"{h.name}: `{command}` failed on the connection "
                         f"({type(exc).__name__}: {exc}); is the host reachable?") from None


def run(h, command: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """``command``'s stdout; raises MoveFailed when it fails."""
    ok, output = shell(h, command, timeout)
    if not ok:
        raise MoveFailed(f"{h.name}: `{command}` failed: {output.output[-600:]}")
    return output.stdout


def connected(h, why: str):
    """``h`` connected: a host outside the run's --limit (a gateway, a serving host whose
    certificate a gateway needs) is connected only when a step needs it. MoveFailed if it
    cannot be reached."""
    if not h.connected:
        try:
            h.connect(reason=why, raise_exceptions=True)
        except Exception as exc:  # noqa: BLE001 - whatever the connector raises
            raise MoveFailed(f"{h.name}: cannot reach this host ({type(exc).__name__}: {exc}); "
                             f"it is needed as {why}") from None
    return h
