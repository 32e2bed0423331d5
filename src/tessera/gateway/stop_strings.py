"""Stop strings applied to the decoded text, as OpenAI does: output ends before the match.

Called by `text_stream.py` with each text delta from the detokenizer. While streaming, text
that might be the beginning of a stop string is held back until the next delta settles it,
so a client never sees part of a stop string. Pure logic.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text deltas; `stopped` turns true once a stop string appears."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._text = ""  # everything fed (truncated at the stop string once matched)
        self._sent = 0  # characters of _text already returned
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Append `delta`; return the text now safe to emit."""
        if self.stopped or not delta:
            return ""
        if not self._stops:
            self._text += delta
            self._sent = len(self._text)
            return delta
        # A new match must end inside `delta`: start looking a stop-length before it.
        start = max(0, len(self._text) - self._longest + 1)
        self._text += delta
        found = [i for i in (self._text.find(s, start) for s in self._stops) if i >= 0]
        if found:
            end = min(found)
            self._text = self._text[:end]
            self.stopped = True
        else:
            end = len(self._text) - self._held_back()
        out = self._text[self._sent : max(end, self._sent)]
        self._sent = max(end, self._sent)
        return out

    def flush(self) -> str:
        """At the end of generation: the held-back text (it did not become a stop string)."""
        out = self._text[self._sent :]
        self._sent = len(self._text)
        return out

    @property
    def text(self) -> str:
        """All text fed so far, cut before the stop string if one matched."""
        return self._text

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        for k in range(min(self._longest - 1, len(self._text)), 0, -1):
            tail = self._text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
