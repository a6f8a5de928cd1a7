"""A non-root SSH login with sudo (docs/non-root.md): the sudo a rollout's host commands get, and
how a secret file goes up through sudo. What the sandbox inventory gives pyinfra is tested in
sandbox/tests/test_sandbox_login.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host
from pyinfra.facts.server import Home

from gpuserve.rollout import remote
from gpuserve.operations import secrets as secrets_ops

from .helpers import make_inventory, one_problem

SECRET = "sk-not-in-any-command-0123456789"


# -- host commands of a rollout (gpuserve.rollout.remote) ----------------------------------------

class Host:
    def __init__(self, data):
        self.name, self.data, self.kwargs = "h1", data, None

    def run_shell_command(self, command, **kwargs):
        self.kwargs = kwargs
        return True, SimpleNamespace(stdout="ok\n", stderr="", output="ok\n")


@pytest.mark.parametrize("data, want", [
    ({}, {"_sudo": False}),
    ({"_sudo": True}, {"_sudo": True}),
    ({"_sudo": True, "_sudo_user": "svc", "_use_sudo_login": True},
     {"_sudo": True, "_sudo_user": "svc", "_use_sudo_login": True}),
    ({"_sudo_user": "svc"}, {"_sudo": False}),      # without _sudo the other keys mean nothing
])
def test_rollout_commands_run_with_the_hosts_sudo_settings(data, want):
    h = Host(data)
    assert remote.run(h, "systemctl is-active x") == "ok\n"
    assert h.kwargs == {**want, "_timeout": remote.COMMAND_TIMEOUT_S}


class UploadHost(Host):
    """Also records uploads (pyinfra's Host.put_file) and the commands run after them."""

    def __init__(self, data, upload_ok=True):
        super().__init__(data)
        self.uploads, self.commands, self.upload_ok = [], [], upload_ok

    def put_file(self, io, remote, **kwargs):
        self.uploads.append((io.read(), remote, kwargs))
        return self.upload_ok

    def run_shell_command(self, command, **kwargs):
        self.commands.append(str(command))
        return super().run_shell_command(command, **kwargs)


def test_a_public_file_is_uploaded_not_put_in_a_command_line_then_renamed():
    """gpuserve.rollout.remote.put_text: a 200 KiB file (the gateway's CA file of about 160 hosts'
    certificates) would not fit a command line (128 KiB); it travels over SFTP, with sudo."""
    h = UploadHost({"_sudo": True})
    text = "x" * 200_000
    remote.put_text(h, "/etc/gpuserve-gateway/workers-ca.pem", text)
    assert h.uploads == [(text, "/etc/gpuserve-gateway/workers-ca.pem.gpuserve-tmp", {"_sudo": True})]
    assert h.commands == ["chmod 644 /etc/gpuserve-gateway/workers-ca.pem.gpuserve-tmp && mv -f "
                          "/etc/gpuserve-gateway/workers-ca.pem.gpuserve-tmp /etc/gpuserve-gateway/workers-ca.pem"]
    assert all(len(c) < 1000 for c in h.commands)


def test_a_failed_upload_names_the_host_and_the_file_and_renames_nothing():
    h = UploadHost({}, upload_ok=False)
    with pytest.raises(remote.MoveFailed, match="h1: uploading /etc/x failed"):
        remote.put_text(h, "/etc/x", "text")
    assert h.commands == []


# -- secret files through sudo (gpuserve.operations.secrets) -------------------------------------

class OpHost:
    """Enough of pyinfra's Host for the secret_file generator: facts asked are recorded."""

    def __init__(self, global_args: dict):
        self.name, self.current_op_global_arguments, self.asked = "h1", global_args, []

    def get_fact(self, cls, **kwargs):
        self.asked.append((cls, kwargs))
        return "/home/ops" if cls is Home else None

    def noop(self, message):
        raise AssertionError(f"unexpected no-op: {message}")


def _secret_file_commands(global_args: dict) -> tuple[OpHost, list]:
    h = OpHost(global_args)
    with ctx_host.use(h):
        commands = list(secrets_ops.secret_file._inner(content=SECRET, dest="/etc/nginx/gpuserve/x.keys"))
    for c in commands:
        if isinstance(c, StringCommand):
            assert SECRET not in c.get_raw_value()   # only file names reach a command line
    return h, commands


def test_through_sudo_a_secret_goes_up_into_the_login_users_private_directory():
    h, commands = _secret_file_commands({"_sudo": True})
    # the login user's home, asked as that user (under sudo, ~ would be root's)
    assert (Home, {"_sudo": False}) in h.asked
    private = [c for c in commands if isinstance(c, StringCommand) and ".gpuserve-upload" in c.get_raw_value()]
    assert len(private) == 1 and private[0].connector_arguments == {"_sudo": False}
    assert "umask 077; mkdir -p /home/ops/.gpuserve-upload && chmod 700" in private[0].get_raw_value()
    upload = next(c for c in commands if isinstance(c, FileUploadCommand))
    assert upload.remote_temp_filename == "/home/ops/.gpuserve-upload/x.keys.upload"
    assert upload.dest == f"{secrets_ops.STAGING}/x.keys.upload"   # sudo cp into root's 0700 dir
    assert upload.src.read().decode() == SECRET


def test_a_root_login_uploads_straight_into_roots_staging_directory():
    h, commands = _secret_file_commands({"_sudo": False})
    assert not [c for c, _ in h.asked if c is Home]
    assert not [c for c in commands if isinstance(c, StringCommand) and ".gpuserve-upload" in c.get_raw_value()]
    upload = next(c for c in commands if isinstance(c, FileUploadCommand))
    assert upload.dest == f"{secrets_ops.STAGING}/x.keys.upload"


def test_other_escalations_are_refused_by_name():
    with pytest.raises(ValueError, match="with _sudo only, not _su_user"):
        _secret_file_commands({"_su_user": "root"})


# -- plan time ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, text", [
    ("_sudo_password", "hunter2", "pyinfra puts this password on the host's command line"),
    ("_su_password", "hunter2", "pyinfra puts this password on the host's command line"),
    ("_su_user", "root", "gpuserve escalates with sudo only"),
    ("_doas", True, "gpuserve escalates with sudo only"),
])
def test_logins_that_would_leak_a_password_or_skip_sudo_are_refused(key, value, text):
    msg = one_problem(make_inventory(host_data={"ssh_user": "deploy", key: value}))
    assert msg.startswith(f"h1: {key} (from host data): {text}") and "docs/non-root.md" in msg


