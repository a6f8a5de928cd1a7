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
A secret made on the host (the engine's internal key, nginx's copy of it) is a credential too
(``generated_credential``): made in /run, it never reaches a disk. A unit that reads its secret
only when it starts loads it itself (``encrypted_credential``: ``LoadCredentialEncrypted=``, the
fan-out's fleet key). No key of any kind lies in plaintext on a host's disk (docs/secrets.md).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import BytesIO, StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.facts.server import Home, User
from pyinfra.operations import files

from gpuserve import layout, templating
from gpuserve.facts.credentials import CredentialLeft, CredentialMatches, CredentialState

STAGING = layout.SECRETS_STAGING_DIR   # root 0700, same filesystem as /etc/gpuserve and /etc/nginx
UPLOAD_DIR = ".gpuserve-upload"      # in the login user's home, 0700: where it uploads under sudo
# credentials (issue 29): plaintext only on tmpfs
RUN_DIR = layout.SECRETS_RUN_DIR     # root 0700: the decrypted credentials, where ``dest`` points
RUN_STAGING = layout.SECRETS_RUN_STAGING
SHM_UPLOAD = "/dev/shm/.gpuserve-upload"   # + "-<login user>", 0700: the sudo upload, in memory


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


def _run_dirs() -> str:
    """Make the /run directories of the decrypted credentials: /run/gpuserve and its secrets 0711
    (a service user such as prometheus reaches its own file by name, and lists nothing), the
    staging 0700; the host's credential key made once."""
    return (f"umask 077; mkdir -p {RUN_DIR} {RUN_STAGING} && chmod 711 {posixpath.dirname(RUN_DIR)} {RUN_DIR} "
            f"&& chmod 700 {RUN_STAGING} && systemd-creds setup >/dev/null")


def _perms(user: str, group: str, mode: str) -> str:
    """What ``stat -c %U:%G:%a`` prints for a file with these owner and mode."""
    return f"{user}:{group}:{int(mode, 8):o}"


def _upload_to_run_staging(content: str, tmp: str):
    """The commands that put ``content`` at ``tmp`` (in RUN_STAGING) through tmpfs only."""
    yield StringCommand(_run_dirs() + f" && rm -f {tmp}")
    upload = tmp
    if _escalates():   # the login user's copy: in memory too (/dev/shm), 0700
        user = host.get_fact(User, _sudo=False)
        private = f"{SHM_UPLOAD}-{user}"
        upload = posixpath.join(private, posixpath.basename(tmp))
        yield StringCommand(f"umask 077; mkdir -p {shlex.quote(private)} && chmod 700 "
                            f"{shlex.quote(private)} && rm -f {shlex.quote(upload)}", _sudo=False)
    yield FileUploadCommand(BytesIO(content.encode()), tmp, remote_temp_filename=upload)


def _encrypt_and_link(tmp: str, dest: str, name: str, user: str, group: str, mode: str) -> str:
    """Encrypt ``tmp`` (plaintext in RUN_STAGING) into ``<dest>.cred`` (with the /run copy's owner
    and mode: the decrypting script copies them from it), move it into /run, shred an old
    plaintext ``dest`` and link ``dest`` to the /run copy."""
    run, cred = posixpath.join(RUN_DIR, name), shlex.quote(dest + ".cred")
    return (f"umask 077; systemd-creds encrypt --name={shlex.quote(name)} {tmp} {cred}.new && "
            f"chown {user}:{group} {cred}.new {tmp} && chmod {mode} {cred}.new {tmp} && "
            f"mv -f {cred}.new {cred} && mv -f {tmp} {run} && "
            f"if [ -f {dest} ] && [ ! -L {dest} ]; then shred -u {dest}; fi && ln -sfn {run} {dest}")


@operation()
def credential_file(content: str, dest: str, cred_name: str, user: str = "root", group: str = "root",
                    mode: str = "600"):
    """``content`` as a systemd credential ``<dest>.cred`` (encrypted at rest), decrypted into
    /run (tmpfs) with owner ``user:group`` and ``mode``, ``dest`` a link to it: compared by the
    hash of the decrypted credential, never shown; an old plaintext ``dest`` is shredded."""
    want = hashlib.sha256(content.encode()).hexdigest()
    name = cred_name   # ``name`` is pyinfra's (the operation's name)
    have, linked = host.get_fact(CredentialState, dest=dest, cred_name=name, perms=_perms(user, group, mode))
    if have == want and linked:
        host.noop(f"credential {dest}.cred is up to date")
        return
    tmp = posixpath.join(RUN_STAGING, name + ".upload")
    yield from _upload_to_run_staging(content, tmp)
    yield StringCommand(_encrypt_and_link(tmp, dest, name, user, group, mode))


@operation()
def generated_credential(dest: str, cred_name: str, check: str, make: str):
    """A secret made on the host, never sent anywhere, as a credential (``credential_file``'s
    layout, root 0600): ``make`` is a shell command that prints it, run once. ``check`` is an
    extended regex a valid secret has a line matching. A valid credential is kept (only its /run
    copy and link made again), a valid old plaintext ``dest`` is encrypted as it is (the same
    key) and shredded; only when neither exists is a new one made."""
    name = cred_name   # ``name`` is pyinfra's
    made, linked = host.get_fact(CredentialMatches, dest=dest, cred_name=name, pattern=check)
    if made and linked:
        host.noop(f"credential {dest}.cred exists")
        return
    tmp = posixpath.join(RUN_STAGING, name + ".new")
    cred, pattern = shlex.quote(dest + ".cred"), shlex.quote(check)
    decrypt = f"systemd-creds decrypt --name={shlex.quote(name)} {cred}"
    yield StringCommand(
        _run_dirs() + f" && rm -f {tmp} && "
        f"if [ -f {cred} ] && {decrypt} - 2>/dev/null | grep -qE {pattern}; then {decrypt} {tmp}; "
        f"elif [ -f {dest} ] && [ ! -L {dest} ] && grep -qE {pattern} {dest}; then cat {dest} > {tmp}; "
        f"else ( {make} ) > {tmp}; fi && grep -qE {pattern} {tmp} && "
        + _encrypt_and_link(tmp, dest, name, "root", "root", "600"))


@operation()
def encrypted_credential(content: str, cred: str, cred_name: str):
    """``content`` as the systemd credential ``cred`` only, with no /run copy: for a unit's
    ``LoadCredentialEncrypted=<cred_name>:<cred>``, which decrypts it into the unit's own
    ``$CREDENTIALS_DIRECTORY`` when it starts. Compared by the hash of the decrypted
    credential, never shown."""
    want = hashlib.sha256(content.encode()).hexdigest()
    name = cred_name   # ``name`` is pyinfra's
    dest = cred[:-len(".cred")] if cred.endswith(".cred") else cred
    have, _ = host.get_fact(CredentialState, dest=dest, cred_name=name)
    if have == want:
        host.noop(f"credential {cred} is up to date")
        return
    tmp = posixpath.join(RUN_STAGING, name + ".upload")
    yield from _upload_to_run_staging(content, tmp)
    yield StringCommand(f"umask 077; systemd-creds encrypt --name={shlex.quote(name)} {tmp} "
                        f"{shlex.quote(dest + '.cred')}.new && mv -f {shlex.quote(dest + '.cred')}.new "
                        f"{shlex.quote(dest + '.cred')} && rm -f {tmp}")


@operation()
def no_credential(dest: str):
    """No credential at ``dest`` (a secret that became a plain file, or went): ``<dest>.cred``,
    the link ``dest`` and its /run copy removed, so a plain file can be written there (not
    through the link into /run) and a reboot decrypts nothing old."""
    if not host.get_fact(CredentialLeft, dest=dest):
        host.noop(f"no credential at {dest}")
        return
    d = shlex.quote(dest)
    yield StringCommand(f"if [ -L {d} ]; then t=$(readlink {d}); case \"$t\" in {RUN_DIR}/*) rm -f \"$t\";; esac; "
                        f"rm -f {d}; fi; rm -f {shlex.quote(dest + '.cred')}")


CREDENTIALS_SCRIPT = f"""#!/bin/sh
# Managed by gpuserve (pyinfra): decrypt the gpuserve credentials in the directories given
# (systemd-creds: <file>.cred beside the link <file> -> {RUN_DIR}/<name>) into {RUN_DIR} (tmpfs),
# with the .cred file's owner and mode, as a service's ExecStartPre=+ before it reads them
# (after a reboot /run is empty). Fails when a link into {RUN_DIR} is left without its file:
# no service starts without its secret.
set -eu
umask 077
mkdir -p {RUN_DIR}
chmod 711 {posixpath.dirname(RUN_DIR)} {RUN_DIR}
for dir in "$@"; do
  for cred in "$dir"/*.cred; do
    [ -f "$cred" ] || continue
    target=$(readlink "${{cred%.cred}}") || continue
    name=$(basename "$target")
    systemd-creds decrypt --name="$name" "$cred" "$target.new"
    chown --reference="$cred" "$target.new"
    chmod --reference="$cred" "$target.new"
    mv -f "$target.new" "$target"
  done
  for link in "$dir"/*; do
    [ -L "$link" ] || continue
    case $(readlink "$link") in
      {RUN_DIR}/*) [ -f "$link" ] || {{ echo "gpuserve: $link has no credential to decrypt" >&2; exit 1; }} ;;
    esac
  done
done
"""
CREDENTIALS_BIN = layout.CREDENTIALS_BIN


def credentials_tool() -> None:
    """Install ``CREDENTIALS_SCRIPT``, which every drop-in and unit that decrypts credentials
    runs (a changed script needs no restart: it runs when a service starts)."""
    files.directory(name="gpuserve tools", path=posixpath.dirname(CREDENTIALS_BIN), user="root", group="root",
                    mode="755")
    files.put(name="Credentials decrypted into /run before a service starts", src=StringIO(CREDENTIALS_SCRIPT),
              dest=CREDENTIALS_BIN, user="root", group="root", mode="755")


def credentials_dropin(directory: str, start_pre: str | None = None) -> str:
    """A drop-in that decrypts ``directory``'s credentials before the unit's own ExecStartPre=
    ``start_pre`` (which may read them; None: the unit has none), as root outside the unit's
    sandbox (``+``: a TPM2 device and the credential key are out of a confined unit's reach)."""
    return templating.render("dropin-credentials.conf.j2", credentials_bin=CREDENTIALS_BIN, directory=directory,
                             start_pre=start_pre)
