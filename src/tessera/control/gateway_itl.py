"""Read the gateway's inter-token latency histogram: `GET /metrics`, as Prometheus scrapes it.

The module-scaling loop's SLO signal is the gateway's
`tessera_gateway_inter_token_latency_seconds` histogram (cumulative buckets); the loop
takes the window between two reads (`policies.scaling_signal.window`). Pulled each tick,
as the overload loop pulls `/admin/v1/load` (`gateway_load` says why). Input: the URL
and the admin token (`/metrics` is open to Prometheus, but the pull carries the token
as every pull of the operator does).
Output: `scaling_signal.Hist`. Caller: `tessera_operator.scaling_tick`.
"""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tessera.control import gateway_load
from tessera.policies.scaling import signal as sig

METRICS_PATH = "/metrics"
ITL = "tessera_gateway_inter_token_latency_seconds"
TIMEOUT_S = 2.0


def parse(text: str) -> sig.Hist:
    """The histogram in a Prometheus text document; ValueError when absent."""
    for family in text_string_to_metric_families(text):
        if family.name == ITL:
            return sig.from_samples(family.samples)
    raise ValueError(f"no {ITL} histogram")


async def fetch(
    url: str, token: str = "", session: gateway_load.AdminSession | None = None
) -> sig.Hist:
    """GET and parse; ValueError saying why it could not be read. `token`: the gateway's
    admin token (sent as a bearer token when set); `session`: a kept one, else one for
    this call."""
    headers = gateway_load.admin_headers(token)
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with (
            gateway_load.client(session) as s,
            s.get(url, headers=headers, timeout=timeout) as r,
        ):
            if r.status != 200:
                raise ValueError(f"GET {url}: HTTP {r.status}")
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"GET {url}: {exc!r}") from exc
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"GET {url}: {exc}") from exc