def test_a_sudo_login_passes_the_plan():
    from gpuserve.config import validate_inventory

    validate_inventory(make_inventory(host_data={"ssh_user": "deploy", "_sudo": True}))


# -- credentials through sudo (issue 29: encrypted at rest, plaintext only in tmpfs) ------------

class CredHost(OpHost):
    def get_fact(self, cls, **kwargs):
        self.asked.append((cls, kwargs))
        if cls is secrets_ops.CredentialState:
            return ("", False)
        return "ops" if cls.__name__ == "User" else None


def _credential_commands(global_args: dict) -> tuple[OpHost, list]:
    h = CredHost(global_args)
    with ctx_host.use(h):
        commands = list(secrets_ops.credential_file._inner(
            content=SECRET, dest="/etc/gpuserve/nginx/x.keys", cred_name="x.keys"))
    for c in commands:
        if isinstance(c, StringCommand):
            assert SECRET not in c.get_raw_value()
    return h, commands


def test_a_credential_never_touches_a_disk_on_its_way_up():
    h, commands = _credential_commands({"_sudo": True})
    upload = next(c for c in commands if isinstance(c, FileUploadCommand))
    # the login user's copy in /dev/shm, root's in /run: both tmpfs
    assert upload.remote_temp_filename == "/dev/shm/.gpuserve-upload-ops/x.keys.upload"
    assert upload.dest == f"{secrets_ops.RUN_STAGING}/x.keys.upload"
    last = commands[-1].get_raw_value()
    assert "systemd-creds encrypt --name=x.keys /run/gpuserve/.staging/x.keys.upload " \
           "/etc/gpuserve/nginx/x.keys.cred.new" in last
    assert "shred -u /etc/gpuserve/nginx/x.keys" in last   # an old plaintext file goes
    assert last.endswith("ln -sfn /run/gpuserve/secrets/x.keys /etc/gpuserve/nginx/x.keys")


