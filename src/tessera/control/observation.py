"""One deployment's pass lock and the one observation of the agents its holder shares.

`Pass(Observation(refs, ...))` pairs the lock with an `Observation`: within `async with
p.held() as obs`, the first `await obs.get()` asks the agents for `Describe`
(`agents.observe_replies`) and later gets of that pass return the same `observed.Observed`
(`replies()`: the raw replies). An actuator that changed the agents calls `obs.acted()`, so
the next `get` observes again. `held(keep=True)` keeps an observation younger than
`max_age_s` that no actuator invalidated (the operator's separate timers share it); `refs`
may change (`retarget`). Callers: `tessera up` (`cli/up_cmd`, `cli/up_overload`), the
operator (`reconciler`, `overload_loop`, `scaling_tick`, `autoscale_tick`),
`converge.converge`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from tessera import observed
from tessera.control import agents
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb

Observe = Callable[[Sequence[agents.AgentRef]], Awaitable[observed.Observed]]


class Observation:
    """The agents `refs` as observed in the current pass (module docstring). `observe`
    replaces the `Describe` round (tests; it yields no raw replies); `channels` are the
    kept channels it asks over (None: a channel per call)."""

    def __init__(
        self,
        refs: Sequence[agents.AgentRef],
        observe: Observe | None = None,
        channels: agents.Channels | None = None,
        max_age_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        tls: transport.TlsFiles | None,
    ) -> None:
        self.refs = tuple(refs)
        self.tls = channels.tls if channels is not None else tls
        self._observe = observe
        self.channels = channels
        self.max_age_s, self._clock = max_age_s, clock
        self._now: observed.Observed | None = None  # this pass's, until an actuator acted
        self._replies: dict[str, pb.DescribeReply] = {}
        self._at = 0.0
        self.latest: observed.Observed | None = None
        self.observations = 0  # `Describe` rounds made (one per agent each)

    async def get(self) -> observed.Observed:
        if self._now is None:
            if self._observe is not None:
                self._now, self._replies = await self._observe(self.refs), {}
            else:
                stub_for = self.channels.stub if self.channels is not None else None
                self._now, self._replies = await agents.observe_replies(
                    self.refs, stub_for=stub_for, tls=self.tls
                )
            self._at = self._clock()
            self.latest = self._now
            self.observations += 1
        return self._now

    async def replies(self) -> Mapping[str, pb.DescribeReply]:
        """The `Describe` replies of the observation `get` returns, by agent address
        (agents that did not answer are absent)."""
        await self.get()
        return dict(self._replies)

    def acted(self) -> None:
        """The agents changed (an actuator ran): the next `get` observes again."""
        self._now = None

    def retarget(self, refs: Sequence[agents.AgentRef]) -> None:
        """Observe `refs` from now on (discovery changed them: observe afresh)."""
        if tuple(refs) != self.refs:
            self.refs = tuple(refs)
            self._now = None

    def fresh(self) -> bool:
        """An observation is held that no actuator invalidated, younger than `max_age_s`."""
        return self._now is not None and self._clock() - self._at < self.max_age_s


class Pass:
    """A deployment's pass lock and its shared `Observation`: a converge pass and the
    loops' ticks take the lock, so they never interleave."""

    def __init__(self, observation: Observation) -> None:
        self.lock = asyncio.Lock()
        self.observation = observation

    @contextlib.asynccontextmanager
    async def held(self, keep: bool = False) -> AsyncIterator[Observation]:
        """Hold the lock for one pass; the observation starts empty (time has passed)
        unless `keep` and it is still fresh (`Observation.fresh`)."""
        async with self.lock:
            if not (keep and self.observation.fresh()):
                self.observation.acted()
            yield self.observation
