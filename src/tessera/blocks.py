"""One block identity: a layer range of one stage of one replica of one layout generation.

`Block` is the single declaration of a block on both sides of the operator ↔ agent boundary:
the reconcile core and transition planner describe wanted blocks with it, the operator's
observation (`observed.AgentInfo.blocks`) reports held ones, and the agent engine loads one from
it (`engine.stage.BlockSpec` is an alias). Its proto conversion lives in `tessera.rpc.blocks`.
Replica ids are opaque to the gateway and agents; the operator builds them as
`<namespace>.<deployment>.<name>.g<generation>` (`replica_id()`), so a replica whose layout
changes gets a new id and its blocks coexist with the old ones until those are freed.
Pure data; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PAGE_SIZE = 16


def replica_id(namespace: str, deployment: str, name: str, generation: int) -> str:
    """`<namespace>.<deployment>.<name>.g<generation>` (names hold no dots)."""
    return f"{namespace}.{deployment}.{name}.g{generation}"


@dataclass(frozen=True)
class ReplicaName:
    """A replica id taken apart (`parse_replica_id`)."""

    deployment: str  # "<namespace>.<deployment>"; "" for ids not built by `replica_id`
    name: str
    generation: int  # 0 when the id carries none


def parse_replica_id(rid: str) -> ReplicaName:
    """The parts of an id built by `replica_id`; other ids (tests, benches) give
    ("", rid, 0)."""
    parts = rid.split(".")
    if len(parts) == 4 and parts[3][:1] == "g" and parts[3][1:].isdigit():
        return ReplicaName(f"{parts[0]}.{parts[1]}", parts[2], int(parts[3][1:]))
    return ReplicaName("", rid, 0)


@dataclass(frozen=True)
class Block:
    """A block: what to load (wanted) or what is held (observed).

    The first fields keep the order of the engine's historical `BlockSpec`, so engine
    code builds one positionally as `Block(model_path, start, end, ...)`. Identity on an
    agent is `key` (replica, stage, tensor-parallel rank); `same_layout` compares what a
    reload would change. `param_bytes` and `kv_bytes` are what the block holds (observed)
    or will hold (planned); `kv_bytes == 0` in a load asks for all the memory left.
    """

    model_path: str
    start: int  # first layer, inclusive
    end: int  # last layer, exclusive
    replica_id: str = "r0"
    stage_index: int = 0
    device: str = "cpu:0"
    dtype: str = "auto"  # tessera.dtypes: "auto" is the checkpoint's torch_dtype
    kv_bytes: int = 0
    page_size: int = DEFAULT_PAGE_SIZE
    num_stages: int = 1
    next_address: str = ""  # host:port of the next stage's agent; "" on the last stage
    generation: int = 0  # layout generation that introduced the replica
    tp_size: int = 1  # tensor-parallel degree of the stage
    tp_rank: int = 0
    param_bytes: int = 0
    # Observed only: the stage's tensor-parallel group (tp_size > 1) as its agent reports it.
    transport: str = ""  # "gloo" or "nccl"
    group_state: str = ""  # "forming", "ready" or "failed"
    group_reason: str = ""  # why it is not ready
    activations: str = ""  # how hidden states reach the next stage: "gloo" (link) or "grpc"
    kv_pages: int = 0  # observed only: pages in the block's KV pool (grows on an overload drop)
    results: str = ""  # leader: how sampled tokens come back: "gloo" (link) or "grpc"
    # Observed only: the stage's compiled or captured decode, "warm" (built at load), "cached"
    # (from the agent's compile cache), "compiling" (steps eager until it is over) or
    # "eager" (off, failed or none).
    compile: str = ""
    # Issue 14: a full fine-tune opted in to serving layers equivalent to the foundation's
    # from the foundation's weights (`shareEquivalent`): the foundation's checkpoint, and
    # the logit-lens threshold (0 = off: only bit-identical layers are shared).
    share_from: str = ""
    share_threshold: float = 0.0
    # Issue 35: the last block of a small model's front in a stitched chain hands its hidden
    # states through the stitching block the zoo folder `stitch_zoo` holds for (this
    # model, `stitch_to`) to the next stage, layers [`stitch_at`, L) of `stitch_to`.
    stitch_zoo: str = ""
    stitch_to: str = ""
    stitch_at: int = 0
    # Issue 35: a bottleneck block speculated on: the zoo folder holding the surrogate of
    # this block's layers of its model (`tessera model surrogate`); "" = not speculated.
    speculate_zoo: str = ""

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp: rank {self.tp_rank} of size {self.tp_size} is invalid")

    @property
    def key(self) -> tuple[str, int, int]:
        """What names the block on its agent: (replica, stage, tp rank)."""
        return (self.replica_id, self.stage_index, self.tp_rank)

    @property
    def deployment(self) -> str:
        return parse_replica_id(self.replica_id).deployment

    @property
    def bytes(self) -> int:
        """Device memory the block holds (parameters plus KV pool)."""
        return self.param_bytes + self.kv_bytes

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def same_layout(self, other: Block) -> bool:
        """Same block up to byte counts and page size: nothing a reload would change."""
        return self.layout_fields() == other.layout_fields()

    def layout_fields(self) -> tuple[object, ...]:
        return (
            self.replica_id,
            self.stage_index,
            self.num_stages,
            self.model_path,
            self.start,
            self.end,
            self.device,
            self.dtype,
            self.next_address,
            self.generation,
            self.tp_size,
            self.tp_rank,
            self.share_from,
            self.share_threshold,
            self.stitch_zoo,
            self.stitch_to,
            self.stitch_at,
            self.speculate_zoo,
        )

    def holds(self, other: Block) -> bool:
        """This block holds every tensor `other` needs (a peer copy source): same model
        and dtype (and equivalence opt-in: the weights served), an unsharded stage, and a
        layer range covering `other`'s."""
        return (
            self.model_path == other.model_path
            and self.dtype == other.dtype
            and (self.share_from, self.share_threshold) == (other.share_from, other.share_threshold)
            and self.tp_size == 1
            and other.tp_size == 1
            and self.start <= other.start
            and other.end <= self.end
            # the first layers' block must also hold the embedding, the last the head
            and (other.start != 0 or self.start == 0)
            and (not other.is_last or self.is_last)
        )

    def describe(self) -> str:
        tp = f" tp {self.tp_rank}/{self.tp_size}" if self.tp_size > 1 else ""
        return (
            f"{self.replica_id} stage {self.stage_index}{tp} layers [{self.start}, {self.end})"
            f" on {self.device}"
        )
