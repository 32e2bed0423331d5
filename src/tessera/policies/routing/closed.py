"""Which ready replicas a new request may go to when the routes close some of them.

A replica the routes document marks `closed` (the head of an overload drop while its
donors drain and its pool grows) takes no new request while another ready replica has
room (free KV pages and no queue, as its leader last reported): a dropped pipeline or an
idle whole replica serves the arrival at once, while the closed head would make it wait
for the grown pool. When no open replica has room, every ready replica stays a candidate
(a full whole replica is no better than the head about to grow; and the routes' reopen
reaches the gateway later than the head's resume). Nothing changes while none is closed.
Pure. Input: the ready replica ids (in the router's order), the closed ones, those with
room. Caller: `tessera.gateway.dispatch`; docs/overload.md.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def open_first(ready: Sequence[str], closed: Collection[str], room: Collection[str]) -> list[str]:
    """`ready` narrowed to the open replicas with room when some ready one is closed and
    such replicas exist; else all of `ready` (module docstring)."""
    if not any(r in closed for r in ready):
        return list(ready)
    roomy = [r for r in ready if r not in closed and r in room]
    return roomy if roomy else list(ready)
