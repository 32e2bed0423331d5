"""Where each replica's blocks came from and its time to ready, for status and events.

`sources(out)` sums, per replica of the plan that is loaded, what its blocks' agents
report (`observed.AgentInfo.loads`, from `Describe`'s `BlockInfo.load`): bytes copied
from peers, taken from the agents' host block caches, read from storage, and the seconds
its blocks took from the load request to ready (the sum: a replica's stages load one
after the other, last first). Written as `status.replicaSources` by `status.build`;
`ready_events` names the replicas that first appear there (one `ReplicaReady` event per
scale step's new replica). Called by `status` and `reconciler`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from tessera.control import outcome


def sources(out: outcome.Outcome) -> list[dict[str, Any]]:
    """`[{replicaId, readySeconds, source: {peer, host, storage}}]` of the plan's replicas
    whose every block is loaded and reports its load."""
    if out.plan is None or out.observed is None:
        return []
    ready = set(out.ready_replicas)
    by_replica: dict[str, list[Any]] = {}
    for a in out.observed.agents:
        if a.reachable:
            for load in a.loads:
                by_replica.setdefault(load.replica_id, []).append(load)
    docs = []
    for r in out.plan.replicas:
        loads = by_replica.get(r.replica_id)
        if r.replica_id not in ready or not loads:
            continue
        docs.append(
            {
                "replicaId": r.replica_id,
                "readySeconds": round(sum(x.seconds for x in loads), 3),
                "source": {
                    "peer": sum(x.peer_bytes for x in loads),
                    "host": sum(x.host_bytes for x in loads),
                    "storage": sum(x.storage_bytes for x in loads),
                },
            }
        )
    return docs


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def ready_events(
    body: kopf.Body, old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> None:
    """One `ReplicaReady` event per replica new in `status.replicaSources`."""
    seen = {d.get("replicaId") for d in old}
    for d in new:
        if d["replicaId"] in seen:
            continue
        src = d["source"]
        kopf.info(
            body,
            reason="ReplicaReady",
            message=(
                f"replica {d['replicaId']} ready in {d['readySeconds']:.2f} s: "
                f"{_mb(src['peer'])} from peers, {_mb(src['host'])} from host caches, "
                f"{_mb(src['storage'])} from storage"
            ),
        )
