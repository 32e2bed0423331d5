"""Read what only the gateway sees of each replica's load: `GET /admin/v1/load`.

The overload loop needs the KV the requests waiting on each replica will need (prompt
tokens and budget), which no agent reports: an agent counts its waiting requests but not
their sizes, and knows nothing of a call not admitted yet. The gateway lists its calls per
replica, most likely waiting first; `queued` takes as many as the agent says wait (at
least those with no token). The loop pulls every tick rather than the gateway pushing:
the loop owns the timing (one fresh snapshot per tick), the gateway needs no address of
its controller, and the same pull reads `/arrivals` for switching. Input: the URL; an
optional bearer token (the admin endpoints' own, not a user's API key); optionally a kept
session (`AdminSession`, one per deployment: every admin read and push reuses its
connection). Output: replica id -> the calls, in that order. Caller:
`tessera_operator.overload_loop`, which also waits with `wait_unrouted` until the gateway
routes none of a drop's donors before draining them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

LOAD_PATH = "/admin/v1/load"
ROUTES_PATH = "/admin/v1/routes"
TIMEOUT_S = 2.0
ROUTES_WAIT_S = 10.0  # how long a drop waits for the gateway to stop routing its donors


def admin_headers(token: str) -> dict[str, str]:
    """The headers of a call to the gateway's admin API: its bearer token, when it has one
    (every control loop's reads and the routes push)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class AdminSession:
    """One kept HTTP session to a gateway's admin API, opened at first use in the running
    event loop and closed by `close` (the operator: with the deployment's agent channels)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


@contextlib.asynccontextmanager
async def client(kept: AdminSession | None) -> AsyncIterator[aiohttp.ClientSession]:
    """`kept`'s session, or one of this call's own (closed after it) when None."""
    if kept is not None:
        yield kept.get()
        return
    async with aiohttp.ClientSession() as own:
        yield own


@dataclass(frozen=True)
class Call:
    prompt_tokens: int
    max_tokens: int
    started: bool  # it had a token


Calls = Mapping[str, Sequence[Call]]


def parse(doc: object) -> dict[str, tuple[Call, ...]]:
    """The load document -> the calls per replica, in its order; ValueError if bad."""
    if not isinstance(doc, dict) or not isinstance(doc.get("replicas"), dict):
        raise ValueError("not a load document")
    out: dict[str, tuple[Call, ...]] = {}
    for rid, entry in doc["replicas"].items():
        calls = entry.get("calls") if isinstance(entry, dict) else None
        if not isinstance(calls, list):
            raise ValueError(f"replica {rid}: no calls list")
        out[str(rid)] = tuple(Call(int(p), int(m), bool(s)) for p, m, s in calls)
    return out


def queued(calls: Sequence[Call], waiting: int) -> list[Call]:
    """The calls that wait: the first `waiting` (the agent's count), at least every call
    with no token yet."""
    fresh = sum(1 for c in calls if not c.started)
    return list(calls[: max(waiting, fresh)])


async def fetch(
    url: str, token: str = "", session: AdminSession | None = None
) -> dict[str, tuple[Call, ...]]:
    """GET the document; ValueError saying why it could not be read."""
    headers = admin_headers(token)
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with client(session) as s, s.get(url, headers=headers, timeout=timeout) as r:
            if r.status != 200:
                raise ValueError(f"GET {url}: HTTP {r.status}")
            doc = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise ValueError(f"GET {url}: {exc!r}") from exc
    try:
        return parse(doc)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"GET {url}: {exc}") from exc


async def wait_unrouted(
    url: str,
    replicas: Sequence[str],
    token: str = "",
    timeout_s: float = ROUTES_WAIT_S,
    session: AdminSession | None = None,
) -> float | None:
    """Poll the gateway's `GET /admin/v1/routes` (`url`) until it routes none of
    `replicas`; the seconds that took, or None when it still did after `timeout_s` (or
    could not be read)."""
    headers = admin_headers(token)
    loop = asyncio.get_running_loop()
    start = loop.time()
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with client(session) as s:
        while loop.time() - start < timeout_s:
            try:
                async with s.get(url, headers=headers, timeout=timeout) as r:
                    doc = await r.json(content_type=None) if r.status == 200 else {}
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
                doc = {}
            routed = doc.get("replicas") if isinstance(doc, dict) else None
            if isinstance(routed, list) and not set(replicas) & set(map(str, routed)):
                return loop.time() - start
            await asyncio.sleep(0.05)
    return None
