#!/bin/bash
# GPU smoke: run on ONE machine with an NVIDIA GPU and its driver, no network needed (< 10 min).
#
#   dev/gpu-smoke.sh [OUT_DIR]          (from the repository root, after the README's setup)
#   ENGINE_VENV=/opt/gpuserve/envs/<id> dev/gpu-smoke.sh   also loads that engine venv's native modules
#
# Records the exact commands gpuserve's facts run (gpuserve/facts/gpus.py Gpus,
# gpuserve/facts/nvidia.py NvidiaSmiGpus, NvidiaKernelModule, CudaDeviceCount) into OUT_DIR as
# parser fixtures, runs the project's parsers on them (GPU facts, CUDA check) and prints what
# they saw, plus the raw `nvidia-smi` and `nvidia-smi -q` for people.
#
# NOT YET RUN ON A GPU: it was written on a machine without one. Only its parser step was tested,
# with a fake nvidia-smi on PATH printing tests/unit/fixtures/gpus (tests/unit/test_gpu_smoke.py).
# The first run on a real host is the test: copy OUT_DIR's files next to the fixtures they replace
# (tests/unit/fixtures/gpus/README.md) and rerun the unit tests.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-gpu-smoke-$(hostname -s)-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
T=${SMOKE_TIMEOUT:-120}   # seconds per command; 6 commands + parsing stay under 10 minutes

command_of() {  # the shell command a gpuserve fact runs on a host
  "$PY" -c "import importlib; m, c = '$1'.rsplit('.', 1); print(getattr(importlib.import_module(m), c)().command())"
}

record() {  # record NAME FACT: run the fact's own command, keep stdout+stderr and the status
  local cmd; cmd=$(command_of "$2") || { echo "cannot get the command of $2" >&2; return 1; }
  printf '%s\n' "$cmd" > "$OUT/$1.command"
  timeout "$T" bash -c "$cmd" > "$OUT/$1.txt" 2>&1
  echo "$?" > "$OUT/$1.rc"
  echo "== $1 (exit $(cat "$OUT/$1.rc")): $OUT/$1.txt"
}

record gpus_fact gpuserve.facts.gpus.Gpus
record nvidia_smi_gpus gpuserve.facts.nvidia.NvidiaSmiGpus
record nvidia_kernel_module gpuserve.facts.nvidia.NvidiaKernelModule
record cuda_device_count gpuserve.facts.nvidia.CudaDeviceCount
timeout "$T" nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
timeout "$T" nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1

"$PY" - "$OUT" <<'EOF'
import sys
from pathlib import Path
from gpuserve.facts import gpus, nvidia

out = Path(sys.argv[1])
text = lambda name: (out / f"{name}.txt").read_text()
report = gpus.parse_gpu_fact(text("gpus_fact"))
print(f"GPU fact: vendor={report.vendor} gpus={len(report.gpus)} error={report.error}")
for g in report.gpus:
    print(f"  {g}")
profile = report.profile
print(f"hardware profile: {profile.describe() if profile else None}")
smi = gpus.parse_nvidia_smi(text("nvidia_smi_gpus"))   # the GPU stack's fact, same parser
print(f"nvidia-smi fact: gpus={len(smi.gpus)} error={smi.error}")
module = nvidia.parse_module_versions(text("nvidia_kernel_module").splitlines())
print(f"kernel module fact: {module}")
cuda = nvidia.parse_cuda_check(text("cuda_device_count").splitlines())
print(f"CUDA check: count={cuda.count} error={cuda.error}")
ok = (report.error is None and bool(report.gpus) and cuda.count == len(report.gpus)
      and smi.error is None and smi.gpus == report.gpus)
print("SMOKE", "OK" if ok else "NOT OK", f"(fixtures in {out})")
EOF
rc=$?

# the engine build's whole check on a real driver: no file owned by two distributions, the kernel
# stack (cuda.bindings, cutlass, flashinfer, deep_gemm) imports, every native module loads
if [ -n "${ENGINE_VENV:-}" ]; then
  echo "== native modules of $ENGINE_VENV"
  code=$("$PY" - "$ENGINE_VENV" <<'EOF'
import json, sys
from gpuserve import engine as eng
r = json.load(open(sys.argv[1] + "/gpuserve-engine.json"))
spec = eng.EngineSpec(engine=r["engine"], package=r["package"], version=r["version"],
                      python=r["python"], torch_backend=r["torch_backend"],
                      python_downloads="never", excludes=tuple(r["excludes"]),
                      kernels=r["kernels"], uv_version=r["uv_version"],
                      constraints=tuple(r.get("constraints", ())),
                      overrides=tuple(r.get("overrides", ())))
print(eng.verify_code(spec))
EOF
) && timeout 600 "$ENGINE_VENV/bin/python" -c "$code" 2>&1 | grep '^gpuserve:' | tee "$OUT/engine_native_modules.txt"
fi
exit $rc
