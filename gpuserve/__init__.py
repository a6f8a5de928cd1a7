"""gpuserve: pyinfra deploys that turn bare-metal GPU hosts into LLM inference servers.

The package holds the logic; ``deploys/`` holds the thin pyinfra entry points.

Modules, one concern each (README.md, "Repository layout", lists them all):
    schema      every setting's type, default, what is allowed and its doc line
    config      validation: one settings object per host, with its rendered serve configs
    layout      where things live on a served host (paths, unit names, the service user)
    layers/     the converge layers as pyinfra ``@deploy`` functions (base, gpu stack, engine,
                weights, units, proxy, ...); host changes only go through pyinfra operations
    facts/      pyinfra facts (GPUs, NVSwitch, NVMe, ...) and their pure parsers
    cli         the ``gpuserve`` command (plan, status, wheelhouse, resolve, top); the sandbox,
                a distribution of its own (sandbox/), adds ``gpuserve sandbox``
"""

__version__ = "0.2.0"
