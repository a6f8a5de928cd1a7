"""NVIDIA HGX H100/H200, 8 GPUs on NVSwitch: the hopper_x8 recipe (TP8, FP8 KV cache, Marlin MoE).

Declared hardware: plan-time validation works from it; the GPU-stack layer checks it against
``nvidia-smi`` on the host. Use gpu_model = "H100" for an H100 board.
The reference machine of gpuserve.hardware.PROFILES["hopper_x8"] (a unit test keeps the two equal).
"""

gpu_model = "H200"
gpu_count = 8
nvswitch = True
