"""The ``deployments`` mapping: each entry's keys over the top-level ones (``--data`` over both),
its serve flags, environment, key files and tenants, and the port each listener of the host needs
for itself."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from gpuserve import proxy_conf, recipes, schema, secret_sources, tenants
from gpuserve.config.secret_values import INLINE, SECRET_ENV_NAME, SECRET_KEYS, _scan_values, _secret_command
from gpuserve.config.settings import DeploymentSettings
from gpuserve.config.sources import DEPLOYMENT_DEFAULTS, _Checker
from gpuserve.secret_sources import SecretCommand
from gpuserve.values import (addresses_overlap, is_host, is_loopback, key_command_problem, key_file_problem,
                             key_lines_problem)

DEPLOYMENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# serve flags that set a parallel size: a positive whole number (vLLM and SGLang spellings)
PARALLEL_FLAG = re.compile(r"(.+-parallel-size(-local)?|tp-size|pp-size|dp-size|ep-size)")


def _deployment(c: _Checker, name: str, entry: Mapping[str, Any], src: str,
                model_repo: str | None) -> DeploymentSettings | None:
    """One entry of ``deployments`` over the top-level keys; None once it has a problem."""
    before = len(c.problems)
    path = f"deployments.{name}"
    values, origins = _entry_values(c, path, entry, src)

    def bad(key: str, message: str) -> None:
        c.problem(origins[key][0], message, origins[key][1])

    served = _served_model_name(values["served_model_name"], model_repo, bad)
    host_ = values["serve_host"]
    _serve_host(c, path, host_, bad)
    _int_key(c, values, origins, "serve_port")
    effort = values["reasoning_effort"]
    if effort is not None and effort not in recipes.REASONING_EFFORTS:
        bad("reasoning_effort", f"{effort!r} is not allowed; use one of "
            f"{', '.join(recipes.REASONING_EFFORTS)} (thinking cannot be turned off)")
    for key in ("max_model_len", "shutdown_timeout_s", "ready_timeout_s", "proxy_port", "max_num_seqs"):
        _int_key(c, values, origins, key)
    flags = _serve_flags(c, values["serve_flags"], origins["serve_flags"], bad)
    env = _serve_env(c, values["serve_env"], origins["serve_env"], bad)
    _key_files(c, path, values, bad)
    keys_file, op_file = values["api_keys_file"], values["operator_keys_file"]
    found_tenants = _tenants(c, values["tenants"], origins["tenants"])
    for key in DEPLOYMENT_DEFAULTS:
        # the entry's own values, and the two mappings it may inherit (the other inherited
        # values were scanned where they were set)
        if key in entry or key in ("serve_flags", "serve_env"):
            _scan_values(c, values[key], origins[key][0], origins[key][1])
    if len(c.problems) > before:
        return None
    return DeploymentSettings(
        name=name, served_model_name=served, serve_host=host_, serve_port=values["serve_port"],
        reasoning_effort=effort, max_model_len=values["max_model_len"],
        max_num_seqs=values["max_num_seqs"], serve_flags=MappingProxyType(dict(flags)),
        serve_env=MappingProxyType({k: str(v) for k, v in env.items()}),
        api_keys_file=keys_file, shutdown_timeout_s=values["shutdown_timeout_s"],
        ready_timeout_s=values["ready_timeout_s"], proxy_port=values["proxy_port"],
        origins=MappingProxyType(origins), operator_keys_file=op_file,
        scrape_keys_file=values["scrape_keys_file"], tenants=found_tenants,
    )


def _entry_values(c: _Checker, path: str, entry: Mapping[str, Any],
                  src: str) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """A deployment's value of each deployment key, and where it came from (key path, source):
    the entry's own, else the top-level value or the default. The entry's secret and unknown
    keys are problems."""
    values: dict[str, Any] = {}
    origins: dict[str, tuple[str, str]] = {}
    overrides = c.host.inventory.get_override_data()
    for key in DEPLOYMENT_DEFAULTS:
        if key in entry and key not in overrides:  # --data beats everything, entries included
            values[key], origins[key] = entry[key], (f"{path}.{key}", src)
        else:
            values[key] = c.get(key)
            origins[key] = (key, c.sources[key])
    for key in entry:
        if key in SECRET_KEYS:
            c.problem(f"{path}.{key}", INLINE, src)
        elif key not in DEPLOYMENT_DEFAULTS:
            close = difflib.get_close_matches(key, DEPLOYMENT_DEFAULTS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            c.problem(f"{path}.{key}", f"unknown deployment key {key!r}{hint} (allowed: "
                      f"{', '.join(DEPLOYMENT_DEFAULTS)})", src)
    return values, origins


def _served_model_name(served: Any, model_repo: str | None, bad: Callable[[str, str], None]) -> Any:
    """The name clients ask for: as set, else the repository's last part in lower case."""
    if served is None and model_repo:
        served = model_repo.rsplit("/", 1)[-1].lower()
    if served is None and not model_repo:
        pass  # the bad model_repo is reported already
    elif not (isinstance(served, str) and served and not re.search(r"\s", served)):
        bad("served_model_name", f"{served!r} is not allowed; use a name without spaces")
    return served


