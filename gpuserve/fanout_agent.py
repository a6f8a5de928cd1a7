"""The fan-out agent on a host: fetch a revision from the fleet, shard by shard, and serve it onward.

Installed on each host beside ``weights.py`` and ``weights_manifest.py`` (``gpuserve.layout.AGENT_DIR``)
by the weights layer when ``weights_fanout = "hosts"``; standard library only (Python >= 3.9), like them.

``run JOB``   the ``gpuserve-weights-fetch`` unit. Stages ``<sha>.partial/`` (hardlinks for files an
              earlier revision has), then one thread per stripe takes each missing file, in order,
              from the stripe's first source that answers: its parent in the stripe's tree, then the
              parent's ancestors, then any other host (``gpuserve.fanout``). A root gets its stripe
              pushed by the control node into ``.incoming/.push/``. Every file is verified (size and
              sha256) and moved into ``<sha>.partial/`` before anyone else can take it from here. When
              all are in, the partial becomes ``<sha>/`` (``weights.commit``). Progress is written
              every second to the job's ``progress`` file (JSON). A reboot or a restart resumes:
              verified files stay, a half-received file is appended to.
``serve MODELS_DIR``   the forced command of the fleet key (authorized_keys ``command=``): allows
              ``rrsync -ro MODELS_DIR`` (read-only rsync below the models directory) and
              ``gpuserve-have REPO SHA PATH WAIT`` (a long-poll: answers ``final``, ``partial`` or
              ``none`` once the file is verified here, or after WAIT seconds). Nothing else.

Exit codes of ``run``: 0 done, 3 refused for space (the unit does not retry), 2 other failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

try:
    from gpuserve import weights as w
except ImportError:  # on a host: weights.py (and weights_manifest.py, which it imports) lie beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import weights as w  # type: ignore[no-redef]

PUSH_DIR = ".push"          # inside .incoming/: where the control node's rsync lands whole files
HAVE = "gpuserve-have"
PARENT_WAIT_S = 10          # long-poll on the stripe's parent
OTHER_WAIT_S = 2            # on a fallback source
DEAD_FOR_S = 20             # a source that did not answer is skipped this long
PUSH_QUIET_S = 60           # a root takes its stripe from other hosts after this long without a push
RATE_WINDOW_S = 30          # the progress file's rate: bytes moved over the last this many seconds
# rsync exits that mean the other side is gone (not that the file is missing there)
RSYNC_GONE = {5, 10, 12, 30, 35, 255}
_REL = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


# --------------------------------------------------------------------------------------------------
# Serving side (forced command)
# --------------------------------------------------------------------------------------------------


def have(models_dir: str, repo: str, sha: str, path: str) -> str:
    """Where a verified copy of ``path`` is here: ``final``, ``partial`` or ``none``."""
    base = os.path.join(models_dir, repo)
    if os.path.isfile(os.path.join(w.final_dir(base, sha), path)):
        return "final"
    if os.path.isfile(os.path.join(w.partial_dir(base, sha), path)):
        return "partial"  # only verified files are ever moved there (weights.accept_file)
    return "none"


def serve(models_dir: str, original: str) -> int:
    argv = shlex.split(original or "")
    if argv[:3] == ["rsync", "--server", "--sender"]:
        os.execvp("rrsync", ["rrsync", "-ro", models_dir])
    if len(argv) == 5 and argv[0] == HAVE:
        repo, sha, path, wait = argv[1:]
        if not (_REL.fullmatch(repo) and ".." not in repo.split("/") and w.SHA_RE.fullmatch(sha)
                and _REL.fullmatch(path) and ".." not in path.split("/") and wait.isdigit()):
            print("refused: bad arguments", file=sys.stderr)
            return 1
        deadline = time.monotonic() + min(int(wait), 60)
        while True:
            where = have(models_dir, repo, sha, path)
            if where != "none" or time.monotonic() >= deadline:
                print(where)
                return 0
            time.sleep(0.2)
    print("refused: this key only reads checkpoints", file=sys.stderr)
    return 1


# --------------------------------------------------------------------------------------------------
# Fetching side (the unit)
# --------------------------------------------------------------------------------------------------


def key_path(key: str, env: Dict[str, str]) -> str:
    """Where ssh reads the fleet key: an absolute path as it is, else a credential name in the
    fetch unit's ``$CREDENTIALS_DIRECTORY`` (its ``LoadCredentialEncrypted=``, issue 29)."""
    if os.path.isabs(key):
        return key
    directory = env.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise RuntimeError(f"the fleet key {key!r} is a credential, and this process has no "
                           "$CREDENTIALS_DIRECTORY: run it as the unit gpuserve-weights-fetch.service")
    return os.path.join(directory, key)


