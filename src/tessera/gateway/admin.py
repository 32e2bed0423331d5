"""Admin endpoints of the gateway: `GET /admin/v1/routes`, `/arrivals` and `/load`.

Installed on the application by `server.start_gateway`. The executor of a transition
(operator or `tessera up`) reads it to see which routes version the gateway serves and
how many requests still run on each leaving replica:
`{"version": int, "replicas": [ids], "leaving": {replica_id: in-flight requests}}`
(`tessera.routes_doc.AdminRoutes`). `/admin/v1/arrivals` is the per-class arrivals per
span the switching loop forecasts from (`arrivals.ArrivalRecorder.snapshot`).
`/admin/v1/load` is what only the gateway sees of each replica's load, for the overload
loop the operator runs (`tessera.control.overload`): `{"replicas": {replica_id:
{"inFlight": n, "calls": [[prompt_tokens, max_tokens, started], ...]}}}`, the calls
most likely waiting first (no token yet, then the longest without one); `started` is 1
once a call had a token (`tessera.control.gateway_load` reads it); `"held": n` counts the
requests held for a replica to wake (`hold.py`: the autoscaler's demand from zero,
`tessera.control.gateway_demand`).
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
