"""Incremental detokenization: text deltas from a growing token list, never splitting a char.

Called by `text_stream.py` for every token chunk an agent streams. Decoding one token at a
time is wrong twice over: byte-level tokens may hold part of a multi-byte UTF-8 character,
and SentencePiece-style decoders drop the leading space of the first token they see. So
we decode a small window twice — `ids[prefix:read]` (already emitted) and `ids[prefix:]` —
and emit the difference, unless it ends in U+FFFD (an incomplete character: wait for more
tokens). The window starts with the last few prompt tokens so the first completion token
is decoded in context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
PROMPT_CONTEXT = 5  # prompt tokens kept as decoding context for the first completion token

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Feed token ids with `add`; concatenating every returned delta and `flush()` gives the
    completion text."""

    def __init__(self, decode: Decode, prompt_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        context = list(prompt_ids[-PROMPT_CONTEXT:])
        if context and decode(context).endswith(REPLACEMENT):
            context = []  # the prompt ends mid-character: a window starting there misleads
        self._ids = context  # the decoding window: it starts at the "prefix" offset
        self._read = len(context)  # ids before this offset were emitted

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the new text that is safe to emit (maybe "")."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[: self._read])
        full_text = self._decode(self._ids)
        if len(full_text) <= len(prefix_text) and not final:
            return ""
        if full_text.endswith(REPLACEMENT) and not final:
            return ""
        delta = full_text[len(prefix_text) :]
        # The next window starts where this one was read up to; ids before it are never
        # decoded again, so drop them (the list stays a few tokens long).
        del self._ids[: self._read]
        self._read = len(self._ids)
        return delta
