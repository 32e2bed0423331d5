"""The operator's one writer of the routes document: the ConfigMap, then a push to the gateway.

Called by `reconciler` (a transition's cut-over, and each pass's gateway objects) and by
`overload_loop` (a routes step). `write` reads the routes ConfigMap back (unless the caller
just did), stamps a changed document one revision past the stored one and at least the wall
clock in ms (`routes_doc.successor`; a recreated ConfigMap still orders after the old one),
replaces the ConfigMap (the source of truth: what a restarted gateway reads) and, when it
changed an existing one, pushes the same document to the gateway (`PUT /admin/v1/routes`,
`tessera.control.gateway_routes`) so it applies now rather than when the kubelet refreshes the
mounted file (about once a minute). A failed push is logged: the file still brings it.
`admin_url` is the gateway's admin base.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera import api, routes_doc
from tessera.control import gateway_load, gateway_routes
from tessera_operator import config, gateway_objects, kube, owned

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Written:
    applied: owned.Applied
    doc: routes_doc.RoutesDoc  # as written, with its revision
    pushed: bool  # the gateway took it over its admin API


def admin_url(cfg: config.OperatorConfig, dep: api.ServingDeployment) -> str:
    """The gateway's admin base URL: `cfg.gateway_admin_url` ("{namespace}", "{name}"
    filled) or the gateway Service's."""
    if cfg.gateway_admin_url:
        base = cfg.gateway_admin_url.format(namespace=dep.namespace, name=dep.name)
    else:
        base = gateway_objects.endpoint(dep)
    return base.rstrip("/")


async def stored(client: kube.Kube, dep: api.ServingDeployment) -> dict[str, Any] | None:
    """The routes ConfigMap as stored (None: absent)."""
    name = gateway_objects.routes_name(dep)
    return await client.get(kube.path("v1", "configmaps", dep.namespace, name))


async def write(
    client: kube.Kube,
    cfg: config.OperatorConfig,
    dep: api.ServingDeployment,
    owner: Mapping[str, Any],
    doc: routes_doc.RoutesDoc,
    existing: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
    session: gateway_load.AdminSession | None = None,
) -> Written:
    """Write `doc` (module docstring); `existing`: the ConfigMap as just read, else read;
    `clock`: the wall clock in s (tests); `session`: the deployment's kept admin session."""
    if existing is None:
        existing = await stored(client, dep)
    floor = int(clock() * 1000)  # a recreated ConfigMap still orders after the old one
    new = routes_doc.successor(gateway_objects.published(existing), doc, floor)
    cm = gateway_objects.config_map(dep, dict(owner), new.to_json())
    applied = await owned.apply(client, cm, existing)
    # a created ConfigMap: the gateway is not running yet, and reads the file when it starts
    pushed = applied.action == "updated" and await push(cfg, dep, new, session)
    return Written(applied, new, pushed)


async def push(
    cfg: config.OperatorConfig,
    dep: api.ServingDeployment,
    doc: routes_doc.RoutesDoc,
    session: gateway_load.AdminSession | None = None,
) -> bool:
    """PUT `doc` to the gateway; False (logged) when it did not take it."""
    url = admin_url(cfg, dep) + gateway_load.ROUTES_PATH
    try:
        took = await gateway_routes.push(url, doc, cfg.gateway_admin_token, session)
    except ValueError as exc:
        log.warning(
            "routes %d.%d of %s/%s not pushed (the gateway gets them from the file): %s",
            doc.version,
            doc.revision,
            dep.namespace,
            dep.name,
            exc,
        )
        return False
    log.debug("routes %d.%d pushed in %.1f ms", doc.version, doc.revision, took * 1000)
    return True
