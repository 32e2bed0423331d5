"""Token chunks → text events: incremental detokenization plus stop strings.

Called by the handlers in `app.py`: `events()` for streamed responses, `complete()` for
buffered ones. Both run the same pipeline (dispatch → detokenizer → stop matcher), so a
streamed response concatenates to exactly the buffered text. When a stop string matches,
the generator returns, which closes the dispatch generator and cancels the gRPC call.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from tessera.gateway import detokenize, dispatch, stop_strings


@dataclass(frozen=True)
class TextEvent:
    """New completion text; `finish_reason` ("stop"/"length") is set on the last event."""

    text: str
    finish_reason: str | None = None
    logprobs: tuple[dispatch.TokenLogprob, ...] = ()  # of the tokens since the last event


class TextGeneration:
    """One request's text pipeline; `completion_tokens` counts tokens of the last attempt."""

    def __init__(
        self,
        dispatcher: dispatch.Dispatcher,
        decode: detokenize.Decode,
        job: dispatch.Job,
        stops: Sequence[str],
    ) -> None:
        self._dispatcher = dispatcher
        self._decode = decode
        self.job = job
        self._stops = tuple(stops)
        self.completion_tokens = 0

    async def events(
        self, exclude: frozenset[str] = frozenset()
    ) -> AsyncGenerator[TextEvent, None]:
        """Text deltas as tokens arrive; raises ApiError or dispatch.ReplicaLost."""
        detok = detokenize.IncrementalDetokenizer(self._decode, self.job.prompt_ids)
        matcher = stop_strings.StopMatcher(self._stops)
        self.completion_tokens = 0
        pending: list[dispatch.TokenLogprob] = []  # held back with text not yet emitted
        first = True
        async with contextlib.aclosing(self._dispatcher.generate(self.job, exclude)) as chunks:
            async for chunk in chunks:
                self.completion_tokens += len(chunk.token_ids)
                pending.extend(chunk.logprobs)
                text = matcher.feed(detok.add(chunk.token_ids))
                if chunk.finish_reason is not None and not matcher.stopped:
                    text += matcher.feed(detok.flush())
                    if not matcher.stopped:
                        text += matcher.flush()
                if matcher.stopped:
                    yield TextEvent(text, "stop", tuple(pending))
                    return
                if chunk.finish_reason is not None:
                    yield TextEvent(text, chunk.finish_reason, tuple(pending))
                    return
                if text or first:  # the first token's event even without text (as vLLM)
                    yield TextEvent(text, None, tuple(pending))
                    pending.clear()
                first = False

    async def complete(self) -> TextEvent:
        """The whole completion; a replica lost mid-way restarts it on another replica."""
        lost: set[str] = set()
        while True:
            parts: list[str] = []
            logprobs: list[dispatch.TokenLogprob] = []
            reason: str | None = None
            try:
                async with contextlib.aclosing(self.events(frozenset(lost))) as events:
                    async for ev in events:
                        parts.append(ev.text)
                        logprobs.extend(ev.logprobs)
                        reason = ev.finish_reason or reason
                return TextEvent("".join(parts), reason or "stop", tuple(logprobs))
            except dispatch.ReplicaLost as exc:
                lost.add(exc.replica_id)
