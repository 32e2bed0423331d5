"""The gateway's admin API needs the operator's token once keys are on (`gateway.admin_auth`).

A real gateway (`helpers.start`) in front of a fake leader. With API keys and an admin
token: every `/admin/` endpoint answers 401 naming the missing token without one, 403
with a user's API key or a wrong token, 200 with the admin token; `/health` and
`/metrics` stay open (and `/admin/v1/status` a user reads with an API key); the
operator's pulls (`control.gateway_load`, `gateway_itl`, `switching_loop.fetch_arrivals`)
read with the token and fail, saying why, without it.
With API keys and no admin token the admin API is closed (403, saying what is not
configured); with neither, everything is open as before.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera.control import gateway_itl, gateway_load
from tessera.gateway import config
from tessera_operator import switching_loop
from tests.gateway import fake_agent, helpers

ADMIN = ("/admin/v1/routes", "/admin/v1/arrivals", "/admin/v1/load")
TOKEN = "adm-0123456789"


@pytest.fixture
async def leader() -> AsyncIterator[str]:
    srv, lead, address = await fake_agent.start("r0")
    lead.release.set()
    yield address
    await srv.stop(None)


def _files(tmp_path: Path, token: bool = True) -> dict[str, str]:
    (tmp_path / "keys").write_text("alice sk-alice\n")
    out = {"api_keys_file": str(tmp_path / "keys")}
    if token:
        (tmp_path / "admin").write_text(f"{TOKEN}\n")
        out["admin_token_file"] = str(tmp_path / "admin")
    return out


async def _get(
    s: aiohttp.ClientSession, url: str, token: str | None
) -> tuple[int, dict[str, Any] | str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with s.get(url, headers=headers) as r:
        if r.content_type == "application/json":
            return r.status, await r.json()
        return r.status, await r.text()


async def test_admin_endpoints_need_the_admin_token(
    tiny_llama: Path, tmp_path: Path, leader: str, session: aiohttp.ClientSession
) -> None:
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("r0", leader), **_files(tmp_path)
    )
    try:
        for path in ADMIN:
            status, body = await _get(session, gw.url + path, None)
            assert status == 401, (path, body)
            assert isinstance(body, dict) and body["error"]["code"] == "missing_admin_token"
            assert "admin token" in body["error"]["message"]
            for wrong in ("sk-alice", "adm-wrong"):  # a user's key is no admin token
                status, body = await _get(session, gw.url + path, wrong)
                assert status == 403, (path, wrong, body)
                assert isinstance(body, dict) and body["error"]["code"] == "invalid_admin_token"
            status, body = await _get(session, gw.url + path, TOKEN)
            assert status == 200, (path, body)
        for path in ("/health", "/metrics"):  # probes and Prometheus need nothing
            assert (await _get(session, gw.url + path, None))[0] == 200
        # the status page's JSON is a user's, with an API key (status_page.py)
        assert (await _get(session, gw.url + "/admin/v1/status", "sk-alice"))[0] == 200
        # the token rotates without a restart: the file is re-read when it changes
        (tmp_path / "admin").write_text("adm-next\n")
        os.utime(tmp_path / "admin", (1, 1))
        assert (await _get(session, gw.url + ADMIN[0], TOKEN))[0] == 403
        assert (await _get(session, gw.url + ADMIN[0], "adm-next"))[0] == 200
    finally:
        await gw.stop()


async def test_the_operators_pulls_send_the_token(
    tiny_llama: Path, tmp_path: Path, leader: str
) -> None:
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("r0", leader), **_files(tmp_path)
    )
    try:
        load = gw.url + gateway_load.LOAD_PATH
        arrivals = gw.url + switching_loop.ARRIVALS_PATH
        assert isinstance(await gateway_load.fetch(load, TOKEN), dict)
        assert "spans" in await switching_loop.fetch_arrivals(arrivals, TOKEN)
        assert (await gateway_itl.fetch(gw.url + gateway_itl.METRICS_PATH, TOKEN)).bounds
        # a drop waits until the gateway routes none of its donors (here: r0 stays routed)
        routes = gw.url + gateway_load.ROUTES_PATH
        assert await gateway_load.wait_unrouted(routes, ["r9"], TOKEN) is not None
        assert await gateway_load.wait_unrouted(routes, ["r0"], TOKEN, timeout_s=0.3) is None
        assert await gateway_load.wait_unrouted(routes, ["r9"], "", timeout_s=0.3) is None
        with pytest.raises(ValueError, match="HTTP 401"):
            await gateway_load.fetch(load)
        with pytest.raises(ValueError, match="HTTP 401"):
            await switching_loop.fetch_arrivals(arrivals)
    finally:
        await gw.stop()


async def test_keys_without_an_admin_token_close_the_admin_api(
    tiny_llama: Path, tmp_path: Path, leader: str, session: aiohttp.ClientSession
) -> None:
    gw = await helpers.start(
        str(tiny_llama), config.ReplicaEndpoint("r0", leader), **_files(tmp_path, token=False)
    )
    try:
        for token in (None, "sk-alice"):
            status, body = await _get(session, gw.url + ADMIN[0], token)
            assert status == 403 and isinstance(body, dict)
            assert body["error"]["code"] == "admin_token_not_configured"
            assert "--admin-token-file" in body["error"]["message"]
    finally:
        await gw.stop()
    open_gw = await helpers.start(str(tiny_llama), config.ReplicaEndpoint("r0", leader))
    try:  # no keys, no token: as open as before
        for path in ADMIN:
            assert (await _get(session, open_gw.url + path, None))[0] == 200, path
    finally:
        await open_gw.stop()
