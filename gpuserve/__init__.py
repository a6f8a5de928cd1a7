"""gpuserve: pyinfra deploys that turn bare-metal GPU hosts into LLM inference servers.

The package holds the logic; ``deploys/`` holds the thin pyinfra entry points.

Modules, one concern each:
    layout      where things live on a served host (paths, unit names, the service user)
    layers/     the converge layers as pyinfra ``@deploy`` functions (base, gpu stack, engine,
                weights, service); host changes only go through pyinfra operations
    facts/      pyinfra facts (GPUs, NVSwitch, NVMe, ...) and their pure parsers
    sandbox/    real local test hosts (systemd-nspawn + network namespaces); the GPU is simulated
    cli         the ``gpuserve`` command (sandbox, plan, status)
"""

__version__ = "0.1.0"
