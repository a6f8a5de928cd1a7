"""The model a host serves (a repository pinned to a commit; branch names are never served, where
it comes from) and the weights layer's keys (gpuserve.layers.weights)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from gpuserve.config.sources import _Checker
from gpuserve.values import base_url_problem, is_host, url_problem

SHA = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def _model(c: _Checker, require_revision: bool) -> dict[str, Any]:
    """The model keys; a value is None when it is invalid (the problem is recorded)."""
    repo = c.get("model_repo")
    if not isinstance(repo, str) or not REPO.fullmatch(repo):
        c.problem("model_repo", f"{repo!r} is not a repository id like 'MiniMaxAI/MiniMax-M3.1-Flash'")
        repo = None
    rev = c.get("model_revision")
    if rev is None and require_revision:
        c.problem("model_revision", "not pinned: set a 40-hex lowercase commit sha (resolve a "
                  "branch with `gpuserve resolve <repo> <branch>`); branch names are never served")
    elif rev is not None and (not isinstance(rev, str) or not SHA.fullmatch(rev)):
        c.problem("model_revision", f"{rev!r} is not a commit sha: use the full 40-hex lowercase "
                  "sha, not a branch, tag or short sha (`gpuserve resolve <repo> <branch>` prints it)")
        rev = None
    source = c.choice("model_source")
    endpoint = c.get("hf_endpoint")
    if endpoint is not None:
        why = url_problem(endpoint) or base_url_problem(endpoint)
        if why:
            c.problem("hf_endpoint", why)
            endpoint = None
    local = c.get("model_local_path")
    if source == "local" and not (isinstance(local, str) and local):
        c.problem("model_local_path", "model_source is 'local': set model_local_path to the "
                  "directory that holds the checkpoint", c.sources["model_source"])
    elif local is not None and not isinstance(local, str):
        c.problem("model_local_path", f"{local!r} is not a path")
        local = None
    return dict(model_repo=repo, model_revision=rev, model_source=source, hf_endpoint=endpoint,
                model_local_path=local)


def _weights(c: _Checker, model: Mapping[str, Any]) -> dict[str, Any]:
    """The weights layer's keys; invalid ones are recorded as problems."""
    fanout = c.choice("weights_fanout")
    if fanout == "hub" and model["model_source"] in ("local", "modelscope"):
        c.problem("weights_fanout", f"'hub' makes every host download over HTTP from a Hugging Face "
                  f"compatible hub; model_source {model['model_source']!r} "
                  f"({c.sources['model_source']}) needs 'control-node'")
    cache = c.get("weights_cache")
    if not (isinstance(cache, str) and cache.strip()):
        c.problem("weights_cache", f"{cache!r} is not a directory path on the control node")
    verify = c.choice("weights_verify")
    bwlimit = c.ranged("weights_bwlimit_kib")
    address = c.get("weights_fanout_address")
    if not (isinstance(address, str) and (address == "" or is_host(address))):
        c.problem("weights_fanout_address", f"{address!r} is not allowed; use the IP address or host "
                  "name other hosts reach this host's sshd at, or leave it empty (the ssh_hostname)")
        address = ""
    return dict(weights_fanout=fanout, weights_cache=cache, weights_verify=verify,
                weights_bwlimit_kib=bwlimit, weights_fanout_degree=c.ranged("weights_fanout_degree"),
                weights_fanout_address=address, weights_progress_s=c.ranged("weights_progress_s"))
