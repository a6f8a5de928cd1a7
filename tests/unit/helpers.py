"""Helpers: pyinfra inventories built in memory, the way pyinfra's own loader builds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api import Inventory

from gpuserve.config import ConfigError, HostSettings, validate_inventory
from gpuserve.hardware import PROFILES

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
SHA = "0123456789abcdef0123456789abcdef01234567"

# vLLM 0.34.0 (the Blackwell pin) needs flashinfer-python==0.7.3, which PyPI lacks, and AMD
# needs vLLM's ROCm wheels: both fleets name an index (never contacted by unit tests)
_FLEET_DATA = {
    "blackwell_x4": {"engine_index": "https://flashinfer-mirror.example.internal/simple"},
    "mi355x_x4": {"torch_backend": "rocm7.2", "engine_index": "https://rocm-wheels.example.internal/simple"},
}
# each profile's reference machine (gpuserve.hardware.PROFILES), as its group data declares it
HARDWARE = {name: {**hw.group_data(), **_FLEET_DATA.get(name, {})} for name, hw in PROFILES.items()}

def key_file(directory: Path) -> Path:
    """An api_keys_file in ``directory`` holding one valid key, 0600 (the plan refuses a key file
    others can read)."""
    keys = directory / "keys"
    keys.write_text("k" * 32 + "\n")
    keys.chmod(0o600)
    return keys


def tls_pair(directory: Path, name: str = "tls", *, not_before_days: float = -1,
             not_after_days: float = 30) -> tuple[Path, Path]:
    """A real self-signed certificate and its key (PEM, 0600) valid from ``not_before_days`` to
    ``not_after_days`` from now (negative: in the past)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=not_before_days))
            .not_valid_after(now + datetime.timedelta(days=not_after_days))
            .sign(key, hashes.SHA256()))
    crt_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    crt_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    for f in (crt_path, key_path):
        f.chmod(0o600)
    return crt_path, key_path


def make_inventory(
    host_data: dict | None = None,
    group: str = "hopper_x8",
    group_data: dict | None = None,
    fleet: dict | None = None,
    all_data: dict | None = None,
    override: dict | None = None,
    hosts: tuple[str, ...] = ("h1",),
) -> Inventory:
    """Hosts in a hardware group and in group ``fleet`` (which wins, like an inventory's file
    group); ``fleet`` pins the model revision unless told otherwise."""
    fleet = {"model_revision": SHA} if fleet is None else fleet
    return Inventory(
        ([(name, dict(host_data or {})) for name in hosts], dict(all_data or {})),
        override_data=override,
        **{
            group: (list(hosts), {**HARDWARE.get(group, {}), **(group_data or {})}),
            "fleet": (list(hosts), fleet),
        },
    )


def settings_of(inventory: Inventory, host: str = "h1") -> HostSettings:
    return validate_inventory(inventory)[host]


def problems_of(inventory: Inventory) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_inventory(inventory)
    return [str(p) for p in caught.value.problems]


def one_problem(inventory: Inventory) -> str:
    found = problems_of(inventory)
    assert len(found) == 1, found
    return found[0]
