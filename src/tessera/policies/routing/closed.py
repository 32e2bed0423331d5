"""Which ready replicas a new request may go to when the routes close some of them.

A replica the routes document marks `closed` (the head of an overload drop while its
donors drain and its pool grows) takes no new request while it is full and another ready
replica has room (free KV pages and no queue, as its leader last reported): a dropped
pipeline or an idle whole replica serves the arrival at once, while the full head would
make it wait for the grown pool. When no other replica has room, every ready replica stays
a candidate (a full whole replica is no better than the head about to grow). A closed
replica with room counts as open: once the head has resumed with its grown pool, the
gateway's next poll of it lets it take requests, before the routes' reopen arrives (which
crosses the operator and the ConfigMap). Nothing changes while none is closed.
Pure. Input: the ready replica ids (in the router's order), the closed ones, those with
room. Caller: `tessera.gateway.dispatch`; docs/overload.md.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def open_first(ready: Sequence[str], closed: Collection[str], room: Collection[str]) -> list[str]:
    """`ready` narrowed to the replicas with room when some ready one is closed and full
    and others have room; else all of `ready` (module docstring)."""
    if not any(r in closed and r not in room for r in ready):
        return list(ready)
    roomy = [r for r in ready if r in room]
    return roomy if roomy else list(ready)
