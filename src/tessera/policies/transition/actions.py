"""The action vocabulary of live reconfiguration: what a transition plan asks shells to do.

Every elastic mechanism (switch, drop, replication, variants) is a transition of these
actions. Policies return them inside `Step`s; the operator's executor
(`tessera.control.actuate`), `tessera up` and the gateway apply them. Pure data.
`LoadBlock` (from the checkpoint or a peer, `PeerSource`); `UnloadBlock` (parameters and KV
pool); `Rewire` (a stage's downstream address); `MoveKV` (a request's computed prefix to
another replica, `tessera.control.kv_move`); `Drain` (until a replica no route names is idle
or past its deadline); `CutOver` (publish a routes document, `tessera.routes_doc`);
`ResizeKV` (a running replica's pool to `num_pages` on every stage, compacting first, never
below the pages its requests hold); `DropLayers` (KunServe's drop over whole replicas: one
pipeline keeping the head's id, the freed bytes becoming KV pool). Every action has `kind` (a
stable name for status and events) and `describe()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import blocks, routes_doc


@dataclass(frozen=True)
class PeerSource:
    """A hosted block to copy the tensors from (`LoadBlock` with a source)."""

    agent: str
    address: str
    replica_id: str
    stage_index: int
    # "local" (same agent), "" (data-plane group, gRPC as the fallback), "grpc", or "host"
    # (the target agent's own host block cache; issue 32)
    transport: str = ""


@dataclass(frozen=True)
class SwitchPart:
    """Part of a block's parameters and where to get it (issue 11): units `[u0, u1)` (0
    the embedding, 1..L the layers, L+1 the final norm and lm_head) copied from a peer
    block, or read from storage (`source` None). Chosen by `policies.switch_sources`."""

    units: tuple[int, int]
    source: PeerSource | None = None


@dataclass(frozen=True)
class DataPlane:
    """Where a tensor-parallel block's ranks meet to form their group (`LoadBlock`)."""

    store_address: str  # the leader agent's rendezvous store
    group: str  # key prefix of the replica's groups (each stage adds its index)
    timeout_s: float = 0.0  # per collective; 0 = the agent's default


@dataclass(frozen=True)
class LoadBlock:
    agent: str
    address: str
    block: blocks.Block
    source: PeerSource | None = None  # None: read the checkpoint from storage
    data_plane: DataPlane | None = None  # for a block with tp_size > 1
    parts: tuple[SwitchPart, ...] = ()  # per-range sources (a switch plan); overrides source

    kind = "LoadBlock"

    def describe(self) -> str:
        how = f" (copy from {self.source.agent})" if self.source is not None else ""
        if self.parts:
            peers = sorted(
                {p.source.agent for p in self.parts if p.source and p.source.transport != "host"}
            )
            peers += (
                ["host cache"]
                if any(p.source and p.source.transport == "host" for p in self.parts)
                else []
            )
            stored = any(p.source is None for p in self.parts)
            how = f" (copy from {', '.join(peers) or 'storage'}" + (
                ", storage)" if stored and peers else ")"
            )
        return f"load {self.block.describe()} on {self.agent}{how}"


@dataclass(frozen=True)
class UnloadBlock:
    agent: str
    address: str
    block: blocks.Block

    kind = "UnloadBlock"

    def describe(self) -> str:
        b = self.block
        return f"unload {b.replica_id} stage {b.stage_index} from {self.agent}"


@dataclass(frozen=True)
class Rewire:
    """Point a loaded stage at a new next-stage address (`block.next_address`)."""

    agent: str
    address: str
    block: blocks.Block

    kind = "Rewire"

    def describe(self) -> str:
        b = self.block
        return (
            f"rewire {b.replica_id} stage {b.stage_index} on {self.agent} "
            f"to {b.next_address or '(last stage)'}"
        )


@dataclass(frozen=True)
class MoveKV:
    """Move a request's prefix KV from a leaving replica to a surviving one."""

    request_id: str
    source_replica: str
    source_address: str  # the source replica's leader agent
    target_replica: str
    target_address: str

    kind = "MoveKV"

    def describe(self) -> str:
        return (
            f"move KV of request {self.request_id} from {self.source_replica} "
            f"to {self.target_replica}"
        )


@dataclass(frozen=True)
class Drain:
    """Wait for a replica no route names to go idle (or its deadline plus grace)."""

    replica_id: str
    deadline_s: float

    kind = "Drain"

    def describe(self) -> str:
        return f"drain {self.replica_id} (deadline {self.deadline_s:g}s)"


@dataclass(frozen=True)
class CutOver:
    """Publish routes naming exactly `replicas` (at plan generation `version`)."""

    version: int
    replicas: tuple[routes_doc.RouteReplica, ...]
    leaving: tuple[str, ...] = ()  # replicas the previous document named and this drops
    drain_deadline_s: float = routes_doc.DEFAULT_DRAIN_DEADLINE_S

    kind = "CutOver"

    def describe(self) -> str:
        ids = ", ".join(r.id for r in self.replicas) or "(none)"
        gone = f"; leaving: {', '.join(self.leaving)}" if self.leaving else ""
        return f"cut routes over to version {self.version}: {ids}{gone}"


@dataclass(frozen=True)
class KVStage:
    """One stage of a `ResizeKV`: where it is, and the block with its new KV budget."""

    agent: str
    address: str
    block: blocks.Block  # kv_bytes: the stage's pool after the resize


@dataclass(frozen=True)
class ResizeKV:
    """Resize a replica's KV pool to `num_pages` pages on every stage (leader first)."""

    replica_id: str
    num_pages: int  # the allocator's pool afterwards
    was_pages: int  # ... before (observed): a shrink when num_pages is smaller
    stages: tuple[KVStage, ...]

    kind = "ResizeKV"

    @property
    def shrink(self) -> bool:
        return self.num_pages < self.was_pages

    def describe(self) -> str:
        how = "shrink" if self.shrink else "grow"
        pages = f"{self.num_pages} pages" if self.num_pages else "the stages' budgets"
        return f"{how} the KV pool of {self.replica_id} from {self.was_pages} to {pages}"


@dataclass(frozen=True)
class DropStage:
    """One member of a `DropLayers`: the whole replica that keeps layers [start, end)."""

    replica_id: str
    agent: str
    address: str  # its agent
    start: int
    end: int


@dataclass(frozen=True)
class DropLayers:
    """Turn whole replicas into one pipeline (KunServe's drop): `stages` in layer order,
    the first is the head (keeps its id, its scheduler and its running requests, whose
    K/V for the donors' layers moves to them); the donors must be drained first."""

    stages: tuple[DropStage, ...]

    kind = "DropLayers"

    @property
    def head(self) -> str:
        return self.stages[0].replica_id

    @property
    def donors(self) -> tuple[str, ...]:
        return tuple(s.replica_id for s in self.stages[1:])

    def describe(self) -> str:
        parts = ", ".join(f"{s.replica_id}@{s.agent} [{s.start}, {s.end})" for s in self.stages)
        return f"drop replicated layers into one pipeline led by {self.head}: {parts}"


Action = LoadBlock | UnloadBlock | Rewire | MoveKV | Drain | CutOver | ResizeKV | DropLayers
BlockAction = LoadBlock | UnloadBlock | Rewire


@dataclass(frozen=True)
class Step:
    """One action of a plan; `after` names the steps (by `id`) that must be done first."""

    id: int
    action: Action
    after: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.id}: {self.action.describe()}"
