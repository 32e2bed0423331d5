"""Admin endpoints of the gateway: `GET /admin/v1/routes`.

Installed on the application by `server.start_gateway`. The executor of a transition
(operator or `tessera up`) reads it to see which routes version the gateway serves and
how many requests still run on each leaving replica:
`{"version": int, "replicas": [ids], "leaving": {replica_id: in-flight requests}}`
(`tessera.routes_doc.AdminRoutes`).
"""

from __future__ import annotations

from aiohttp import web

from tessera.gateway import cutover


def install(application: web.Application, switch: cutover.Cutover) -> None:
    async def routes(request: web.Request) -> web.StreamResponse:
        return web.json_response(switch.snapshot().to_json())

    application.router.add_get("/admin/v1/routes", routes)
