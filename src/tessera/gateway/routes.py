"""The routes file: replicas and class shares published to the gateway as JSON.

The Kubernetes operator writes it into a ConfigMap mounted in the gateway pod; the
gateway (`server.py`) re-reads it whenever its mtime changes. Format:

    {"model": "NAME", "modelPath": "DIR",
     "replicas": [{"id": "r0", "address": "host:port"}, ...],
     "classShares": {"CLASS": {"r0": 0.7, "r1": 0.3}, ...},
     "classes": [{"name": "CLASS", "inputTokens": 512, "outputTokens": 128}, ...],
     "version": 3, "drainDeadlineSeconds": 30}

Only `replicas` is required; a replica whose `address` is still empty (its leader agent
is not known yet) is left out until a later version of the file names it. `classes`
(representative token counts, as in the ServingDeployment spec) let the gateway classify
requests for `classShares`. `version` (the plan generation, default 0) and
`drainDeadlineSeconds` drive the cut-over (`cutover.py`): replicas the previous document
named that a new one does not are *leaving*; their in-flight requests finish there within
the deadline or move. A document with a lower version than the one served is ignored. A
change is detected by mtime, size or inode, so the atomic
symlink swap of a mounted ConfigMap counts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from tessera.gateway import config

DEFAULT_DRAIN_DEADLINE_S = 30.0


@dataclass(frozen=True)
class Routes:
    """A parsed routes file."""

    replicas: tuple[config.ReplicaEndpoint, ...]
    model: str = ""
    model_path: str = ""
    class_shares: dict[str, dict[str, float]] = field(default_factory=dict)
    class_centroids: dict[str, tuple[float, float]] = field(default_factory=dict)
    version: int = 0  # plan generation; a higher one is a cut-over
    drain_deadline_s: float = DEFAULT_DRAIN_DEADLINE_S  # leaving replicas' requests by then


def parse(obj: object) -> Routes:
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
        if item.get("address") == "":
            continue  # not placed yet: unroutable, and not an error
        try:
            replicas.append(
                config.ReplicaEndpoint(str(item.get("id", "")), str(item.get("address", "")))
            )
        except ValueError as exc:
            raise ValueError(f"replicas[{i}].{exc}") from exc
    ids = [r.replica_id for r in replicas]
    if len(set(ids)) != len(ids):
        raise ValueError(f"replicas: duplicate ids in {ids}")
    return Routes(
        replicas=tuple(replicas),
        model=_str(obj, "model"),
        model_path=_str(obj, "modelPath"),
        class_shares=_shares(obj.get("classShares", {})),
        class_centroids=_centroids(obj.get("classes", [])),
        version=_version(obj.get("version", 0)),
        drain_deadline_s=_number(
            obj.get("drainDeadlineSeconds", DEFAULT_DRAIN_DEADLINE_S), "drainDeadlineSeconds"
        ),
    )


def load(path: str) -> Routes:
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    return parse(doc)


class RoutesWatcher:
    """Re-reads the routes file when its mtime (or size) changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def poll(self) -> Routes | None:
        """New routes if the file changed since the last poll, else None. Raises ValueError
        (file unreadable or invalid) once per change; the caller keeps the old routes."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise ValueError(f"{self.path}: {exc.strerror}") from exc
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._seen:
            return None
        self._seen = stamp
        try:
            return load(self.path)
        except OSError as exc:
            raise ValueError(f"{self.path}: {exc.strerror}") from exc


def _str(obj: dict[str, Any], key: str) -> str:
    v = obj.get(key, "")
    if not isinstance(v, str):
        raise ValueError(f"{key}: expected a string")
    return v


def _number(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"{where}: expected a number >= 0")
    return float(v)


def _version(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError("version: expected an integer >= 0")
    return v


def _shares(v: object) -> dict[str, dict[str, float]]:
    if not isinstance(v, dict):
        raise ValueError("classShares: expected {class: {replica: share}}")
    out: dict[str, dict[str, float]] = {}
    for name, per in v.items():
        if not isinstance(per, dict):
            raise ValueError(f"classShares.{name}: expected {{replica: share}}")
        out[str(name)] = {str(r): _number(s, f"classShares.{name}.{r}") for r, s in per.items()}
    return out


def _centroids(v: object) -> dict[str, tuple[float, float]]:
    if not isinstance(v, list):
        raise ValueError("classes: expected a list of {name, inputTokens, outputTokens}")
    out: dict[str, tuple[float, float]] = {}
    for i, c in enumerate(v):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise ValueError(f"classes[{i}]: expected {{name, inputTokens, outputTokens}}")
        out[c["name"]] = (
            _number(c.get("inputTokens"), f"classes[{i}].inputTokens"),
            _number(c.get("outputTokens"), f"classes[{i}].outputTokens"),
        )
    return out
