"""Secret files on hosts without a secret in any pyinfra output.

files.put/files.template print the old and new content with ``--diff`` (and facts such as
FindInFile return matching lines, which ``--debug`` prints). These never do: the content is
compared by sha256 only, uploaded into a root-only (0700) staging directory, given its owner and
mode there, then renamed into place, so it is never readable by others, not even for an instant.

Logged in as a non-root user with ``_sudo`` (docs/non-root.md): SFTP writes as that user, who
cannot write into root's staging directory. The content then goes first into the login user's own
0700 directory (``~/.gpuserve-upload``, made as that user), pyinfra's sudo ``cp`` takes it into the
staging directory, and the login user's copy is removed at once. Only file names ever reach a
command line, so sudo's log (the journal) and ``ps`` see no secret.
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.facts.server import Home

from gpuserve import layout

STAGING = layout.SECRETS_STAGING_DIR   # root 0700, same filesystem as /etc/gpuserve and /etc/nginx
UPLOAD_DIR = ".gpuserve-upload"      # in the login user's home, 0700: where it uploads under sudo


class MatchesInFile(FactBase):
    """Whether a file has a line matching an extended regex: True/False, never the line."""

    def command(self, path: str, pattern: str) -> str:
        return (f"if grep -qE {shlex.quote(pattern)} {shlex.quote(path)} 2>/dev/null; "
                "then echo yes; else echo no; fi")

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[-1].strip() == "yes"


def staging_dir_commands() -> str:
    return f"umask 077; mkdir -p {STAGING} && chown root:root {STAGING} && chmod 700 {STAGING}"


@operation()
def secret_file(content: str, dest: str, user: str = "root", group: str = "root", mode: str = "600"):
    """Upload ``content`` to ``dest`` (a secret): compared by hash, never shown."""
    want = hashlib.sha256(content.encode()).hexdigest()
    have = host.get_fact(Sha256File, path=dest)
    info = host.get_fact(File, path=dest) or {}
    if (have == want and info.get("user") == user and info.get("group") == group
            and info.get("mode") == int(mode)):
        host.noop(f"secret {dest} is up to date")
        return
    tmp = posixpath.join(STAGING, posixpath.basename(dest) + ".upload")
    yield StringCommand(staging_dir_commands() + f" && rm -f {tmp}")
    upload = tmp
    if _escalates():
        # as the login user itself (not through sudo): its own private directory
        private = posixpath.join(host.get_fact(Home, _sudo=False), UPLOAD_DIR)
        upload = posixpath.join(private, posixpath.basename(tmp))
        yield StringCommand(f"umask 077; mkdir -p {shlex.quote(private)} && chmod 700 "
                            f"{shlex.quote(private)} && rm -f {shlex.quote(upload)}", _sudo=False)
    yield FileUploadCommand(BytesIO(content.encode()), tmp, remote_temp_filename=upload)
    yield StringCommand(f"chown {user}:{group} {tmp} && chmod {mode} {tmp} && mv -f {tmp} {dest}")


def _escalates() -> bool:
    """Whether this operation runs through sudo (a non-root login user with ``_sudo``)."""
    args = host.current_op_global_arguments or {}
    for other in ("_su_user", "_doas", "_dzdo"):
        if args.get(other):
            raise ValueError(f"{host.name}: secret files support a non-root login with _sudo only, "
                             f"not {other} (docs/non-root.md)")
    return bool(args.get("_sudo"))


@operation()
def generated_secret(dest: str, line_prefix: str, check: str):
    """Make ``dest`` (root 0600) holding ``line_prefix`` + a random key made on the host, once.
    ``check`` is an extended regex a valid file matches; the key never leaves the host."""
    if host.get_fact(MatchesInFile, path=dest, pattern=check):
        host.noop(f"secret {dest} exists")
        return
    tmp = posixpath.join(STAGING, posixpath.basename(dest) + ".new")
    yield StringCommand(
        staging_dir_commands() + f" && key=$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\\n')"
        f" && printf '%s%s\\n' {shlex.quote(line_prefix)} \"$key\" > {tmp} && mv -f {tmp} {dest}")
