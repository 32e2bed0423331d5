"""The one way a control loop's kopf timer is registered on the operator.

`register_timer` adds a timer every `interval` seconds (first after `interval`) per
ServingDeployment that calls `tick(body, patch, memo, cfg)` unless the timer is stopping
or the object is being deleted. Called by the loops' `register` functions
(`switching_loop`, `overload_loop`, `scaling_tick`, `autoscale_tick`), which
`handlers.build_registry` calls. `deployment(body)` is what each tick reads first;
`from_gateway` reads the gateway, warning once while it cannot.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import kopf

from tessera import api, fields
from tessera_operator import config

T = TypeVar("T")
Tick = Callable[[kopf.Body, kopf.Patch, kopf.Memo, config.OperatorConfig], Awaitable[None]]


def register_timer(
    registry: kopf.OperatorRegistry,
    resource: tuple[str, str, str],
    name: str,
    interval: float,
    tick: Tick,
    cfg: config.OperatorConfig,
) -> None:
    """Add the timer `name` (its kopf handler id) that runs `tick` every `interval` s."""

    async def timer(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kw: Any) -> None:
        if not kw["stopped"] and not body.metadata.get("deletionTimestamp"):
            await tick(body, patch, memo, cfg)

    timer.__name__ = timer.__qualname__ = name
    kopf.timer(*resource, id=name, interval=interval, initial_delay=interval, registry=registry)(
        timer
    )


def deployment(body: kopf.Body) -> api.ServingDeployment | None:
    """The timer's object parsed; None where its spec is invalid (the reconciler reports it)."""
    try:
        return api.parse(copy.deepcopy(dict(body)))
    except fields.FieldError:
        return None


async def from_gateway(
    body: kopf.Body, memo: kopf.Memo, warned_key: str, reason: str, read: Awaitable[T]
) -> T | None:
    """`read` (a gateway fetch) awaited; where it raises ValueError (unreachable, unusable),
    a warning event `reason` once until a read succeeds again (`memo[warned_key]`), and None."""
    try:
        got = await read
    except ValueError as exc:
        if not memo.get(warned_key):
            kopf.warn(body, reason=reason, message=str(exc))
            memo[warned_key] = True
        return None
    memo.pop(warned_key, None)
    return got
