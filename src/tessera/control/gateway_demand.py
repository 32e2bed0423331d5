"""Read the gateway's demand for the autoscaler: held requests, waiting calls, TTFT.

The autoscale loop (`autoscale_loop`) pulls, each tick, `GET /admin/v1/load` (the calls
per replica and `held`: the requests waiting for a replica to wake, `gateway/hold.py`)
and `GET /metrics` (the `tessera_gateway_time_to_first_token_seconds` histogram, whose
window between two reads gives the p99 TTFT); pulled rather than pushed for the reasons
`gateway_load` gives. `tessera up` builds the same `Demand` from its in-process gateway.
Input: the gateway's base URL and the admin token. Output: `Demand`. Callers:
`tessera_operator.autoscale_tick`, `tessera.cli.up_autoscale`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tessera.control import gateway_load
from tessera.policies.scaling import signal as sig

TTFT = "tessera_gateway_time_to_first_token_seconds"
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Demand:
    held: int = 0  # requests held for a replica to wake
    queued: int = 0  # calls with no token yet, on any replica
    busy: frozenset[str] = field(default_factory=frozenset)  # replicas with calls
    ttft: sig.Hist | None = None  # cumulative TTFT histogram (None: not read)


def from_calls(calls: gateway_load.Calls, held: int, ttft: sig.Hist | None) -> Demand:
    return Demand(
        held,
        sum(1 for cs in calls.values() for c in cs if not c.started),
        frozenset(r for r, cs in calls.items() if cs),
        ttft,
    )


def p99(prev: sig.Hist | None, now: sig.Hist | None) -> float | None:
    """The p99 of the observations between two reads of a cumulative histogram
    (interpolated in its bucket; the largest finite bound when it falls past it); None
    when nothing was observed."""
    if now is None:
        return None
    if prev is not None and prev.bounds != now.bounds:
        prev = None
    base = prev.counts if prev is not None else (0.0,) * len(now.counts)
    total = now.total - (prev.total if prev is not None else 0.0)
    if total <= 0:
        return None
    want = 0.99 * total
    lo_b, lo_c = 0.0, 0.0
    for b, c, c0 in zip(now.bounds, now.counts, base, strict=True):
        d = c - c0
        if d >= want:
            if math.isinf(b):
                return lo_b
            return lo_b + (b - lo_b) * (want - lo_c) / max(d - lo_c, 1e-12)
        lo_b, lo_c = (lo_b if math.isinf(b) else b), d
    return lo_b


async def fetch(
    base_url: str, token: str = "", session: gateway_load.AdminSession | None = None
) -> Demand:
    """GET `/admin/v1/load` and `/metrics`; ValueError saying why they could not be read.
    `session`: a kept one (`gateway_load.AdminSession`), else one for this call."""
    url = base_url.rstrip("/")
    headers = gateway_load.admin_headers(token)
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with gateway_load.client(session) as s:
            load_url = url + gateway_load.LOAD_PATH
            async with s.get(load_url, headers=headers, timeout=timeout) as r:
                if r.status != 200:
                    raise ValueError(f"GET {url}{gateway_load.LOAD_PATH}: HTTP {r.status}")
                doc = await r.json(content_type=None)
            async with s.get(url + "/metrics", headers=headers, timeout=timeout) as r:
                text = await r.text() if r.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ValueError(f"GET {url}: {exc!r}") from exc
    try:
        calls = gateway_load.parse(doc)
        held = int(doc.get("held", 0))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"GET {url}{gateway_load.LOAD_PATH}: {exc}") from exc
    ttft = None
    for family in text_string_to_metric_families(text):
        if family.name == TTFT:
            ttft = sig.from_samples(family.samples)
    return from_calls(calls, held, ttft)
