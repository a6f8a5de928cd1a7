"""Run by an SGLang venv's python: SGLang's own ServerArgs from a rendered serve.yaml, then its
resolution (``resolve_once``: the model overrides, MegaMoE budget, speculative settings) and
``check_server_args``, on a declared GPU, as deep as no GPU allows.

    python probe_sglang.py <checkpoint dir> <serve.yaml> <gpu: H200|GB200> <gpu count> <out.json>

The platform (simulated driver): torch's CUDA calls that ask the driver (is_available, device
count, capability, name, properties) answer for the declared GPU, and a ``nvidia-smi`` stand-in
first on PATH prints its memory; every decision from there on is SGLang's own code (its
``get_platform()`` probes read the same torch calls). What the unit runs is ``sglang serve
--model-type llm --model-path <dir> --config <yaml>``: sglang/cli/serve.py's ``_run_llm`` is
``prepare_server_args(argv)`` then ``launch_server.run_server``, whose first step is
``resolve_once()``; the probe runs the same two calls. Prints ``STEP <name>: OK`` or
``STEP <name>: FAIL <error>``, and writes the same as JSON.
"""

from __future__ import annotations

import os
import sys
import tempfile

ckpt, serve_yaml, gpu, count, out_path = sys.argv[1:6]
CAPABILITY = {"H200": (9, 0), "H100": (9, 0), "GB200": (10, 0), "B200": (10, 0)}[gpu]
MEMORY_MIB = {"H200": 143771, "H100": 81559, "GB200": 189471, "B200": 183359}[gpu]
GPUS = int(count)
from probe_steps import dump, objects, step  # noqa: E402 (beside this file)


def platform():
    import torch

    class Props:
        name = f"NVIDIA {gpu}"
        major, minor = CAPABILITY
        total_memory = MEMORY_MIB << 20
        multi_processor_count = 132 if CAPABILITY[0] == 9 else 148

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: GPUS
    torch.cuda.get_device_capability = lambda device=None: CAPABILITY
    torch.cuda.get_device_name = lambda device=None: Props.name
    torch.cuda.get_device_properties = lambda device=None: Props()
    torch.cuda.current_device = lambda: 0
    smi = tempfile.mkdtemp(prefix="probe-smi-")
    with open(os.path.join(smi, "nvidia-smi"), "w") as f:
        f.write("#!/bin/sh\n" + "".join(f"echo {MEMORY_MIB}\n" for _ in range(GPUS)))
    os.chmod(os.path.join(smi, "nvidia-smi"), 0o755)
    os.environ["PATH"] = smi + os.pathsep + os.environ.get("PATH", "")
    from sglang.srt.runtime_context import get_platform

    p = get_platform()
    return (f"is_cuda={p.is_cuda} is_sm90={p.is_sm90} is_sm100={p.is_sm100} "
            f"is_blackwell={p.is_blackwell} device_capability={p.device_capability}")


def server_args():
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", ckpt, "--config", serve_yaml])


PARSE = "ServerArgs (prepare_server_args: parser, --config)"
if step(f"platform: torch's driver calls answer for {GPUS} x {gpu}", platform):
    print("  ", objects[f"platform: torch's driver calls answer for {GPUS} x {gpu}"], flush=True)
    if step(PARSE, server_args):
        sa = objects[PARSE]
        if step("ServerArgs.resolve_once (model overrides, MegaMoE, speculative)", sa.resolve_once):
            from sglang.srt.arg_groups.overrides import resolving_view

            cfg = resolving_view(sa)
            print("  resolved: quantization", cfg.quantization, "page_size", cfg.page_size,
                  "tp", cfg.tp_size, "kv", cfg.kv_cache_dtype, "spec", cfg.speculative_algorithm,
                  "moe_runner", cfg.moe_runner_backend, "moe_a2a", cfg.moe_a2a_backend,
                  "attention", cfg.attention_backend, "chunked_prefill", cfg.chunked_prefill_size,
                  flush=True)
            step("ServerArgs.check_server_args", sa.check_server_args)
dump(out_path)