def test_an_up_to_date_credential_is_a_noop():
    import hashlib

    class Same(CredHost):
        def get_fact(self, cls, **kwargs):
            return (hashlib.sha256(SECRET.encode()).hexdigest(), True)

        def noop(self, message):
            self.noted = message

    h = Same({})
    with ctx_host.use(h):
        assert list(secrets_ops.credential_file._inner(
            content=SECRET, dest="/etc/gpuserve/nginx/x.keys", cred_name="x.keys")) == []
    assert h.noted == "credential /etc/gpuserve/nginx/x.keys.cred is up to date"
    fact = secrets_ops.CredentialState()
    assert fact.process(["none no"]) == ("", False)
    assert fact.process(["ab12 yes"]) == ("ab12", True)


# -- issue 29: every key encrypted at rest (engine keys, the proxy's copy, the monitor's, the fleet key)

class FactHost(CredHost):
    """Answers each fact class from ``facts``; records no-ops."""

    def __init__(self, global_args: dict, facts: dict):
        super().__init__(global_args)
        self.facts, self.noted = facts, None

    def get_fact(self, cls, **kwargs):
        self.asked.append((cls, kwargs))
        return self.facts.get(cls.__name__, "ops" if cls.__name__ == "User" else None)

    def noop(self, message):
        self.noted = message


def _run(op, facts: dict, global_args: dict | None = None, **kwargs) -> tuple[FactHost, list]:
    h = FactHost(global_args or {}, facts)
    with ctx_host.use(h):
        return h, list(op._inner(**kwargs))


def test_a_credential_for_a_service_user_has_its_owner_and_mode_on_the_cred_and_the_run_copy():
    h, commands = _run(secrets_ops.credential_file, {"CredentialState": ("", False)}, content=SECRET,
                       dest="/etc/prometheus/gpuserve-keys/a-m.key", cred_name="scrape.a-m.key",
                       user="root", group="prometheus", mode="640")
    # the fact compares the /run copy's owner and mode too
    assert ("CredentialState", "root:prometheus:640") in [(c.__name__, k.get("perms")) for c, k in h.asked]
    last = commands[-1].get_raw_value()
    # the decrypting script copies them from the .cred file (chown/chmod --reference)
    assert ("chown root:prometheus /etc/prometheus/gpuserve-keys/a-m.key.cred.new "
            "/run/gpuserve/.staging/scrape.a-m.key.upload") in last
    assert "chmod 640 /etc/prometheus/gpuserve-keys/a-m.key.cred.new" in last
    assert "mv -f /run/gpuserve/.staging/scrape.a-m.key.upload /run/gpuserve/secrets/scrape.a-m.key" in last
    # /run/gpuserve and its secrets: 0711, so that user reaches its own file by name
    assert "chmod 711 /run/gpuserve /run/gpuserve/secrets" in commands[0].get_raw_value()
    assert all(SECRET not in c.get_raw_value() for c in commands if isinstance(c, StringCommand))


def test_the_credential_fact_names_the_run_copys_owner_and_mode():
    cmd = secrets_ops.CredentialState().command("/etc/x/k", "k", "root:prometheus:640")
    assert "stat -c %U:%G:%a /run/gpuserve/secrets/k" in cmd and "root:prometheus:640" in cmd


