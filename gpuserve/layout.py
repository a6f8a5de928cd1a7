"""Where things live on a served host. One place, so every layer and every test agrees.

    /opt/gpuserve/envs/<engine-id>/                     immutable uv venvs, one per engine pin
    <nvme>/gpuserve/models/<org>--<name>/<sha>/         immutable checkpoint revisions
    <nvme>/gpuserve/cache/<deployment>/                 persistent compile caches (vLLM, torch)
    /etc/gpuserve/<deployment>/releases/<release-id>/   serve.yaml, env (0600), release.json
    /etc/gpuserve/<deployment>/current -> releases/<id> what the unit serves
    /etc/gpuserve/<deployment>/previous -> releases/<id> the rollback target
    gpuserve-<deployment>.service                       the systemd unit
    /opt/gpuserve/lib/{weights,weights_manifest,fanout_agent}.py   the fan-out agent (weights_fanout = "hosts")
    /etc/gpuserve/fanout/{id_ed25519.cred,known_hosts,job.json}   its fleet key (encrypted), peers, job
    gpuserve-weights-fetch.service                      the fan-out agent's unit
    /var/lib/gpuserve-fanout/.ssh/authorized_keys       the fleet key, forced to read checkpoints only

and, below, the host-wide paths: other programs' directories gpuserve writes into (systemd, nginx,
apt) and gpuserve's own state (/var/lib/gpuserve-stack, the rollout lock, ...). A module that
needs a host path takes it from here (it may keep a local alias of the same constant).
"""

from __future__ import annotations

import posixpath

SERVICE_USER = "gpuserve"
SERVICE_GROUP = "gpuserve"
SERVICE_HOME = "/var/lib/gpuserve"

OPT_DIR = "/opt/gpuserve"
ENVS_DIR = f"{OPT_DIR}/envs"
ETC_DIR = "/etc/gpuserve"

# host-to-host weights fan-out (gpuserve.layers.fanout)
AGENT_DIR = f"{OPT_DIR}/lib"
FANOUT_ETC = f"{ETC_DIR}/fanout"
FANOUT_KEY = f"{FANOUT_ETC}/id_ed25519"   # before issue 29: the fleet key in plaintext (removed)
FANOUT_KEY_CRED = f"{FANOUT_KEY}.cred"    # the fleet key, a systemd credential the fetch unit loads
FANOUT_KEY_CREDENTIAL = "fleet-key"       # its name in the unit's $CREDENTIALS_DIRECTORY
FANOUT_KNOWN_HOSTS = f"{FANOUT_ETC}/known_hosts"
FANOUT_JOB = f"{FANOUT_ETC}/job.json"
FANOUT_USER = "gpuserve-fanout"
FANOUT_HOME = "/var/lib/gpuserve-fanout"
FANOUT_UNIT = "gpuserve-weights-fetch.service"
FANOUT_RUN_DIR = "/run/gpuserve-fanout"   # the unit's RuntimeDirectory (ssh control sockets)
# the monitor's alert relay (gpuserve.receivers, issue 29): the webhooks with a secret in their URL
ALERT_RELAY_CRED = f"{ETC_DIR}/alert-relay/receivers.cred"   # their URLs, a credential its unit loads
ALERT_RELAY_CREDENTIAL = "alert-receivers"   # its name in the unit's $CREDENTIALS_DIRECTORY
ALERT_RELAY = "gpuserve-alert-relay"
ALERT_RELAY_UNIT = f"{ALERT_RELAY}.service"
ALERT_RELAY_BIN = f"{OPT_DIR}/bin/gpuserve-alert-relay"


def fanout_progress(repo_dir: str, sha: str) -> str:
    """The agent's progress file (JSON), beside the revision it stages."""
    return posixpath.join(repo_dir, f".gpuserve-fanout-{sha}.json")


def gpuserve_root(nvme_path: str) -> str:
    """The directory gpuserve owns on the NVMe mount."""
    return posixpath.join(nvme_path, "gpuserve")


def models_dir(nvme_path: str) -> str:
    return posixpath.join(gpuserve_root(nvme_path), "models")


def model_repo_dir(nvme_path: str, repo_id: str) -> str:
    """``MiniMaxAI/MiniMax-M3.1-Flash`` -> ``<nvme>/gpuserve/models/MiniMaxAI--MiniMax-M3.1-Flash``."""
    return posixpath.join(models_dir(nvme_path), repo_id.replace("/", "--"))


