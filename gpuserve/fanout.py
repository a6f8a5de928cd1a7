"""Host-to-host fan-out of a checkpoint revision: who sends which shard to whom (pure logic).

The control node sends each byte once for the whole fleet; hosts feed hosts, shard by shard.

The shape is SplitStream's: the revision's files are split into ``d`` *stripes* of about equal
bytes (``d`` = ``weights_fanout_degree``), and each stripe travels down its own tree over all hosts.
The trees are *interior-disjoint*: hosts are split into ``d`` groups, and in tree ``j`` only the
hosts of group ``j`` have children (at most ``d`` each); every other host is a leaf. So every host
uploads about one checkpoint (``d`` children x ``1/d`` of the bytes) and downloads one, from ``d``
parents at once, whatever the fleet's size; the control node uploads one (``d`` stripes, one root
each). A host forwards a shard as soon as it has verified it, so a stripe flows down its tree in a
pipeline: the stage time is about one copy plus ``depth x d / shards`` copies, with ``depth`` about
``log_d(N / d) + 1``.

Each host's *sources* for a stripe: its parent in that stripe's tree, then the parent's ancestors up
to the root, then every other host. A host whose parent stops answering takes the shard from the
next source that has it (the run says so); the control node re-targets a stripe whose root stops
answering to the next interior host of that tree (:func:`push_targets`).

Standard library only (gpuserve.weights is too), and no host access: the weights layer turns a
:class:`FanoutPlan` into each host's job (``gpuserve.fanout_agent``) and the control node's push.
The progress lines the run and ``gpuserve status`` print come from here as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from gpuserve.weights import human


class FanoutError(ValueError):
    pass


@dataclass(frozen=True)
class FanoutPlan:
    hosts: Tuple[str, ...]
    degree: int                                   # d actually used: min(asked, hosts)
    stripes: Tuple[Tuple[str, ...], ...]          # file paths of each stripe, in sending order
    parents: Tuple[Mapping[str, Optional[str]], ...]   # per stripe: host -> parent (None: root)

    def root(self, stripe: int) -> str:
        return next(h for h, p in self.parents[stripe].items() if p is None)

    def children(self, stripe: int, host: str) -> List[str]:
        return [h for h in self.hosts if self.parents[stripe][h] == host]

    def ancestors(self, stripe: int, host: str) -> List[str]:
        out, cur = [], self.parents[stripe][host]
        while cur is not None:
            out.append(cur)
            cur = self.parents[stripe][cur]
        return out

    def depth(self, stripe: int) -> int:
        """Hops from the control node to the deepest host of the stripe's tree."""
        return 1 + max(len(self.ancestors(stripe, h)) for h in self.hosts)

    def sources(self, host: str) -> List[List[str]]:
        """Per stripe, where ``host`` takes that stripe's shards from, in order of preference:
        its parent, the parent's ancestors, then every other host (inventory order). Empty
        ancestry (the root) means the control node pushes the stripe to it."""
        out = []
        for j in range(len(self.stripes)):
            chain = self.ancestors(j, host)
            out.append(chain + [h for h in self.hosts if h != host and h not in chain])
        return out

    def stripe_of(self) -> Dict[str, int]:
        return {p: j for j, paths in enumerate(self.stripes) for p in paths}

    def uploads(self) -> Dict[str, int]:
        """Bytes-free view of load: how many (stripe, child) edges each host serves."""
        return {h: sum(len(self.children(j, h)) for j in range(len(self.stripes)))
                for h in self.hosts}


def split_stripes(files: Mapping[str, int], d: int) -> List[List[str]]:
    """``d`` stripes of about equal bytes: largest file first to the lightest stripe (ties: the
    lower stripe, then the path), then each stripe in path order (shards are sent in order)."""
    stripes: List[List[str]] = [[] for _ in range(d)]
    load = [0] * d
    for path, size in sorted(files.items(), key=lambda kv: (-kv[1], kv[0])):
        j = min(range(d), key=lambda k: (load[k], k))
        stripes[j].append(path)
        load[j] += size
    return [sorted(s) for s in stripes]


