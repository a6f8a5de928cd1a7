"""The layers of a converge, in order: base, gpu stack, engine, weights, service; and the rollout.

Each layer is a pyinfra ``@deploy`` function: it only adds operations (so ``--dry`` shows every
change and a second run is a no-op) and reads facts, never changes a host directly.

The custom pyinfra operations the layers call are in gpuserve.operations. Not everything here is a
layer (gpuserve/__init__.py lists each module): the rollout's modules (rollout, stack_move, patch,
rotation) and the rollout/ package do change hosts directly: the rollout is one operation, run
once, that moves other hosts through commands each bounded in time (gpuserve.rollout.remote;
docs/rollout.md).
"""
