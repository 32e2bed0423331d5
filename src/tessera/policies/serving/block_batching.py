"""Per-block batching across chains: which pending steps run together, in which passes.

Several chains (a foundation replica and full fine-tunes' replicas) on one agent share
block instances: the zoo points their layer modules at the same parameters
(`tessera_agent.engine.block_zoo`). Their steps all go to the agent's one compute thread.
Rather than run each step alone, the compute thread runs a *co-step*: at every layer, the
rows of all admitted steps whose layer is the same instance go through its projections and
MLP in one *pass*; a chain's own (differing) layers are their own instances and run on its
rows alone. BlockLLM §5 ("Batching"): a block queues what arrives and packs it with its
neighbours up to its batch limit; with nothing queued it runs the batch directly.

The rules (`plan`):
- every block instance has a batch limit in rows per pass (`BatchLimits`: a default, and
  overrides per piece label such as `layer.3` or `final`);
- pending steps are taken in priority order: the most passed-over first, then arrival
  order. The first always runs (alone in its passes if it exceeds a limit), so no chain
  starves: a step passed over climbs ahead of every newer one;
- another step joins if it shares an instance with a step already admitted, its chain has
  no step admitted yet (one step per chain: a chain's KV cache and adapter slots belong to
  one step at a time), and adding its rows keeps every instance it uses within its limit.
  Steps that do not fit wait for the next co-step (the instance's next pass);
- a step that shares nothing with the admitted ones waits too: running it in the same
  co-step would only delay the others' results.

`expected` and `linger_s` say whom the compute thread waits for, and how long: chains
resubmit one by one (each handles its results on the event loop first), and taking
whichever comes first alone would leave the chains alternating, never batched. So before
running a step, the thread waits briefly for the other chains that share its instances,
still have work, and were seen lately, but have no step queued yet. Pure and torch-free;
applied by `tessera_agent.engine.cobatch`.
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
