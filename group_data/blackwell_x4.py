"""NVIDIA GB200 (or B200), 4 GPUs on NVLink: the blackwell_x4 recipe (TP4, NVFP4 KV cache, DSpark).

Declared hardware: plan-time validation works from it; the GPU-stack layer checks it against
``nvidia-smi`` on the host. Use gpu_model = "B200" for a B200 board.
The reference machine of gpuserve.hardware.PROFILES["blackwell_x4"] (a unit test keeps the two equal).
"""

gpu_model = "GB200"
gpu_count = 4
nvswitch = True
