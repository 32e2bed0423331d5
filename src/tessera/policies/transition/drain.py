"""Which in-flight requests on leaving replicas finish there and which move, and where.

Leaving replicas (named by the old routes, not the new) take no new requests, but their running
requests must not be lost. `decide` is the rule the gateway's cut-over
(`tessera.gateway.cutover`) applies every tick: a request expected to finish before the drain
deadline (tokens left at its decode rate, plus a margin) drains; a longer one moves (its KV
prefix copied to a survivor, `kv_move.move_prefix`, the stream continuing there); one with no
token yet moves at once, nothing copied, to the least loaded survivor (room or not: it has
no KV yet); after the deadline everything moves. A started request's target must hold its
whole sequence in free KV pages; among those the least loaded after this tick's moves wins
(ties by id). A started request no survivor can hold is `stranded`: it drains while its
replica lives and is retried next tick. Frozen dataclasses in
and out; no I/O, no clock (the caller passes elapsed times).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_TOKENS_PER_S = 10.0  # decode rate assumed before a request produced two tokens


@dataclass(frozen=True)
class InFlight:
    """One request running on a leaving replica, as the gateway sees it."""

    request_id: str
    replica_id: str  # the leaving replica it runs on
    tokens: int  # prompt + tokens generated so far (the prefix a move would copy)
    remaining: int  # tokens it may still generate (max_tokens left)
    tokens_per_s: float = 0.0  # its observed decode rate; 0: not known yet
    started: bool = True  # it has produced a token (False: queued or in its prefill)

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.remaining < 0 or self.tokens_per_s < 0:
            raise ValueError(f"{self.request_id}: tokens, remaining and rate must be >= 0")


@dataclass(frozen=True)
class Survivor:
    """A replica of the new version that may take moved requests."""

    replica_id: str
    free_pages: int  # KV pages it can still allocate
    page_size: int  # tokens per KV page
    in_flight: int = 0  # requests it is already serving

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.free_pages < 0 or self.in_flight < 0:
            raise ValueError(f"{self.replica_id}: page_size > 0, free_pages and in_flight >= 0")


@dataclass(frozen=True)
class DrainConfig:
    """The deadline and the margins of the rule (validated)."""

    deadline_s: float  # requests must be off the leaving replicas by then
    elapsed_s: float  # time since the cut-over
    safety: float = 1.5  # a request drains if remaining / rate * safety fits what is left
    default_tokens_per_s: float = DEFAULT_TOKENS_PER_S

    def __post_init__(self) -> None:
        if self.deadline_s < 0 or self.elapsed_s < 0:
            raise ValueError("deadline_s and elapsed_s: must be >= 0")
        if self.safety < 1 or self.default_tokens_per_s <= 0:
            raise ValueError("safety: must be >= 1; default_tokens_per_s: must be > 0")

    @property
    def left_s(self) -> float:
        return max(0.0, self.deadline_s - self.elapsed_s)


@dataclass(frozen=True)
class Move:
    """Copy `request_id`'s KV prefix from `source` to `target` and continue it there."""

    request_id: str
    source: str
    target: str
    tokens: int  # prefix length to copy


@dataclass(frozen=True)
class Decision:
    """What to do this tick; every request given appears in exactly one field."""

    drain: tuple[str, ...] = ()  # request ids left to finish where they run
    moves: tuple[Move, ...] = ()
    stranded: tuple[str, ...] = field(default=())  # must move, but no survivor holds them


def expected_s(req: InFlight, cfg: DrainConfig) -> float:
    """Seconds `req` still needs at its observed (or the default) decode rate."""
    rate = req.tokens_per_s if req.tokens_per_s > 0 else cfg.default_tokens_per_s
    return req.remaining / rate


def decide(
    requests: Sequence[InFlight], survivors: Sequence[Survivor], cfg: DrainConfig
) -> Decision:
    """Drain or move each request (module docstring); deterministic for equal inputs."""
    left = cfg.left_s
    drain: list[str] = []
    must_move: list[InFlight] = []
    queued: list[InFlight] = []
    for req in requests:
        if not req.started:
            queued.append(req)
        elif left > 0 and expected_s(req, cfg) * cfg.safety <= left:
            drain.append(req.request_id)
        else:
            must_move.append(req)
    free = {s.replica_id: s.free_pages for s in survivors}
    load = {s.replica_id: s.in_flight for s in survivors}
    page = {s.replica_id: s.page_size for s in survivors}
    moves: list[Move] = []
    stranded: list[str] = []
    for req in sorted(queued, key=lambda r: r.request_id):
        if not load:  # no survivor: it waits where it is
            drain.append(req.request_id)
            continue
        target = min(load, key=lambda rid: ((load[rid] + 1) / (free[rid] + 1), rid))
        load[target] += 1
        moves.append(Move(req.request_id, req.replica_id, target, 0))
    # longest first: they gain most from a move and are the hardest to place
    for req in sorted(must_move, key=lambda r: (-(r.tokens + r.remaining), r.request_id)):
        need = {rid: math.ceil((req.tokens + req.remaining) / page[rid]) for rid in free}
        fits = [rid for rid in free if need[rid] <= free[rid]]
        if not fits:
            stranded.append(req.request_id)
            continue
        target = min(fits, key=lambda rid: ((load[rid] + 1) / (free[rid] + 1), rid))
        free[target] -= need[target]
        load[target] += 1
        moves.append(Move(req.request_id, req.replica_id, target, req.tokens))
    return Decision(tuple(drain), tuple(moves), tuple(stranded))
