"""The routes document's schema: one place for the operator (writer) and the gateway (reader).

Written by the operator (`tessera_operator.gateway_objects.routes`) and `tessera up`; re-read by
the gateway (`tessera.gateway.routes`), which answers `GET /admin/v1/routes` with `AdminRoutes`.
JSON: `version` (plan generation), `revision` (bumped by every writer that changes the
document: `successor`), `drainDeadlineSeconds`, `cutOverAt` (unix time published), `model`,
`modelPath`, `replicas` (`id`, `address`, `closed`), `classShares`, `classes`. The gateway
orders documents by (`version`, `revision`): one older than the one it serves is ignored, so a
late file read never undoes a newer push (`PUT /admin/v1/routes`). Every change of the replica
set is a cut-over, even at one `version`; replicas named before but not now are leaving (they
drain within `drainDeadlineSeconds` or have their KV moved). Pure; docs/transitions.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera import variant_routes

DEFAULT_DRAIN_DEADLINE_S = 30.0


@dataclass(frozen=True)
class RouteReplica:
    id: str
    address: str  # the leader's (stage 0) agent, host:port; "" = not placed yet
    # no new requests while another replica is routable; its running and queued ones stay
    # (the head of an overload drop, until its pool has grown: docs/overload.md)
    closed: bool = False


@dataclass(frozen=True)
class ClassCentroid:
    name: str
    input_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class RoutesDoc:
    replicas: tuple[RouteReplica, ...]
    version: int = 0
    drain_deadline_s: float = DEFAULT_DRAIN_DEADLINE_S
    cut_over_at: float = 0.0
    model: str = ""
    model_path: str = ""
    class_shares: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    classes: tuple[ClassCentroid, ...] = ()
    variants: tuple[variant_routes.RouteVariant, ...] = ()  # issue 14: variant_routes.py
    revision: int = 0  # bumped by each write that changes the document (`successor`)

    @property
    def replica_ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.replicas)

    @property
    def order(self) -> tuple[int, int]:
        """What the gateway orders documents by: a lower one is stale."""
        return (self.version, self.revision)

    def to_json(self) -> dict[str, Any]:
        out = self._base_json()
        if self.variants:
            out["variants"] = [v.to_json() for v in self.variants]
        return out

    def _base_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "revision": self.revision,
            "drainDeadlineSeconds": self.drain_deadline_s,
            "cutOverAt": self.cut_over_at,
            "model": self.model,
            "modelPath": self.model_path,
            "replicas": [
                {"id": r.id, "address": r.address, **({"closed": True} if r.closed else {})}
                for r in self.replicas
            ],
            "classShares": {k: dict(v) for k, v in self.class_shares.items()},
            "classes": [
                {"name": c.name, "inputTokens": c.input_tokens, "outputTokens": c.output_tokens}
                for c in self.classes
            ],
        }


def successor(stored: RoutesDoc | None, new: RoutesDoc, floor: int = 0) -> RoutesDoc:
    """`new` as the write that follows `stored` (the document as read back): the stored
    revision when nothing else differs (an unchanged write stays unchanged), else one past
    it and at least `floor` (the operator's wall clock in ms: a deleted and recreated
    document still orders after what the gateway holds). Revisions never go down."""
    if stored is None:
        return dataclasses.replace(new, revision=max(new.revision, floor))
    same = dataclasses.replace(new, revision=stored.revision)
    if same.to_json() == stored.to_json():
        return same
    return dataclasses.replace(new, revision=max(new.revision, stored.revision + 1, floor))


def leaving(previous: RoutesDoc | None, new: RoutesDoc) -> tuple[str, ...]:
    """Replicas `previous` named that `new` does not."""
    if previous is None:
        return ()
    keep = set(new.replica_ids)
    return tuple(r for r in previous.replica_ids if r not in keep)


def parse(obj: object) -> RoutesDoc:
    """Validate a routes document; ValueError naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("routes: expected a JSON object")
    raw = obj.get("replicas")
    if not isinstance(raw, list):
        raise ValueError("replicas: expected a list of {id, address}")
    replicas = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"replicas[{i}]: expected an object")
        rid, address = item.get("id", ""), item.get("address", "")
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"replicas[{i}].id: expected a non-empty string")
        if not isinstance(address, str):
            raise ValueError(f"replicas[{i}].address: expected a string host:port")
        closed = item.get("closed", False)
        if not isinstance(closed, bool):
            raise ValueError(f"replicas[{i}].closed: expected true or false")
        replicas.append(RouteReplica(rid, address, closed))
    ids = [r.id for r in replicas]
    if len(set(ids)) != len(ids):
        raise ValueError(f"replicas: duplicate ids in {ids}")
    return RoutesDoc(
        replicas=tuple(replicas),
        version=_count(obj, "version"),
        revision=_count(obj, "revision"),
        drain_deadline_s=_number(
            obj.get("drainDeadlineSeconds", DEFAULT_DRAIN_DEADLINE_S), "drainDeadlineSeconds"
        ),
        cut_over_at=_number(obj.get("cutOverAt", 0.0), "cutOverAt"),
        model=_str(obj, "model"),
        model_path=_str(obj, "modelPath"),
        class_shares=_shares(obj.get("classShares", {})),
        classes=_classes(obj.get("classes", [])),
        variants=variant_routes.parse(obj.get("variants", []), _str(obj, "model")),
    )


