"""Run by an engine venv's python: build vLLM's own configuration objects from a rendered
serve.yaml, step by step, as deep as a machine without a GPU allows.

    python probe_vllm.py <checkpoint dir> <serve.yaml> <gpu: H200|GB200> <out.json> <gpu count>

The platform: vLLM's CUDA platform class itself, with only the calls that ask the driver
(device capability, name, memory) answered for the declared GPU: H200 = SM 9.0, GB200 = SM 10.0.
Each step prints ``STEP <name>: OK`` or ``STEP <name>: FAIL <error>``; later steps that need an
earlier one's object are skipped. The JSON holds the same.
"""

from __future__ import annotations

import sys

ckpt, serve_yaml, gpu, out_path = sys.argv[1:5]
CAPABILITY = {"H200": (9, 0), "H100": (9, 0), "GB200": (10, 0), "B200": (10, 0)}[gpu]
GPUS = int(sys.argv[5]) if len(sys.argv) > 5 else 8
MEMORY_GIB = {"H200": 141, "H100": 80, "GB200": 186, "B200": 180}[gpu]
from probe_steps import dump, objects, step  # noqa: E402 (beside this file)


def platform():
    import vllm.platforms as platforms
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    base = cuda.CudaPlatform

    class DeclaredGPU(base):  # the driver's answers for the declared GPU; the rest is vLLM's
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*CAPABILITY)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"NVIDIA {gpu}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return MEMORY_GIB << 30

        @classmethod
        def is_fully_connected(cls, physical_device_ids) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return GPUS

    platforms._current_platform = DeclaredGPU()
    return DeclaredGPU.__mro__[1].__name__


def parse():
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    import importlib

    for where in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            make = importlib.import_module(where).make_arg_parser
            break
        except ImportError:
            continue
    parser = make(FlexibleArgumentParser())
    return parser.parse_args(["--model", ckpt, "--config", serve_yaml])


def engine_args():
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(objects["parse serve.yaml (vLLM's parser)"])


step("platform: vLLM's CUDA platform, driver answers for " + gpu, platform)
if step("parse serve.yaml (vLLM's parser)", parse) and step(
        "EngineArgs (builds AttentionConfig, CompilationConfig)", engine_args):
    ea = objects["EngineArgs (builds AttentionConfig, CompilationConfig)"]
    step("AttentionConfig", lambda: repr(ea.attention_config)[:200])
    step("CompilationConfig", lambda: repr(ea.compilation_config.cudagraph_mode))
    if step("ModelConfig (create_model_config)", ea.create_model_config):
        mc = objects["ModelConfig (create_model_config)"]
        print("  architecture:", mc.architectures, "dtype:", mc.dtype, flush=True)

    def parallel():
        from vllm.config import ParallelConfig

        return ParallelConfig(tensor_parallel_size=ea.tensor_parallel_size,
                              pipeline_parallel_size=ea.pipeline_parallel_size,
                              data_parallel_size=ea.data_parallel_size,
                              distributed_executor_backend=ea.distributed_executor_backend)

    def cache():
        from vllm.config import CacheConfig

        return CacheConfig(block_size=ea.block_size, gpu_memory_utilization=ea.gpu_memory_utilization,
                           cache_dtype=ea.kv_cache_dtype)

    step("ParallelConfig", parallel)
    step("CacheConfig", cache)
    if ea.speculative_config and "ModelConfig (create_model_config)" in objects and \
            "ParallelConfig" in objects:
        import inspect

        def speculative():
            fn = ea.create_speculative_config
            params = inspect.signature(fn).parameters
            kwargs = {"target_model_config": objects["ModelConfig (create_model_config)"],
                      "target_parallel_config": objects["ParallelConfig"]}
            for extra in ("enable_chunked_prefill", "disable_log_stats"):
                if extra in params:
                    kwargs[extra] = getattr(ea, extra, None)
            kwargs = {k: v for k, v in kwargs.items() if k in params}
            return fn(**kwargs)

        step("SpeculativeConfig (create_speculative_config)", speculative)
    step("VllmConfig (create_engine_config)", ea.create_engine_config)

dump(out_path)
