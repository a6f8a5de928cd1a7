"""Every alert rule has a runbook section in docs/runbooks.md and links to it (issue 29)."""

from __future__ import annotations

import re
from pathlib import Path

from gpuserve import monitoring
from gpuserve.monitoring import MonitorSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
PARTS = ("**What it means**", "**What to check**", "**What acts**")


def sections() -> dict[str, str]:
    text = DOC.read_text()
    found = re.split(r"^## (\S+)\n", text, flags=re.M)
    return dict(zip(found[1::2], found[2::2]))


def rules() -> list[dict]:
    return monitoring.alert_rules(MonitorSettings())


def test_every_alert_rule_has_a_runbook_section_with_its_three_parts():
    docs = sections()
    names = [r["alert"] for r in rules()]
    assert names and set(names) == set(monitoring.ALERTS)
    missing = [n for n in names if n not in docs]
    assert missing == [], f"alerts without a section in docs/runbooks.md: {missing}"
    assert set(docs) <= set(names), f"sections for no alert: {set(docs) - set(names)}"
    for name in names:
        absent = [p for p in PARTS if p not in docs[name]]
        assert absent == [], f"{name}'s runbook lacks {absent}"
        # each names the gpuserve command that acts (a deploy or a gpuserve subcommand)
        acts = docs[name].split("**What acts**", 1)[1]
        assert re.search(r"deploys/\w+\.py|gpuserve \w+|watchdog", acts), name


def test_every_alert_links_to_its_section():
    docs = sections()
    for rule in rules():
        url = rule["annotations"]["runbook_url"]
        path, anchor = url.split("#")
        assert path == "docs/runbooks.md"
        assert anchor == rule["alert"].lower()   # GitHub's anchor of the heading "## <alert>"
        assert rule["alert"] in docs
