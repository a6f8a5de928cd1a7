"""AMD Instinct MI355X (or MI350X), 4 GPUs: the mi355x_x4 recipe (TP4, derived; see docs/recipes.md).

Declared hardware: plan-time validation works from it; the GPU-stack layer checks it against
``amd-smi`` on the host.
"""

gpu_model = "MI355X"
gpu_count = 4
nvswitch = False  # AMD GPUs talk over Infinity Fabric (XGMI); there is no NVSwitch

# ROCm wheels: the CUDA default in all.py does not fit AMD hosts.
torch_backend = "rocm7.2"
