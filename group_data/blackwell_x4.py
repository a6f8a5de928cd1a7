"""NVIDIA GB200 (or B200), 4 GPUs on NVLink: the blackwell_x4 recipe (TP4, NVFP4 KV cache, DSpark).

Declared hardware: plan-time validation works from it; the GPU-stack layer checks it against
``nvidia-smi`` on the host. Use gpu_model = "B200" for a B200 board.
"""

gpu_model = "GB200"
gpu_count = 4
nvswitch = True
