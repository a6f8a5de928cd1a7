"""The one error a bad inventory raises: every problem, on every host, in one message.

``gpuserve.config`` re-exports both names; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api.exceptions import PyinfraError


@dataclass(frozen=True)
class Problem:
    host: str
    source: str  # where the value came from: "group 'prod'", "host data", "all", "--data", ...
    key: str  # the key path, e.g. "deployments.minimax.serve_flags.block-size"
    message: str  # what is wrong and what is allowed

    def __str__(self) -> str:
        return f"{self.host}: {self.key} (from {self.source}): {self.message}"


class ConfigError(PyinfraError):
    """Invalid inventory or group data. ``.problems`` lists each one; ``str()`` all of them.

    A PyinfraError, so the pyinfra command prints it as an error message, not a traceback."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        count = len(self.problems)
        lines = [f"{count} configuration error{'s' if count != 1 else ''}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))
