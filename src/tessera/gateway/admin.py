"""Admin endpoints of the gateway: `GET /admin/v1/routes` and `GET /admin/v1/arrivals`.

Installed on the application by `server.start_gateway`. The executor of a transition
(operator or `tessera up`) reads it to see which routes version the gateway serves and
how many requests still run on each leaving replica:
`{"version": int, "replicas": [ids], "leaving": {replica_id: in-flight requests}}`
(`tessera.routes_doc.AdminRoutes`). `/admin/v1/arrivals` is the per-class arrivals per
span the switching loop forecasts from (`arrivals.ArrivalRecorder.snapshot`).
"""

from __future__ import annotations

from aiohttp import web

from tessera.gateway import arrivals as arrivals_mod
from tessera.gateway import cutover


def install(
    application: web.Application,
    switch: cutover.Cutover,
    arrivals: arrivals_mod.ArrivalRecorder | None = None,
) -> None:
    async def routes(request: web.Request) -> web.StreamResponse:
        return web.json_response(switch.snapshot().to_json())

    application.router.add_get("/admin/v1/routes", routes)
    if arrivals is not None:
        recorder = arrivals

        async def counts(request: web.Request) -> web.StreamResponse:
            return web.json_response(recorder.snapshot())

        application.router.add_get("/admin/v1/arrivals", counts)
