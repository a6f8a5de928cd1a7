"""The host's OS, and apt package sets: what a held set wants, what it replaces, and the plan
from what is installed and held to it."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuserve.stack.settings import SUPPORTED_OS, StackError

# --- the host's OS ------------------------------------------------------------------------------
def os_key(release_meta: Mapping) -> str:
    """/etc/os-release (pyinfra LinuxDistribution.release_meta) -> debian12 | ubuntu2204 | ubuntu2404."""
    key = f"{release_meta.get('ID', '')}{str(release_meta.get('VERSION_ID', '')).replace('.', '')}"
    if key not in SUPPORTED_OS:
        found = f"{release_meta.get('ID', '?')} {release_meta.get('VERSION_ID', '?')}"
        raise StackError(f"the GPU stack supports {', '.join(SUPPORTED_OS)}; this host runs {found}")
    return key


def cuda_arch(deb_arch: str) -> str:
    """dpkg architecture -> the CUDA repository's directory name."""
    archs = {"amd64": "x86_64", "arm64": "sbsa"}
    if deb_arch not in archs:
        raise StackError(f"no CUDA repository for architecture {deb_arch!r}; known: {', '.join(archs)}")
    return archs[deb_arch]


# --- apt package sets ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PackageSpec:
    """A package of the held set. version: the upstream version it must have (exact, or a
    release prefix such as '7.2' for ROCm); None: any version, upgraded with the set."""

    name: str
    version: str | None = None


def upstream(version: str) -> str:
    """'1:580.95.05-1' -> '580.95.05' (no epoch, no Debian revision)."""
    version = version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def version_matches(version: str, wanted: str) -> bool:
    """Whether a Debian version is the wanted upstream release ('7.2' matches '7.2.0.70200-43~22.04')."""
    up = upstream(version)
    return up == wanted or up.startswith(wanted + ".")


def satisfied(spec: PackageSpec, installed: str | None) -> bool:
    if installed is None:
        return False
    return spec.version is None or version_matches(installed, spec.version)


def obsolete_packages(installed: Iterable[str], specs: Iterable[PackageSpec],
                      family: Iterable[str]) -> list[str]:
    """Installed packages of the managed family (fnmatch patterns) that the set no longer wants,
    e.g. nvidia-driver-pinning-580 after a bump to 590."""
    wanted = {s.name for s in specs}
    patterns = list(family)
    return sorted(p for p in installed
                  if p not in wanted and any(fnmatch.fnmatchcase(p, pat) for pat in patterns))


@dataclass(frozen=True)
class PackagePlan:
    unhold: list[str]      # held packages that must move (or go) first
    install: list[str]     # apt-get install arguments: name=version, name, or name- (remove)
    hold: list[str]        # packages of the set not yet held
    problems: list[str]    # why the set cannot be installed from the configured repositories

    @property
    def changes(self) -> bool:
        return bool(self.install)


def plan_packages(specs: list[PackageSpec], installed: Mapping[str, str], held: Iterable[str],
                  available: Mapping[str, list[str]] | None = None,
                  family: Iterable[str] = ()) -> PackagePlan:
    """Unhold -> install -> hold, as one plan for the whole set.

    installed: name -> installed version; held: `apt-mark showhold`; available: name -> versions
    the configured repositories offer (newest first, as `apt-cache policy` lists them), or None
    when not known yet (then versioned specs are planned by name only, for a dry run).
    Nothing to do when every spec is satisfied and nothing obsolete is installed; otherwise the
    whole set moves together: every held member is released, installed at its target (versioned
    specs at the newest offered version of that release, the others at apt's candidate), and
    held again, so apt never meets a held package it must change ("held broken packages").
    """
    held = set(held)
    obsolete = obsolete_packages(installed, specs, family)
    names = [s.name for s in specs]
    if all(satisfied(s, installed.get(s.name)) for s in specs) and not obsolete:
        return PackagePlan([], [], sorted(set(names) - held), [])
    install, problems = [], []
    for spec in specs:
        if spec.version is None:
            install.append(spec.name)
            continue
        if available is None:
            install.append(spec.name)
            continue
        offered = available.get(spec.name, [])
        match = next((v for v in offered if version_matches(v, spec.version)), None)
        if match is None:
            problems.append(f"{spec.name} {spec.version} is not offered by the configured repositories "
                            f"(offered: {', '.join(offered[:5]) or 'none'})")
        else:
            install.append(f"{spec.name}={match}")
    install += [f"{name}-" for name in obsolete]
    unhold = sorted(held & (set(names) | set(obsolete)))
    return PackagePlan(unhold, install, [], problems)


APT_INSTALL = ("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
               "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")