def _serve_host(c: _Checker, path: str, host_: Any, bad: Callable[[str, str], None]) -> None:
    if not (isinstance(host_, str) and is_host(host_)):
        bad("serve_host", f"{host_!r} is not an IP address or host name")
    elif host_ in ("0.0.0.0", "::"):
        c.warnings.append(f"{path}: serve_host {host_} listens on every interface; vLLM's API key "
                          "covers only /v1 (/invocations, /tokenize, /metrics, /scale_elastic_ep "
                          "answer without it): the engine guard (nftables) resets connections from "
                          "the network unless trusted_network = True, and from local users other "
                          "than root, gpuserve and the proxy's (docs/configuration.md)")


def _serve_flags(c: _Checker, flags: Any, origin: tuple[str, str],
                 bad: Callable[[str, str], None]) -> Mapping[str, Any]:
    """The flags, or {} when they are no mapping; each flag's value checked (``origin``: where
    serve_flags came from)."""
    if not isinstance(flags, Mapping) or not all(isinstance(k, str) for k in flags):
        bad("serve_flags", f"{flags!r} is not a mapping of flag name -> value")
        flags = {}
    for flag, value in flags.items():
        if not _flag_value_ok(value):
            c.problem(f"{origin[0]}.{flag}", f"{value!r} is not a flag value: use "
                      "a string, number, True, a list or a mapping (JSON flags), or None to "
                      "remove the flag", origin[1])
        elif (value is not None and PARALLEL_FLAG.fullmatch(recipes.normalize_flag(flag))
              and (isinstance(value, bool) or not isinstance(value, int) or value < 1)):
            c.problem(f"{origin[0]}.{flag}", f"{value!r} is not allowed; a parallel "
                      "size is a whole number >= 1 (without quotes), or None to remove the flag",
                      origin[1])
    return flags


def _serve_env(c: _Checker, env: Any, origin: tuple[str, str],
               bad: Callable[[str, str], None]) -> Mapping[str, Any]:
    """The environment, or {} when it is no mapping; each name and value checked as one line of
    systemd's EnvironmentFile= (``origin``: where serve_env came from)."""
    if not isinstance(env, Mapping):
        bad("serve_env", f"{env!r} is not a mapping of NAME -> value")
        env = {}
    for env_name, env_value in env.items():
        where = (f"{origin[0]}.{env_name}", origin[1])
        if not (isinstance(env_name, str) and ENV_NAME.fullmatch(env_name)):
            c.problem(where[0], f"{env_name!r} is not an environment variable name", where[1])
        elif SECRET_ENV_NAME.search(env_name):
            c.problem(where[0], INLINE + f" ({env_name} looks like a secret; the service layer "
                      "writes secrets to the 0600 env file from api_keys_file)", where[1])
        elif not isinstance(env_value, (str, int, float)) or isinstance(env_value, bool):
            c.problem(where[0], f"{env_value!r} is not allowed; use a string or number", where[1])
        elif isinstance(env_value, str) and ("\n" in env_value or "\r" in env_value):
            c.problem(where[0], f"{env_value!r} spans lines; a value in the service's env file "
                      "must be one line", where[1])
        elif isinstance(env_value, str) and re.search(r'[$`"\\]', env_value):
            c.problem(where[0], f"{env_value!r} is not allowed: systemd's EnvironmentFile= does not "
                      "expand $VARIABLES or backquotes, and quotes or backslashes change how it "
                      "reads the line; write the literal value", where[1])
    return env