@dataclass(frozen=True)
class AdminRoutes:
    """`GET /admin/v1/routes` of the gateway: the version (and revision) it routes by, its
    replicas and, per leaving replica, the requests still in flight there."""

    version: int
    replicas: tuple[str, ...]
    leaving: Mapping[str, int] = field(default_factory=dict)
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "revision": self.revision,
            "replicas": list(self.replicas),
            "leaving": dict(self.leaving),
        }


def parse_admin(obj: object) -> AdminRoutes:
    if not isinstance(obj, dict):
        raise ValueError("admin routes: expected a JSON object")
    version, replicas, gone = obj.get("version"), obj.get("replicas"), obj.get("leaving", {})
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError("version: expected an integer")
    if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
        raise ValueError("replicas: expected a list of replica ids")
    if not isinstance(gone, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in gone.values()
    ):
        raise ValueError("leaving: expected {replica id: in-flight count}")
    revision = obj.get("revision", 0)
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise ValueError("revision: expected an integer")
    leaving_now = {str(k): int(v) for k, v in gone.items()}
    return AdminRoutes(version, tuple(replicas), leaving_now, revision)


def _count(obj: Mapping[str, Any], key: str) -> int:
    v = obj.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{key}: expected an integer >= 0")
    return v


def _str(obj: Mapping[str, Any], key: str) -> str:
    v = obj.get(key, "")
    if not isinstance(v, str):
        raise ValueError(f"{key}: expected a string")
    return v


def _number(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"{where}: expected a number >= 0")
    return float(v)


def _shares(v: object) -> dict[str, dict[str, float]]:
    if not isinstance(v, dict):
        raise ValueError("classShares: expected {class: {replica: share}}")
    out: dict[str, dict[str, float]] = {}
    for name, per in v.items():
        if not isinstance(per, dict):
            raise ValueError(f"classShares.{name}: expected {{replica: share}}")
        out[str(name)] = {str(r): _number(s, f"classShares.{name}.{r}") for r, s in per.items()}
    return out


def _classes(v: object) -> tuple[ClassCentroid, ...]:
    if not isinstance(v, list):
        raise ValueError("classes: expected a list of {name, inputTokens, outputTokens}")
    out = []
    for i, c in enumerate(v):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise ValueError(f"classes[{i}]: expected {{name, inputTokens, outputTokens}}")
        out.append(
            ClassCentroid(
                c["name"],
                _number(c.get("inputTokens"), f"classes[{i}].inputTokens"),
                _number(c.get("outputTokens"), f"classes[{i}].outputTokens"),
            )
        )
    return tuple(out)
