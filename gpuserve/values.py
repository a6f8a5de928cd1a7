"""Checks of single values that several settings share: URLs, host names, host paths, listen
addresses and key files. A leaf: it imports nothing of gpuserve but secret_sources (a leaf), so
config and stack both use it.

Each ``*_problem`` returns why a value is refused (a sentence that says what is allowed), or
None when it is fine. Secrets are never put into a message.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import stat
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpuserve import secret_sources
from gpuserve.secret_sources import SecretCommand

# A host path gpuserve writes into or names in a unit: plain characters only (an env file or
# ReadWritePaths= splits on spaces), normalized (no '..'), and not a system directory.
HOST_PATH = re.compile(r"/[A-Za-z0-9._/+@-]*")
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run",
               "/sbin", "/sys", "/usr", "/var/lib/dpkg", "/var/lib/apt")
# An RFC 1123 host name: dot-separated labels of letters, digits and '-' (never first or last), 63
# characters each at most and 253 in all. Nothing in it a shell, an nginx file or a certificate
# subject reads as syntax.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*")
# a host's name in an inventory or an ssh config (ssh_hostname) may hold '_' as well (gpu_01)
_NAME_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
INVENTORY_NAME = re.compile(rf"(?=.{{1,253}}\Z){_NAME_LABEL}(\.{_NAME_LABEL})*")
# an IPv6 address's zone (fe80::1%eth0) is an interface name: Python's ipaddress takes any text
ZONE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
# a pyinfra connector's host in the inventory: @local, @docker/ubuntu:24.04, @chroot/srv/root
CONNECTOR_HOST = re.compile(r"@[a-z][a-z0-9_]*(/[A-Za-z0-9._:/@+-]+)?")
# api_keys_file: keys at least this long (a short key can be guessed), file private to its owner
MIN_KEY_LENGTH = 24


# query parameters that carry a secret (a presigned or token URL): printed and written like the rest
SECRET_QUERY = re.compile(r"(access_?)?token|(api_?)?key|secret|password|passwd|pwd|auth\w*|sig"
                          r"|signature|credentials?|x-amz-[\w-]+|x-goog-[\w-]+", re.IGNORECASE)


def url_problem(value: Any, *, file_ok: bool = False) -> str | None:
    """Why ``value`` is not a plain http(s) URL gpuserve may print and write into non-secret
    files (None when it is): one line, no spaces, and no credentials in it, neither as
    user:password@ nor as a token in the query. ``file_ok``: a file:// URL is allowed too."""
    plain = r"https?://[^\s/?#]+[^\s]*" + (r"|file://[^\s]+" if file_ok else "")
    if not isinstance(value, str) or not re.fullmatch(plain, value):
        # the value is shown without its query and user part, which may hold a credential
        shown = (re.sub(r"//[^/@\s]*@", "//...@", value.split("?", 1)[0].split("#", 1)[0])
                 + ("?..." if "?" in value else "")) if isinstance(value, str) else value
        return f"{shown!r} is not an http(s) URL" + (" or a file:// URL" if file_ok else "")
    parts = urlsplit(value)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return ("holds credentials (user:password@); URLs are printed by `gpuserve plan` and "
                "written into non-secret files: give the mirror its credentials another way "
                "(an apt auth.conf, a netrc on the host) and use the plain URL")
    secret = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)
              if SECRET_QUERY.fullmatch(name)]
    if secret:
        return (f"holds a credential in its query ({', '.join(dict.fromkeys(secret))}=...); URLs "
                "are printed by `gpuserve plan` and written into non-secret files: give the "
                "mirror its credentials another way (a netrc on the host) and use the plain URL")
    return None


def is_host(value: Any, *, underscore: bool = False) -> bool:
    """Whether ``value`` is an IP address or an RFC 1123 host name (so safe in a command line,
    an nginx file or a certificate as it is). ``underscore``: '_' in a label too, as an
    inventory's or an ssh config's name may have it."""
    if not isinstance(value, str):
        return False
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return bool((INVENTORY_NAME if underscore else HOST_NAME).fullmatch(value))
    return not isinstance(ip, ipaddress.IPv6Address) or ip.scope_id is None or bool(
        ZONE.fullmatch(ip.scope_id))


