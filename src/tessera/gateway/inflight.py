"""The requests running on each replica, as the cut-over needs to see and steer them.

`dispatch.Dispatcher` registers one `Attempt` per call to a replica's `Generate` (and
unregisters it when the call ends); `cutover.Cutover` reads the attempts on leaving
replicas to decide drain or move (`policies.drain`), and after a KV move calls
`Attempt.redirect(target)`: that cancels the gRPC call, and the dispatcher continues the
request on `target` (its mid-stream continuation path) instead of counting a failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Attempt:
    """One request's call to one replica."""

    request_id: str
    replica_id: str
    prompt_ids: tuple[int, ...]  # this attempt's prompt (a continuation's includes tokens)
    max_tokens: int  # this attempt's budget
    started: float  # monotonic time the call was made
    generated: list[int] = field(default_factory=list)  # tokens this attempt yielded
    first_token_at: float | None = None
    last_token_at: float | None = None
    call: Any = None  # the grpc.aio call, cancelled by `redirect`
    moving: bool = False  # a move was decided; the cut-over owns it now
    target: str | None = None  # set by `redirect`: continue there
    trace_parent: str = ""  # the attempt's span (tracing on): a KV move joins its trace

    @property
    def tokens(self) -> tuple[int, ...]:
        """The sequence whose KV the replica holds: prompt + generated."""
        return self.prompt_ids + tuple(self.generated)

    @property
    def remaining(self) -> int:
        return max(0, self.max_tokens - len(self.generated))

    def tokens_per_s(self) -> float:
        """Observed decode rate since the first token (0 before two tokens)."""
        if self.first_token_at is None or self.last_token_at is None:
            return 0.0
        span = self.last_token_at - self.first_token_at
        return (len(self.generated) - 1) / span if span > 0 and len(self.generated) > 1 else 0.0

    def observe(self, ids: Iterable[int], now: float) -> None:
        self.generated.extend(ids)
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now

    def redirect(self, target: str) -> bool:
        """Stop this call and continue the request on `target`; False if it already ended."""
        self.target = target
        return bool(self.call is not None and self.call.cancel())


class InFlightTable:
    """Attempts by replica; one per running Generate call."""

    def __init__(self) -> None:
        self._by_replica: dict[str, set[Attempt]] = {}

    def add(self, attempt: Attempt) -> None:
        self._by_replica.setdefault(attempt.replica_id, set()).add(attempt)

    def remove(self, attempt: Attempt) -> None:
        group = self._by_replica.get(attempt.replica_id)
        if group is None:
            return
        group.discard(attempt)
        if not group:
            del self._by_replica[attempt.replica_id]

    def replica_ids(self) -> list[str]:
        return sorted(self._by_replica)

    def on(self, replica_id: str) -> list[Attempt]:
        return sorted(self._by_replica.get(replica_id, ()), key=lambda a: a.request_id)

    def count(self, replica_id: str) -> int:
        return len(self._by_replica.get(replica_id, ()))
