#!/bin/bash
# Set up a Debian 12 machine for gpuserve development, tests and the sandbox. Run as root.
# Idempotent and quick when everything is there: installs only what is missing.
#   Debian packages: the sandbox's tools (debootstrap, systemd-nspawn, apt-cacher-ng, lxcfs, ...)
#                    and what builds its stand-in GPU repositories (gcc, dpkg-dev, gnupg),
#                    promtool (Debian's prometheus package: the unit tests check the alert rules)
#   .venv/:          gpuserve itself (editable) with its test dependencies, pinned in pyproject.toml,
#                    and the sandbox, a distribution of its own (sandbox/, editable, its
#                    dependencies pinned in sandbox/pyproject.toml): it adds `gpuserve sandbox`
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "bootstrap: run as root (the sandbox makes network namespaces, mounts and containers)" >&2
  exit 1
fi
PACKAGES=(
  debootstrap systemd-container iproute2 openssh-client util-linux apt-cacher-ng lxcfs
  python3 python3-venv python3-pip ca-certificates curl rsync
  gnupg gcc libc6-dev dpkg-dev
  prometheus age
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.gpuserve-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ sandbox/pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing gpuserve, the sandbox and their pinned dependencies into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' -e ./sandbox \
    2> >(grep -v "^WARNING: Location" >&2)
  touch "$stamp"
fi
echo "bootstrap: ready (.venv/bin/gpuserve, .venv/bin/pyinfra, .venv/bin/pytest)"
