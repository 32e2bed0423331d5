"""The asyncio event loop of every serving process: uvloop when installed, else asyncio's.

Called by `tessera up`, `tessera gateway` and `tessera agent` (`run` instead of
`asyncio.run`). The gateway and the agents spend their loop time on many small callbacks
(an SSE write and a gRPC message per token per request, task wake-ups); uvloop runs the
loop, its timers and socket transports in C (libuv), as uvicorn and vLLM's server do, which
leaves more of a shared CPU to the model. grpc.aio and aiohttp both run on it. Set
`TESSERA_EVENT_LOOP=asyncio` to force the standard loop (to compare, or to debug).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
ENV = "TESSERA_EVENT_LOOP"


def kind() -> str:
    """ "uvloop" or "asyncio": the loop `run` starts in this process."""
    if os.environ.get(ENV, "").strip().lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:  # an optional speed-up: not on every platform
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `kind()` names."""
    if kind() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
