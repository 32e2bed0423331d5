"""Which in-flight requests on leaving replicas finish there and which move, and where.

When the gateway's routes switch to a new version, replicas of the old version that the
new one no longer names are *leaving*: they take no new requests, but requests already
running on them must not be lost. `decide` is the pure rule the gateway's cut-over
controller (`tessera.gateway.cutover`) applies every tick while any replica is leaving:

* a request expected to finish before the drain deadline (its tokens left at its observed
  decode rate, plus a safety margin) stays and **drains** on its replica;
* a longer one **moves**: its computed KV prefix is copied to a surviving replica
  (`kv_move.move_prefix`) and the request continues there (the gateway's mid-stream
  continuation path), so its client's stream goes on where it stopped;
* a request that has no token yet (queued on its replica, or in its prefill) **moves at
  once**, with nothing copied, to the least loaded survivor whatever its free pages: it
  waits there as it waited on its replica, but for a replica that stays (a leaving
  replica under an overload drop would otherwise serve its whole queue before it can
  leave; `tessera bench overload --via operator` measured it);
* once the deadline has passed, every request still on a leaving replica moves;
* a request moves only to a survivor whose free KV pages can hold its whole sequence
  (prompt, generated and remaining tokens); among those, the least loaded after the moves
  already decided this tick (fewest in-flight requests per KV page free, ties by id) wins.
  A request no survivor can hold stays (`stranded`): it drains as long as its replica
  lives, and the caller retries the decision on the next tick.

Inputs and outputs are frozen dataclasses; no I/O, no clock (the caller passes elapsed
times). Tested in `tests/policies/test_drain.py`.
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
