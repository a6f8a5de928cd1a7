"""The sandbox inventory's login (docs/non-root.md): a non-root user with sudo by default, root on
request, anything else refused naming the choices. Moved from tests/unit/test_nonroot.py."""

from __future__ import annotations

import pytest

from gpuserve_sandbox import inventory
from gpuserve_sandbox.hosts import LOGIN_USER
from gpuserve_sandbox.util import SandboxError


def test_sandbox_logs_in_as_the_non_root_user_with_sudo_by_default(monkeypatch):
    monkeypatch.delenv("GPUSERVE_SANDBOX_LOGIN", raising=False)
    assert LOGIN_USER != "root"
    assert inventory.login_user() == LOGIN_USER
    assert inventory.login_data(LOGIN_USER) == {"ssh_user": LOGIN_USER, "_sudo": True}


def test_root_login_has_no_sudo(monkeypatch):
    monkeypatch.setenv("GPUSERVE_SANDBOX_LOGIN", "root")
    assert inventory.login_user() == "root"
    assert inventory.login_data("root") == {"ssh_user": "root"}


def test_an_unknown_login_is_refused_naming_the_choices(monkeypatch):
    monkeypatch.setenv("GPUSERVE_SANDBOX_LOGIN", "admin")
    with pytest.raises(SandboxError, match=f"GPUSERVE_SANDBOX_LOGIN='admin': sandbox hosts accept "
                                           f"{LOGIN_USER} or root"):
        inventory.login_user()
