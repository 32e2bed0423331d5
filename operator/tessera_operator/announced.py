"""What the operator's events last announced per deployment, so a stale body posts nothing twice.

One `Announced` per kind of change, held operator-wide in `reconciler.Context`: the
overload groups (`status.overload.groups`, `overload_status.changes`) and the replicated
layer runs (`status.scaling.layerRuns`, `scaling.changes`). `record` posts the events
between the previous status and the new one; a pass or tick that reads a body of the
same resourceVersion as the last one recorded read a body older than its own status
write (the watch has not delivered it yet), so it compares with what was announced.
Called by `reconciler.one_pass` and the overload loop's tick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kopf

Docs = Sequence[Mapping[str, Any]]
Changes = Callable[[Docs, Docs], list[tuple[str, str]]]


class Announced:
    """The `key` list each deployment's events last announced, with the resourceVersion
    of the body it was computed from (module docstring)."""

    def __init__(self, changes: Changes, key: str) -> None:
        self._changes, self._key = changes, key
        self._by_uid: dict[str, tuple[str, list[dict[str, Any]]]] = {}

    def record(self, body: kopf.Body, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Post the events for the changes between the previous document (`old`, or what
        was announced from the same body version) and `new`."""
        meta = body.metadata
        uid, version = (
            str(meta.get("uid") or meta.get("name") or ""),
            str(meta.get("resourceVersion") or ""),
        )
        before: Sequence[Mapping[str, Any]] = old.get(self._key) or []
        held = self._by_uid.get(uid)
        if held is not None and version and held[0] == version:
            before = held[1]
        after = [dict(g) for g in new.get(self._key) or []]
        for reason, message in self._changes(before, after):
            kopf.info(body, reason=reason, message=message)
        self._by_uid[uid] = (version, after)