def _tree(hosts: Sequence[str], interior: Sequence[str], d: int) -> Dict[str, Optional[str]]:
    """A tree over ``hosts`` rooted at ``interior[0]`` whose inner nodes are ``interior`` (a
    complete d-ary tree in breadth-first order), with every other host a leaf under the first
    interior node with room (at most ``d`` children); when none has room (a remainder of the
    split), under the interior node with the fewest children."""
    parents: Dict[str, Optional[str]] = {interior[0]: None}
    kids = {h: 0 for h in interior}
    for k, h in enumerate(interior[1:], start=1):
        parent = interior[(k - 1) // d]
        parents[h] = parent
        kids[parent] += 1
    for h in hosts:
        if h in parents:
            continue
        roomy = [p for p in interior if kids[p] < d]
        parent = roomy[0] if roomy else min(interior, key=lambda p: (kids[p], interior.index(p)))
        parents[h] = parent
        kids[parent] += 1
    return parents


def plan(hosts: Sequence[str], files: Mapping[str, int], degree: int) -> FanoutPlan:
    """The fan-out of ``files`` (path -> size) over ``hosts`` (inventory order) with ``degree``."""
    if not hosts:
        raise FanoutError("a fan-out needs at least one host")
    if len(set(hosts)) != len(hosts):
        raise FanoutError(f"a host is listed twice: {sorted(h for h in hosts if list(hosts).count(h) > 1)}")
    if degree < 1:
        raise FanoutError(f"weights_fanout_degree must be at least 1, got {degree}")
    if not files:
        raise FanoutError("a fan-out needs at least one file")
    d = max(1, min(degree, len(hosts), len(files)))
    groups = [list(hosts[j::d]) for j in range(d)]
    stripes = split_stripes(files, d)
    parents = tuple(_tree(hosts, groups[j], d) for j in range(d))
    return FanoutPlan(tuple(hosts), d, tuple(tuple(s) for s in stripes), parents)


def push_targets(p: FanoutPlan, stripe: int) -> List[str]:
    """Where the control node sends a stripe, in order: its tree's root, then the tree's other
    interior hosts (breadth-first), then the rest: a target that stops answering hands its stripe
    to the next one."""
    interior = [h for h in p.hosts if p.children(stripe, h) or p.parents[stripe][h] is None]
    order = sorted(interior, key=lambda h: len(p.ancestors(stripe, h)))
    return order + [h for h in p.hosts if h not in order]


def predicted_stage_copies(p: FanoutPlan) -> float:
    """The stage time in units of one copy at link rate, on equal links with pipelining by
    shard: each stripe flows at 1/d of the rate, one shard of it per hop of its tree."""
    worst = 0.0
    for j, paths in enumerate(p.stripes):
        n = max(1, len(paths))
        worst = max(worst, (n + p.depth(j) - 1) / n)
    return worst


# --------------------------------------------------------------------------------------------------
# Progress, as the run and `gpuserve status` print it, from the agents' progress files
# --------------------------------------------------------------------------------------------------


def progress_line(doc: Mapping[str, Any], now: float) -> str:
    """``412.0 MiB / 1.0 GiB (40%), 12.3 MiB/s, ETA 48 s`` from one host's progress file. The rate
    is the agent's over its last 30 s (``rate_bps``); an older file's, since the agent started."""
    total, done = doc.get("total_bytes", 0), doc.get("done_bytes", 0)
    if "rate_bps" in doc:
        rate = float(doc["rate_bps"])
    else:
        moved = max(0, done - doc.get("linked_bytes", 0))
        rate = moved / max(1e-3, now - doc.get("started", now))
    left = total - done
    eta = "done" if left <= 0 else (f"ETA {left / rate:.0f} s" if rate > 0 else "ETA ?")
    pct = 100 * done / total if total else 100
    return f"{human(done)} / {human(total)} ({pct:.0f}%), {human(rate)}/s, {eta}"


def fleet_line(docs: Mapping[str, Mapping[str, Any]], expected: int, now: float) -> str:
    """``fleet: 3/8 host(s) done, ...``: the hosts' files summed (rates too)."""
    agg: Dict[str, Any] = {
        "total_bytes": sum(d.get("total_bytes", 0) for d in docs.values()),
        "done_bytes": sum(d.get("done_bytes", 0) for d in docs.values()),
        "linked_bytes": sum(d.get("linked_bytes", 0) for d in docs.values()),
        "started": min((d.get("started", now) for d in docs.values()), default=now)}
    if docs and all("rate_bps" in d for d in docs.values()):
        agg["rate_bps"] = sum(d["rate_bps"] for d in docs.values() if d.get("state") == "running")
    finished = sum(1 for d in docs.values() if d.get("state") == "complete")
    return f"fleet: {finished}/{expected} host(s) done, {progress_line(agg, now)}"
