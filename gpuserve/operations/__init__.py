"""gpuserve's own pyinfra operations (``@operation``), one module per kind of thing they change,
as pyinfra keeps its own in ``pyinfra.operations``.

The deploy layers (gpuserve.layers) call them; they read facts (gpuserve.facts) and the pure
modules, never a layer (pyproject.toml's import-linter contracts hold that).
"""
