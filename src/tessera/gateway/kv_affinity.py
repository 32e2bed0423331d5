"""The gateway's inputs to KV-owner-first dispatch, and applying its decision.

`dispatch.Dispatcher` asks `KvAffinity.choose` for every attempt that is not a cut-over
redirect, with the ready replicas the request's model allows. The rule is pure
(`tessera.policies.routing.kv_dispatch`); this module gathers its inputs: where the KV lives (a
`PrefixOwners` LRU of page-aligned prompt prefixes, namespaced by LoRA variant; each choice
records the prompt's pages on the chosen replica, `finished` adds the generated tokens; page
size from the leader's `Describe`, 16 until then); how loaded each replica is (requests in
flight and outstanding tokens from `policies.routing.Router`, the leader's `max_num_seqs`, and
tokens/s per stream measured by `observe` per chunk, so estimated latency grows with the queue;
docs/overload.md says why not an aggregate rate); and the plan's class shares
(`Router.class_weights`) with a seeded draw. Each decision bumps
`tessera_gateway_dispatch_decisions_total{reason}`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tessera.gateway import metrics, replicas, router
from tessera.policies.routing import kv_dispatch

DEFAULT_PAGE = 16  # the engine's default page size, until the leader reports its own
PRIOR_TOKENS_PER_S = 100.0  # before any replica was measured (only ratios matter)
IDLE_GAP_S = 1.0  # a longer gap between chunks is idle time, not a sample
DECAY = 0.9  # weight of the past per sample in the throughput average


class Throughput:
    """Tokens/s per stream of one replica from the gaps between its chunks (all its
    streams together, each chunk's tokens divided by the streams in flight), an
    exponentially decayed average: about one over the replica's step time, not growing
    with its batch as the aggregate rate does."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._tokens = 0.0
        self._seconds = 0.0

    def observe(self, tokens: int, now: float, first: bool, streams: int = 1) -> None:
        """`tokens` arrived at `now` while `streams` requests were in flight there. A
        request's first chunk carries its prefill, whose length is unknown here (cached
        or not), so it only marks the time."""
        last, self._last = self._last, now
        if first or last is None or not 0 < now - last <= IDLE_GAP_S:
            return
        self._tokens = self._tokens * DECAY + tokens / max(1, streams)
        self._seconds = self._seconds * DECAY + (now - last)

    @property
    def rate(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 and self._tokens > 0 else None


class KvAffinity:
    """Chooses replicas KV-owner first (see the module docstring)."""

    def __init__(
        self,
        replica_set: replicas.ReplicaSet,
        route: router.Router,
        gauges: metrics.GatewayMetrics,
        seed: int = 0,
        entries: int = kv_dispatch.OWNER_ENTRIES,
    ) -> None:
        self._replicas = replica_set
        self._router = route
        self._metrics = gauges
        self._rng = random.Random(seed)
        self.owners = kv_dispatch.PrefixOwners(entries)
        self._rates: dict[str, Throughput] = {}
        self._last_pick: dict[str, int] = {}
        self._picks = 0
        self._members: dict[str, replicas.ReplicaState] = {}  # as of the last choice

    def choose(
        self,
        ready: Sequence[str],
        prompt_ids: Sequence[int],
        max_tokens: int,
        namespace: str,
    ) -> router.Route | None:
        """A replica among `ready` for this prompt under `namespace` (the LoRA variant)."""
        if not ready:
            return None
        states = self._replicas.states()
        self._follow_membership(states)
        page = _page(states, ready)
        keys = kv_dispatch.reusable_keys(namespace, prompt_ids, page)
        owner, pages = self.owners.lookup(keys, ready)
        weights = self._router.class_weights(len(prompt_ids), max_tokens)
        prior = self._prior()
        cands = [
            kv_dispatch.Candidate(
                rid,
                running=self._router.in_flight(rid),
                batch_limit=_limit(states.get(rid)),
                queued_tokens=self._router.outstanding(rid),
                tokens_per_s=self._rate(rid) or prior,
                share=weights.get(rid, 0.0),
                last_pick=self._last_pick.get(rid, -1),
            )
            for rid in ready
        ]
        req = kv_dispatch.KvRequest(
            len(prompt_ids), max_tokens, owner, pages * page, self._rng.random()
        )
        decision = kv_dispatch.decide(cands, req)
        if decision is None:
            return None
        rid = decision.replica_id
        self._last_pick[rid] = self._picks
        self._picks += 1
        self.owners.remember(keys, rid)  # it computes (or reuses) these pages now
        self._metrics.dispatches.labels(decision.reason).inc()
        return router.Route(rid, decision.reason)

    def _follow_membership(self, states: dict[str, replicas.ReplicaState]) -> None:
        """Forget the prefixes of replicas that left the routes or moved to another leader
        (`ReplicaSet.update` makes a new state for a changed endpoint): their KV is gone,
        and a later replica of the same id must not inherit the ownership."""
        if states.keys() == self._members.keys() and all(
            states[r] is st for r, st in self._members.items()
        ):
            return
        kept = {r for r, st in self._members.items() if states.get(r) is st}
        self.owners.forget(kept | (states.keys() - self._members.keys()))
        self._members = states

    def observe(self, replica_id: str, tokens: int, now: float, first: bool) -> None:
        """A chunk of `tokens` tokens arrived from `replica_id` (dispatch.py, per chunk)."""
        streams = self._router.in_flight(replica_id)
        self._rates.setdefault(replica_id, Throughput()).observe(tokens, now, first, streams)

    def finished(self, replica_id: str, tokens: Sequence[int], namespace: str) -> None:
        """A request ended on `replica_id` holding KV for `tokens` (prompt + generated):
        a conversation's next turn starts with them."""
        page = _page(self._replicas.states(), [replica_id])
        # the last token was sampled, never fed back: its K/V is not in the cache
        self.owners.remember(kv_dispatch.prefix_keys(namespace, tokens[:-1], page), replica_id)

    def _rate(self, replica_id: str) -> float | None:
        t = self._rates.get(replica_id)
        return None if t is None else t.rate

    def _prior(self) -> float:
        """Unmeasured replicas count as the mean of the measured ones."""
        seen = [r for t in self._rates.values() if (r := t.rate) is not None]
        return sum(seen) / len(seen) if seen else PRIOR_TOKENS_PER_S


def _page(states: dict[str, replicas.ReplicaState], ids: Sequence[str]) -> int:
    """The page size of these replicas: one deployment's replicas share it."""
    for rid in ids:
        st = states.get(rid)
        if st is not None and st.page_size > 0:
            return st.page_size
    return DEFAULT_PAGE


def _limit(st: replicas.ReplicaState | None) -> int:
    if st is None or st.max_num_seqs < 1:
        return 1 << 30  # not reported: no known limit
    return st.max_num_seqs
