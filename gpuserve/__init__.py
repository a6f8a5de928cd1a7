"""gpuserve: pyinfra deploys that turn bare-metal GPU hosts into LLM inference servers.

The package holds the logic; ``deploys/`` holds the thin pyinfra entry points.

Every module of the package, one concern each (tests/unit/test_package_docstring.py keeps this
list whole; docs/rollout.md maps the move pipeline across them):

Settings and plans (pure: no host access; the schema, the recipes and validation are the packages
schema/, recipes/ and config/, below)
    host_plan       one immutable plan per host: what validation decided for it
    values          checks of single values several settings share (URLs, host names, paths)
    errors          the one error a bad inventory raises: every problem on every host
    config_repo     where a config repo's files are found (docs/config-repo.md)
    hardware        the GPU catalogue and a host's hardware profile
    engine_pins     which engine package and version a host installs, and what that pin serves
    engine_flags    the serve flags and torch pins of every engine pin gpuserve knows
    engine_overlay  a config repo's own engine releases (engines/*.json): the file format, checked
    engine_parser   an engine's serve parser described (standard library; runs in the engine's venv)
    packages        facts about engine packages by name
    layout          where things live on a served host (paths, unit names, the service user)
What goes onto hosts, rendered on the control node (pure; the engine's venv and the GPU stack are the
packages engine/ and stack/, below)
    templating      the Jinja2 templates (the top-level templates/): a unit, drop-in or site by name
    venv_files      which distribution owns which file of a venv (the engine build fails on a clash)
    release_files   a deployment's release as files (serve.yaml, launch, the readiness gate's command)
    releases        releases: the immutable pinned tuple a host serves, and their bookkeeping
    admission       the admission checks per GPU (ECC, retired pages, PCIe, NVLink, XIDs)
    engine_guard    the nftables table that lets only the proxy open the engine ports
    proxy_conf      the nginx configuration of the TLS front
    tenants         a deployment's tenants: groups of client keys with per-key limits of their own
    meter           tokens per key: the mtail program and unit that count the proxy's usage log
    certs           the command that makes a self-signed certificate on a host
    gateway         the fleet gateway (smg): worker file, unit, nginx front
    monitoring      what monitor hosts run: Prometheus scrape configs, rules, alertmanager
    receivers       alertmanager's receivers from ``alert_receivers`` (webhook, email, Slack, PagerDuty)
    grafana         the Grafana dashboards
    weights         checkpoint revisions staged on a host: lock, prepare, commit, HTTP fetch, its command
    weights_manifest  checkpoint revisions on disk: manifests, hashing, audits, hardlink or fetch, space
    engine_cache    engine compile caches shared across hosts: seed names and commands
    removal         what the plan no longer keeps on a host, from its footprint
Moves (pure: which host moves when; the moves themselves are in rollout/, below)
    patch           OS and kernel updates as a reason to move a host
    canary          the canary bake's Prometheus queries and their verdicts
The control node
    checkpoints     resolve, download once, verify a model revision (the weights layer's side)
    fanout          host-to-host weights fan-out: who sends which shard to whom (pure; opt-in)
    fanout_agent    the fan-out's host agent and its fleet key's forced command (standard library)
    fanout_push     the control node's part of the fan-out: each stripe once, to its root
    wheelhouse      an engine's wheels gathered once for offline installs
    engine_add      ``gpuserve engine add``: a release's flags and pins from PyPI and its parser
    api_keys        secret environment values, read at deploy time
    secret_sources  where a secret comes from: a file, or a command whose output stays in memory
    locks           a lock file on the control node (fcntl)
The ``gpuserve`` command
    cli             the command and its subcommands (plan, status, wheelhouse, resolve, top,
                    engine); the sandbox (sandbox/, a distribution of its own) adds ``gpuserve sandbox``
    plan            ``gpuserve plan``: what each host would serve, without touching a host
    status          ``gpuserve status``: what runs on each host and whether it answers
    top             ``gpuserve top``: the fleet live, from Prometheus
    monitoring_export  ``gpuserve monitoring-export``: file_sd targets and rules for a Prometheus of your own
config/: validation, group data -> frozen settings per host (__init__: check_host, validate_inventory)
    sources         where a value comes from (data_source), the defaults, the checker of one host's data
    settings        HostSettings and DeploymentSettings: what validation hands every layer
    connection      the host's inventory name and ssh_hostname, and the SSH login's keys
    machine         hardware and role groups, the GPUs, the recipe they select, the GPU stack's keys
    model           the pinned model revision and the weights layer's keys
    engine_keys     the engine package, version and torch backend, and how its venv is built
    host_level      storage, reboots, the rollout's budget and lock, the TLS proxy, removal, patching
    secret_values   no secret inline and no misspelt key; secrets from a file or a command
    deployments     each deployment's keys, flags, env, key files and tenants; the host's ports
    monitor         monitoring, alerting, the hang watchdog and the canary bake
    gateway_keys    a gateway host's keys (smg, its ports, the clients' keys)
    principles      the rules every value is held to; gpuserve's own units and ports on a host
    fleet           checks across hosts: the gateway's workers, one machine under two names
schema/: every setting's type, default, what is allowed and its doc line (__init__: key, default,
        allowed, choices, defaults: the lookups every other module makes)
    types           a key's row and what it allows: a choice, an int range, a number range
    keys            the table of every key, in docs/configuration.md's order, and its sections
    doc             docs/configuration.md's key tables, regenerated between their markers
    __main__        ``python -m gpuserve.schema docs/configuration.md``
engine/: the engine's venv: its id, the uv commands that build it, how the unit starts it
    spec            the engine spec (its id, paths, per-package defaults), spec_for, the unit's argv
    uv              uv's binary from its wheel, its environment, the venv and install commands
    bytecode        the venv's .pyc files compiled in fixed chunks: the same bytes every build
    verify          what the new venv runs: no file owned twice, the pin imports, native modules load
    build           the whole build of one venv as one shell script: locked, verified, renamed
stack/: the GPU stack as data: packages, versions, repositories, the checks of a host
    settings        the stack's group-data keys validated (StackSettings), admission's thresholds
    packages        the host's OS, and apt package sets: what is wanted, replaced, held and why not
    nvidia          NVIDIA's CUDA repository, driver pin, package set and units
    amd             ROCm's repository, key, origin pin and package set
    checks          reboot and verification: a reboot owed, free space, GPUs, driver and units
    target          the stack as a rollout target: its pins, why a host is not there, the record
recipes/: hardware recipes: settings + a deployment -> the exact serve configuration (__init__: render)
    types           a recipe and its engine tables, and the model families whose flags it must carry
    table           the recipe table, flag for flag from its source; the recipe hardware selects
    flags           ServeConfig, and the flag rules: what each key renders to, forbidden, secret
    render          one deployment rendered: its flags, their checks, its environment and GPU set
    checks          a host's recipe-level problems: hardware, model, engine, backend, the pin
rollout/: the one host-move pipeline (docs/rollout.md): out, drained, stop, change, reboot, verify,
start, gate, bake, in
    plan            the moves a rollout plans, their batches, budget and refusals (pure)
    commands        the commands of a move on a host: drain flag, pointers, stop, start (pure)
    lock            the fleet-wide rollout lock's commands and rules (pure)
    locking         the rollout lock on the hosts: taken, refreshed, broken when stale, released
    pipeline        the steps every host move shares: start, gate and in; the reboot
    gate            the readiness gate of a move
    canary_bake     the canary bake after an upgrade's canary batches
    remote          commands a rollout runs on other hosts, each bounded in time
layers/: pyinfra ``@deploy`` layers and the rollout's steps
    base            the service user and the directory layout
    gpu_stack       the vendor driver stack, pinned and held, loaded and verified
    engine          uv and one immutable venv per engine pin: its build started, then waited for
    packages        the service and proxy layers' packages, installed while the venv builds
    engine_guard    the engine guard's nftables table on every serving host
    weights         the pinned checkpoint revision on every host's NVMe
    fanout          the fan-out's two halves: start at the top of a converge, wait at the weights step
    units           the service layer: releases, secrets, systemd units, start and gate, retention
    proxy           nginx with TLS and API keys in front of every deployment
    watchdog        the hang watchdog's unit per deployment
    gateway         smg behind nginx on a gateway host
    monitoring      node-exporter everywhere; Prometheus and alertmanager on monitor hosts
    removal         removal of deployments no longer planned, and decommission
    context         the validated settings and plan of the host a deploy runs for
    rollout         the rollout operation: lock, budget, batches, release moves
    stack_move      the GPU-stack and OS-update moves of a rollout
    patch           the host's OS-update move, and the gateway and monitor checks during it
    rotation        out, drained and back in: the first and last steps of every move
    cache_seed      a move's engine-cache seed: unpacked before the start, published after the gate
operations/: gpuserve's own pyinfra ``@operation`` functions, one module per kind of thing changed
    gpu_stack       the GPU stack's package sets, driver reboot, verification and admission, decided
                    at execute time (also the host checks a rollout's stack move reads)
    secrets         secret files and systemd credentials, written without showing them
    venv            uv, the pushed wheels and the venvs uv builds (the engine's, smg's); the
                    engine's build in a background unit, and the wait for it
    weights         a checkpoint revision staged, verified and published on a host; rsync over SSH
    fanout          the weights fan-out: start a host's fetch, the control node's pusher, the wait
facts/: pyinfra facts, each beside its pure parser
    admission       everything the admission checks read, in one round trip
    amd             amd-smi's GPUs, ROCm and the loaded amdgpu module
    apt             apt holds and what the repositories offer
    checkpoints     what a host holds of a model repository
    credentials     a systemd credential's state (its hash, its link), never its content
    deployment      a deployment's releases, pointers, unit state and health
    gpus            the one parser of nvidia-smi's and amd-smi's GPU lists
    kernel          kernels, DKMS builds and pending updates (gpuserve.patch)
    nvidia          nvidia-smi's GPUs, the loaded and installed driver, NVSwitches, CUDA
    removal         what gpuserve has on a host (gpuserve.removal reads it)
    ssh             the host's SSH host key, which the fan-out's peers pin
    status          what `gpuserve status` asks: /health, units' states, a watchdog's counters
"""

__version__ = "0.2.0"