def checkpoint_dir(nvme_path: str, repo_id: str, sha: str) -> str:
    return posixpath.join(model_repo_dir(nvme_path, repo_id), sha)


# an engine-cache seed on its way into a host's cache dir (gpuserve.engine_cache); the unpack
# removes it, and the pack's output beside it (``<this>.<deployment>.out``) is removed once fetched
CACHE_SEED_UPLOAD = "/var/tmp/gpuserve-cache-seed.tar.gz"


def cache_dir(nvme_path: str, deployment: str) -> str:
    return posixpath.join(gpuserve_root(nvme_path), "cache", deployment)


def env_dir(engine_id: str) -> str:
    return posixpath.join(ENVS_DIR, engine_id)


def deployment_dir(deployment: str) -> str:
    return posixpath.join(ETC_DIR, deployment)


def releases_dir(deployment: str) -> str:
    return posixpath.join(deployment_dir(deployment), "releases")


def release_dir(deployment: str, release_id: str) -> str:
    return posixpath.join(releases_dir(deployment), release_id)


def current_link(deployment: str) -> str:
    return posixpath.join(deployment_dir(deployment), "current")


def previous_link(deployment: str) -> str:
    return posixpath.join(deployment_dir(deployment), "previous")


def unit_name(deployment: str) -> str:
    return f"gpuserve-{deployment}.service"


# --- host-wide paths (issue 28: layout.py is the one source of host paths) ------------------------
# Other programs' directories that gpuserve writes into.
SYSTEMD_DIR = "/etc/systemd/system"
NGINX_ETC_DIR = "/etc/nginx"
NGINX_CONF_D = f"{NGINX_ETC_DIR}/conf.d"
DRAIN_FLAG_DIR = f"{NGINX_ETC_DIR}/gpuserve"   # <deployment>.drain: nginx's workers must see it (rollout)
NGINX_DEFAULT_SITE = f"{NGINX_ETC_DIR}/sites-enabled/default"   # Debian's; gpuserve removes the link
NGINX_DROPIN_PATH = f"{SYSTEMD_DIR}/nginx.service.d/gpuserve.conf"   # its text: proxy_conf.NGINX_DROPIN
NGINX_GPUSERVE_DIR = f"{NGINX_ETC_DIR}/gpuserve"   # the proxy's keys, drain flags, certificate, njs
NGINX_COMMON_CONF = f"{NGINX_CONF_D}/000-gpuserve-common.conf"   # sorts before every site
NGINX_OLD_COMMON_CONF = f"{NGINX_CONF_D}/gpuserve-common.conf"   # its old place (removed)
GATEWAY_NGINX_CONF = f"{NGINX_CONF_D}/gpuserve-gateway.conf"     # the gateway's front
PROMETHEUS_DIR = "/etc/prometheus"
NODE_EXPORTER_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"   # Debian's node-exporter textfile dir
NFT_BIN = "/usr/sbin/nft"
LOCK_DIR = "/run/lock"   # the engine builds' per-id locks
APT_KEYRINGS_DIR = "/etc/apt/keyrings"
APT_PREFERENCES_DIR = "/etc/apt/preferences.d"
APT_SOURCES_DIR = "/etc/apt/sources.list.d"
MODPROBE_DIR = "/etc/modprobe.d"
CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"   # where NVIDIA's cuda-keyring package puts it
# Debian's /etc/default files of the monitoring packages (gpuserve's when their first line is its marker)
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
ALERTMANAGER_DEFAULTS = "/etc/default/prometheus-alertmanager"

# gpuserve's own host-wide state
TOOLS_DIR = f"{OPT_DIR}/bin"                   # gpuserve's commands on a host
CREDENTIALS_BIN = f"{TOOLS_DIR}/gpuserve-credentials"   # decrypts systemd credentials into /run
RUN_DIR = "/run/gpuserve"                      # tmpfs: nothing here outlives a reboot
SECRETS_RUN_DIR = f"{RUN_DIR}/secrets"         # root 0711: the decrypted credentials (operations/secrets.py)
SECRETS_RUN_STAGING = f"{RUN_DIR}/.staging"    # root 0700: a credential's upload, before it is encrypted
SECRETS_STAGING_DIR = f"{ETC_DIR}/.staging"   # root 0700, same filesystem as /etc/gpuserve and /etc/nginx
DOWNLOADS_DIR = "/var/cache/gpuserve"          # GPU-stack downloads
ENGINE_LOG_DIR = "/var/log/gpuserve"           # engine build logs (gpuserve.engine.LOG_DIR)
ENGINE_BUILD_UNIT_PREFIX = "gpuserve-engine-build-"   # + <engine id>.service: a venv built in the background


