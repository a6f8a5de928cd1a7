"""What every host of every inventory in this repository shares, beyond gpuserve's defaults.

Nothing yet: every default lives in the package (gpuserve.schema), so a config
repo of its own (docs/config-repo.md) gets them by installing gpuserve, with no copy of this
file. Set a key here only to change it for the whole repository, e.g.::

    nvme_path = "/data/nvme"
    reboot = "allowed"

Keys and their defaults: docs/configuration.md. Per fleet: group_data/<inventory>.py (prod.py);
per hardware: group_data/<hardware group>.py. Secrets are never written here: name a file that
holds them (``api_keys_file``), relative to the directory pyinfra runs in.
"""
