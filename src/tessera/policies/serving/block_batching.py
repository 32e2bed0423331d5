"""Per-block batching across chains: which pending steps run together, in which passes.

Chains sharing block instances on one agent (the zoo, `tessera_agent.engine.block_zoo`) send
their steps to one compute thread, which runs a co-step: at every layer, the rows of all
admitted steps using the same instance go through it in one pass (BlockLLM §5). `plan`: every
instance has a batch limit in rows per pass (`BatchLimits`, overridable per piece label such as
`layer.3`); steps are taken most passed-over first, then by arrival; the first always runs (no
chain starves); another joins if it shares an instance with an admitted step, its chain has no
step admitted (one step per chain), and every instance stays within its limit; the rest wait
for the next co-step. `expected` and `linger_s` say whom the thread briefly waits for (chains
sharing its instances, with work, seen lately, nothing queued), else chains would alternate and
never batch. Pure and torch-free; applied by `tessera_agent.engine.cobatch` (docs/variants.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_ROWS_PER_PASS = 8192  # four full default steps (2048 tokens each) in one pass
DEFAULT_LINGER_S = 0.002


@dataclass(frozen=True)
class Use:
    """A step runs block instance `piece` at position `slot` of the model."""

    slot: int  # global layer index; the final norm + LM head sit at num_layers
    label: str  # what the piece is ("layer.3", "final"): the key of per-piece limits
    piece: str  # the instance: equal ids are the same parameters


@dataclass(frozen=True)
class PendingStep:
    """One step waiting for the compute thread."""

    key: int  # unique ticket
    chain: str  # the stage it runs on (one step per chain per co-step)
    rows: int  # token rows
    uses: tuple[Use, ...]  # in execution order; () = runs alone (nothing to share)
    waited: int = 0  # co-steps that passed it over
    order: int = 0  # arrival order

    def __post_init__(self) -> None:
        if self.rows < 0:
            raise ValueError(f"step {self.key}: rows must be >= 0")


@dataclass(frozen=True)
class BatchLimits:
    """Rows per pass of each block instance, and the wait for partners."""

    rows_per_pass: int = DEFAULT_ROWS_PER_PASS
    per_label: tuple[tuple[str, int], ...] = ()  # e.g. (("final", 1024),)
    linger_s: float = DEFAULT_LINGER_S
    recent_s: float = 0.25  # a peer seen this recently may still be co-batched with

    def __post_init__(self) -> None:
        if self.rows_per_pass < 1:
            raise ValueError("rows_per_pass: must be >= 1")
        for label, n in self.per_label:
            if n < 1:
                raise ValueError(f"per_label {label!r}: must be >= 1")
        if self.linger_s < 0 or self.recent_s < 0:
            raise ValueError("linger_s and recent_s: must be >= 0")

    def limit(self, label: str) -> int:
        for name, n in self.per_label:
            if name == label:
                return n
        return self.rows_per_pass


@dataclass(frozen=True)
class Pass:
    """One batched pass of an instance: the admitted steps using it, in row order."""

    slot: int
    label: str
    piece: str
    steps: tuple[int, ...]
    rows: int


@dataclass(frozen=True)
class CoStep:
    """What the compute thread runs next."""

    steps: tuple[int, ...]  # admitted, in row order
    passes: tuple[Pass, ...]  # in execution order (slot, then first step)
    waiting: tuple[int, ...]  # pending steps passed over this time

    @property
    def shared(self) -> bool:
        """Some instance runs the rows of more than one step in one pass."""
        return any(len(p.steps) > 1 for p in self.passes)


def priority(pending: Sequence[PendingStep]) -> list[PendingStep]:
    """Most passed-over first, then oldest."""
    return sorted(pending, key=lambda s: (-s.waited, s.order))


def plan(pending: Sequence[PendingStep], limits: BatchLimits) -> CoStep:
    """The next co-step over `pending` (not empty)."""
    if not pending:
        raise ValueError("plan needs at least one pending step")
    order = priority(pending)
    head = order[0]
    admitted = [head]
    chains = {head.chain}
    rows: dict[str, int] = {}
    for u in head.uses:
        rows[u.piece] = rows.get(u.piece, 0) + head.rows
    grew = bool(head.uses)
    while grew:  # a step may connect through one admitted after it in priority order
        grew = False
        for s in order:
            if s in admitted or s.chain in chains or not s.uses:
                continue
            if not any(u.piece in rows for u in s.uses):
                continue
            if any(
                rows.get(u.piece, 0) and rows[u.piece] + s.rows > limits.limit(u.label)
                for u in s.uses
            ):
                continue
            admitted.append(s)
            chains.add(s.chain)
            for u in s.uses:
                rows[u.piece] = rows.get(u.piece, 0) + s.rows
            grew = True
    return CoStep(
        steps=tuple(s.key for s in admitted),
        passes=_passes(admitted),
        waiting=tuple(s.key for s in order if s not in admitted),
    )


def _passes(admitted: list[PendingStep]) -> tuple[Pass, ...]:
    found: dict[tuple[int, str], tuple[str, list[PendingStep]]] = {}
    for s in admitted:
        for u in s.uses:
            found.setdefault((u.slot, u.piece), (u.label, []))[1].append(s)
    first = {s.key: i for i, s in enumerate(admitted)}
    out = [
        Pass(slot, label, piece, tuple(s.key for s in steps), sum(s.rows for s in steps))
        for (slot, piece), (label, steps) in found.items()
    ]
    return tuple(sorted(out, key=lambda p: (p.slot, first[p.steps[0]])))


@dataclass(frozen=True)
class Peer:
    """Another chain the compute thread has seen lately."""

    chain: str
    pieces: frozenset[str]  # the instances its steps use
    idle_s: float  # since its last step was handed back
    active: bool  # it has work left (False: no step of it is coming)


def expected(
    head: frozenset[str], peers: Sequence[Peer], pending: frozenset[str], limits: BatchLimits
) -> frozenset[str]:
    """Chains worth waiting for before running a step over instances `head`: they share
    one of them, have work left, were seen within `limits.recent_s`, and have no step
    queued yet (their results are being handled; their next step is on its way)."""
    return frozenset(
        p.chain
        for p in peers
        if p.chain not in pending
        and p.active
        and p.idle_s <= limits.recent_s
        and not p.pieces.isdisjoint(head)
    )


def linger_s(missing: frozenset[str], waited_s: float, limits: BatchLimits) -> float:
    """How much longer to wait for the `missing` expected chains (0 = plan now): at most
    `limits.linger_s` in all, so a partner that does not come costs that once."""
    if not missing:
        return 0.0
    return max(0.0, limits.linger_s - waited_s)