def test_a_generated_credential_keeps_a_valid_one_then_an_old_plaintext_key_and_makes_one_last():
    h, commands = _run(secrets_ops.generated_credential, {"CredentialMatches": (False, False)},
                       dest="/etc/gpuserve/m/secrets.env", cred_name="m.secrets.env",
                       check="^VLLM_API_KEY=.", make="printf 'VLLM_API_KEY=%s\\n' new")
    (cmd,) = [c.get_raw_value() for c in commands]
    keep = cmd.index("systemd-creds decrypt --name=m.secrets.env /etc/gpuserve/m/secrets.env.cred "
                     "/run/gpuserve/.staging/m.secrets.env.new")
    plaintext = cmd.index("cat /etc/gpuserve/m/secrets.env > /run/gpuserve/.staging/m.secrets.env.new")
    made = cmd.index("( printf 'VLLM_API_KEY=%s\\n' new ) > /run/gpuserve/.staging/m.secrets.env.new")
    assert keep < plaintext < made   # the same key where there is one: nginx's copy stays valid
    assert "systemd-creds encrypt --name=m.secrets.env" in cmd and "shred -u /etc/gpuserve/m/secrets.env" in cmd
    assert cmd.endswith("ln -sfn /run/gpuserve/secrets/m.secrets.env /etc/gpuserve/m/secrets.env")
    h, commands = _run(secrets_ops.generated_credential, {"CredentialMatches": (True, True)},
                       dest="/etc/gpuserve/m/secrets.env", cred_name="m.secrets.env",
                       check="^VLLM_API_KEY=.", make="true")
    assert commands == [] and h.noted == "credential /etc/gpuserve/m/secrets.env.cred exists"
    fact = secrets_ops.CredentialMatches()
    assert fact.process(["yes no"]) == (True, False) and fact.process([]) == (False, False)
    # the fact prints yes/no, never a line of the secret (grep -q)
    assert "grep -qE" in fact.command("/etc/gpuserve/m/secrets.env", "m.secrets.env", "^VLLM_API_KEY=.")


def test_an_encrypted_credential_for_a_unit_has_no_run_copy_and_an_up_to_date_one_is_a_noop():
    import hashlib

    h, commands = _run(secrets_ops.encrypted_credential, {"CredentialState": ("", False)}, {"_sudo": True},
                       content=SECRET, cred="/etc/gpuserve/fanout/id_ed25519.cred", cred_name="fleet-key")
    upload = next(c for c in commands if isinstance(c, FileUploadCommand))
    assert upload.remote_temp_filename == "/dev/shm/.gpuserve-upload-ops/fleet-key.upload"
    last = commands[-1].get_raw_value()
    assert ("systemd-creds encrypt --name=fleet-key /run/gpuserve/.staging/fleet-key.upload "
            "/etc/gpuserve/fanout/id_ed25519.cred.new") in last
    assert "/run/gpuserve/secrets" not in last and last.endswith("rm -f /run/gpuserve/.staging/fleet-key.upload")
    same = (hashlib.sha256(SECRET.encode()).hexdigest(), False)   # no link: none is wanted
    h, commands = _run(secrets_ops.encrypted_credential, {"CredentialState": same},
                       content=SECRET, cred="/etc/gpuserve/fanout/id_ed25519.cred", cred_name="fleet-key")
    assert commands == [] and h.noted == "credential /etc/gpuserve/fanout/id_ed25519.cred is up to date"


def test_no_credential_removes_the_cred_the_link_and_its_run_copy_only():
    h, commands = _run(secrets_ops.no_credential, {"CredentialLeft": False}, dest="/etc/prometheus/alertmanager.yml")
    assert commands == [] and h.noted
    h, (cmd,) = _run(secrets_ops.no_credential, {"CredentialLeft": True}, dest="/etc/prometheus/alertmanager.yml")
    raw = cmd.get_raw_value()
    assert "/run/gpuserve/secrets/*) rm -f" in raw and raw.endswith("rm -f /etc/prometheus/alertmanager.yml.cred")


def test_the_decrypting_script_fails_when_a_link_into_run_has_no_credential():
    script = secrets_ops.CREDENTIALS_SCRIPT
    assert 'chown --reference="$cred"' in script and 'chmod --reference="$cred"' in script
    assert "has no credential to decrypt" in script and "exit 1" in script
    assert script.index("systemd-creds decrypt") < script.index("has no credential to decrypt")
