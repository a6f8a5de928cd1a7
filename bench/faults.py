"""The fault and bad-input suite: every test marked `faults`, the slow ones included, and its tally.

    .venv/bin/python bench/faults.py              # as root; about 25 min on 2 cores
    .venv/bin/python bench/faults.py -k bad_input # a part of it (any pytest arguments)

Runs the test modules that hold fault tests (whole: a fault test starts from the state the tests
before it left), then prints one line per fault tried (passed / FAILED / skipped / not run) and
"N tried, N passed". Exits non-zero unless every fault tried passed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def faults_marked(argv: list[str]) -> list[str]:
    """Node ids of the tests marked ``faults`` (collected, not run)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "faults",
                          "-p", "no:cacheprovider", *argv], cwd=REPO, capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "::" in line]


def main(argv: list[str]) -> int:
    marked = faults_marked(argv)
    if not marked:
        print("no test marked 'faults' was collected")
        return 1
    # a fault test starts from the state the tests before it in its module left (a converged
    # fleet, say): run those modules whole, slow ones included, and tally the marked tests
    modules = list(dict.fromkeys(node.split("::", 1)[0] for node in marked))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.xml"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "slow or not slow", "-q",
                               "-p", "no:cacheprovider", f"--junitxml={report}", *argv, *modules], cwd=REPO)
        results: dict[str, str] = {}
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
                if case.find("skipped") is not None:
                    results[node] = "skipped"
                elif case.find("failure") is not None or case.find("error") is not None:
                    results[node] = "FAILED"
                else:
                    results[node] = "passed"
    print()
    tried = passed = 0
    for node in marked:
        result = results.get(node, "not run")
        print(f"  {result:8} {node}")
        if result != "skipped":
            tried += 1
            passed += result == "passed"
    print(f"\n{tried} tried, {passed} passed")
    return 0 if tried == passed and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
