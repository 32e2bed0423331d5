"""The reason and message of one reconcile pass, from what it saw: the status ladder.

Pure. Input: `PassFacts` (the first failed action, the transition's blocked reason, the
unreachable agents, the next step, the replicas loaded and planned). Output: (reason,
message), in this order of precedence: a failed action (`InsufficientCapacity` for
RESOURCE_EXHAUSTED, `AgentUnreachable` for UNAVAILABLE / DEADLINE_EXCEEDED, else
`LoadFailed`), a blocked transition (its own reason), an unreachable agent, a step left
(`Switching` while a generation serves, else `Loading`), replicas still loading
(`Loading`), else `Serving`. Caller: `tessera.control.converge.converge` (the operator
and `tessera up`); `status.build` turns the reason into conditions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Failed:
    code: str  # gRPC status code name
    action: str  # the action, described
    message: str


@dataclass(frozen=True)
class Down:
    name: str
    address: str
    error: str


@dataclass(frozen=True)
class PassFacts:
    failed: Failed | None = None
    blocked: tuple[str, str] | None = None  # (reason, message) of a stalled transition
    down: Sequence[Down] = ()
    next_step: str = ""  # the next step's action, described ("" when none is left)
    generation: int = 0
    mode: str = ""
    steps_left: int = 0
    serving: bool = False  # a generation serves
    ready: int = 0
    planned: int = 0
    source: str = ""


def failure_reason(code: str) -> str:
    if code == "RESOURCE_EXHAUSTED":
        return "InsufficientCapacity"
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return "AgentUnreachable"
    return "LoadFailed"


def reason(f: PassFacts) -> tuple[str, str]:
    """(reason, message) of the pass (module docstring)."""
    if f.failed is not None:
        return failure_reason(
            f.failed.code
        ), f"{f.failed.action}: {f.failed.code}: {f.failed.message}"
    if f.blocked is not None:
        return f.blocked
    if f.down:
        return "AgentUnreachable", "; ".join(
            f"agent {a.name} ({a.address}): {a.error}" for a in f.down
        )
    if f.next_step:
        return "Switching" if f.serving else "Loading", (
            f"generation {f.generation} ({f.mode}), {f.steps_left} steps left; next: {f.next_step}"
        )
    if f.ready < f.planned:
        return "Loading", f"{f.ready}/{f.planned} replicas loaded"
    return "Serving", f"{f.planned} replicas serving ({f.source}, generation {f.generation})"
