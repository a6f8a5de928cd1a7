"""A systemd credential's state on a host, never its content (``gpuserve.operations.secrets``
writes them): the hash of what it decrypts to, whether it decrypts to a line matching a pattern,
whether anything of it is left, and whether ``dest`` is the link to its /run copy."""

from __future__ import annotations

import posixpath
import shlex

from pyinfra.api import FactBase

from gpuserve import layout

RUN_DIR = layout.SECRETS_RUN_DIR   # where a credential is decrypted to (tmpfs), and ``dest`` links


class CredentialState(FactBase):
    """A credential's state, never its content: the sha256 of its decrypted content ("" when
    ``<dest>.cred`` is missing or does not decrypt), and whether ``dest`` is the link to its /run
    copy with that copy present (with owner and mode ``perms``, ``user:group:mode``, when given)."""

    def command(self, dest: str, cred_name: str, perms: str = "root:root:600") -> str:
        name = cred_name   # ``name`` is pyinfra's
        cred, run = shlex.quote(dest + ".cred"), shlex.quote(posixpath.join(RUN_DIR, name))
        return (f"h=$( [ -f {cred} ] && systemd-creds decrypt --name={shlex.quote(name)} {cred} - "
                f"2>/dev/null | sha256sum | cut -d' ' -f1 ); "
                f"[ -f {cred} ] && systemd-creds decrypt --name={shlex.quote(name)} {cred} - "
                f">/dev/null 2>&1 || h=; "
                f"l=no; [ \"$(readlink {shlex.quote(dest)})\" = {run} ] && [ -f {run} ] && "
                f"[ \"$(stat -c %U:%G:%a {run})\" = {shlex.quote(perms)} ] && l=yes; "
                f"echo \"${{h:-none}} $l\"")

    def process(self, output: list[str]) -> tuple[str, bool]:
        digest, linked = (output[-1].split() + ["", ""])[:2] if output else ("none", "no")
        return ("" if digest == "none" else digest), linked == "yes"


class CredentialMatches(FactBase):
    """Whether ``<dest>.cred`` decrypts to content with a line matching the extended regex
    ``pattern``, and ``dest`` is the link to its /run copy: "yes"/"no" twice, never a line."""

    def command(self, dest: str, cred_name: str, pattern: str) -> str:
        name = cred_name   # ``name`` is pyinfra's
        cred, run = shlex.quote(dest + ".cred"), shlex.quote(posixpath.join(RUN_DIR, name))
        return (f"c=no; [ -f {cred} ] && systemd-creds decrypt --name={shlex.quote(name)} {cred} - "
                f"2>/dev/null | grep -qE {shlex.quote(pattern)} && c=yes; "
                f"l=no; [ \"$(readlink {shlex.quote(dest)})\" = {run} ] && "
                f"grep -qE {shlex.quote(pattern)} {run} 2>/dev/null && l=yes; echo \"$c $l\"")

    def process(self, output: list[str]) -> tuple[bool, bool]:
        made, linked = (output[-1].split() + ["", ""])[:2] if output else ("no", "no")
        return made == "yes", linked == "yes"


class CredentialLeft(FactBase):
    """Whether anything of a credential is left: ``<dest>.cred``, or ``dest`` as a link."""

    def command(self, dest: str) -> str:
        return (f"if [ -e {shlex.quote(dest + '.cred')} ] || [ -L {shlex.quote(dest)} ]; "
                "then echo yes; else echo no; fi")

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[-1].strip() == "yes"
