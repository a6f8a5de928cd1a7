"""The local test hosts (inventories/sandbox.py): same layers as production, tiny model on CPU."""

nvme_path = "/srv/nvme"   # a plain directory on sandbox hosts
