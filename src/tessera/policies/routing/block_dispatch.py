"""Which instance of a block serves a request next: the KV-cache owner first (BlockLLM §5).

A block may run as several instances (replicas of a hot shared block, or the same block in
several variants' chains), each with its queue and batch limit; a request's KV stays on the
instance it ran on. The rule: the instance holding the request's KV while its batch has room;
otherwise the lowest estimated latency: queueing (tokens ahead / throughput) + compute (its
tokens / throughput) + transfer (its KV bytes over the link, zero on the owner; an instance with
`receives_kv=False` pays recomputing its `kv_tokens` instead). Estimates within `tolerance`
(relative) are equal; among those the lowest `rank` wins (fewer in flight, then least recently
picked), so equal idle instances share sequential traffic. Pure: frozen dataclasses in, a
`Dispatch` out. Called by the simulator (`tessera.sim.blockllm`) and, through
`policies.routing.kv_dispatch`, by the gateway (`tessera.gateway.kv_affinity`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockInstance:
    """One instance of a block as the dispatcher sees it now."""

    id: str
    running: int  # requests in its current batch
    batch_limit: int  # most requests per batch
    queued_tokens: int  # tokens waiting in its queue
    tokens_per_s: float  # measured (or modelled) throughput
    link_bytes_per_s: float = float("inf")  # bandwidth from the KV owner to it
    receives_kv: bool = True  # False: the KV cannot be moved here, it is recomputed

    def __post_init__(self) -> None:
        if self.batch_limit < 1:
            raise ValueError(f"{self.id}: batch_limit must be >= 1")
        if self.tokens_per_s <= 0 or self.link_bytes_per_s <= 0:
            raise ValueError(f"{self.id}: throughput and link bandwidth must be positive")

    @property
    def has_room(self) -> bool:
        return self.running < self.batch_limit


@dataclass(frozen=True)
class Dispatch:
    instance: str
    reason: str  # "kv-owner" or "lowest-latency"
    estimated_s: float
    moves_kv: bool


def estimate_s(
    inst: BlockInstance, tokens: int, kv_bytes: int, owner: str | None, kv_tokens: int = 0
) -> float:
    """Queueing + compute + KV transfer time of `tokens` of a request on `inst` (transfer:
    moving `kv_bytes`, or recomputing `kv_tokens` where the KV cannot be received)."""
    if owner in (None, inst.id):
        transfer = 0.0
    elif inst.receives_kv:
        transfer = kv_bytes / inst.link_bytes_per_s
    else:
        transfer = kv_tokens / inst.tokens_per_s
    wait = inst.queued_tokens / inst.tokens_per_s
    if not inst.has_room:  # waits for a batch slot too: at least one more step's worth
        wait += tokens / inst.tokens_per_s
    return wait + tokens / inst.tokens_per_s + transfer


def choose(
    instances: Sequence[BlockInstance],
    tokens: int,
    kv_bytes: int,
    owner: str | None,
    kv_tokens: int = 0,
    tolerance: float = 0.0,
    rank: Mapping[str, tuple[int, ...]] | None = None,
) -> Dispatch:
    """The instance for a request of `tokens` tokens whose KV (`kv_bytes`, `kv_tokens`
    tokens) lives on `owner`; see the module docstring for `tolerance` and `rank`."""
    if not instances:
        raise ValueError("no instance of the block is serving")
    if tolerance < 0:
        raise ValueError("tolerance: must be >= 0")
    by_id = {i.id: i for i in instances}
    if owner is not None and owner in by_id and by_id[owner].has_room:
        o = by_id[owner]
        return Dispatch(o.id, "kv-owner", estimate_s(o, tokens, kv_bytes, owner), False)
    est = {i.id: estimate_s(i, tokens, kv_bytes, owner, kv_tokens) for i in instances}
    low = min(est.values())
    near = [i for i in instances if est[i.id] <= low * (1.0 + tolerance)]
    order = rank or {}
    best = min(near, key=lambda i: (order.get(i.id, ()), est[i.id], i.id))
    return Dispatch(best.id, "lowest-latency", est[best.id], owner is not None and best.id != owner)
