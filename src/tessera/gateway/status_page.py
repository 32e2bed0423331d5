"""The gateway's read-only status page: `GET /status` (HTML), `/status/layout.svg`, and
`GET /admin/v1/status` (the same facts as JSON).

Shows every replica's stages on agents and devices, drawn server-side
(`tessera.observability.layout_svg`: layers, shared blocks hatched, leaving replicas dashed, KV
pages used), readiness and KV use, each control loop's last action
(`tessera.observability.control`, when the loops run in this process) and the class shares; a
meta refresh every `REFRESH_S` (no script). Facts are gathered per request (`Describe` of every
leader, then each next stage's agent) and cached for `CACHE_S`. With API keys configured the
page needs one (`Authorization: Bearer KEY`, or HTTP Basic with the key as password). Installed
by `server.start_gateway` (`install`); it also exposes the loops' metrics on /metrics.
"""

from __future__ import annotations

import asyncio
import base64
import html
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web
from prometheus_client.registry import Collector

from tessera import observed
from tessera.gateway import app, auth, cutover
from tessera.observability import control, layout_svg
from tessera.rpc import blocks as rpc_blocks
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

REFRESH_S = 2
CACHE_S = 0.5
DESCRIBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Snapshot:
    """What one page shows."""

    observed: observed.Observed
    shared_bytes: Mapping[tuple[str, str, int, int], int]  # per block: params in shared pieces
    leaving: tuple[str, ...]
    version: int
    shares: Mapping[str, Mapping[str, float]]
    replicas: Mapping[str, Mapping[str, Any]]  # the gateway's view: ready, detail, KV
    actions: tuple[control.ActionRecord, ...]
    taken_at: float


class StatusPage:
    """Gathers snapshots (cached briefly) and renders them."""

    def __init__(
        self,
        service: app.Service,
        switch: cutover.Cutover,
        shares: Callable[[], Mapping[str, Mapping[str, float]]],
        recorder: control.Recorder,
    ) -> None:
        self.s, self.switch, self.shares, self.recorder = service, switch, shares, recorder
        self._cached: Snapshot | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self) -> Snapshot:
        async with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached.taken_at > CACHE_S:
                self._cached = await self._gather(now)
            return self._cached

    async def _gather(self, now: float) -> Snapshot:
        leaving = tuple(sorted(self.switch.leaving))
        starts = [ep.address for ep in self.s.replicas.endpoints]
        starts += [lv.endpoint.address for lv in self.switch.leaving.values()]
        agents, shared = await describe_chain(
            [a for a in dict.fromkeys(starts) if a], self.s.replicas.tls
        )
        states = self.s.replicas.states()
        return Snapshot(
            observed.Observed(tuple(agents)),
            shared,
            leaving,
            self.switch.snapshot().version,
            self.shares(),
            {rid: st.to_json() for rid, st in sorted(states.items())},
            tuple(self.recorder.recent()),
            now,
        )


SharedBytes = dict[tuple[str, str, int, int], int]


async def describe_chain(
    addresses: list[str], tls: transport.TlsFiles | None
) -> tuple[list[observed.AgentInfo], SharedBytes]:
    """Describe the agents at `addresses` and every next-stage agent their blocks name;
    also per block (agent, replica, stage, rank) its parameter bytes in shared pieces."""
    seen: dict[str, observed.AgentInfo] = {}
    shared: SharedBytes = {}
    todo = list(addresses)
    while todo:
        batch = [a for a in dict.fromkeys(todo) if a not in seen]
        todo = []
        for info, held in await asyncio.gather(*(_describe(a, tls) for a in batch)):
            seen[info.address] = info
            shared.update(held)
            todo += [b.next_address for b in info.blocks if b.next_address]
    return sorted(seen.values(), key=lambda a: a.name), shared