def _key_files(c: _Checker, path: str, values: dict[str, Any], bad: Callable[[str, str], None]) -> None:
    """The deployment's key files, or their command twins (which replace the file in ``values``)."""
    for key in ("api_keys_file", "operator_keys_file", "scrape_keys_file"):
        file, twin = values[key], secret_sources.SECRET_SETTINGS[key]
        if values[twin] is not None:   # the secret from a command (issue 29)
            values[key] = _secret_command(c, key, file, values[twin], bad, keys=True)
            continue
        if file is not None and not (isinstance(file, str) and file):
            bad(key, f"{file!r} is not a path to a file on the control node")
        elif file is not None and not Path(file).is_file():
            if c.deploying:
                bad(key, f"{file} does not exist on this control node; create it (one key per "
                    "line, mode 0600) before deploying")
            else:
                c.warnings.append(f"{path}: {key} {file} does not exist on this control node yet; "
                                  "a deploy refuses to start without it")
        elif file is not None:
            why = key_file_problem(Path(file)) or key_lines_problem(Path(file))
            if why:
                bad(key, why)


def _tenants(c: _Checker, given: Any, origin: tuple[str, str]) -> tuple:
    """The deployment's tenants (gpuserve.tenants), their limits within the host's proxy limits."""
    host_limits = {k: (c.get(f"proxy_{k}") if isinstance(c.get(f"proxy_{k}"), int)
                       else schema.default(f"proxy_{k}")) for k in tenants.LIMITS}
    found_tenants, why = tenants.check(given, host_limits, origin[0])
    for where, message in why:
        c.problem(where, message, origin[1])
    for t in found_tenants:   # their keys: checked as api_keys_file's (a deploy runs a command)
        where = f"{origin[0]}.{t.name}"
        if isinstance(t.keys, SecretCommand):
            why_keys = key_command_problem(t.keys) if c.deploying else None
        elif not Path(t.keys).is_file():
            why_keys = f"{t.keys} does not exist on this control node" if c.deploying else None
        else:
            why_keys = key_file_problem(Path(t.keys))
        if why_keys:
            c.problem(f"{where}.keys", why_keys, origin[1])
    return found_tenants


def _int_key(c: _Checker, values: dict, origins: dict, key: str) -> None:
    """A deployment's integer key within its schema bounds (gpuserve.schema)."""
    path, src = origins[key]
    spec = schema.allowed(key)
    c.integer(key, spec.lo, value=values[key], src=src, path=path, maximum=spec.hi,
              optional=spec.optional)


