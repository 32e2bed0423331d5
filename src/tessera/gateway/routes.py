"""The routes file: replicas and class shares published to the gateway as JSON.

The operator writes it into a ConfigMap mounted in the gateway pod (`tessera up` hands the same
document to its in-process gateway); the gateway (`server.py`) re-reads the file when its
mtime, size or inode changes (so a ConfigMap's atomic symlink swap counts). Schema:
`tessera.routes_doc` (`model`, `modelPath`, `replicas`, `classShares`, `classes`, `version`,
`drainDeadlineSeconds`). Only `replicas` is required; a replica with an empty `address` (leader
not known yet) is left out until a later version names it. `classes` (representative token
counts) let the gateway classify requests for `classShares`. `version` and
`drainDeadlineSeconds` drive the cut-over (`cutover.py`); a document older than the one served
is ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from tessera import routes_doc, variant_routes
from tessera.gateway import config

DEFAULT_DRAIN_DEADLINE_S = routes_doc.DEFAULT_DRAIN_DEADLINE_S


@dataclass(frozen=True)
class Routes:
    """A parsed routes file."""

    replicas: tuple[config.ReplicaEndpoint, ...]
    model: str = ""
    model_path: str = ""
    class_shares: dict[str, dict[str, float]] = field(default_factory=dict)
    class_centroids: dict[str, tuple[float, float]] = field(default_factory=dict)
    version: int = 0  # plan generation; a higher one is a cut-over
    revision: int = 0  # within a version: a lower one is older (`routes_doc.successor`)
    drain_deadline_s: float = DEFAULT_DRAIN_DEADLINE_S  # leaving replicas' requests by then
    variants: tuple[variant_routes.RouteVariant, ...] = ()  # models served beside the foundation
    closed: frozenset[str] = frozenset()  # replicas sent new requests only when none else is


def from_doc(doc: routes_doc.RoutesDoc) -> Routes:
    """The gateway's view of a routes document (the schema lives in `tessera.routes_doc`);
    ValueError naming a replica whose address is not host:port."""
    replicas = []
    for i, r in enumerate(doc.replicas):
        if r.address == "":
            continue  # not placed yet: unroutable, and not an error
        try:
            replicas.append(config.ReplicaEndpoint(r.id, r.address))
        except ValueError as exc:
            raise ValueError(f"replicas[{i}].{exc}") from exc
    return Routes(
        replicas=tuple(replicas),
        model=doc.model,
        model_path=doc.model_path,
        class_shares={k: dict(v) for k, v in doc.class_shares.items()},
        class_centroids={c.name: (c.input_tokens, c.output_tokens) for c in doc.classes},
        version=doc.version,
        revision=doc.revision,
        drain_deadline_s=doc.drain_deadline_s,
        variants=doc.variants,
        closed=frozenset(r.id for r in doc.replicas if r.closed),
    )


def parse(obj: object) -> Routes:
    """Validate a routes document; ValueError naming the bad field."""
    return from_doc(routes_doc.parse(obj))


def load(path: str) -> Routes:
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    return parse(doc)


GONE = (-1, -1, -1)  # the stamp of a file that could not be stat'ed


class RoutesWatcher:
    """Re-reads the routes file when its mtime (or size) changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None  # GONE: the file could not be read

    def poll(self) -> Routes | None:
        """New routes if the file changed since the last poll, else None. Raises ValueError
        (file unreadable or invalid) once per change; the caller keeps the old routes."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self._seen == GONE:  # said once: the 20 ms check must not flood the log
                return None
            self._seen = GONE
            raise ValueError(f"{self.path}: {exc.strerror}") from exc
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._seen:
            return None
        self._seen = stamp
        try:
            return load(self.path)
        except OSError as exc:
            raise ValueError(f"{self.path}: {exc.strerror}") from exc
