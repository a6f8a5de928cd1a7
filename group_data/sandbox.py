"""The local test hosts (inventories/sandbox.py): same layers as production, tiny model on CPU."""

from gpuserve.sandbox import standin_repo

nvme_path = "/srv/nvme"   # a plain directory on sandbox hosts

# GPU stack: the stand-in NVIDIA/AMD repositories `gpuserve sandbox up` serves on the bridge of
# instance $GPUSERVE_SANDBOX_INSTANCE (real repositories are out of reach from sandbox hosts)
cuda_repo_url = standin_repo.cuda_repo_url()
rocm_repo_url = standin_repo.rocm_repo_url()
# sandbox hosts are disposable and reboot in seconds: a driver install may reboot them
reboot = "allowed"
reboot_delay = 2
reboot_timeout = 120