async def _describe(
    address: str, tls: transport.TlsFiles | None
) -> tuple[observed.AgentInfo, SharedBytes]:
    channel = transport.channel(address, tls)
    try:
        d = await pb_grpc.AgentStub(channel).Describe(
            pb.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as exc:
        return observed.AgentInfo(address, address, False, error=exc.code().name), {}
    finally:
        await channel.close()
    name = d.agent_id or address
    shared = {
        (name, b.replica_id, b.stage_index, b.tp_rank): b.shared_param_bytes for b in d.blocks
    }
    info = observed.AgentInfo(
        name=name,
        address=address,
        devices=tuple(
            observed.DeviceInfo(x.id, x.kind, x.capacity_bytes, x.free_bytes, x.name)
            for x in d.devices
        ),
        blocks=tuple(rpc_blocks.from_proto(b) for b in d.blocks),
        kv=tuple(
            observed.ReplicaLoad(k.replica_id, k.pages_total, k.pages_used, k.running, k.waiting)
            for k in d.kv
        ),
    )
    return info, shared


def to_json(snap: Snapshot) -> dict[str, Any]:
    return {
        "version": snap.version,
        "leaving": list(snap.leaving),
        "classShares": {k: dict(v) for k, v in snap.shares.items()},
        "replicas": {k: dict(v) for k, v in snap.replicas.items()},
        "agents": [
            {
                "name": a.name,
                "address": a.address,
                "reachable": a.reachable,
                "devices": [
                    {"id": d.id, "capacityBytes": d.capacity_bytes, "freeBytes": d.free_bytes}
                    for d in a.devices
                ],
                "stages": [
                    {
                        "replica": b.replica_id,
                        "stage": b.stage_index,
                        "device": b.device,
                        "layers": [b.start, b.end],
                        "tpRank": b.tp_rank,
                    }
                    for b in a.blocks
                ],
            }
            for a in snap.observed.agents
        ],
        "lastActions": {loop: rec.to_json() for loop, rec in _last_per_loop(snap.actions).items()},
        "actions": [rec.to_json() for rec in snap.actions[-20:]],
    }


def _last_per_loop(actions: tuple[control.ActionRecord, ...]) -> dict[str, control.ActionRecord]:
    out: dict[str, control.ActionRecord] = {}
    for rec in actions:
        out[rec.loop] = rec
    return out


def unrouted(snap: Snapshot) -> list[str]:
    """Replicas the agents hold that the gateway does not route new requests to: leaving
    ones, or new ones loading before their cut-over."""
    routed = set(snap.replicas)
    held = {b.replica_id for a in snap.observed.agents for b in a.blocks}
    return sorted(held - routed)


def svg(snap: Snapshot) -> str:
    picture = layout_svg.from_observed(
        snap.observed,
        unrouted(snap),
        title=f"routes version {snap.version}",
        shared_bytes=snap.shared_bytes,
    )
    return layout_svg.render(picture, snap.shares)


def page(snap: Snapshot, model: str) -> str:
    e = html.escape
    rows = []
    for rid, st in snap.replicas.items():
        used, total = st.get("kv_pages_used", 0), st.get("kv_pages_total", 0)
        pct = f"{used / total:.0%}" if total else "-"
        rows.append(
            f'<tr data-replica="{e(rid)}"><td>{e(rid)}</td><td>{"yes" if st.get("ready") else "no"}'
            f"</td><td>{used}/{total} ({pct})</td><td>{st.get('running', 0)}</td>"
            f"<td>{st.get('waiting', 0)}</td><td>{e(str(st.get('detail', '')))}</td></tr>"
        )
    for rid in unrouted(snap):
        why = (
            "leaving: draining or moving its requests"
            if rid in snap.leaving
            else "not routed (leaving, or loading before its cut-over)"
        )
        rows.append(
            f'<tr data-replica="{e(rid)}" class="leaving"><td>{e(rid)}</td>'
            f'<td colspan="5">{why}</td></tr>'
        )
    last = _last_per_loop(snap.actions)
    loops = [
        f'<tr data-loop="{e(loop)}"><td>{e(loop)}</td>'
        + (
            f"<td>{e(rec.action)}</td><td>{e(rec.outcome)}</td><td>{rec.seconds:.2f}s</td>"
            f"<td>{e(time.strftime('%H:%M:%S', time.localtime(rec.started)))}</td>"
            f"<td>{e(rec.detail)}</td>"
            if (rec := last.get(loop))
            else '<td colspan="5">no action yet (or the loop runs in another process)</td>'
        )
        + "</tr>"
        for loop in control.LOOPS
    ]
    shares = [
        f'<tr data-class="{e(c)}"><td>{e(c)}</td><td>'
        + ", ".join(f"{e(r)}: {v:.0%}" for r, v in sorted(per.items()))
        + "</td></tr>"
        for c, per in sorted(snap.shares.items())
    ] or ['<tr><td colspan="2">no class shares (plain balancing)</td></tr>']
    unreachable = [a for a in snap.observed.agents if not a.reachable]
    warn = "".join(
        f'<p class="warn">agent {e(a.address)} unreachable: {e(a.error)}</p>' for a in unreachable
    )
    return _TEMPLATE.format(
        refresh=REFRESH_S,
        model=e(model),
        version=snap.version,
        picture=svg(snap),
        warn=warn,
        replicas="\n".join(rows),
        loops="\n".join(loops),
        shares="\n".join(shares),
        when=e(time.strftime("%Y-%m-%d %H:%M:%S")),
    )


_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh}">
<title>Tessera: {model}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 16px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; font-size: 13px; text-align: left; }}
th {{ background: #f3f3f3; }} .warn {{ color: #b00; }} tr.leaving {{ color: #888; }}
</style></head>
<body>
<h1>Tessera: {model} <small>(routes version {version})</small></h1>
{warn}
<h2>Layout</h2>
<div id="layout">{picture}</div>
<h2>Replicas</h2>
<table id="replicas"><tr><th>replica</th><th>ready</th><th>KV pages used</th>
<th>running</th><th>waiting</th><th>detail</th></tr>
{replicas}
</table>
<h2>Control loops: last action</h2>
<table id="loops"><tr><th>loop</th><th>action</th><th>outcome</th><th>took</th>
<th>ended</th><th>detail</th></tr>
{loops}
</table>
<h2>Class shares of the plan</h2>
<table id="shares"><tr><th>class</th><th>replica shares</th></tr>
{shares}
</table>
<p><small>read at {when}; refreshed every {refresh}s</small></p>
</body></html>
"""


class _Forward(Collector):
    """The control recorder's metrics, collected into the gateway's registry."""

    def __init__(self, recorder: control.Recorder) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Any]:
        yield from self.recorder.registry.collect()


def _authorized(keys: auth.ApiKeys | None, request: web.Request) -> bool:
    if keys is None:
        return True
    token = auth.bearer(request)
    if not token:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                token = base64.b64decode(value.strip()).decode().partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                token = ""
    return bool(token) and keys.name_of(token) is not None


def install(
    application: web.Application,
    service: app.Service,
    switch: cutover.Cutover,
    shares: Callable[[], Mapping[str, Mapping[str, float]]],
    recorder: control.Recorder | None = None,
) -> StatusPage:
    """Register /status, /status/layout.svg and /admin/v1/status; forward the control
    loops' metrics to /metrics."""
    rec = recorder or control.current()
    status = StatusPage(service, switch, shares, rec)
    service.metrics.registry.register(_Forward(rec))

    def denied(request: web.Request) -> web.Response | None:
        """401 asking for Basic (a browser prompts) unless the request carries a key."""
        if _authorized(service.api_keys, request):
            return None
        return web.Response(
            status=401,
            headers={"WWW-Authenticate": 'Basic realm="tessera status"'},
            text="an API key is needed (Bearer, or Basic with the key as password)\n",
        )

    async def html_page(request: web.Request) -> web.StreamResponse:
        if (no := denied(request)) is not None:
            return no
        body = page(await status.snapshot(), service.model_name)
        return web.Response(text=body, content_type="text/html")

    async def picture(request: web.Request) -> web.StreamResponse:
        if (no := denied(request)) is not None:
            return no
        return web.Response(text=svg(await status.snapshot()), content_type="image/svg+xml")

    async def as_json(request: web.Request) -> web.StreamResponse:
        if (no := denied(request)) is not None:
            return no
        return web.json_response(to_json(await status.snapshot()))

    application.router.add_get("/status", html_page)
    application.router.add_get("/status/layout.svg", picture)
    application.router.add_get("/admin/v1/status", as_json)
    return status
