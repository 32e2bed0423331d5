"""Per-class arrivals per span: what the switching loop forecasts from.

Every admitted generation request is typed on arrival by a `ClassRouter` `(prompt_tokens,
max_tokens) -> class name` and counted in the current span: the live classifier
(`tessera.workload.live_classes`, `live_class_router`) when given, else the routes document's
centroids (`policies.routing.centroid_class_router`); unknown classes count as
``"unclassified"``. Spans are ``[k * span_s, (k + 1) * span_s)`` of the recorder's clock; only
complete spans are reported (a truncated one would look like a drop in demand). Exposed at
``GET /admin/v1/arrivals`` (`snapshot`: ``spanSeconds``, ``classes``, ``firstSpan``, ``spans``
[span][class] oldest first, ``current``, ``currentElapsedSeconds``, ``unclassified``) and as
``tessera_gateway_class_arrivals_total{class}``. Read by the operator's switching loop
(`tessera.control.switching`) and ``tessera bench adaptive``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from tessera.policies.routing import shares as routing
from tessera.workload import live_classes

DEFAULT_SPAN_S = 10.0
DEFAULT_KEEP_SPANS = 360  # an hour of 10 s spans
UNCLASSIFIED = "unclassified"


def live_class_router(
    classifier: live_classes.LiveClassifier, names: Sequence[str]
) -> routing.ClassRouter:
    """The live classifier as a `ClassRouter` (``max_tokens <= 0``: not set by the client)."""
    names = tuple(names)
    if len(names) != classifier.k:
        raise ValueError(f"{len(names)} class names for a classifier of {classifier.k} classes")

    def classify(prompt_tokens: int, max_tokens: int) -> str | None:
        return names[classifier.classify(prompt_tokens, max_tokens if max_tokens > 0 else None)]

    return classify


class ArrivalRecorder:
    """Counts arrivals per (span, class); `snapshot` is the admin endpoint's body."""

    def __init__(
        self,
        span_s: float = DEFAULT_SPAN_S,
        keep_spans: int = DEFAULT_KEEP_SPANS,
        clock: Callable[[], float] = time.monotonic,
        on_arrival: Callable[[str], None] | None = None,
    ) -> None:
        if not span_s > 0:
            raise ValueError("span_s: must be > 0")
        if keep_spans < 1:
            raise ValueError("keep_spans: must be >= 1")
        self.span_s = span_s
        self._clock = clock
        self._start = clock()
        self._on_arrival = on_arrival
        self._classify: routing.ClassRouter | None = None
        self._names: tuple[str, ...] = ()
        self._done: deque[tuple[int, dict[str, int]]] = deque(maxlen=keep_spans)
        self._span = 0  # index of the span being counted
        self._current: dict[str, int] = {}
        self._unclassified = 0

    def set_classes(self, classify: routing.ClassRouter | None, names: Sequence[str]) -> None:
        """Replace the class rule and the reported class order (counts so far are kept)."""
        self._classify, self._names = classify, tuple(names)

    @property
    def class_names(self) -> tuple[str, ...]:
        return self._names

    def _roll(self) -> None:
        now = int((self._clock() - self._start) // self.span_s)
        if now <= self._span:
            return
        self._done.append((self._span, self._current))
        self._current = {}
        # spans with no request; after a long idle only the last keep_spans matter
        for k in range(max(self._span + 1, now - (self._done.maxlen or 0)), now):
            self._done.append((k, {}))
        self._span = now

    def record(self, prompt_tokens: int, max_tokens: int | None) -> str:
        """Type and count one arriving request; returns its class name."""
        self._roll()
        name = None
        if self._classify is not None:
            name = self._classify(prompt_tokens, max_tokens if max_tokens else 0)
        if name is None or name not in self._names:
            self._unclassified += 1
            name = UNCLASSIFIED
        else:
            self._current[name] = self._current.get(name, 0) + 1
        if self._on_arrival is not None:
            self._on_arrival(name)
        return name

    def snapshot(self) -> dict[str, Any]:
        """Complete spans so far (module docstring)."""
        self._roll()
        spans = [[counts.get(n, 0) for n in self._names] for _, counts in self._done]
        elapsed = (self._clock() - self._start) - self._span * self.span_s
        return {
            "spanSeconds": self.span_s,
            "classes": list(self._names),
            "firstSpan": self._done[0][0] if self._done else self._span,
            "spans": spans,
            "current": [self._current.get(n, 0) for n in self._names],
            "currentElapsedSeconds": round(elapsed, 3),
            "unclassified": self._unclassified,
        }
