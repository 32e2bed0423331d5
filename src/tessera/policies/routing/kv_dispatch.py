"""Which replica serves a request: the one holding its KV cache first (BlockLLM §5, live).

The gateway's dispatch rule, called through `tessera.gateway.kv_affinity` for every attempt.
`PrefixOwners`: a bounded LRU of which replica last computed each page-aligned prompt prefix,
keyed by a hash chain over full pages from the request's variant namespace (so prefixes never
cross adapters); a hint only (evicted pages cost just the prefill). `Candidate`: the gateway's
view of a replica's load (requests in flight, outstanding tokens, measured tokens/s, the
leader's `max_num_seqs`). `decide`: among the replicas allowed for the model (narrowed to the
plan's positive class shares when given), the KV owner while its batch has room (`kv_owner`);
no owner and shares given, a weighted share choice (`class_share`: shares pick where a
conversation starts, its KV where it continues); else the lowest estimated latency
(`block_dispatch.choose`, recomputing the owner's prefix on a non-owner; `owner_full` or
`lowest_latency`), estimates within `TIE` equal, then fewer in flight, then least recently
picked. Pure: `PrefixOwners` is the only state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tessera.policies.routing import block_dispatch

OWNER_ENTRIES = 8192  # remembered page-prefix keys, least recently used dropped
TIE = 0.25  # estimates within this fraction of the best count as equal


def prefix_keys(namespace: str, tokens: Sequence[int], page_size: int) -> list[int]:
    """One key per full page of `tokens`, first page first. Key k names the namespace and
    every token of pages 0..k (a chained hash: one page of hashing per key)."""
    if page_size < 1:
        raise ValueError("page_size: must be >= 1")
    keys, h = [], hash(("kv-prefix", namespace))
    for end in range(page_size, len(tokens) + 1, page_size):
        h = hash((h, tuple(tokens[end - page_size : end])))
        keys.append(h)
    return keys


def reusable_keys(namespace: str, prompt: Sequence[int], page_size: int) -> list[int]:
    """Keys of the pages of `prompt` an agent can take from its cache: full pages before
    the prompt's last token (that one is always computed, it yields the first logits)."""
    return prefix_keys(namespace, prompt[:-1], page_size)


class PrefixOwners:
    """Page-prefix key → the replica that last computed it (bounded LRU)."""

    def __init__(self, entries: int = OWNER_ENTRIES) -> None:
        if entries < 1:
            raise ValueError("entries: must be >= 1")
        self._entries = entries
        self._owner: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def lookup(self, keys: Sequence[int], candidates: Collection[str]) -> tuple[str | None, int]:
        """The candidate owning the longest remembered prefix, and how many pages it is."""
        for n in range(len(keys), 0, -1):
            rid = self._owner.get(keys[n - 1])
            if rid is not None and rid in candidates:
                self._owner.move_to_end(keys[n - 1])
                return rid, n
        return None, 0

    def remember(self, keys: Sequence[int], replica_id: str) -> None:
        """`replica_id` now holds every prefix in `keys` (it computed or reused them)."""
        for key in keys:
            self._owner[key] = replica_id
            self._owner.move_to_end(key)
        while len(self._owner) > self._entries:
            self._owner.popitem(last=False)

    def forget(self, keep: Collection[str]) -> None:
        """Drop the entries of replicas not in `keep` (they left the routes)."""
        for key in [k for k, rid in self._owner.items() if rid not in keep]:
            del self._owner[key]


@dataclass(frozen=True)
class Candidate:
    """One replica allowed to serve the request, as the gateway sees it now."""

    id: str
    running: int  # requests the gateway has in flight there
    batch_limit: int  # sequences per step its leader reports
    queued_tokens: int  # outstanding: prompts not yet prefilled + tokens not yet generated
    tokens_per_s: float  # measured from its streams (or a prior)
    share: float = 0.0  # the plan's share of the request's class (0: none)
    last_pick: int = -1  # order of its last pick (tie-break: least recent first)

    def instance(self) -> block_dispatch.BlockInstance:
        return block_dispatch.BlockInstance(
            self.id,
            self.running,
            self.batch_limit,
            self.queued_tokens,
            self.tokens_per_s,
            receives_kv=False,
        )


@dataclass(frozen=True)
class KvRequest:
    """What the rule needs to know about one request."""

    prompt_tokens: int
    max_tokens: int
    owner: str | None  # the candidate holding the longest cached prefix, if any
    cached_tokens: int  # prompt tokens whose KV the owner holds
    share_draw: float = 0.0  # uniform in [0, 1): the weighted class choice's draw


@dataclass(frozen=True)
class KvDecision:
    replica_id: str
    reason: str  # "kv_owner", "owner_full", "lowest_latency" or "class_share"
    estimated_s: float  # 0 for a class_share choice (not estimated)


def decide(candidates: Sequence[Candidate], req: KvRequest) -> KvDecision | None:
    """The replica for `req` among `candidates` (module docstring); None when empty."""
    if not candidates:
        return None
    shared = [c for c in candidates if c.share > 0]
    pool = shared or list(candidates)
    by_id = {c.id: c for c in pool}
    owner = req.owner if req.owner in by_id else None
    cached = req.cached_tokens if owner is not None else 0
    tokens = max(1, req.prompt_tokens - cached) + req.max_tokens
    if owner is not None and by_id[owner].running < by_id[owner].batch_limit:
        d = block_dispatch.choose([by_id[owner].instance()], tokens, 0, owner)
        return KvDecision(owner, "kv_owner", d.estimated_s)
    if shared and owner is None:
        return KvDecision(_weighted(shared, req.share_draw), "class_share", 0.0)
    d = block_dispatch.choose(
        [c.instance() for c in pool],
        tokens,
        0,
        owner,
        kv_tokens=cached,
        tolerance=TIE,
        rank={c.id: (c.running, c.last_pick) for c in pool},
    )
    return KvDecision(d.instance, "owner_full" if owner else "lowest_latency", d.estimated_s)


def _weighted(options: Sequence[Candidate], draw: float) -> str:
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"share_draw: {draw} is outside [0, 1)")
    total = sum(c.share for c in options)
    acc = 0.0
    for c in options:
        acc += c.share / total
        if draw < acc:
            return c.id
    return options[-1].id
