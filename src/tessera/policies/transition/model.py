"""The transition planner's model: what it looks at (`World`, `Target`) and decides
(`Transition`, `Blocked`), as frozen dataclasses.

Re-exported by `tessera.policies.transition.planner` (use the names from there); split out so the
planner's step builder (`transition_steps`) can share them. Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera import blocks, observed, routes_doc
from tessera.policies import links
from tessera.policies.placement import ModelBytes
from tessera.policies.transition import actions

# where a load's parameters come from: "block" the fastest single peer holding all of
# them when it beats storage; "switch" the OServe switch plan (`policies.switch_sources`:
# parts from several peers, same agent first, storage only for what no block holds);
# "storage" always the checkpoint (a reload, for comparison)
SOURCINGS = ("block", "switch", "storage")

DevKey = tuple[str, str]  # (agent, device)
Where = tuple[str, tuple[str, int, int]]  # (agent, block key)


@dataclass(frozen=True)
class Placed:
    """A block on an agent."""

    agent: str
    address: str
    block: blocks.Block
    data_plane: actions.DataPlane | None = None  # how a TP rank meets its group


@dataclass(frozen=True)
class Target:
    """The desired state of one plan generation: its blocks and the replicas to route."""

    generation: int
    blocks: tuple[Placed, ...]
    replicas: tuple[routes_doc.RouteReplica, ...]


@dataclass(frozen=True)
class DrainPolicy:
    # the deadline a cut-over publishes (drains use the one their routes document says)
    deadline_s: float = routes_doc.DEFAULT_DRAIN_DEADLINE_S
    grace_s: float = 5.0  # past the deadline: the gateway has given up on the replica
    settle_s: float = 2.0  # before an idle replica counts as drained: the gateway's reload

    def __post_init__(self) -> None:
        if min(self.deadline_s, self.grace_s, self.settle_s) < 0:
            raise ValueError("drain policy: durations must be >= 0")


@dataclass(frozen=True)
class World:
    """What the planner may look at."""

    observed: observed.Observed
    owner_prefix: str  # replica ids of this deployment start with it
    published: routes_doc.RoutesDoc | None = None  # routes the gateway was last given
    now: float = 0.0  # unix seconds
    memory: Mapping[DevKey, int] | None = None  # free bytes; None: the agents' free_bytes
    links: links.LinkModel = field(default_factory=links.LinkModel)
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    checkpoint_readable: bool = True  # agents can read the weights from storage
    sourcing: str = "block"  # one of SOURCINGS
    model: ModelBytes | None = None  # parameter bytes per unit (switch sourcing); None: even
    # a full device: shrink the serving replicas' KV pools to load the new layout beside
    # them (`transition_shrink`), never below the pages their requests hold plus this share
    resize_kv: bool = True
    kv_headroom: float = 0.1
    # ... and where even that leaves no room: whole replicas drop replicated layers into
    # one pipeline (KunServe's drop) first (`transition_drop`)
    drop_layers: bool = True

    def __post_init__(self) -> None:
        if self.sourcing not in SOURCINGS:
            raise ValueError(f"sourcing: must be one of {', '.join(SOURCINGS)}")
        if self.kv_headroom < 0:
            raise ValueError(f"kv_headroom: must be >= 0, got {self.kv_headroom}")


@dataclass(frozen=True)
class Blocked:
    """Why a transition cannot be done; `reason` is a condition reason."""

    # InsufficientMemory, AgentUnreachable, NoSource, or WaitingForKV (the pools could make
    # room once the requests holding their pages finish or move)
    reason: str
    message: str


MODES = (
    "converged",
    "make-before-break",
    "freeing-order",
    "shrink-pools",
    "drop-layers",
    "blocked",
)


@dataclass(frozen=True)
class Transition:
    generation: int
    steps: tuple[actions.Step, ...]
    mode: str  # one of MODES
    blocked: Blocked | None = None
    peak_bytes: int = 0  # this deployment's block bytes at the plan's peak (simulated)
    start_bytes: int = 0  # ... before its first step
    end_bytes: int = 0  # ... after its last step

    @property
    def converged(self) -> bool:
        return not self.steps and self.blocked is None