def host_name_problem(value: Any, *, connector: bool = False) -> str | None:
    """Why ``value`` is not a host's name or address (an inventory's name, an ssh_hostname)
    gpuserve may write into commands, nginx files and certificates; None when it is.
    ``connector``: a pyinfra connector's name (@local) is allowed too."""
    if is_host(value, underscore=True) or (
            connector and isinstance(value, str) and CONNECTOR_HOST.fullmatch(value)):
        return None
    return (f"{value!r} is not a host name (letters, digits, '-' and '_' in dot-separated labels, "
            "e.g. gpu-01.example.internal) or an IP address"
            + (", or a pyinfra connector like @local" if connector else ""))


def key_file_problem(path: Path) -> str | None:
    """Why a key file on the control node must not be used (None when it may): readable by
    others, empty, or holding a key short enough to guess. The keys are never in the message."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} cannot be read: {getattr(exc, 'strerror', None) or exc}"
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (f"{path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"`chmod 600 {path}`")
    return keys_text_problem(text, str(path))


def key_command_problem(source: SecretCommand) -> str | None:
    """Why the keys a ``*_command`` prints must not be used (None when they may): it fails,
    prints no key, or a key short enough to guess. Runs it (once per process: secret_sources)."""
    try:
        text = secret_sources.read_text(source)
    except secret_sources.SecretSourceError as exc:
        return str(exc)
    return keys_text_problem(text, str(source))


def keys_text_problem(text: str, where: str) -> str | None:
    """Why these keys (one per line) must not be used; ``where`` names their source."""
    keys = [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]
    if not keys:
        return f"{where} holds no key (one key per line; blank lines and # comments are ignored)"
    short = [i for i, k in enumerate(keys, 1) if len(k) < MIN_KEY_LENGTH]
    if short:
        return (f"{where}: key {', '.join(map(str, short))} (counting keys, not lines) is shorter "
                f"than {MIN_KEY_LENGTH} characters; use random keys, e.g. `openssl rand -hex 32`")
    return None


def host_path_problem(value: Any) -> str | None:
    """Why ``value`` is not a host directory gpuserve may write into (None when it is)."""
    if not isinstance(value, str) or not value.startswith("/"):
        return f"{value!r} is not an absolute path"
    if not HOST_PATH.fullmatch(value):
        return (f"{value!r} has characters a unit file or env file cannot hold safely (spaces, "
                "newlines, quotes, ...); use letters, digits and . _ - + @ /")
    if posixpath.normpath(value) != value or value == "/":
        return (f"{value!r} is not a normalized directory (no '..', '.', '//' or trailing '/'); "
                f"write it as {posixpath.normpath(value)!r}" if value != "/" else
                "'/' is not a data directory")
    for system in SYSTEM_DIRS:
        if value == system or value.startswith(system + "/"):
            return f"{value!r} is inside the system directory {system}; use a data mount like /mnt/nvme"
    return None


def _addresses(value: str) -> set[str]:
    """The addresses a listener on ``value`` binds, canonical: ``localhost`` is 127.0.0.1 and
    ::1, ``::ffff:127.0.0.1`` is 127.0.0.1, ``0:0::1`` is ::1; a wildcard is ``*4``/``*6``."""
    if value.lower() in ("localhost", "localhost.localdomain"):
        return {"127.0.0.1", "::1"}
    try:
        ip = ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return {value.lower().rstrip(".")}  # a host name: compared as a name
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        # Linux binds '::' dual-stack by default: it takes the IPv4 port too
        return {"*4", "*6"} if ip.version == 6 else {"*4"}
    return {str(ip)}


def addresses_overlap(a: str, b: str) -> bool:
    """Whether listeners on ``a`` and ``b`` (same port) would clash."""
    one, two = _addresses(a), _addresses(b)
    if one & two:
        return True
    for wild, other in ((one, two), (two, one)):
        if "*4" in wild and any(x.count(".") == 3 or x == "*4" for x in other):
            return True
        if "*6" in wild and any(":" in x or x.count(".") == 3 for x in other):
            return True
    return False


def is_loopback(value: str) -> bool:
    """Whether a listen address is this host's loopback (``localhost``, ``127.x``, ``::1``,
    ``[::1]``, ``::ffff:127.0.0.1``): the one test validation and the unit both use."""
    if value.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        ip = ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped   # ::ffff:127.0.0.1 is 127.0.0.1
    return ip.is_loopback
