"""The one way a control loop's kopf timer is registered on the operator.

`register_timer` adds a timer every `interval` seconds (first after `interval`) per
ServingDeployment that calls `tick(body, patch, memo, cfg)` unless the timer is stopping
or the object is being deleted. Called by the loops' `register` functions
(`switching_loop`, `overload_loop`, `scaling_tick`, `autoscale_tick`), which
`handlers.build_registry` calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from tessera_operator import config

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
