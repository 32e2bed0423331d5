"""Which replica serves a request: per-class shares when set, else the replica that holds
the prompt's prefix in its KV cache when that is worth it, else least outstanding tokens.

Pure; called by the gateway (`tessera.gateway.dispatch`, via `tessera.gateway.router`) per
attempt, and by the simulator (`tessera.sim`). Outstanding tokens of a replica: over its
in-flight requests, prompt tokens until the first token arrives plus `max_tokens` not yet
generated; ties go to fewer in flight, then least recently picked. Class shares: a
`ClassRouter` `(prompt_tokens, max_tokens) -> class` (`centroid_class_router`,
`workload_class_router`) and `{class: {replica id: share}}` (the planner's
`Deployment.class_shares`) make a seeded weighted choice among ready replicas with a positive
share. Prefix affinity: the router remembers the replica it last sent prefixes of 32, 64, 128,
... tokens to (`PREFIX_ENTRIES`, LRU) and prefers the owner of the longest one while its
outstanding tokens exceed the least loaded's by at most the prefix length.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

ClassRouter = Callable[[int, int], str | None]
ClassShares = Mapping[str, Mapping[str, float]]
PREFIX_MIN = 32  # shortest prompt prefix remembered (tokens); lengths double from there
PREFIX_ENTRIES = 4096  # remembered prefixes, least recently used dropped


def _prefix_hashes(prompt_ids: Sequence[int], namespace: str = "") -> list[tuple[int, int]]:
    """(length, hash) of the prefixes remembered for a prompt, longest first: 32, 64, ...
    tokens, up to the whole prompt but its last token. `namespace` (the request's variant)
    is hashed in: a prefix cached under one adapter is not the same KV under another."""
    out, length = [], PREFIX_MIN
    while length < len(prompt_ids):
        out.append((length, hash((namespace, tuple(prompt_ids[:length])))))
        length *= 2
    return out[::-1]


@dataclass(frozen=True)
class Route:
    """A routing decision."""

    replica_id: str
    policy: str  # "class_share", "prefix_affinity" or "least_outstanding"
    class_name: str | None = None


@dataclass
class Ticket:
    """One request's token accounting on the replica it was routed to."""

    replica_id: str
    prompt_left: int  # until the first token arrives
    gen_left: int
    released: bool = False

    @property
    def outstanding(self) -> int:
        return self.prompt_left + self.gen_left


class Router:
    """Routes requests and keeps per-replica outstanding-token counts."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._tokens: dict[str, int] = {}
        self._requests: dict[str, int] = {}
        self._last_pick: dict[str, int] = {}
        self._picks = 0
        self._shares: dict[str, dict[str, float]] = {}
        self._classify: ClassRouter | None = None
        # hash of a prompt prefix -> replica (a hint: a collision only costs a prefill)
        self._owners: OrderedDict[int, str] = OrderedDict()

    # -- configuration ------------------------------------------------------------------
    def set_class_shares(self, shares: ClassShares, classify: ClassRouter | None) -> None:
        """Replace the per-class shares and classifier (empty shares: plain balancing)."""
        clean: dict[str, dict[str, float]] = {}
        for name, per_replica in shares.items():
            for rid, share in per_replica.items():
                if not (math.isfinite(share) and share >= 0):
                    raise ValueError(f"class_shares[{name}][{rid}]: {share} is not >= 0")
            clean[name] = dict(per_replica)
        self._shares, self._classify = clean, classify

    @property
    def class_shares(self) -> dict[str, dict[str, float]]:
        return {k: dict(v) for k, v in self._shares.items()}

    def class_weights(self, prompt_tokens: int, max_tokens: int) -> dict[str, float]:
        """The shares of the request's class ({} when none are set or it has none); for
        the KV-owner-first dispatch (`policies.kv_dispatch`)."""
        if not self._shares or self._classify is None:
            return {}
        return dict(self._shares.get(self._classify(prompt_tokens, max_tokens) or "", {}))

    # -- decisions ----------------------------------------------------------------------
    def choose(
        self,
        ready: Sequence[str],
        prompt_tokens: int,
        max_tokens: int,
        prompt_ids: Sequence[int] = (),
        variant: str = "",
    ) -> Route | None:
        """A replica among `ready` for this request, or None when `ready` is empty;
        `prompt_ids` (when given) enable prefix affinity and are remembered, per
        `variant`."""
        if not ready:
            return None
        prefixes = _prefix_hashes(prompt_ids, variant)
        route = self._choose(ready, prompt_tokens, max_tokens, prefixes)
        self._remember(prefixes, route.replica_id)
        return route

    def _choose(
        self,
        ready: Sequence[str],
        prompt_tokens: int,
        max_tokens: int,
        prefixes: list[tuple[int, int]],
    ) -> Route:
        class_name = None
        if self._shares and self._classify is not None:
            class_name = self._classify(prompt_tokens, max_tokens)
            weights = self._shares.get(class_name or "", {})
            options = [(rid, weights.get(rid, 0.0)) for rid in ready]
            options = [(rid, w) for rid, w in options if w > 0]
            if options:
                rid = self._rng.choices([r for r, _ in options], [w for _, w in options])[0]
                return self._picked(Route(rid, "class_share", class_name))
        best = min(
            ready,
            key=lambda r: (
                self._tokens.get(r, 0),
                self._requests.get(r, 0),
                self._last_pick.get(r, -1),
                r,
            ),
        )
        owner, saved = self._owner(ready, prefixes)
        if owner is not None and owner != best:
            if self._tokens.get(owner, 0) - self._tokens.get(best, 0) <= saved:
                return self._picked(Route(owner, "prefix_affinity", class_name))
        return self._picked(Route(best, "least_outstanding", class_name))

    def _owner(
        self, ready: Sequence[str], prefixes: list[tuple[int, int]]
    ) -> tuple[str | None, int]:
        """The ready replica that last got the longest remembered prefix, and its length."""
        for length, key in prefixes:
            rid = self._owners.get(key)
            if rid is not None and rid in ready:
                return rid, length
        return None, 0

    def _remember(self, prefixes: list[tuple[int, int]], replica_id: str) -> None:
        for _, key in prefixes:
            self._owners[key] = replica_id
            self._owners.move_to_end(key)
        while len(self._owners) > PREFIX_ENTRIES:
            self._owners.popitem(last=False)

    def _picked(self, route: Route) -> Route:
        self._last_pick[route.replica_id] = self._picks
        self._picks += 1
        return route

    # -- accounting ---------------------------------------------------------------------
    def admit(self, replica_id: str, prompt_tokens: int, max_tokens: int) -> Ticket:
        """Count a request as in flight on `replica_id`."""
        ticket = Ticket(replica_id, prompt_tokens, max_tokens)
        self._tokens[replica_id] = self._tokens.get(replica_id, 0) + ticket.outstanding
        self._requests[replica_id] = self._requests.get(replica_id, 0) + 1
        return ticket

    def progress(self, ticket: Ticket, new_tokens: int) -> None:
        """`new_tokens` were generated: the prompt is prefilled, and fewer tokens remain."""
        if ticket.released:
            return
        before = ticket.outstanding
        ticket.prompt_left = 0
        ticket.gen_left = max(0, ticket.gen_left - new_tokens)
        self._tokens[ticket.replica_id] -= before - ticket.outstanding

    def release(self, ticket: Ticket) -> None:
        """The request ended (any way): drop what it still counted. Idempotent."""
        if ticket.released:
            return
        self._tokens[ticket.replica_id] -= ticket.outstanding
        self._requests[ticket.replica_id] -= 1
        ticket.prompt_left, ticket.gen_left, ticket.released = 0, 0, True

    def outstanding(self, replica_id: str) -> int:
        return self._tokens.get(replica_id, 0)

    def in_flight(self, replica_id: str) -> int:
        return self._requests.get(replica_id, 0)


class SupportsClassify(Protocol):
    """What `tessera.workload.classes.WorkloadClasses` offers (no import needed here)."""

    def classify(self, input_tokens: int, output_tokens: int) -> int: ...


def workload_class_router(classes: SupportsClassify, names: Sequence[str]) -> ClassRouter:
    """Adapt fitted `WorkloadClasses` (class ids) to names, e.g. `Deployment.classes`."""
    names = tuple(names)

    def classify(prompt_tokens: int, max_tokens: int) -> str | None:
        cid = classes.classify(prompt_tokens, max_tokens)
        return names[cid] if 0 <= cid < len(names) else None

    return classify


def centroid_class_router(centroids: Mapping[str, tuple[float, float]]) -> ClassRouter:
    """Nearest class by (log1p input, log1p output) tokens — `WorkloadClasses.classify`'s
    rule — from representative `{name: (input_tokens, output_tokens)}` (a deployment's
    request classes). Ties go to the first class listed."""
    points = [(name, math.log1p(i), math.log1p(o)) for name, (i, o) in centroids.items()]
    if not points:
        raise ValueError("centroid_class_router: no classes")

    def classify(prompt_tokens: int, max_tokens: int) -> str | None:
        x, y = math.log1p(prompt_tokens), math.log1p(max_tokens)
        return min(points, key=lambda p: (p[1] - x) ** 2 + (p[2] - y) ** 2)[0]

    return classify
