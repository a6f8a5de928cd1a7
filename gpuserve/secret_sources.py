"""Where a secret comes from on the control node: a file, or a command that prints it (issue 29).

Every ``*_file`` secret setting has a ``*_command`` twin (``SECRET_SETTINGS``): an argv list, run
on the control node without a shell, whose standard output is the secret, e.g.

    api_keys_command: ["age", "-d", "-i", "/home/me/.config/age/key.txt", "secrets/prod-keys.age"]
    api_keys_command: ["sops", "-d", "secrets/prod-keys.sops"]
    api_keys_command: ["pass", "show", "gpuserve/prod-keys"]
    api_keys_command: ["vault", "kv", "get", "-field=keys", "secret/gpuserve/prod"]

The output is held in this process's memory only: never written to the control node's disk, never
printed (messages name the command, never its output), and each command runs once per run, however
many hosts use it (``read_text`` keeps the result in memory for the process's lifetime). Its
standard error is passed through, so a passphrase prompt (age, gpg's pinentry) still reaches the
terminal. On the hosts the content is installed by gpuserve.operations.secrets, which shows no
content in any pyinfra output, ``--diff`` included.

A leaf: no gpuserve imports.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

# the file setting -> its command twin
SECRET_SETTINGS = {
    "api_keys_file": "api_keys_command",
    "operator_keys_file": "operator_keys_command",
    "scrape_keys_file": "scrape_keys_command",
    "proxy_tls_key_file": "proxy_tls_key_command",
}
TIMEOUT_S = 120   # a command that asks for a passphrase gets this long
EXAMPLE = "['age', '-d', '-i', 'key.txt', 'keys.age']"


@dataclass(frozen=True)
class SecretCommand:
    """A command on the control node that prints a secret; ``setting`` names it in messages."""

    argv: tuple[str, ...]
    setting: str

    def __str__(self) -> str:   # what messages and `gpuserve plan` show: the command, not its output
        return f"the output of `{' '.join(self.argv)}` ({self.setting})"

    def __fspath__(self) -> str:   # never a path: Path(command) must fail loudly, not read a file
        raise TypeError(f"{self} is a command, not a file")


Source = Union[str, Path, SecretCommand]

_CACHE: dict[tuple[str, ...], str] = {}   # argv -> output, in memory for this process only


class SecretSourceError(Exception):
    """A secret that could not be read; the message never holds the secret."""


def command_problem(value: Any) -> str | None:
    """Why ``value`` is not a command gpuserve runs (None when it is): a non-empty list of
    non-empty strings."""
    if isinstance(value, str):
        return (f"{value!r} is a string; give the command as a list of words, e.g. {EXAMPLE} "
                "(it runs without a shell)")
    if not (isinstance(value, (list, tuple)) and value
            and all(isinstance(w, str) and w for w in value)):
        return f"{value!r} is not a command: use a list of words, e.g. {EXAMPLE}"
    return None


def program_missing(argv: tuple[str, ...]) -> str | None:
    """Why ``argv``'s program cannot run on this control node (None when it can)."""
    if shutil.which(argv[0]) is None:
        return f"{argv[0]!r} is not a program on this control node (not on PATH)"
    return None


def read_text(source: Source, base_dir: str | Path = ".") -> str:
    """The secret: the file's text, or the command's standard output (run once per process,
    without a shell, in ``base_dir``). Raises SecretSourceError naming the source, never the
    content; a missing file raises OSError as reading it would."""
    if not isinstance(source, SecretCommand):
        return Path(base_dir, source).read_text(encoding="utf-8")
    if source.argv not in _CACHE:
        _CACHE[source.argv] = _run(source, base_dir)
    return _CACHE[source.argv]


def _run(source: SecretCommand, base_dir: str | Path) -> str:
    try:
        done = subprocess.run(list(source.argv), cwd=base_dir, stdout=subprocess.PIPE, stderr=None,
                              timeout=TIMEOUT_S, check=False)
    except OSError as exc:
        raise SecretSourceError(f"{source} cannot run: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise SecretSourceError(f"{source} did not finish within {TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise SecretSourceError(f"{source} failed (exit status {done.returncode}; its error is "
                                "above)")
    try:
        text = done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretSourceError(f"{source} printed something that is not UTF-8 text") from None
    if not text.strip():
        raise SecretSourceError(f"{source} printed nothing")
    return text


def forget() -> None:
    """Drop every command's output this process holds (tests; a long-lived process)."""
    _CACHE.clear()
