"""The venv's bytecode, the same bytes on every build (issue 25).

uv's ``--compile-bytecode`` hands the sources to a pool of Python workers, each taking the next
file when it is free. CPython's marshal writes an object as a back-reference (``FLAG_REF``) or
not depending on its reference count, and from Python 3.12 on those counts depend on what the
interpreter compiled before. So one source gives different ``.pyc`` bytes depending on which
worker got it and after what: 3 of ~90,000 files differed between cold vLLM installs
(bench/RESULTS.md). pycparser's c_parser.py compiled in a fresh interpreter and right after its
neighbour c_lexer.py gives two different files (tests/unit/engine/test_bytecode.py shows it).

Here the venv's own Python compiles every source of site-packages in fixed chunks: the sources
in sorted path order, cut every ``CHUNK_FILES`` files, each chunk in a fresh interpreter with a
fixed hash seed, its files in order. The same files make the same chunks, so every file is
compiled after the same files in the same interpreter state, whatever the number of cores or
which chunk finishes first. The .pyc files are checked-hash ones (the source's hash, not its
mtime, which uv sets to the install time); the venv is immutable, so one is never stale.

Pure: the code is a string the build script runs with the venv's Python on the host.
"""

from __future__ import annotations

import posixpath

# sources per interpreter: big enough that start-up (~20 ms) is noise, small enough that two
# cores share the ~90,000 files of a GPU venv evenly
CHUNK_FILES = 500

# Runs with the venv's Python: argv[1] site-packages, argv[2] files per chunk, argv[3] jobs
# (0: the cores). One worker per chunk, fed the chunk's paths on stdin; it prints how many
# sources do not compile (Python cannot import those either; uv skips them the same way).
COMPILE_CODE = r'''
import concurrent.futures, os, subprocess, sys
site, per_chunk, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) or os.cpu_count() or 1
WORKER = """
import py_compile, sys
bad = 0
for path in sys.stdin.read().split("\\0"):
    try:
        py_compile.compile(path, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except py_compile.PyCompileError:
        bad += 1
print(bad)
"""
files = []
for top, dirs, names in os.walk(site):
    dirs.sort()
    files += [os.path.join(top, n) for n in sorted(names) if n.endswith(".py")]
chunks = [files[i:i + per_chunk] for i in range(0, len(files), per_chunk)]
env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
def run(chunk):
    done = subprocess.run([sys.executable, "-s", "-c", WORKER], input="\0".join(chunk),
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("gpuserve: compiling bytecode failed in " + chunk[0] + ": " + done.stderr[-2000:])
    return int(done.stdout)
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    bad = sum(pool.map(run, chunks))
print(f"gpuserve: compiled {len(files) - bad} sources in {len(chunks)} chunks of {per_chunk} "
      f"(checked-hash .pyc); {bad} do not compile (Python cannot import them either)")
'''


def site_packages(path: str, python: str) -> str:
    return posixpath.join(path, "lib", f"python{python}", "site-packages")


def compile_command(path: str, python: str, jobs: int = 0,
                    chunk_files: int = CHUNK_FILES) -> list[str]:
    """The venv's Python compiling its own site-packages, chunk by chunk (``COMPILE_CODE``);
    ``jobs`` 0: as many at once as the host has cores (the bytes do not depend on it)."""
    return [posixpath.join(path, "bin", "python"), "-s", "-c", COMPILE_CODE,
            site_packages(path, python), str(chunk_files), str(jobs)]
