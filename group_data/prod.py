"""Production fleet (inventories/prod.py): what every prod host shares.

Every prod host is also in its hardware group (hopper_x8.py, blackwell_x4.py, mi355x_x4.py),
which picks the recipe. This file beats those groups (pyinfra: the inventory's own group wins).
"""

# THE PIN TO CHANGE: the MiniMaxAI/MiniMax-M3.1-Flash commit every prod host serves.
# Placeholder until the first rollout; resolve the real one on the control node with
#   gpuserve resolve MiniMaxAI/MiniMax-M3.1-Flash main
model_revision = "0123456789abcdef0123456789abcdef01234567"

# One API key, on the control node (a path relative to where pyinfra/gpuserve runs, i.e. the
# repo root; keep it out of git). The service layer copies it into a 0600 env file on each host
# as VLLM_API_KEY; it never appears in argv or serve.yaml.
api_keys_file = "secrets/prod-api-keys"

# Login. Most fleets forbid root logins: log in as a user with passwordless sudo and the control
# node's key instead, and everything runs through sudo (docs/non-root.md):
# ssh_user = "deploy"
# _sudo = True
