"""Commands a rollout runs on other hosts, from inside its one operation, each bounded in time.

The rollout (gpuserve.layers.rollout) runs as one pyinfra operation that drives every host of the
run; its steps reach the hosts through these two functions, never through an unbounded call.
"""

from __future__ import annotations

from io import StringIO

import gevent
from pyinfra.api import StringCommand

COMMAND_TIMEOUT_S = 60   # a step of a move other than stop and the gate; bounds an unreachable host
# the host's own sudo settings (its data, as in an operation): a non-root login runs these with sudo
SUDO_KEYS = ("_sudo_user", "_use_sudo_login", "_preserve_sudo_env")


def escalation(h) -> dict:
    """The connector arguments that make a command on ``h`` run as its operations do: ``_sudo``
    (always given, False for a root login) and the other sudo keys its data sets."""
    args = {"_sudo": bool(h.data.get("_sudo"))}
    if args["_sudo"]:
        args.update({k: h.data.get(k) for k in SUDO_KEYS if h.data.get(k) is not None})
    return args


class MoveFailed(Exception):
    """A step of a move failed; the message names the host and the step."""


def shell(h, command: str, timeout: float):
    """run_shell_command bounded as a whole: pyinfra's _timeout covers reading the output only,
    and opening a channel to a host that vanished can wait for an hour."""
    try:
        with gevent.Timeout(timeout):
            return h.run_shell_command(StringCommand(command), **escalation(h), _timeout=timeout)
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


MISSING = "__gpuserve_missing_command__"


def put_text(h, path: str, text: str, timeout: float = COMMAND_TIMEOUT_S) -> None:
    """Write a public file (never a secret) on ``h`` atomically, 0644: uploaded over SFTP as
    ``<path>.gpuserve-tmp``, then renamed. Unlike content in a command line, it has no size limit
    (a command line ends at 128 KiB: the gateway's CA file of about 70 hosts' certificates, base64).
    Raises MoveFailed, naming the host and the file."""
    tmp = f"{path}.gpuserve-tmp"
    transfer(h, "put_file", StringIO(text), tmp, what=f"uploading {path}", timeout=timeout)
    run(h, f"chmod 644 {tmp} && mv -f {tmp} {path}", timeout)


def transfer(h, method: str, *args, what: str, timeout: float) -> None:
    """``h.put_file`` or ``h.get_file`` (``method``) with ``args``, as the host's operations
    would (its sudo settings), bounded in time as a whole. Raises MoveFailed naming the host and
    ``what`` ("uploading /etc/x") when it times out, the connection fails or pyinfra says no."""
    try:
        with gevent.Timeout(timeout):
            ok = getattr(h, method)(*args, **escalation(h))
    except (gevent.Timeout, TimeoutError):
        raise MoveFailed(f"{h.name}: {what} got no answer in {timeout:.0f} s; is the host "
                         "reachable?") from None
    except Exception as exc:   # the connection itself failed
        raise MoveFailed(f"{h.name}: {what} failed on the connection "
                         f"({type(exc).__name__}: {exc}); is the host reachable?") from None
    if not ok:
        raise MoveFailed(f"{h.name}: {what} failed (pyinfra's log above says why)")


def fact(h, cls, timeout: float = COMMAND_TIMEOUT_S, **kwargs):
    """A pyinfra fact read fresh from host ``h`` now, bounded in time (pyinfra's own
    ``host.get_fact`` is for the host of the running operation; a rollout reads other hosts, and
    must read them again after it changed them). The fact's own command and parser are used."""
    f = cls()
    command = str(f.command(**kwargs))
    requires = f.requires_command(**kwargs)
    if requires:
        command = (f"if command -v {requires} >/dev/null 2>&1; then ( {command} ); "
                   f"else echo {MISSING}; fi")
    ok, output = shell(h, command, timeout)
    lines = output.stdout_lines
    if not ok or not lines or lines == [MISSING]:
        return f.default()
    return f.process(lines)


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
