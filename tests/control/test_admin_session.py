"""The control loops' kept session to the gateway's admin API (`gateway_load.AdminSession`).

A small HTTP server stands in for the gateway's admin API and records the client port of
every request. Through a kept session, the overload tick's load read, the drop's routes
wait and the routes push (all three paths the operator takes many times a second) reuse
one connection; without one, each call opens its own (as every tick did before). Closing
the session closes its connection, and the next use opens a fresh one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tessera import routes_doc
from tessera.control import gateway_load, gateway_routes


@pytest.fixture
async def admin() -> AsyncIterator[tuple[str, list[int]]]:
    ports: list[int] = []

    async def seen(request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ports.append(int(peer[1]) if peer else -1)

    async def load(request: web.Request) -> web.Response:
        await seen(request)
        return web.json_response({"replicas": {"r0": {"calls": [[8, 4, False]]}}})

    async def routes(request: web.Request) -> web.Response:
        await seen(request)
        if request.method == "PUT":
            return web.json_response({"ok": True})
        return web.json_response({"version": 1, "replicas": ["r0"]})

    app = web.Application()
    app.router.add_get(gateway_load.LOAD_PATH, load)
    app.router.add_route("*", gateway_load.ROUTES_PATH, routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", ports
    await runner.cleanup()


async def _calls(url: str, kept: gateway_load.AdminSession | None) -> None:
    for _ in range(3):
        calls = await gateway_load.fetch(url + gateway_load.LOAD_PATH, session=kept)
        assert calls == {"r0": (gateway_load.Call(8, 4, False),)}
    took = await gateway_load.wait_unrouted(url + gateway_load.ROUTES_PATH, ["r9"], session=kept)
    assert took is not None
    doc = routes_doc.RoutesDoc((routes_doc.RouteReplica("r0", "127.0.0.1:1"),), version=1)
    await gateway_routes.push(url + gateway_load.ROUTES_PATH, doc, session=kept)


async def test_a_kept_session_reuses_one_connection(admin: tuple[str, list[int]]) -> None:
    url, ports = admin
    kept = gateway_load.AdminSession()
    try:
        await _calls(url, kept)
        assert len(ports) == 5 and len(set(ports)) == 1
        await kept.close()
        await _calls(url, kept)  # closed: the next use opens a fresh session
        assert len(ports) == 10 and len(set(ports[5:])) == 1 and ports[5] != ports[0]
    finally:
        await kept.close()


async def test_without_a_session_each_call_opens_its_own(admin: tuple[str, list[int]]) -> None:
    url, ports = admin
    await _calls(url, None)
    assert len(ports) == 5 and len(set(ports)) == 5
