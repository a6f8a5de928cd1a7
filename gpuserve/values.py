"""Checks of single values that several settings share: URLs, host names, host paths, listen
addresses and key files. A leaf: it imports nothing of gpuserve but secret_sources (a leaf), so
config and stack both use it.

Each ``*_problem`` returns why a value is refused (a sentence that says what is allowed), or
None when it is fine. Secrets are never put into a message.
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
import stat
import unicodedata
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


# --- principles every value is checked by (docs/configuration.md, "How values are checked") -----
# Each is a rule about what a value becomes, not a list of known mistakes: a number is a quantity
# in its key's unit, a string is a name, host, version, URL or path that other programs read.

# characters nobody can see or tell apart from a space: format (zero-width, bidi overrides),
# control, private-use, unassigned, surrogate, and every separator but the plain space
_INVISIBLE_CATEGORIES = {"Cf", "Cc", "Co", "Cs", "Cn", "Zl", "Zp", "Zs"}
_ALLOWED_WHITESPACE = {" ", "\t", "\n"}


def _named(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}"


def text_problem(value: str, *, ascii_only: bool, multiline: bool = False) -> str | None:
    """Why a string setting is refused (None when it is fine): it holds a character nobody sees
    (zero-width, bidi, non-breaking space, ...), it is not in Unicode's NFKC form (full-width
    letters, ligatures: what is shown is not what a program compares), or, where ``ascii_only``
    (names, hosts, versions, URLs, host paths: what other programs match byte for byte), it holds
    a non-ASCII character, such as a Cyrillic 'а' that looks like a Latin 'a'."""
    allowed = _ALLOWED_WHITESPACE if multiline else {" "}
    hidden = [ch for ch in value if ch not in allowed and unicodedata.category(ch) in _INVISIBLE_CATEGORIES]
    if hidden:
        return (f"holds a character nobody sees ({', '.join(dict.fromkeys(map(_named, hidden)))}); "
                "type the value again by hand")
    normal = unicodedata.normalize("NFKC", value)
    if normal != value:
        return f"is not in Unicode normal form (NFKC): it reads as {normal!r}; write it that way"
    if ascii_only and not value.isascii():
        odd = [ch for ch in value if not ch.isascii()]
        return (f"holds {', '.join(dict.fromkeys(map(_named, odd)))}, which is not ASCII: names, "
                "hosts, versions and URLs are matched byte for byte, and a look-alike letter "
                "names something else")
    return None


def finite_problem(value: Any) -> str | None:
    """NaN and infinity are never a setting: every comparison with NaN is false (so it passes
    range checks), and no key means "unlimited" by a number; where a key can be unlimited it
    says so by being unset."""
    if isinstance(value, float) and not math.isfinite(value):
        return (f"{value!r} is not a finite number: NaN and infinity are never a setting (to mean "
                "no limit, leave the key unset where it allows that)")
    return None


# a key's unit, from its name's suffix -> (unit name, the neighbouring unit a value is often given
# in by mistake, how many of those make one of these)
UNIT_SUFFIXES = {"_s": ("seconds", "milliseconds", 1000), "_kib": ("KiB", "bytes", 1024),
                 "_mib": ("MiB", "KiB", 1024), "_gib": ("GiB", "MiB", 1024),
                 "_ratio": ("a fraction (0.05 is 5%)", "percent", 100),
                 "_ratio_max": ("a fraction (0.05 is 5%)", "percent", 100),
                 "_len": ("tokens", "thousands of tokens (32 for 32K)", 1 / 1024)}


def unit_of(key: str) -> tuple[str, str, float] | None:
    """(unit, the unit a value is mistaken in, factor) for a key whose name carries a unit."""
    for suffix in sorted(UNIT_SUFFIXES, key=len, reverse=True):
        if key.endswith(suffix):
            return UNIT_SUFFIXES[suffix]
    return None


def scale_hint(key: str, value: Any, lo: float, hi: float | None) -> str:
    """For a number outside [lo, hi]: " (... did you mean X?)" when the value fits once read in
    the unit it was probably given in (bytes for KiB, percent for a fraction, 32 for 32K tokens);
    "" otherwise."""
    unit = unit_of(key.rsplit(".", 1)[-1])
    if unit is None or isinstance(value, bool) or not isinstance(value, (int, float)) or finite_problem(value):
        return ""
    name, mistaken, factor = unit
    meant = value / factor
    if meant == int(meant):
        meant = int(meant)
    if lo <= meant and (hi is None or meant <= hi):
        return (f" ({key.rsplit('.', 1)[-1]} is in {name}; {value} looks like a value in {mistaken}:"
                f" did you mean {meant}?)")
    return ""


# URLs gpuserve appends paths to (an index, a mirror, a hub endpoint): the URL it builds is the
# base + "/" + a path, so a query or a fragment in the base lands in the middle of it
def base_url_problem(value: str) -> str | None:
    """Why ``value`` cannot be the base of the URLs gpuserve builds from it (None when it can)."""
    parts = urlsplit(value)
    if parts.fragment or "#" in value:
        return (f"has a fragment ('#{parts.fragment}'): gpuserve appends paths to this URL, and "
                "everything after '#' never reaches the server; drop it")
    if parts.query:
        return ("has a query ('?...'): gpuserve appends paths to this URL, which would land after "
                "the query; use the plain base URL")
    return None


def pem_problems(cert_path: Path, key_path: Path | None, now: float) -> list[str]:
    """A certificate file read as what it must be: PEM that parses, not expired (nor not yet
    valid), and, with ``key_path``, a private key that parses and is the certificate's."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        return [f"{cert_path} is not a PEM certificate ({type(exc).__name__}: {exc})"]
    out = []
    start, end = cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()
    if now > end:
        out.append(f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    elif now < start:
        out.append(f"{cert_path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d}")
    if key_path is not None:
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            out.append(f"{key_path} is not an unencrypted PEM private key ({type(exc).__name__})")
        else:
            der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            if key.public_key().public_bytes(*der) != cert.public_key().public_bytes(*der):
                out.append(f"{key_path} is not the private key of {cert_path} (their public keys "
                           "differ)")
    return out


def key_lines_problem(path: Path) -> str | None:
    """An API keys file read as one: one key per line, each a single token of printable ASCII;
    a PEM block, an SSH key or a line with spaces is some other file given by mistake."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None   # key_file_problem says why it cannot be read
    if "-----BEGIN" in text or re.search(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-)", text, re.M):
        return (f"{path} holds a PEM block or an SSH key, not API keys (one random key per line, "
                "e.g. `openssl rand -hex 32`)")
    bad = [i for i, line in enumerate((x.strip() for x in text.splitlines()
                                       if x.strip() and not x.strip().startswith("#")), 1)
           if not re.fullmatch(r"[\x21-\x7e]+", line)]
    if bad:
        return (f"{path}: key {', '.join(map(str, bad))} (counting keys, not lines) has spaces or "
                "characters outside printable ASCII; one key per line")
    return None