def _flag_value_ok(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
    if isinstance(value, Mapping):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return False
        return True
    return False


def _deployments(c: _Checker, model_repo: str | None,
                 proxy_bind: str | None) -> tuple[DeploymentSettings, ...] | None:
    deployments = c.get("deployments")
    src = c.sources["deployments"]
    if not isinstance(deployments, Mapping) or not deployments:
        c.problem("deployments", f"{deployments!r} is not allowed; use a mapping of deployment "
                  "name -> overrides, e.g. {'minimax': {}}")
        return None
    out = []
    ok = True
    for name, entry in deployments.items():
        if not (isinstance(name, str) and DEPLOYMENT_NAME.fullmatch(name)):
            c.problem(f"deployments.{name}", "a deployment name becomes the unit gpuserve-<name>"
                      ".service: use lowercase letters, digits, '-' and '_' (at most 40)", src)
            ok = False
            continue
        if name in proxy_conf.OWN_NAMES:
            c.problem(f"deployments.{name}", f"{name!r} is the name of a file the proxy writes for "
                      f"itself (conf.d/gpuserve-{name}.conf); choose another name", src)
            ok = False
            continue
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            c.problem(f"deployments.{name}", f"{entry!r} is not a mapping of overrides", src)
            ok = False
            continue
        same = [other.name for other in out if other.name.replace("-", "_") == name.replace("-", "_")]
        if same:
            c.problem(f"deployments.{name}", f"{name!r} and {same[0]!r} are the same name to nginx "
                      "and systemd once '-' and '_' are made equal; rename one", src)
            ok = False
            continue
        dep = _deployment(c, name, entry, src, model_repo)
        ok = ok and dep is not None
        if dep is not None:
            out.append(dep)
    if not ok:
        return None
    _port_clashes(c, out, proxy_bind)
    return tuple(out)


def _port_clashes(c: _Checker, deployments: list[DeploymentSettings], proxy_bind: str | None) -> None:
    """Every listener on the host needs its own address and port: each engine (serve_host:
    serve_port) and, when the proxy is on (``proxy_bind`` set), each deployment's TLS front
    (proxy_bind:proxy_port; nginx would quietly hand a second front on one port to the first)."""
    listeners = [(d, "serve_port", d.serve_host, d.serve_port) for d in deployments]
    if proxy_bind is not None:
        listeners += [(d, "proxy_port", proxy_bind, d.proxy_port) for d in deployments]
    for i, mine in enumerate(listeners):
        for other in listeners[:i]:
            if mine[3] != other[3] or not addresses_overlap(mine[2], other[2]):
                continue
            if mine[1] != other[1] and not mine[0].is_set(mine[1]) and other[0].is_set(other[1]):
                mine, other = other, mine  # blame the port that was set, not the default
            _port_clash(c, mine, other)
            break


def _port_clash(c: _Checker, mine: tuple, other: tuple) -> None:
    a, key, a_host, port = mine
    b, b_key, b_host, b_port = other
    path, src = a.origin(key)
    shared = not path.startswith("deployments.")  # the top-level value, or the default
    if shared and (a is not b or not a.is_set(key)):  # blame the entry that should set a port
        path, src = f"deployments.{a.name}.{key}", c.sources["deployments"]
    if key == b_key == "serve_port":
        c.problem(path, f"port {port} on {a_host} clashes with deployment {b.name!r} "
                  f"({b_host}:{b_port}); give each deployment its own serve_port", src)
    else:
        c.problem(path, f"{key} {port} on {a_host} clashes with the {b_key} of deployment "
                  f"{b.name!r} ({b_host}:{b_port}); the engines and the proxy each need their "
                  f"own port: set deployments.{a.name}.{key}, e.g. to {_free_port(c, port)}", src)


def _free_port(c: _Checker, port: int) -> int:
    """The next port above ``port`` that no deployment of the host sets (a suggestion)."""
    deployments = c.get("deployments")
    used = {port}
    for entry in (deployments.values() if isinstance(deployments, Mapping) else ()):
        for key in ("serve_port", "proxy_port"):
            if isinstance(entry, Mapping) and isinstance(entry.get(key), int):
                used.add(entry[key])
    for key in ("serve_port", "proxy_port"):
        if isinstance(c.get(key), int):
            used.add(c.get(key))
    free = port + 1
    while free in used:
        free += 1
    return free


def _in_front_of_engines(c: _Checker, deployments: Iterable[DeploymentSettings],
                         level: Mapping[str, Any]) -> None:
    """What stands in front of each engine: the proxy (proxy: True) needs the deployment's client
    keys; without it, an engine beyond loopback needs trusted_network = True."""
    if level.get("proxy") is True:
        for dep in deployments:
            if dep.api_keys_file is None:
                c.problem(f"deployments.{dep.name}.api_keys_file", "the proxy (proxy: True) lets no "
                          "client in without keys: name a file of keys on the control node",
                          dep.origin("api_keys_file")[1])
    for dep in deployments:
        if (not is_loopback(dep.serve_host) and level.get("proxy") is False
                and level.get("trusted_network") is False):
            key, src = dep.origin("serve_host")
            c.problem(key, f"{dep.serve_host} is beyond loopback and no proxy is in front: vLLM's key "
                      "covers only /v1 (/invocations, /tokenize, /metrics, /scale_elastic_ep stay "
                      "open). Allowed: a loopback address, proxy = True, or trusted_network = True "
                      "where the network in front is trusted", src)
