"""Real local test hosts ("the sandbox"); only the GPU is simulated.

A distribution of its own, ``gpuserve-sandbox`` (sandbox/pyproject.toml), installed from the
checkout beside gpuserve for the tests and benches (dev/bootstrap.sh). It adds ``gpuserve
sandbox`` through the ``gpuserve.commands`` entry point; gpuserve never imports it.
"""
