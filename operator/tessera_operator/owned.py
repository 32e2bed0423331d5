"""Create-or-replace of objects the operator owns, writing only when the desired state changed.

Called by `reconciler.py` for the gateway ConfigMap, Deployment and Service. The API
server fills defaults into what it stores, so comparing stored and desired objects field
by field would always differ; instead each object carries the hash of the desired
manifest it was written from (annotation `serving.tessera.dev/desired-hash`) and is
replaced only when that hash changes. A converged pass therefore costs one GET per
object and no write. Fields the server owns (a Service's clusterIP) are carried over.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tessera import api
from tessera_operator import kube

HASH_ANNOTATION = f"{api.API_GROUP}/desired-hash"

# (apiVersion, kind) -> plural
PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("apps/v1", "Deployment"): "deployments",
    ("cert-manager.io/v1", "Certificate"): "certificates",  # gateway_certificate.py
}


@dataclass(frozen=True)
class Applied:
    kind: str
    name: str
    action: str  # "created", "updated" or "unchanged"


def desired_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _carry_over(desired: dict[str, Any], existing: dict[str, Any]) -> None:
    if desired["kind"] == "Service":
        for key in ("clusterIP", "clusterIPs"):
            if key in existing.get("spec", {}):
                desired["spec"][key] = existing["spec"][key]


async def apply(
    client: kube.Kube, desired: dict[str, Any], existing: dict[str, Any] | None = None
) -> Applied:
    """Create `desired`, or replace the existing object when its desired hash differs.
    `existing`: the object as just read in this pass (saves a GET), else it is read."""
    obj = copy.deepcopy(desired)
    digest = desired_hash(desired)
    meta = obj["metadata"]
    meta.setdefault("annotations", {})[HASH_ANNOTATION] = digest
    plural = PLURALS[(obj["apiVersion"], obj["kind"])]
    ns, name = meta["namespace"], meta["name"]
    if existing is None:
        existing = await client.get(kube.path(obj["apiVersion"], plural, ns, name))
    if existing is None:
        await client.create(kube.path(obj["apiVersion"], plural, ns), obj)
        return Applied(obj["kind"], name, "created")
    if (existing["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == digest:
        return Applied(obj["kind"], name, "unchanged")
    meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
    _carry_over(obj, existing)
    await client.replace(kube.path(obj["apiVersion"], plural, ns, name), obj)
    return Applied(obj["kind"], name, "updated")