class Agent:
    def __init__(self, job: Dict[str, Any]):
        self.job = job
        self.repo_dir: str = job["repo_dir"]
        self.models_dir: str = job["models_dir"]
        self.repo_rel = os.path.relpath(self.repo_dir, self.models_dir)
        self.manifest = w.Manifest.from_json(job["manifest"])
        self.sha = self.manifest.revision
        self.stage = w.partial_dir(self.repo_dir, self.sha)
        self.incoming = os.path.join(self.stage, w.INCOMING)
        self.push_dir = os.path.join(self.incoming, PUSH_DIR)
        self.sources: List[List[Dict[str, str]]] = job["sources"]
        self.stripes: List[List[str]] = job["stripes"]
        self.roots = set(job.get("roots", []))  # stripes the control node pushes to this host
        self.lock = threading.Lock()
        self.dead: Dict[str, float] = {}
        self.done: Dict[str, int] = {}         # path -> bytes, verified here
        self.events: List[Dict[str, Any]] = []  # one per file received: path, source, t0, t1
        self.notes: List[str] = []             # fallbacks and retries, for the run's output
        self.state = "running"
        self.error = ""
        self.started = time.time()
        self.linked_bytes = 0
        self.samples: List[Tuple[float, int]] = []   # (time, bytes moved): the rate's window

    # -- helpers ---------------------------------------------------------------------------------
    def ssh_argv(self) -> List[str]:
        s = self.job["ssh"]
        return ["ssh", "-i", key_path(s["key"], os.environ), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={s['known_hosts']}", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR", "-p", str(s.get("port", 22)),
                "-o", "ControlMaster=auto", "-o", f"ControlPath={s['control_dir']}/%C",
                "-o", "ControlPersist=60"]

    def note(self, message: str) -> None:
        with self.lock:
            self.notes.append(f"{time.strftime('%H:%M:%S')} {message}")
        print(message, flush=True)

    def is_dead(self, name: str) -> bool:
        return self.dead.get(name, 0) > time.monotonic()

    def ask(self, src: Dict[str, str], path: str, wait: int) -> Optional[str]:
        """``final``/``partial``/``none`` from a source, or None when it did not answer."""
        user = self.job["ssh"]["user"]
        cmd = self.ssh_argv() + [f"{user}@{src['address']}", HAVE, self.repo_rel, self.sha, path,
                                 str(wait)]
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError:
            return None
        deadline = time.monotonic() + wait + 15
        while proc.poll() is None:
            if self.pushed(path) or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return "none" if self.pushed(path) else None
            time.sleep(0.2)
        out = proc.stdout.read().decode(errors="replace").strip() if proc.stdout else ""
        return out if proc.returncode == 0 and out in ("final", "partial", "none") else None

    def pushed(self, path: str) -> bool:
        try:
            return os.path.getsize(os.path.join(self.push_dir, path)) == self.manifest.files[path].size
        except OSError:
            return False

    def pull(self, src: Dict[str, str], where: str, path: str) -> int:
        """rsync one file from a source into .incoming/ (appending to what is there)."""
        user = self.job["ssh"]["user"]
        sub = self.sha if where == "final" else self.sha + w.PARTIAL_SUFFIX
        remote = f"{user}@{src['address']}:{self.repo_rel}/{sub}/{path}"
        dst = os.path.join(self.incoming, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        args = ["rsync", "--times", "--append-verify", "--timeout=60",
                "-e", shlex.join(self.ssh_argv()), remote, dst]
        if self.job.get("bwlimit_kib"):
            args.insert(1, f"--bwlimit={self.job['bwlimit_kib']}")
        return subprocess.run(args, capture_output=True, check=False).returncode

    def accept(self, src_path: str, path: str, source: str, t0: float) -> bool:
        result = w.accept_file(self.repo_dir, self.manifest, src_path, path)
        if result["ok"]:
            with self.lock:
                self.done[path] = self.manifest.files[path].size
                if result["reason"] == "verified":
                    self.events.append({"path": path, "source": source, "t0": t0, "t1": time.time(),
                                        "bytes": self.manifest.files[path].size})
            return True
        self.note(f"{path} from {source} failed verification ({result['reason']}): fetching it again")
        return False

    # -- one stripe ------------------------------------------------------------------------------
    def push_seen(self) -> float:
        """When the control node's push into this host last wrote (wall clock; the agent's start
        before the first push)."""
        newest = 0.0
        for root, _dirs, names in os.walk(self.push_dir):
            for name in names:
                try:
                    newest = max(newest, os.path.getmtime(os.path.join(root, name)))
                except OSError:
                    pass
        return max(newest, self.started)

    def fetch(self, stripe: int, path: str) -> None:
        """Take one file: from the push (a root), else from the first source that answers."""
        sources = self.sources[stripe]
        is_root = stripe in self.roots
        announced = ""
        t0 = time.time()
        while True:
            if self.pushed(path):
                if self.accept(os.path.join(self.push_dir, path), path, "control node", t0):
                    return
                continue
            if is_root and time.time() - self.push_seen() < PUSH_QUIET_S:
                time.sleep(0.2)  # the control node is sending this stripe here
                continue
            live = [s for s in sources if not self.is_dead(s["name"])]
            if not live:
                time.sleep(1)
                continue
            src = live[0]
            primary = not is_root and src is sources[0]
            if not primary and announced != src["name"]:
                why = (f"no push from the control node for {PUSH_QUIET_S} s" if is_root else
                       f"parent {sources[0]['name']} is not answering")
                self.note(f"{path}: {why}; taking it from {src['name']}")
                announced = src["name"]
            where = self.ask(src, path, PARENT_WAIT_S if primary else OTHER_WAIT_S)
            if where is None:
                self.dead[src["name"]] = time.monotonic() + DEAD_FOR_S
                continue
            if where == "none" and not primary:
                for other in live[1:]:  # not there yet: does another live source have it?
                    where = self.ask(other, path, 0)
                    if where in ("final", "partial"):
                        src = other
                        break
                    if where is None:
                        self.dead[other["name"]] = time.monotonic() + DEAD_FOR_S
                if where not in ("final", "partial"):
                    time.sleep(0.5)
                    continue
            if where == "none":
                continue  # the parent has not verified it yet: ask again (a long-poll)
            rc = self.pull(src, where, path)
            if rc == 0:
                if self.accept(os.path.join(self.incoming, path), path, src["name"], t0):
                    return
            elif rc in RSYNC_GONE:
                self.note(f"{path}: {src['name']} went away mid-copy (rsync exit {rc}); "
                          "resuming from the next source")
                self.dead[src["name"]] = time.monotonic() + DEAD_FOR_S
            else:
                time.sleep(0.5)  # e.g. 23/24: the file moved from .partial to final meanwhile

    def stripe_worker(self, stripe: int) -> None:
        try:
            for path in self.stripes[stripe]:
                if path not in self.done:
                    self.fetch(stripe, path)
        except Exception as exc:  # noqa: BLE001 - reported in the progress file and the exit code
            with self.lock:
                self.state, self.error = "failed", f"stripe {stripe}: {type(exc).__name__}: {exc}"

    # -- progress --------------------------------------------------------------------------------
    def in_flight(self) -> int:
        total = 0
        for base in (self.incoming, self.push_dir):
            for path in self.manifest.files:
                if path in self.done:
                    continue
                try:
                    total += os.path.getsize(os.path.join(base, path))
                except OSError:
                    pass
        return total

    def write_progress(self) -> None:
        with self.lock:
            verified = sum(self.done.values())
            doc = {"host": self.job["self"], "repo": self.manifest.repo, "revision": self.sha,
                   "state": self.state, "error": self.error, "started": self.started,
                   "updated": time.time(), "total_bytes": self.manifest.total_size,
                   "verified_bytes": verified, "files_total": len(self.manifest.files),
                   "files_done": len(self.done), "linked_bytes": self.linked_bytes,
                   "events": list(self.events), "notes": list(self.notes[-50:])}
        doc["done_bytes"] = min(doc["total_bytes"], verified + (self.in_flight()
                                                                if doc["state"] == "running" else 0))
        doc["rate_bps"] = self.rate(doc["updated"], doc["done_bytes"] - self.linked_bytes)
        path = self.job["progress"]
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)

    def rate(self, now: float, moved: int) -> float:
        """Bytes per second over the last RATE_WINDOW_S (since the start until then): what the
        copy does now, not its average since a stall or a fallback."""
        self.samples.append((now, moved))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.pop(0)
        t0, m0 = self.samples[0] if len(self.samples) > 1 else (self.started, 0)
        return max(0.0, (moved - m0) / (now - t0)) if now > t0 else 0.0

    # -- the whole run ---------------------------------------------------------------------------
    def run(self) -> int:
        if os.path.isdir(w.final_dir(self.repo_dir, self.sha)):
            self.state = "complete"
            self.done = {p: s.size for p, s in self.manifest.files.items()}
            self.write_progress()
            return 0
        try:
            prep = w.prepare(self.repo_dir, self.manifest, margin=int(self.job.get("margin", 0)),
                             where=self.job["self"])
        except w.SpaceError as exc:
            self.state, self.error = "failed", str(exc)
            self.write_progress()
            return w.EXIT_SPACE
        todo = set(prep["transfer"])
        self.done = {p: s.size for p, s in self.manifest.files.items() if p not in todo}
        self.linked_bytes = sum(self.done.values())
        os.makedirs(self.push_dir, exist_ok=True)
        threads = [threading.Thread(target=self.stripe_worker, args=(j,), daemon=True)
                   for j in range(len(self.stripes))]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            self.write_progress()
            time.sleep(1)
        if self.state == "failed":
            self.write_progress()
            return w.EXIT_ERROR
        done = w.commit(self.repo_dir, self.manifest)
        if not done["complete"]:
            self.state, self.error = "failed", f"not complete after the fetch: {done['missing'][:5]}"
            self.write_progress()
            return w.EXIT_ERROR
        self.state = "complete"
        self.write_progress()
        return 0


def main(argv: List[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 2:
        return serve(argv[1], os.environ.get("SSH_ORIGINAL_COMMAND", ""))
    if argv[:1] == ["run"] and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as fh:
            job = json.load(fh)
        try:
            return Agent(job).run()
        except (w.WeightsError, OSError) as exc:
            print(f"fan-out failed: {exc}", file=sys.stderr)
            return w.EXIT_ERROR
    print("usage: fanout_agent.py run JOB | serve MODELS_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
