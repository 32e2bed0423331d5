"""The operator writes the routes ConfigMap, then pushes the document to the gateway (issue 30).

The test API server (KMock) holds the ConfigMap; a real gateway (`tests.gateway.helpers`,
API keys and the admin token on) in front of two fake leaders takes the pushes. An overload
routes step (`overload_loop._routes_writer`) taking a replica out bumps the revision, pushes,
and its wait for the gateway to stop routing the replica ends at once, with no kubelet
mirroring the ConfigMap into a file. A write that changes nothing neither bumps nor pushes;
a document built without a revision (the reconcile's cut-over) gets the stored one's next,
and at least the wall clock in ms: a deleted and recreated ConfigMap still orders after what
the gateway holds, so its pushes are taken;
a push that fails (gateway down) is logged, and the ConfigMap is written all the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest

from tessera import api, routes_doc
from tessera.control import agents
from tessera.gateway import routes, server
from tessera.policies.overload import steps as overload_steps
from tessera_operator import (
    config,
    gateway_objects,
    kube,
    overload_loop,
    reconciler,
    routes_publish,
)
from tessera_operator.testing import background
from tests.gateway import fake_agent, helpers

TOKEN = "adm-operator-push"
BODY: dict[str, Any] = {
    "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
    "kind": api.KIND,
    "metadata": {"name": "ovl", "namespace": "default", "uid": "u-1", "generation": 1},
    "spec": {
        "model": {"name": "tiny-llama", "path": "/m"},
        "layout": {
            "mode": "explicit",
            "kvCacheBytes": 16 << 20,
            "replicas": [
                {
                    "name": f"r{i}",
                    "stages": [{"agent": f"a{i}", "device": "cpu:0", "layers": [0, 8]}],
                }
                for i in range(2)
            ],
        },
        "gateway": {"port": 8000},
    },
}


@pytest.fixture
async def gateway(tmp_path: Path, tiny_llama: Path) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    (tmp_path / "keys").write_text("alice sk-alice\n")
    (tmp_path / "admin").write_text(f"{TOKEN}\n")
    leaders, servers = {}, []
    for rid in ("r0", "r1"):
        srv, lead, address = await fake_agent.start(rid)
        lead.release.set()
        servers.append(srv)
        leaders[rid] = address
    gw = await helpers.start(
        str(tiny_llama),
        api_keys_file=str(tmp_path / "keys"),
        admin_token_file=str(tmp_path / "admin"),
    )
    yield gw, leaders
    await gw.stop()
    for srv in servers:
        await srv.stop(None)


def _cfg(api_server: background.ApiServerThread, gateway_url: str) -> config.OperatorConfig:
    return config.OperatorConfig(
        agents=(agents.AgentRef("a0", "127.0.0.1:1"),),
        api_server=api_server.url,
        gateway_admin_url=gateway_url,
        gateway_admin_token=TOKEN,
    )


def _stored(cm: dict[str, Any] | None) -> routes_doc.RoutesDoc:
    doc = gateway_objects.published(cm)
    assert doc is not None
    return doc


async def test_a_routes_step_pushes_and_the_drop_waits_for_no_file(
    api_server: background.ApiServerThread,
    gateway: tuple[server.GatewayHandle, dict[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, leaders = gateway
    client = kube.Kube.connect(api_server.url)
    start_wall = time.time()
    try:
        cfg = _cfg(api_server, gw.url)
        dep = api.parse(json.loads(json.dumps(BODY)))
        owner = gateway_objects.owner_reference(BODY)
        replicas = tuple(routes_doc.RouteReplica(r, a) for r, a in leaders.items())
        first = await routes_publish.write(
            client, cfg, dep, owner, routes_doc.RoutesDoc(replicas, 1), clock=lambda: 5.0
        )
        assert (first.applied.action, first.doc.revision, first.pushed) == ("created", 5000, False)
        gw.apply_routes(routes.from_doc(first.doc))  # what the gateway read from its file

        ctx = reconciler.Context(cfg, client)
        memo = kopf.Memo(ctx=ctx)
        kept = reconciler.admin_session(memo)  # the deployment's, as the overload tick's
        assert reconciler.admin_session(memo) is kept and ctx.admin_sessions == [kept]
        set_routes = overload_loop._routes_writer(ctx, kopf.Body(BODY), dep, leaders, cfg, kept)
        start = time.monotonic()
        await set_routes(overload_steps.Routes(remove=("r1",)))
        took = time.monotonic() - start
        await kept.close()
        doc = _stored(await routes_publish.stored(client, dep))
        assert (doc.version, doc.replica_ids) == (1, ("r0",))
        assert doc.revision >= int(start_wall * 1000)  # the wall clock: past 5000
        assert (gw.cutover.version, gw.cutover.revision) == (1, doc.revision)
        assert [ep.replica_id for ep in gw.service.replicas.endpoints] == ["r0"]
        assert took < 5.0  # no file ever changed: without the push it waits 10 s
        assert "still routes" not in caplog.text

        # the reconcile writes the same document again (no revision of its own): unchanged
        same = dataclasses.replace(doc, revision=0)
        again = await routes_publish.write(client, cfg, dep, owner, same, clock=lambda: 1.0)
        assert (again.applied.action, again.doc.revision, again.pushed) == (
            "unchanged",
            doc.revision,
            False,
        )
        # the reconcile's cut-over (no revision of its own) after the step, its clock behind
        # (another operator's): one past the stored revision
        back = routes_doc.RoutesDoc(replicas, 1)
        cut = await routes_publish.write(client, cfg, dep, owner, back, clock=lambda: 1.0)
        assert (cut.applied.action, cut.doc.revision, cut.pushed) == (
            "updated",
            doc.revision + 1,
            True,
        )
        assert (gw.cutover.revision, len(gw.service.replicas.endpoints)) == (doc.revision + 1, 2)

        # the ConfigMap deleted and recreated: revisions start from the clock again, past
        # what the gateway holds, so a later step's push is taken
        name = gateway_objects.routes_name(dep)
        url = api_server.url + kube.path("v1", "configmaps", "default", name)
        async with aiohttp.ClientSession() as s, s.delete(url) as r:  # a user, not the operator
            assert r.status == 200
        await routes_publish.write(client, cfg, dep, owner, back)
        await set_routes(overload_steps.Routes(remove=("r0",)))
        assert [ep.replica_id for ep in gw.service.replicas.endpoints] == ["r1"]
        assert gw.cutover.revision == _stored(await routes_publish.stored(client, dep)).revision
    finally:
        client.close()


async def test_a_failed_push_is_logged_and_the_config_map_written(
    api_server: background.ApiServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    client = kube.Kube.connect(api_server.url)
    try:
        cfg = _cfg(api_server, f"http://{helpers.dead_address()}")
        dep = api.parse(json.loads(json.dumps(BODY)))
        owner = gateway_objects.owner_reference(BODY)
        one = (routes_doc.RouteReplica("r0", "127.0.0.1:1"),)
        await routes_publish.write(
            client, cfg, dep, owner, routes_doc.RoutesDoc(one, 1), clock=lambda: 0.0
        )
        with caplog.at_level(logging.WARNING):
            out = await asyncio.wait_for(
                routes_publish.write(
                    client, cfg, dep, owner, routes_doc.RoutesDoc((), 1), clock=lambda: 0.0
                ),
                timeout=10,
            )
        assert (out.applied.action, out.doc.revision, out.pushed) == ("updated", 1, False)
        assert _stored(await routes_publish.stored(client, dep)).revision == 1
        assert "not pushed (the gateway gets them from the file)" in caplog.text
    finally:
        client.close()
