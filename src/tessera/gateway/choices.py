"""The `n` choices of one request, run concurrently, as one stream of indexed text events.

Called by `app.py`: each choice is its own `text_stream.TextGeneration` (its own agent
request, seed + index when a seed is given). `events()` restarts a choice whose replica
was lost before it produced any text (as a single request does), and `merged()`
interleaves the choices' events as they come; an error in any choice ends the merge and
cancels the others (their agent calls are cancelled, which frees their KV pages).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from tessera.gateway import dispatch, text_stream


@dataclass(frozen=True)
class IndexedEvent:
    index: int
    event: text_stream.TextEvent


async def events(gen: text_stream.TextGeneration) -> AsyncGenerator[text_stream.TextEvent, None]:
    """`gen`'s events; a replica lost before the first event starts the choice over."""
    lost: set[str] = set()
    while True:
        stream = gen.events(frozenset(lost))
        try:
            first = await anext(stream, None)
        except dispatch.ReplicaLost as exc:  # tokens came but no text yet: start over
            lost.add(exc.replica_id)
            await stream.aclose()
            continue
        break
    async with contextlib.aclosing(stream):
        if first is None:
            return
        yield first
        async for ev in stream:
            yield ev


async def merged(
    gens: Sequence[text_stream.TextGeneration],
) -> AsyncGenerator[IndexedEvent, None]:
    """Every choice's events, interleaved as they arrive, until all choices finished."""
    if len(gens) == 1:  # the common case: no tasks, no queue
        async with contextlib.aclosing(events(gens[0])) as only:
            async for ev in only:
                yield IndexedEvent(0, ev)
        return
    queue: asyncio.Queue[tuple[int, text_stream.TextEvent | None, Exception | None]]
    queue = asyncio.Queue()

    async def pump(i: int, gen: text_stream.TextGeneration) -> None:
        try:
            async with contextlib.aclosing(events(gen)) as evs:
                async for ev in evs:
                    await queue.put((i, ev, None))
            await queue.put((i, None, None))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((i, None, exc))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        live = len(tasks)
        while live:
            i, got, exc = await queue.get()
            if exc is not None:
                raise exc
            if got is None:
                live -= 1
                continue
            yield IndexedEvent(i, got)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
