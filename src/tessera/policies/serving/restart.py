"""When to restart a dead local agent: immediately at first, then with growing back-off (pure).

Input: the times (monotonic seconds) of the agent's recent restarts and now. Output: a
`RestartDecision` saying whether to restart now or when to look again. A process that keeps
dying right after start (a bad device flag, a port taken) is retried ever more slowly instead
of spinning; one that ran longer than `stable_s` starts afresh. Called by
`tessera.cli.supervise.Supervisor`, which does the restarting.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    initial_backoff_s: float = 0.0  # the first restart is immediate
    backoff_s: float = 1.0  # after that: 1, 2, 4, ... seconds
    max_backoff_s: float = 30.0
    stable_s: float = 60.0  # restarts older than this are forgotten

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0 or self.backoff_s <= 0:
            raise ValueError("backoffs: initial_backoff_s >= 0 and backoff_s > 0")
        if self.max_backoff_s < self.backoff_s or self.stable_s <= 0:
            raise ValueError("max_backoff_s >= backoff_s and stable_s > 0")


@dataclass(frozen=True)
class RestartDecision:
    restart_now: bool
    not_before: float  # when a restart is allowed (== now when restart_now)
    attempt: int  # restarts within the stable window, this one included


def decide(policy: RestartPolicy, restarts: tuple[float, ...], now: float) -> RestartDecision:
    """Restart an agent that died at or before `now`, given its past restart times?"""
    recent = tuple(t for t in restarts if now - t < policy.stable_s)
    if not recent:
        wait = policy.initial_backoff_s
    else:
        wait = min(policy.max_backoff_s, policy.backoff_s * 2 ** (len(recent) - 1))
    last = recent[-1] if recent else now - wait
    not_before = max(now, last + wait)
    return RestartDecision(not_before <= now, not_before, len(recent) + 1)
