"""kstatus's rules, written from its documentation, to check what cluster tooling would see.

sigs.k8s.io/cli-utils `pkg/kstatus` (used by Flux, Argo CD health checks and
`kubectl wait`-style tooling) computes a resource's status without knowing its kind:
* `metadata.deletionTimestamp` set → Terminating;
* `status.observedGeneration` present and different from `metadata.generation` →
  InProgress (the controller has not seen the latest spec);
* a condition `Reconciling` with status True → InProgress;
* a condition `Stalled` with status True → Failed;
* otherwise → Current.
Reconciling and Stalled are abnormal-true conditions: absent or False means normal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def compute(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    observed = status.get("observedGeneration")
    if observed is not None and observed != meta.get("generation"):
        return "InProgress"
    for c in status.get("conditions") or []:
        if c.get("type") == "Reconciling" and c.get("status") == "True":
            return "InProgress"
        if c.get("type") == "Stalled" and c.get("status") == "True":
            return "Failed"
    return "Current"
