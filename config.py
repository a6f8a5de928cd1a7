"""pyinfra configuration, read from the directory pyinfra runs in (the repository root)."""

from pyinfra import config

config.REQUIRE_PYINFRA_VERSION = ">=3.10,<3.11"
