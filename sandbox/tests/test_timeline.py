"""The rollout timeline PNG (gpuserve_sandbox.timeline): the spans come from the load loop's own
rotation events, and the picture shows them."""

from __future__ import annotations

import matplotlib.image

from gpuserve_sandbox import timeline
from gpuserve_sandbox.loadloop import LoadStats


def _stats() -> LoadStats:
    s = LoadStats()
    s.moves = [(0.1, "sandbox-1", True), (0.2, "sandbox-2", True),
               (10.0, "sandbox-1", False), (25.0, "sandbox-1", True),      # sandbox-1 moved
               (30.0, "sandbox-2", False), (44.0, "sandbox-2", True)]      # then sandbox-2
    s.requests = [(t / 2, "sandbox-1" if t % 2 else "sandbox-2", 200, 0.05) for t in range(100)]
    s.requests.append((12.0, "sandbox-2", 502, 0.3))
    return s


def test_spans_follow_the_rotation_events_and_end_at_the_last_sample():
    spans = timeline.in_rotation(_stats(), end=60.0)
    assert spans == {"sandbox-1": [(0.1, 10.0), (25.0, 60.0)], "sandbox-2": [(0.2, 30.0), (44.0, 60.0)]}


def test_a_host_that_never_came_back_has_no_span_after_it_left():
    s = _stats()
    s.moves = s.moves[:3]
    assert timeline.in_rotation(s, end=60.0)["sandbox-1"] == [(0.1, 10.0)]


def test_the_png_is_written_and_the_out_of_rotation_gap_is_visible(tmp_path):
    png = timeline.plot(_stats(), tmp_path / "t.png", "test", marks=[(27.0, "canary judged")])
    img = matplotlib.image.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 800
    # the top panel: sandbox-1's row has coloured pixels (its bar) and a white gap where it was out
    rows = img[: img.shape[0] // 3, :, :3]
    coloured = ((rows.max(axis=2) - rows.min(axis=2)) > 0.3).sum(axis=0)   # saturated pixels per column
    assert coloured.max() > 0
    assert (coloured == 0).sum() > 0
