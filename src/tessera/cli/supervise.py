"""Supervision of `tessera up`'s local agents: a dead agent is restarted on its old port.

`Supervisor.check()` looks at every child started by `tessera up` (or by the chaos bench);
one that exited is started again with the same id, devices, threads and port, so the
addresses the plan, the stage links and the gateway hold stay valid, when the pure
`tessera.policies.serving.restart` allows (immediately, then with back-off for one that keeps
dying). The caller then re-converges at once (`wait` returns early), which reloads the
restarted agent's blocks with the operator's reconcile core; the gateway's replica poll
sees them ready again. Local mode only: in a cluster the DaemonSet restarts agents and
the operator reconciles their blocks back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tessera.cli import local_agents
from tessera.policies.serving import restart

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    devices: str
    threads: int
    port: int
    restarts: tuple[float, ...] = ()
    down_since: float | None = None


@dataclass
class Supervisor:
    """Restarts dead agents in `procs` (the list is updated in place)."""

    procs: list[local_agents.AgentProcess]
    devices: str
    threads: int
    say: Callable[[str], None] = print
    policy: restart.RestartPolicy = field(default_factory=restart.RestartPolicy)
    poll_s: float = 0.2
    extra_args: tuple[str, ...] = ()
    nice: int = 0  # a restarted agent's niceness, as the first's (`tessera up --agent-nice`)
    _slots: dict[str, _Slot] = field(default_factory=dict)
    restarted: asyncio.Event = field(default_factory=asyncio.Event)
    deaths: int = 0
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        for p in self.procs:
            port = int(p.address.rsplit(":", 1)[1])
            self._slots[p.agent_id] = _Slot(self.devices, self.threads, port)

    def _restart(self, i: int, now: float) -> None:
        old = self.procs[i]
        slot = self._slots[old.agent_id]
        decision = restart.decide(self.policy, slot.restarts, now)
        if not decision.restart_now:
            return
        host = old.address.rsplit(":", 1)[0]
        try:
            new = local_agents.start_agent(
                old.agent_id,
                slot.devices,
                slot.threads,
                host=host,
                port=slot.port,
                extra_args=self.extra_args,
                nice=self.nice,
            )
        except RuntimeError as exc:
            slot.restarts = (*slot.restarts, now)
            self.say(f"agent {old.agent_id}: restart {decision.attempt} failed: {exc}")
            return
        slot.restarts = (*slot.restarts, now)
        down = now - slot.down_since if slot.down_since is not None else 0.0
        slot.down_since = None
        self.procs[i] = new
        self.say(
            f"agent {old.agent_id} restarted at {new.address} after {down:.1f}s down "
            f"(restart {decision.attempt}); reloading its blocks"
        )
        self.restarted.set()

    def check(self) -> list[str]:
        """Restart the agents that exited; returns the ids of those restarted now.

        Blocks while an agent starts (seconds): the caller runs it in a thread."""
        done = []
        for i, p in enumerate(list(self.procs)):
            if p.proc.poll() is None:
                continue
            slot = self._slots[p.agent_id]
            now = time.monotonic()
            if slot.down_since is None:
                slot.down_since = now
                self.deaths += 1
                self.say(f"agent {p.agent_id} exited with code {p.proc.returncode}")
            self._restart(i, now)
            if self.procs[i] is not p:
                done.append(p.agent_id)
        return done

    async def run(self) -> None:
        """Check every `poll_s` seconds until cancelled."""
        while True:
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # the supervisor must outlive any one failure
                log.exception("agent supervision failed; retrying")
            await asyncio.sleep(self.poll_s)


async def wait_any(events: Sequence[asyncio.Event], timeout_s: float) -> None:
    """Until any of `events` is set, or `timeout_s` seconds."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w


async def wait(stop: asyncio.Event, interval_s: float, supervisor: Supervisor | None) -> None:
    """Until `stop`, `interval_s` seconds, or an agent restart (then re-converge at once)."""
    await wait_any([stop, *([supervisor.restarted] if supervisor else [])], interval_s)
    if supervisor is not None:
        supervisor.restarted.clear()


def start(
    procs: list[local_agents.AgentProcess],
    devices: str,
    threads: int,
    say: Callable[[str], None] = print,
    extra_args: tuple[str, ...] = (),
    nice: int = 0,
) -> Supervisor | None:
    """Supervise `procs` in the running loop (None when there are no local agents);
    `extra_args` and `nice` go to every restarted agent, as to the first (e.g.
    `--model-root`)."""
    if not procs:
        return None
    sup = Supervisor(procs, devices, threads, say, extra_args=extra_args, nice=nice)
    sup.task = asyncio.get_running_loop().create_task(sup.run())
    return sup


async def stop(supervisor: Supervisor | None) -> None:
    """Stop supervising (before the agents are stopped, so none is restarted)."""
    if supervisor is None or supervisor.task is None:
        return
    supervisor.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await supervisor.task
    supervisor.task = None
