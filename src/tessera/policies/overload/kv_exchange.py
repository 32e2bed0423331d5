"""Which bytes move when a drop is applied or restored, in what chunks, in what order.

KunServe §4.2 (coordinated KV exchange) and §4.4 (restore). Input: a group of the drop
plan (`drop_plan.Group`: the pipeline stages), the layers each member held before the
drop, the running requests (where their KV is, how many tokens), the KV bytes of one
token in one layer, the link bandwidth and one stage step's seconds. Output: `Transfer`s
(a request's KV for a run of layers, or a run of parameters, from one member to another,
cut into chunks), and `next_transfer`, the arbiter that picks what goes on a link next.
Called by the live executor (operator actuator / agent transfer loop) when it lands, and
by `tessera bench overload`.

Decisions:
- Drop: a running request's KV lives on the member that served it whole; after the drop,
  each stage's member needs that request's KV for the stage's layers. One transfer per
  (request, stage on another member), for the layers the source held.
- Restore: each member pulls back the parameters of the layers it dropped from the member
  that kept them; running requests get a home member (the least loaded by KV bytes, so
  the group's requests spread evenly) and gather their KV for all layers there.
- Requests with the least KV move first (shortest job first: the mean stall of the
  requests waiting for their KV is smallest).
- Chunks take about one stage step on the link (bandwidth x step seconds, whole pages,
  at least one page), so a pending activation never waits longer than one chunk.
- Priority on a link: activations, then KV chunks, then parameter chunks (restore pulls
  run below activations, as the paper's coordinated transfer does).
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
