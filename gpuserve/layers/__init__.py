"""The layers of a converge, in order: base, gpu stack, engine, weights, service.

Each layer is a pyinfra ``@deploy`` function: it only adds operations (so ``--dry`` shows every
change and a second run is a no-op) and reads facts, never changes a host directly.
"""
