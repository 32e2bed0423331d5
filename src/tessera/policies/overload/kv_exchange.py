"""Which bytes move when a drop is applied or restored, in what chunks, in what order.

KunServe §4.2 (coordinated KV exchange) and §4.4 (restore). Input: a drop-plan group, the
layers each member held before, the running requests (where their KV is, how many tokens), KV
bytes per token per layer, link bandwidth and one stage step's seconds. Output: `Transfer`s
(a request's KV or a run of parameters between members, in chunks) and `next_transfer`, the
link arbiter. Drop: one transfer per (request, stage on another member). Restore: members pull
back dropped parameters; running requests gather their KV on a home member (the least loaded by
KV bytes). Least KV moves first (shortest job first); chunks take about one stage step on the
link (whole pages, at least one), so an activation waits at most one chunk; link priority is
activations, then KV, then parameters. Called by the live executor and `tessera bench overload`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera.policies.overload import drop_plan

PRIORITY = {"activation": 0, "kv": 1, "params": 2}


@dataclass(frozen=True)
class RunningRequest:
    request: str
    member: str  # where its KV is: the member that served it (drop) or its home (restore)
    tokens: int  # tokens in its KV cache


@dataclass(frozen=True)
class Transfer:
    kind: str  # "kv" | "params"
    request: str  # "" for parameters
    source: str
    target: str
    start: int  # layers [start, end)
    end: int
    bytes: int
    chunks: tuple[int, ...]  # chunk sizes, summing to bytes


@dataclass(frozen=True)
class Pending:
    """Something waiting for a link: an activation, or a chunk of a transfer."""

    kind: str  # "activation" | "kv" | "params"
    seq: int  # enqueue order
    nbytes: int


def chunk_bytes(bandwidth_bytes_per_s: float, stage_step_s: float, page_bytes: int) -> int:
    """Bytes a link moves in about one stage step, in whole pages, at least one page."""
    if page_bytes < 1 or not bandwidth_bytes_per_s > 0 or stage_step_s < 0:
        raise ValueError("need page_bytes >= 1, bandwidth > 0 and stage_step_s >= 0")
    pages = int(bandwidth_bytes_per_s * stage_step_s) // page_bytes
    return max(1, pages) * page_bytes


def _chunks(total: int, chunk: int) -> tuple[int, ...]:
    full, rest = divmod(total, chunk)
    return (chunk,) * full + ((rest,) if rest else ())


def _runs(layers: Sequence[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in sorted(layers):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def exchange_for_drop(
    group: drop_plan.Group,
    held_before: Mapping[str, frozenset[int]],
    running: Sequence[RunningRequest],
    kv_bytes_per_token_layer: int,
    chunk: int,
) -> tuple[Transfer, ...]:
    """KV each running request needs on the stages of other members after the drop."""
    out: list[Transfer] = []
    for r in sorted(running, key=lambda r: (r.tokens, r.request)):
        if r.member not in group.members:
            continue
        for s in group.stages:
            if s.replica == r.member:
                continue
            have = [i for i in range(s.start, s.end) if i in held_before[r.member]]
            for a, b in _runs(have):
                n = r.tokens * kv_bytes_per_token_layer * (b - a)
                out.append(
                    Transfer("kv", r.request, r.member, s.replica, a, b, n, _chunks(n, chunk))
                )
    return tuple(out)


def restore_homes(group: drop_plan.Group, running: Sequence[RunningRequest]) -> dict[str, str]:
    """A home member per running request: the least loaded by KV tokens (largest first)."""
    load = dict.fromkeys(group.members, 0)
    homes: dict[str, str] = {}
    for r in sorted(running, key=lambda r: (-r.tokens, r.request)):
        home = min(group.members, key=lambda m: (load[m], group.members.index(m)))
        homes[r.request] = home
        load[home] += r.tokens
    return homes


def plan_restore(
    group: drop_plan.Group,
    held_before: Mapping[str, frozenset[int]],
    layer_bytes: Sequence[int],
    running: Sequence[RunningRequest],
    kv_bytes_per_token_layer: int,
    chunk: int,
) -> tuple[Transfer, ...]:
    """Parameters each member pulls back, then each running request's KV gathered at
    its home (`restore_homes`); `running[i].member` is ignored (the KV is spread over the
    stages)."""
    out: list[Transfer] = []
    for m in group.members:
        for s in group.stages:
            if s.replica == m:
                continue
            want = [i for i in range(s.start, s.end) if i in held_before[m]]
            for a, b in _runs(want):
                n = sum(layer_bytes[a:b])
                out.append(Transfer("params", "", s.replica, m, a, b, n, _chunks(n, chunk)))
    homes = restore_homes(group, running)
    for r in sorted(running, key=lambda r: (r.tokens, r.request)):
        for s in group.stages:
            if s.replica == homes[r.request]:
                continue
            n = r.tokens * kv_bytes_per_token_layer * (s.end - s.start)
            out.append(
                Transfer(
                    "kv",
                    r.request,
                    s.replica,
                    homes[r.request],
                    s.start,
                    s.end,
                    n,
                    _chunks(n, chunk),
                )
            )
    return tuple(out)


def next_transfer(pending: Sequence[Pending]) -> Pending | None:
    """What a link sends next: activations first, then KV chunks, then parameter chunks,
    each in enqueue order."""
    return min(pending, key=lambda p: (PRIORITY[p.kind], p.seq), default=None)
