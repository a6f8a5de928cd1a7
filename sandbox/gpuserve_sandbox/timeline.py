"""A rollout's timeline as a PNG, for a person to look at (tests and benches write them).

From a ``LoadLoop``'s stats: each host's time in and out of rotation (top), and every request's
latency over time, failures marked (bottom); vertical marks for what the rollout did (a canary
judged, a batch started). matplotlib's Agg backend: no display needed.

    with LoadLoop(...) as loop: ...
    timeline.plot(loop.stats, "upgrade.png", "Rolling upgrade of 4 hosts", marks=[(t, "canary judged")])
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gpuserve_sandbox.loadloop import LoadStats


def in_rotation(stats: LoadStats, end: float) -> dict[str, list[tuple[float, float]]]:
    """Per host, the (start, end) spans it was in rotation, in seconds since the loop started."""
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for t, host, up in sorted(stats.moves):
        spans.setdefault(host, [])
        if up and host not in since:
            since[host] = t
        elif not up and host in since:
            spans[host].append((since.pop(host), t))
    for host, t in since.items():
        spans[host].append((t, max(t, end)))
    return spans


def plot(stats: LoadStats, path: str | Path, title: str,
         marks: Sequence[tuple[float, str]] = ()) -> Path:
    """Write the timeline PNG to ``path``; returns it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max([t + lat for t, _, _, lat in stats.requests] + [t for t, _, _ in stats.moves] + [1.0])
    spans = in_rotation(stats, end)
    hosts = sorted(spans)
    colours = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(hosts)}
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(11, 2.2 + 0.45 * len(hosts) + 3),
                                      gridspec_kw={"height_ratios": [max(1, len(hosts)), 4]})
    for row, host in enumerate(hosts):
        top.broken_barh([(a, b - a) for a, b in spans[host]], (row - 0.35, 0.7), color=colours[host])
    top.set_yticks(range(len(hosts)), hosts)
    top.set_ylim(-0.6, len(hosts) - 0.4)
    top.invert_yaxis()
    top.set_title(f"{title}\nbars: in rotation (health 200); gaps: out")
    ok = [(t, lat, host) for t, host, status, lat in stats.requests if status == 200]
    for host in hosts:
        mine = [(t, lat) for t, lat, h in ok if h == host]
        if mine:
            bottom.scatter(*zip(*mine), s=6, color=colours[host], label=host)
    failed = [(t, lat) for t, _, status, lat in stats.requests if status != 200]
    if failed:
        bottom.scatter(*zip(*failed), s=40, marker="x", color="red", label=f"failed ({len(failed)})")
    bottom.set_ylabel("request latency (s)")
    bottom.set_xlabel("seconds since the client loop started")
    bottom.set_title(f"{len(stats.requests)} requests, {len(failed)} failed")
    if hosts:
        bottom.legend(loc="best", fontsize="small", ncol=min(len(hosts) + 1, 6))
    for t, label in marks:
        for ax in (top, bottom):
            ax.axvline(t, color="black", linestyle="--", linewidth=0.8)
        bottom.annotate(label, (t, 1), xycoords=("data", "axes fraction"), rotation=90, va="top",
                        ha="right", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
