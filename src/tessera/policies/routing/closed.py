"""Which ready replicas a new request may go to when the routes close some of them.

A replica the routes document marks `closed` (the head of an overload drop while its
donors drain and its pool grows) takes no new request while another replica is ready;
when every ready replica is closed, they all stay candidates (the request queues on one
rather than waiting for nothing). Its running and queued requests stay where they are.
Pure. Input: the ready replica ids (in the router's order) and the closed ones. Caller:
`tessera.gateway.dispatch`; docs/overload.md.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def open_first(ready: Sequence[str], closed: Collection[str]) -> list[str]:
    """`ready` less the closed replicas, or all of `ready` when every one is closed."""
    open_ = [r for r in ready if r not in closed]
    return open_ if open_ else list(ready)
