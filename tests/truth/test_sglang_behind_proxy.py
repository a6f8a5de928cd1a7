"""SGLang behind the proxy and the gateway, read by SGLang's own parser (issue 27): the serve.yaml
gpuserve renders for an SGLang host behind its proxy (with client keys, a gateway in the fleet)
goes through ``sglang.srt.server_args.prepare_server_args`` in the engine venv the truth suite
builds: it parses, it listens on loopback only, and it sets no API key (the proxy checks the
clients' keys; the engine guard keeps everyone else off the port).

    GPUSERVE_TRUTH_DIR=/var/tmp/gpuserve-truth .venv/bin/pytest -m truth tests/truth/test_sglang_behind_proxy.py -s

The unit side (plan, guard, gateway worker URL) is tests/unit/test_sglang_behind_proxy.py.
"""

from __future__ import annotations

import json
import os

import pytest

from . import harness as h
from .test_engine_truth import built, checkpoint, pytestmark  # noqa: F401 (fixture, marks)

PROBE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
sa = prepare_server_args(["--model-path", sys.argv[1], "--config", sys.argv[2]])
print("ARGS " + json.dumps({"host": sa.host, "port": sa.port, "api_key": sa.api_key}))
"""


@pytest.mark.parametrize("recipe", ["hopper_x8", "blackwell_x4"])
def test_sglang_behind_the_proxy_parses_keyless_on_loopback(recipe, checkpoint, tmp_path):  # noqa: F811
    keys = tmp_path / "keys"
    keys.write_text("k" * 32 + "\n")
    os.chmod(keys, 0o600)
    settings, problems = h.settings(recipe, "sglang", proxy=True, api_keys_file=str(keys))
    assert settings is not None, problems
    serve_yaml = tmp_path / "serve.yaml"
    serve_yaml.write_text(settings.serve_configs["minimax"].config_yaml())
    spec, _ = built(recipe, "sglang")
    done = h.run_python(h.venv_of(spec), PROBE, str(checkpoint), str(serve_yaml),
                        env={"LD_LIBRARY_PATH": str(h.libcuda_stub(h.venv_of(spec)))})
    line = next((x for x in done.stdout.splitlines() if x.startswith("ARGS ")), None)
    assert line, done.stdout[-3000:] + done.stderr[-3000:]
    args = json.loads(line[5:])
    assert args["api_key"] is None
    assert args["host"] in ("127.0.0.1", "localhost", "::1")
    assert args["port"] == settings.deployments[0].serve_port
