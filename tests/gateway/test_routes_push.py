"""`PUT /admin/v1/routes`: the operator pushes the routes document the gateway also reads.

A real gateway (`helpers.start`) with a routes file, API keys and the admin token, in front
of two fake leaders. The push needs the admin token (401 without, 403 with a user's key, 403
when the gateway has none configured); a bad document is a 400 naming the field; a pushed
document applies at once (`GET /admin/v1/routes` shows it). File and push are ordered by
(`version`, `revision`): a late read of an older file never undoes a newer push, a stale push
is a 409, and a newer file applies over an older push. `gateway_routes.push` (the operator's
client) says why a push failed.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera import routes_doc
from tessera.control import gateway_routes
from tessera.gateway import server
from tests.gateway import fake_agent, helpers

TOKEN = "adm-push-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def leaders() -> AsyncIterator[dict[str, str]]:
    out, servers = {}, []
    for rid in ("r0", "r1"):
        srv, lead, address = await fake_agent.start(rid)
        lead.release.set()
        servers.append(srv)
        out[rid] = address
    yield out
    for srv in servers:
        await srv.stop(None)


def _doc(leaders: dict[str, str], ids: list[str], version: int, revision: int) -> dict[str, Any]:
    replicas = tuple(routes_doc.RouteReplica(r, leaders[r]) for r in ids)
    return routes_doc.RoutesDoc(replicas, version, revision=revision).to_json()


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)  # a new inode, as a ConfigMap's symlink swap: the watcher sees it


@pytest.fixture
async def gw(tmp_path: Path, tiny_llama: Path, leaders: dict[str, str]) -> AsyncIterator[Any]:
    (tmp_path / "keys").write_text("alice sk-alice\n")
    (tmp_path / "admin").write_text(f"{TOKEN}\n")
    _write(tmp_path / "routes.json", _doc(leaders, ["r0", "r1"], 1, 1))
    h = await helpers.start(
        str(tiny_llama),
        routes_file=str(tmp_path / "routes.json"),
        api_keys_file=str(tmp_path / "keys"),
        admin_token_file=str(tmp_path / "admin"),
    )
    yield h
    await h.stop()


async def _put(
    s: aiohttp.ClientSession, gw: server.GatewayHandle, doc: object, token: str | None = TOKEN
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with s.put(gw.url + "/admin/v1/routes", json=doc, headers=headers) as r:
        body: dict[str, Any] = await r.json()
        return r.status, body


async def _routed(s: aiohttp.ClientSession, gw: server.GatewayHandle) -> tuple[list[str], int]:
    async with s.get(gw.url + "/admin/v1/routes", headers=AUTH) as r:
        assert r.status == 200
        body = await r.json()
        return body["replicas"], body["revision"]


async def test_push_needs_the_admin_token(
    gw: server.GatewayHandle, leaders: dict[str, str], session: aiohttp.ClientSession
) -> None:
    doc = _doc(leaders, ["r0"], 1, 2)
    status, body = await _put(session, gw, doc, None)
    assert status == 401 and body["error"]["code"] == "missing_admin_token"
    for wrong in ("sk-alice", "adm-wrong"):  # a user's key is no admin token
        status, body = await _put(session, gw, doc, wrong)
        assert status == 403 and body["error"]["code"] == "invalid_admin_token"
    assert await _routed(session, gw) == (["r0", "r1"], 1)  # nothing applied
    status, body = await _put(session, gw, doc)
    assert (status, body) == (200, {"applied": True, "version": 1, "revision": 2})
    assert await _routed(session, gw) == (["r0"], 2)


async def test_no_push_without_an_admin_token_configured(
    tiny_llama: Path, leaders: dict[str, str], session: aiohttp.ClientSession
) -> None:
    """With neither API keys nor an admin token the other admin endpoints are open; a
    routes push never is (it could send traffic anywhere): the file stays the only way."""
    gw = await helpers.start(str(tiny_llama))
    try:
        status, body = await _put(session, gw, _doc(leaders, ["r0"], 1, 2), None)
        assert status == 403 and body["error"]["code"] == "admin_token_not_configured"
        assert (await _routed(session, gw))[0] == []
    finally:
        await gw.stop()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replicas": [{"id": "", "address": "127.0.0.1:1"}]}, "replicas[0].id"),
        ({"revision": -1}, "revision"),
        ({"revision": "2"}, "revision"),
        ({"version": True}, "version"),
        ({"replicas": [{"id": "r0", "address": "nowhere"}]}, "replicas[0].address"),
        ({"drainDeadlineSeconds": -3}, "drainDeadlineSeconds"),
    ],
)
async def test_a_bad_push_is_a_400_naming_the_field(
    gw: server.GatewayHandle,
    leaders: dict[str, str],
    session: aiohttp.ClientSession,
    change: dict[str, Any],
    field: str,
) -> None:
    status, body = await _put(session, gw, {**_doc(leaders, ["r0"], 1, 2), **change})
    assert status == 400, body
    assert body["error"]["param"] == field and body["error"]["code"] == "invalid_routes"
    assert field in body["error"]["message"]
    assert await _routed(session, gw) == (["r0", "r1"], 1)


async def test_a_body_that_is_no_json_object_is_a_400(
    gw: server.GatewayHandle, session: aiohttp.ClientSession
) -> None:
    for raw in (b"{not json", b"[1, 2]"):
        async with session.put(gw.url + "/admin/v1/routes", data=raw, headers=AUTH) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "invalid_json"


async def test_file_and_push_are_ordered_by_version_and_revision(
    gw: server.GatewayHandle,
    leaders: dict[str, str],
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    routes = tmp_path / "routes.json"
    assert (await _put(session, gw, _doc(leaders, ["r0"], 1, 3)))[0] == 200
    assert await _routed(session, gw) == (["r0"], 3)
    # the kubelet's late copy of an older write: ignored, the push stands
    _write(routes, _doc(leaders, ["r0", "r1"], 1, 2))
    await gw.refresh()  # reads the changed file now (the 20 ms check would too)
    assert await _routed(session, gw) == (["r0"], 3)
    # the same document again (the file catching up with the push): no change
    _write(routes, _doc(leaders, ["r0"], 1, 3))
    await gw.refresh()
    assert await _routed(session, gw) == (["r0"], 3)
    # a stale push is refused, saying what is served
    status, body = await _put(session, gw, _doc(leaders, ["r0", "r1"], 1, 2))
    assert status == 409 and body["error"]["code"] == "stale_routes"
    assert "1.2" in body["error"]["message"] and "1.3" in body["error"]["message"]
    # a newer file applies over the push; so does a newer version at any revision
    _write(routes, _doc(leaders, ["r0", "r1"], 1, 4))
    await gw.refresh()
    assert await _routed(session, gw) == (["r0", "r1"], 4)
    assert (await _put(session, gw, _doc(leaders, ["r1"], 2, 0)))[0] == 200
    assert await _routed(session, gw) == (["r1"], 0)


async def test_the_operators_client_says_why_a_push_failed(
    gw: server.GatewayHandle, leaders: dict[str, str]
) -> None:
    url = gw.url + "/admin/v1/routes"
    doc = routes_doc.parse(_doc(leaders, ["r0"], 1, 5))
    with pytest.raises(ValueError, match="HTTP 401"):
        await gateway_routes.push(url, doc)
    stale = routes_doc.parse(_doc(leaders, ["r0"], 1, 0))
    with pytest.raises(ValueError, match=r"HTTP 409.*stale_routes"):
        await gateway_routes.push(url, stale, TOKEN)
    with pytest.raises(ValueError, match="PUT http://"):  # nothing listens there
        await gateway_routes.push(f"http://{helpers.dead_address()}/admin/v1/routes", doc)
    assert await gateway_routes.push(url, doc, TOKEN) >= 0
    assert gw.cutover.revision == 5


def test_successor_bumps_the_revision_only_when_the_document_changed() -> None:
    one = (routes_doc.RouteReplica("r0", "h:1"),)
    two = (*one, routes_doc.RouteReplica("r1", "h:2"))
    stored = routes_doc.RoutesDoc(two, 3, revision=7)
    assert routes_doc.successor(None, routes_doc.RoutesDoc(two, 3)).revision == 0
    assert routes_doc.successor(stored, routes_doc.RoutesDoc(two, 3)) == stored  # unchanged
    assert routes_doc.successor(stored, routes_doc.RoutesDoc(one, 3)).order == (3, 8)
    assert routes_doc.successor(stored, routes_doc.RoutesDoc(two, 4)).order == (4, 8)
    assert routes_doc.successor(stored, routes_doc.RoutesDoc(one, 3, revision=20)).revision == 20
    # the wall clock as a floor: a recreated document (nothing stored) still orders later
    assert routes_doc.successor(None, routes_doc.RoutesDoc(one, 3), floor=900).order == (3, 900)
    assert routes_doc.successor(stored, routes_doc.RoutesDoc(one, 3), floor=900).revision == 900
    assert routes_doc.successor(stored, routes_doc.RoutesDoc(two, 3), floor=900) == stored
    back = routes_doc.parse(routes_doc.RoutesDoc(one, 3, revision=8).to_json())
    assert back.order == (3, 8) and routes_doc.parse({"replicas": []}).revision == 0
    admin = routes_doc.AdminRoutes(3, ("r0",), {"r1": 2}, 8)
    assert routes_doc.parse_admin(admin.to_json()) == admin
