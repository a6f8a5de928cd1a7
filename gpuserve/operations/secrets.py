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

``credential_file`` (issue 29) keeps a secret encrypted at rest instead: a systemd credential
(``systemd-creds encrypt``, bound to the host's credential key, and to its TPM2 where it has one)
at ``<dest>.cred``, and the plaintext only in /run (a tmpfs: memory), where ``dest`` is a symbolic
link to. The upload goes through tmpfs directories only (root's under /run, the login user's under
/dev/shm), so no plaintext copy ever reaches a disk. After a reboot /run is empty: the service that
reads the secret decrypts it again before it starts (``CREDENTIALS_SCRIPT``, an ExecStartPre=).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.facts.server import Home, User

from gpuserve import layout, templating

STAGING = layout.SECRETS_STAGING_DIR   # root 0700, same filesystem as /etc/gpuserve and /etc/nginx
UPLOAD_DIR = ".gpuserve-upload"      # in the login user's home, 0700: where it uploads under sudo
# credentials (issue 29): plaintext only on tmpfs
RUN_DIR = layout.SECRETS_RUN_DIR     # root 0700: the decrypted credentials, where ``dest`` points
RUN_STAGING = layout.SECRETS_RUN_STAGING
SHM_UPLOAD = "/dev/shm/.gpuserve-upload"   # + "-<login user>", 0700: the sudo upload, in memory


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


class CredentialState(FactBase):
    """A credential's state, never its content: the sha256 of its decrypted content ("" when
    ``<dest>.cred`` is missing or does not decrypt), and whether ``dest`` is the link to its /run
    copy with that copy present."""

    def command(self, dest: str, cred_name: str) -> str:
        name = cred_name   # ``name`` is pyinfra's
        cred, run = shlex.quote(dest + ".cred"), shlex.quote(posixpath.join(RUN_DIR, name))
        return (f"h=$( [ -f {cred} ] && systemd-creds decrypt --name={shlex.quote(name)} {cred} - "
                f"2>/dev/null | sha256sum | cut -d' ' -f1 ); "
                f"[ -f {cred} ] && systemd-creds decrypt --name={shlex.quote(name)} {cred} - "
                f">/dev/null 2>&1 || h=; "
                f"l=no; [ \"$(readlink {shlex.quote(dest)})\" = {run} ] && [ -f {run} ] && l=yes; "
                f"echo \"${{h:-none}} $l\"")

    def process(self, output: list[str]) -> tuple[str, bool]:
        digest, linked = (output[-1].split() + ["", ""])[:2] if output else ("none", "no")
        return ("" if digest == "none" else digest), linked == "yes"


@operation()
def credential_file(content: str, dest: str, cred_name: str):
    """``content`` as a systemd credential ``<dest>.cred`` (encrypted at rest), decrypted into
    /run (tmpfs), ``dest`` a link to it: compared by the hash of the decrypted credential, never
    shown; an old plaintext ``dest`` is shredded."""
    want = hashlib.sha256(content.encode()).hexdigest()
    name = cred_name   # ``name`` is pyinfra's (the operation's name)
    have, linked = host.get_fact(CredentialState, dest=dest, cred_name=name)
    if have == want and linked:
        host.noop(f"credential {dest}.cred is up to date")
        return
    run, tmp = posixpath.join(RUN_DIR, name), posixpath.join(RUN_STAGING, name + ".upload")
    yield StringCommand(f"umask 077; mkdir -p {RUN_DIR} {RUN_STAGING} && chmod 700 {RUN_DIR} "
                        f"{RUN_STAGING} && rm -f {tmp} && systemd-creds setup >/dev/null")
    upload = tmp
    if _escalates():   # the login user's copy: in memory too (/dev/shm), 0700
        user = host.get_fact(User, _sudo=False)
        private = f"{SHM_UPLOAD}-{user}"
        upload = posixpath.join(private, posixpath.basename(tmp))
        yield StringCommand(f"umask 077; mkdir -p {shlex.quote(private)} && chmod 700 "
                            f"{shlex.quote(private)} && rm -f {shlex.quote(upload)}", _sudo=False)
    yield FileUploadCommand(BytesIO(content.encode()), tmp, remote_temp_filename=upload)
    cred = shlex.quote(dest + ".cred")
    yield StringCommand(
        f"umask 077; systemd-creds encrypt --name={shlex.quote(name)} {tmp} {cred}.new && "
        f"mv -f {cred}.new {cred} && chown root:root {tmp} && chmod 600 {tmp} && mv -f {tmp} {run} && "
        f"if [ -f {dest} ] && [ ! -L {dest} ]; then shred -u {dest}; fi && ln -sfn {run} {dest}")


CREDENTIALS_SCRIPT = f"""#!/bin/sh
# Managed by gpuserve (pyinfra): decrypt the gpuserve credentials in the directories given
# (systemd-creds: <file>.cred beside the link <file> -> {RUN_DIR}/<name>) into {RUN_DIR} (tmpfs),
# as a service's ExecStartPre=+ before it reads them (after a reboot /run is empty).
set -eu
umask 077
mkdir -p {RUN_DIR}
chmod 700 {RUN_DIR}
for dir in "$@"; do
  for cred in "$dir"/*.cred; do
    [ -f "$cred" ] || continue
    target=$(readlink "${{cred%.cred}}") || continue
    name=$(basename "$target")
    systemd-creds decrypt --name="$name" "$cred" "$target.new"
    mv -f "$target.new" "$target"
  done
done
"""
CREDENTIALS_BIN = layout.CREDENTIALS_BIN


def credentials_dropin(directory: str, start_pre: str) -> str:
    """A drop-in that decrypts ``directory``'s credentials before the unit's own ExecStartPre=
    ``start_pre`` (which may read them), as root outside the unit's sandbox (``+``: a TPM2 device
    and the credential key are out of a confined unit's reach)."""
    return templating.render("dropin-credentials.conf.j2", credentials_bin=CREDENTIALS_BIN, directory=directory,
                             start_pre=start_pre)
