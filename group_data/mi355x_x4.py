"""AMD Instinct MI355X (or MI350X), 4 GPUs: the mi355x_x4 recipe (TP4, derived; see docs/recipes.md).

Declared hardware: plan-time validation works from it; the GPU-stack layer checks it against
``amd-smi`` on the host.
The reference machine of gpuserve.hardware.PROFILES["mi355x_x4"] (a unit test keeps the two equal).
"""

gpu_model = "MI355X"
gpu_count = 4
nvswitch = False  # AMD GPUs talk over Infinity Fabric (XGMI); there is no NVSwitch

# ROCm wheels: PyPI's vllm is the CUDA build, so the plan refuses this group until engine_index
# names an index that serves vLLM's ROCm wheels (and their ROCm torch): vLLM's ROCm wheel index
# or a mirror of it reachable from the hosts; air-gapped fleets build the wheelhouse from it
# (gpuserve wheelhouse build --torch-index <that index>). See docs/recipes.md, "AMD".
torch_backend = "rocm7.2"
engine_index = None
