"""Push a routes document straight to the gateway: `PUT /admin/v1/routes`.

The routes ConfigMap stays the source of truth (what a restarted gateway reads), but a
kubelet refreshes a mounted ConfigMap only about once a minute, so a loop that waits for
the gateway to stop routing a drop's donors would wait that long. The operator writes the
ConfigMap, then pushes the same document here; the gateway orders file and push by
(`version`, `revision`) (`tessera.routes_doc`), so neither undoes a newer one. Input: the
gateway's routes URL, the document, the admin token (the admin endpoints' own). Output: the
seconds the push took; ValueError saying why it failed (gateway down, 4xx, timeout): the
caller logs it and falls back to the file. Caller: `tessera_operator.routes_publish`.
"""

from __future__ import annotations

import time

import aiohttp

from tessera import routes_doc
from tessera.control import gateway_load

TIMEOUT_S = 2.0


async def push(
    url: str,
    doc: routes_doc.RoutesDoc,
    token: str = "",
    session: gateway_load.AdminSession | None = None,
) -> float:
    """PUT `doc` to `url` (module docstring); the seconds it took, ValueError if not applied.
    `session`: a kept one (`gateway_load.AdminSession`), else one for this call."""
    headers = gateway_load.admin_headers(token)
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    try:
        async with (
            gateway_load.client(session) as s,
            s.put(url, json=doc.to_json(), headers=headers, timeout=timeout) as r,
        ):
            if r.status != 200:
                text = (await r.text())[:300]
                raise ValueError(f"PUT {url}: HTTP {r.status} {text}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"PUT {url}: {exc!r}") from exc
    return time.monotonic() - start
