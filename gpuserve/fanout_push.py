"""The control node's part of the host-to-host fan-out: each stripe once, to its tree's root.

    python -m gpuserve.fanout_push JOB.json

Started by the weights fan-out (``gpuserve.layers.fanout``, its ``push`` operation in
``gpuserve.operations.fanout``) at the beginning of a converge, in the
background, as a child of the pyinfra process (it dies with it). It stages the revision in the
control node's cache (``gpuserve.checkpoints.fleet_stage``: the hub is asked once per fleet), then
sends each stripe's files, in order, with rsync over that host's own SSH settings into
``<sha>.partial/.incoming/.push/`` on the stripe's root, where the host's agent verifies each
file before serving it onward. A root that stops answering hands its stripe to the next target
(``gpuserve.fanout.push_targets``); the state file says so. Files a target already has verified
are skipped (``--compare-dest``), so the control node sends each byte once for the fleet.

State file (JSON, rewritten after every file): ``state`` (running, done, failed), ``sent_bytes``,
``files_sent``, ``notes``, ``error``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

from gpuserve import checkpoints
from gpuserve.fanout_agent import PUSH_DIR, RSYNC_GONE

_SENT = re.compile(r"Total bytes sent:\s*([\d,.]+)")
TRIES = 3          # per target, a few seconds apart, before its stripe moves on
RETRY_S = 4


class Pusher:
    def __init__(self, job: Dict[str, Any]):
        self.job = job
        self.lock = threading.Lock()
        self.state = {"state": "running", "sent_bytes": 0, "files_sent": 0, "notes": [], "error": "",
                      "started": time.time(), "events": []}
        # one SSH connection per target for all its files: a new one per file cost a handshake
        # (and sudo) per shard, time the control node's uplink stood idle
        self.control_dir = tempfile.mkdtemp(prefix="gpuserve-push-")

    def ssh(self, target: Dict[str, Any]) -> str:
        return (f"{target['ssh']} -o ControlMaster=auto -o ControlPersist=60 "
                f"-o ControlPath={shlex.quote(self.control_dir)}/%C")

    def close(self) -> None:
        """End the shared connections and remove their directory."""
        for row in self.job["targets"]:
            for target in row:
                subprocess.run([*shlex.split(self.ssh(target)), "-O", "exit", target["address"]],
                               capture_output=True, check=False, timeout=30)
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def save(self) -> None:
        path = self.job["state"]
        with self.lock:
            doc = json.dumps(self.state)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(doc)
        os.replace(path + ".tmp", path)

    def note(self, message: str) -> None:
        with self.lock:
            self.state["notes"].append(f"{time.strftime('%H:%M:%S')} {message}")
        self.save()

    def send(self, src_dir: str, target: Dict[str, Any], path: str) -> int:
        """rsync one file to a target; returns rsync's exit code (0: sent or already there)."""
        dest = f"{target['incoming']}/{PUSH_DIR}/"
        args = ["rsync", "--relative", "--times", "--chmod=D755,F644", "--mkpath", "--stats",
                "--partial-dir=.rsync-partial", "--compare-dest=../../", "--timeout=60",
                "-e", self.ssh(target)] + target.get("rsync_path", [])
        if self.job.get("bwlimit_kib"):
            args.append(f"--bwlimit={self.job['bwlimit_kib']}")
        args += [f"{src_dir.rstrip('/')}/./{path}", f"{target['address']}:{dest}"]
        t0 = time.time()
        proc = subprocess.run(args, capture_output=True, check=False)
        if proc.returncode == 0:
            m = _SENT.search(proc.stdout.decode(errors="replace"))
            sent = int(re.sub(r"[,.]", "", m.group(1))) if m else 0
            with self.lock:
                self.state["sent_bytes"] += sent
                self.state["files_sent"] += 1
                self.state["events"].append({"path": path, "host": target["name"], "t0": t0,
                                             "t1": time.time(), "bytes": sent})
            self.save()
        return proc.returncode

    def stripe(self, src_dir: str, j: int) -> None:
        targets: List[Dict[str, Any]] = self.job["targets"][j]
        t = 0
        for path in self.job["stripes"][j]:
            while True:
                target = targets[t]
                if path in target.get("have", ()):
                    break
                for _ in range(TRIES):
                    rc = self.send(src_dir, target, path)
                    if rc == 0 or rc not in RSYNC_GONE:
                        break
                    time.sleep(RETRY_S)
                if rc == 0:
                    break
                if rc not in RSYNC_GONE:
                    raise RuntimeError(f"rsync of {path} to {target['name']} failed (exit {rc})")
                if t + 1 >= len(targets):
                    raise RuntimeError(f"stripe {j}: no host takes {path} (last tried "
                                       f"{target['name']}, rsync exit {rc})")
                self.note(f"stripe {j}: {target['name']} is not answering (rsync exit {rc}); "
                          f"sending the rest of the stripe to {targets[t + 1]['name']}")
                t += 1

    def run(self) -> int:
        job = self.job
        source = checkpoints.Source(**job["source"])
        try:
            src_dir, _manifest = checkpoints.fleet_stage(source, job["sha"], job["cache"],
                                                         lambda m: self.note(m))
        except checkpoints.CheckpointError as exc:
            self.state.update(state="failed", error=str(exc))
            self.save()
            return 2
        errors: List[str] = []

        def worker(j: int) -> None:
            try:
                self.stripe(src_dir, j)
            except Exception as exc:  # noqa: BLE001 - into the state file
                errors.append(str(exc))

        threads = [threading.Thread(target=worker, args=(j,)) for j in range(len(job["stripes"]))]
        try:
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        finally:
            self.close()
        self.state.update(state="failed" if errors else "done", error="; ".join(errors),
                          finished=time.time())
        self.save()
        return 2 if errors else 0


def main(argv: List[str]) -> int:
    with open(argv[0], encoding="utf-8") as fh:
        job = json.load(fh)
    return Pusher(job).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
