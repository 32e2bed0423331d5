"""Admin endpoints of the gateway: `GET /admin/v1/routes`, `/arrivals` and `/load`.

Installed by `server.start_gateway`. `/admin/v1/routes` (`tessera.routes_doc.AdminRoutes`:
`{"version", "replicas", "leaving": {replica_id: in-flight requests}}`) tells a transition's
executor (operator or `tessera up`) which version the gateway serves and what still runs on
leaving replicas. `/admin/v1/arrivals` is the per-class arrivals per span the switching loop
forecasts from (`arrivals.ArrivalRecorder.snapshot`). `/admin/v1/load` is each replica's load as
only the gateway sees it, for the overload loop: `{"replicas": {id: {"inFlight": n, "calls":
[[prompt_tokens, max_tokens, started], ...]}}, "held": n}`, calls most likely waiting first;
`started` is 1 once a call had a token (`tessera.control.gateway_load`); `held` counts requests
held for a replica to wake (`hold.py`, read by `tessera.control.gateway_demand`).
"""

from __future__ import annotations

from aiohttp import web

from tessera.gateway import arrivals as arrivals_mod
from tessera.gateway import cutover, hold
from tessera.gateway import inflight as inflight_mod


def install(
    application: web.Application,
    switch: cutover.Cutover,
    arrivals: arrivals_mod.ArrivalRecorder | None = None,
    table: inflight_mod.InFlightTable | None = None,
    holding: hold.Holding | None = None,
) -> None:
    async def routes(request: web.Request) -> web.StreamResponse:
        return web.json_response(switch.snapshot().to_json())

    application.router.add_get("/admin/v1/routes", routes)
    if arrivals is not None:
        recorder = arrivals

        async def counts(request: web.Request) -> web.StreamResponse:
            return web.json_response(recorder.snapshot())

        application.router.add_get("/admin/v1/arrivals", counts)
    if table is not None:
        calls = table

        async def load(request: web.Request) -> web.StreamResponse:
            out = {}
            for rid in calls.replica_ids():
                on = sorted(
                    calls.on(rid),
                    key=lambda a: (a.first_token_at is not None, a.last_token_at or a.started),
                )
                rows = [
                    [len(a.prompt_ids), a.max_tokens, int(a.first_token_at is not None)] for a in on
                ]
                out[rid] = {"inFlight": len(on), "calls": rows}
            held = holding.held if holding is not None else 0
            return web.json_response({"replicas": out, "held": held})

        application.router.add_get("/admin/v1/load", load)
