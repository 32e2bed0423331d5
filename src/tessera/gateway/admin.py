"""Admin endpoints of the gateway: `GET`/`PUT /admin/v1/routes`, `/arrivals` and `/load`.

Installed by `server.start_gateway`; `admin_auth` guards them. `GET /admin/v1/routes`
(`routes_doc.AdminRoutes`: version, revision, replicas, in-flight per leaving replica) tells a
transition's executor which document the gateway serves. `PUT /admin/v1/routes`: the operator
pushes the routes document it just wrote to the ConfigMap (a kubelet refreshes a mounted one
only about once a minute): 200 `{"applied", "version", "revision"}`, 400 naming the field, 409
`stale_routes` when older than the one served, 403 when no admin token is configured (never
open). `/admin/v1/arrivals`: per-class arrivals per span (the switching loop's).
`/admin/v1/load`: each replica's load as only the gateway sees it, for the overload loop:
`{"replicas": {id: {"inFlight": n, "calls": [[prompt_tokens, max_tokens, started], ...]}},
"held": n}`, calls most likely waiting first (`tessera.control.gateway_load`); `held`:
requests held for a replica to wake (`hold.py`, read by `tessera.control.gateway_demand`).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from tessera.gateway import arrivals as arrivals_mod
from tessera.gateway import body, cutover, errors, hold
from tessera.gateway import inflight as inflight_mod
from tessera.gateway import routes as routes_mod

ROUTES_PATH = "/admin/v1/routes"
Apply = Callable[[routes_mod.Routes], bool]  # `GatewayHandle.apply_routes`


def install(
    application: web.Application,
    switch: cutover.Cutover,
    arrivals: arrivals_mod.ArrivalRecorder | None = None,
    table: inflight_mod.InFlightTable | None = None,
    holding: hold.Holding | None = None,
    apply: Apply | None = None,
    writable: bool = False,
) -> None:
    async def routes(request: web.Request) -> web.StreamResponse:
        return web.json_response(switch.snapshot().to_json())

    application.router.add_get(ROUTES_PATH, routes)
    if apply is not None:
        application.router.add_put(ROUTES_PATH, _put_routes(switch, apply, writable))
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


def _put_routes(switch: cutover.Cutover, apply: Apply, writable: bool) -> body.Handler:
    async def put(request: web.Request) -> web.StreamResponse:
        if not writable:  # a write is never open: it could route traffic anywhere
            raise errors.ApiError(
                403,
                "Routes can be pushed only with an admin token (--admin-token-file); the "
                "gateway reads them from its routes file.",
                code="admin_token_not_configured",
            )
        doc = body.parse(await request.read())
        try:
            new = routes_mod.parse(doc)
        except ValueError as exc:  # its message starts with the field's name
            field = str(exc).split(":", 1)[0]
            raise errors.ApiError(
                400, f"routes: {exc}", param=field, code="invalid_routes"
            ) from exc
        if not apply(new):
            raise errors.ApiError(
                409,
                f"routes {new.version}.{new.revision} is older than the "
                f"{switch.version}.{switch.revision} served",
                param="revision",
                code="stale_routes",
            )
        return web.json_response(
            {"applied": True, "version": switch.version, "revision": switch.revision}
        )

    return put