def engine_build_unit(engine_id: str) -> str:
    """The transient unit that builds one engine venv in the background (``systemd-run``)."""
    return f"{ENGINE_BUILD_UNIT_PREFIX}{engine_id}.service"


def engine_build_script(engine_id: str) -> str:
    """The build script that unit runs (root 0700, removed once the venv is built)."""
    return posixpath.join(ENGINE_LOG_DIR, f"build-{engine_id}.sh")


ROLLOUT_LOCK_DIR = "/var/lib/gpuserve-rollout"   # the rollout lock (gpuserve.rollout.LOCK_FILE)
ROLLOUT_LOCK_FILE = f"{ROLLOUT_LOCK_DIR}/lock"   # root-only; not the service user's home
STACK_STATE_DIR = "/var/lib/gpuserve-stack"    # root-only, beside nothing the service user reads
STACK_RECORD = f"{STACK_STATE_DIR}/record.json"   # the stack a host serves, and the one before
STACK_MOVING = f"{STACK_STATE_DIR}/moving"        # a stack move began here and has not finished
PATCH_MOVING = f"{STACK_STATE_DIR}/patching"      # an OS-update move began here and has not finished
EXPORTERS_DIR = f"{NGINX_ETC_DIR}/gpuserve-exporters"   # the exporters' TLS front's key pair (layers/monitoring.py)
EXPORTERS_CONF = f"{NGINX_CONF_D}/gpuserve--exporters.conf"   # its site; no deployment has this name
# the token meter (gpuserve.meter): the proxy's usage log, which Debian's logrotate rotates with
# nginx's other logs, and the mtail program that reads it (world-readable: mtail runs as mtail)
USAGE_LOG = "/var/log/nginx/gpuserve-usage.log"
METER_PROGRAM_DIR = "/etc/gpuserve-meter"
# the nftables guards (gpuserve.engine_guard): each ruleset file its unit loads with nft -f
ENGINE_GUARD_RULES = f"{ETC_DIR}/engine-guard.nft"
MONITOR_GUARD_RULES = "/etc/gpuserve-monitor-guard.nft"     # on the monitor: Prometheus, alertmanager
GATEWAY_GUARD_RULES = "/etc/gpuserve-gateway-guard.nft"     # on a gateway host: smg
GATEWAY_STATE_DIRS = ("/var/lib/gpuserve-gateway",   # smg's StateDirectory (DynamicUser: a link to private/)
                      "/var/lib/private/gpuserve-gateway")


def systemd_unit_path(unit: str) -> str:
    """``/etc/systemd/system/<unit>``: where gpuserve writes a unit file."""
    return posixpath.join(SYSTEMD_DIR, unit)


def systemd_dropin_path(service: str, name: str) -> str:
    """``/etc/systemd/system/<service>.service.d/<name>``: a drop-in gpuserve adds to a service."""
    return posixpath.join(SYSTEMD_DIR, f"{service}.service.d", name)


GUARD_DROPIN = "gpuserve-guard.conf"   # a service's drop-in that requires its guard (engine_guard.requires_dropin)
NGINX_CREDENTIALS_DROPIN = systemd_dropin_path("nginx", "gpuserve-credentials.conf")   # decrypts nginx's keys
PROMETHEUS_CREDENTIALS_DROPIN = systemd_dropin_path("prometheus", "gpuserve-credentials.conf")   # scrape keys
ALERTMANAGER_CREDENTIALS_DROPIN = systemd_dropin_path("prometheus-alertmanager", "gpuserve-credentials.conf")


def unit_path(deployment: str) -> str:
    """The deployment's systemd unit file."""
    return systemd_unit_path(unit_name(deployment))


WATCHDOG_UNIT_PATH = systemd_unit_path("gpuserve-watchdog@.service")   # the watchdog's template unit


def proxy_site(deployment: str) -> str:
    """The proxy's nginx site of one deployment."""
    return posixpath.join(NGINX_CONF_D, f"gpuserve-{deployment}.conf")
