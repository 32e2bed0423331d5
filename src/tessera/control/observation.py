"""One deployment's pass lock and the one observation of the agents its holder shares.

`Pass` pairs the deployment's lock with an `Observation`: `async with p.held() as obs`
takes the lock and starts a pass with nothing observed; within it `await obs.get()` asks
the agents for `Describe` once (`agents.observe`) and every later `get` of that pass — the
converge pass's, then a loop tick's scheduled in the same holding — returns the same
`observed.Observed`. An actuator that changed the agents calls `obs.acted()`, and the next
`get` observes again (level-triggered: what a pass reports is what the agents hold after
it acted). `latest` is the last observation made, for a reader that needs no fresh one.
Callers: `tessera up` (`cli/up_cmd`, `cli/up_overload`: the converge pass, the overload
and the scaling ticks), `converge.converge` (its `observation` argument).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from tessera import observed
from tessera.control import agents

Observe = Callable[[Sequence[agents.AgentRef]], Awaitable[observed.Observed]]


class Observation:
    """The agents `refs` as observed in the current pass (module docstring)."""

    def __init__(self, refs: Sequence[agents.AgentRef], observe: Observe = agents.observe) -> None:
        self.refs = tuple(refs)
        self._observe = observe
        self._now: observed.Observed | None = None  # this pass's, until an actuator acted
        self.latest: observed.Observed | None = None
        self.observations = 0  # `Describe` rounds made (one per agent each)

    async def get(self) -> observed.Observed:
        if self._now is None:
            self._now = await self._observe(self.refs)
            self.latest = self._now
            self.observations += 1
        return self._now

    def acted(self) -> None:
        """The agents changed (an actuator ran): the next `get` observes again."""
        self._now = None


class Pass:
    """A deployment's pass lock and its shared `Observation`: a converge pass and the
    loops' ticks take the lock, so they never interleave."""

    def __init__(self, refs: Sequence[agents.AgentRef], observe: Observe = agents.observe) -> None:
        self.lock = asyncio.Lock()
        self.observation = Observation(refs, observe)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Observation]:
        """Hold the lock for one pass; the observation starts empty (time has passed)."""
        async with self.lock:
            self.observation.acted()
            yield self.observation
