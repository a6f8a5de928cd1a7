"""Run by an SGLang venv's python: SGLang's own ServerArgs from a rendered serve.yaml, with its
post-init checks (model overrides, page size, speculative settings), as deep as no GPU allows.

    python probe_sglang.py <checkpoint dir> <serve.yaml> <out.json>

Prints ``STEP <name>: OK`` or ``STEP <name>: FAIL <error>``, and writes the same as JSON.
"""

from __future__ import annotations

import sys

ckpt, serve_yaml, out_path = sys.argv[1:4]
from probe_steps import dump, objects, step  # noqa: E402 (beside this file)


def server_args():
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", ckpt, "--config", serve_yaml])


if step("ServerArgs (prepare_server_args: parser, --config, __post_init__ checks)", server_args):
    sa = objects["ServerArgs (prepare_server_args: parser, --config, __post_init__ checks)"]
    print("  page_size", sa.page_size, "tp", sa.tp_size, "kv", sa.kv_cache_dtype,
          "spec", sa.speculative_algorithm, "moe", getattr(sa, "moe_runner_backend", None), flush=True)
    if hasattr(sa, "check_server_args"):
        step("ServerArgs.check_server_args", sa.check_server_args)
dump(out_path)
