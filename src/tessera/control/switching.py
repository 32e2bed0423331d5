"""The predictive switching loop (OServe): one step per span — observe, decide, report.

Inputs: the gateway's per-class arrivals per span (`arrivals`, e.g. `fetch_arrivals`) and
the candidate deployments (`candidates`, or `planner_candidates`: the planner's layouts
for the observed agents, priced per class, with switch times). A complete span is decided
by the pure `tessera.policies.switching.decide.decide` (in a thread: pricing can take
seconds), returning a `switching_decide.Outcome` (status, an event, in active mode a new
`spec.layout`) for the shell to write; the next reconcile pass applies the layout. Acts on
no agent; a failure becomes the outcome's reason. Caller: the operator's timer
(`tessera_operator.switching_loop`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from tessera import api, model_facts
from tessera.control import agents, gateway_load
from tessera.cost import calibration as cost_calibration
from tessera.cost import profile as cost_profile
from tessera.policies.switching import candidates as switching_candidates
from tessera.policies.switching import current as switching_current
from tessera.policies.switching import decide as switching_decide
from tessera.policies.switching import planner as switching_planner
from tessera.rpc import transport

ARRIVALS_PATH = "/admin/v1/arrivals"
FETCH_TIMEOUT_S = 5.0

SwitchingCandidates = switching_decide.SwitchingCandidates
Outcome = switching_decide.Outcome
Placed = Sequence[Mapping[str, Any]] | None
Arrivals = Callable[[], Awaitable[dict[str, Any]]]
# (class names, the auto planner's placement or None) -> the candidates; ValueError: none
Candidates = Callable[[Sequence[str], Placed], Awaitable[SwitchingCandidates | None]]


async def fetch_arrivals(
    url: str, token: str = "", session: gateway_load.AdminSession | None = None
) -> dict[str, Any]:
    """The gateway's arrivals snapshot (`token`: its admin token, sent when set; `session`:
    a kept one, else one for this call); ValueError saying why it could not be read."""
    headers = gateway_load.admin_headers(token)
    try:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with (
            gateway_load.client(session) as s,
            s.get(url, headers=headers, timeout=timeout) as r,
        ):
            if r.status != 200:
                raise ValueError(f"GET {url}: HTTP {r.status}")
            doc = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise ValueError(f"GET {url}: {exc!r}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("spans"), list):
        raise ValueError(f"GET {url}: not an arrivals document")
    return doc


async def planner_candidates(
    dep: api.ServingDeployment,
    model_path: str,
    refs: Sequence[agents.AgentRef],
    names: Sequence[str],
    profile: cost_profile.Profile | None = None,
    placed: Placed = None,
    cache: switching_candidates.CandidateCache | None = None,
    max_candidates: int = switching_planner.MAX_CANDIDATES,
    calibration: cost_calibration.Calibration | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> SwitchingCandidates:
    """The planner's candidates for `dep` on the agents `refs` as observed now (the cost
    `profile` that `layout: auto` would use, or None for its default), priced with the
    latency model's `calibration` when given (its per-layout error then sets the switching
    threshold); ValueError saying why there are none."""
    shape = model_facts.served_shape(model_path, dep.spec.model.dtype)
    if shape is None:
        raise ValueError(f"model not readable: no config.json in {model_path}")
    obs = await agents.observe(refs, tls=tls)
    made = await asyncio.to_thread(
        switching_candidates.build,
        dep,
        shape,
        obs,
        names,
        profile,
        placed=placed,
        cache=cache,
        max_candidates=max_candidates,
    )
    if calibration is None:
        return SwitchingCandidates(made.layouts, made.planned.price, made.planned.switch_seconds)
    cal, raw = calibration, made.planned.price

    def price(name: str, demand: tuple[float, ...]) -> float:
        return float(cal.price(name, raw(name, demand)))

    return SwitchingCandidates(made.layouts, price, made.planned.switch_seconds, cal.error)


async def step(
    dep: api.ServingDeployment,
    raw_spec: Mapping[str, Any],
    status: Mapping[str, Any],
    arrivals: Arrivals,
    candidates: Candidates,
    now: str,
) -> Outcome:
    """One span's step (module docstring); `status` is the deployment's status as read."""
    sw = dep.spec.policies.switching
    previous = dict(status.get("switching") or {})
    base = {
        "mode": sw.mode,
        "spanSeconds": sw.span_seconds,
        "lastStepTime": now,
        "specLayout": dep.spec.layout.mode,
    }
    held = base | switching_decide.held(previous)
    placed = (
        switching_current.placed_replicas(status.get("plan"))
        if dep.spec.layout.mode == "auto"
        else None
    )
    try:
        snapshot = await arrivals()
    except ValueError as exc:
        return switching_decide.stopped(held, "ArrivalsUnavailable", str(exc))
    names = [str(n) for n in snapshot.get("classes") or []]
    try:
        # without a complete span decide waits: nothing to price yet
        made = await candidates(names, placed) if snapshot.get("spans") else None
    except ValueError as exc:
        return switching_decide.stopped(held, "NoCandidates", str(exc))
    return await asyncio.to_thread(
        switching_decide.decide,
        dep,
        raw_spec,
        previous,
        "transition" in status,
        snapshot,
        made,
        now,
        placed,
    )
