"""The command that makes a self-signed certificate on a host (the proxy's, the exporters' front).

One builder, every argument quoted: a host's name reaches openssl's subject and subjectAltName,
and nothing in it may be read as shell syntax (validation refuses such names too:
gpuserve.values.host_name_problem). A leaf: pure string building.
"""

from __future__ import annotations

import ipaddress
import re
import shlex

# a leaf, not a CA: rustls (smg, the gateway) refuses a CA as a server's certificate
# (CaUsedAsEndEntity), and openssl's default makes one
LEAF_EXTENSIONS = ("basicConstraints=critical,CA:FALSE",
                   "keyUsage=critical,digitalSignature,keyEncipherment",
                   "extendedKeyUsage=serverAuth")


def subject(name: str) -> str:
    """openssl's -subj for common name ``name``: '/' and '+' separate fields there, so escaped."""
    return "/CN=" + re.sub(r"([\\/+])", r"\\\1", name)


def self_signed(name: str, key: str, crt: str, *, address: str | None = None,
                leaf: bool = False) -> str:
    """``umask 077; openssl req -x509 ...``: a key and a certificate for ``name``, valid 825 days.
    ``address``: where clients reach the host; an IP address joins the subjectAltName.
    ``leaf``: a subjectAltName and the extensions of a server's (not a CA's) certificate."""
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "825",
            "-subj", subject(name)]
    if leaf:
        sans = [f"DNS:{name}"]
        try:
            ip = ipaddress.ip_address(address or name)
        except ValueError:
            ip = None
        if ip is not None and not getattr(ip, "scope_id", None):
            sans.append(f"IP:{ip}")
        argv += ["-addext", f"subjectAltName={','.join(sans)}"]
        for extension in LEAF_EXTENSIONS:
            argv += ["-addext", extension]
    argv += ["-keyout", key, "-out", crt]
    return f"umask 077; {shlex.join(argv)} 2>/dev/null"
