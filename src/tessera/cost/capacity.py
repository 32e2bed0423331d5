"""Sustainable request rate of one replica for one workload class under an SLO.

The planner (``tessera.planner.capacity_table``) calls :func:`replica_capacity` per
candidate replica shape and class; the rates are the ``cap[k][j]`` of the assignment LP.
Model (docs/planner.md, "Capacity model"): ``b`` sequences in flight in ``min(b, pp)``
micro-batches; a decode round takes ``R(b) = max(sum_s T_s(m), n_mb * max_s T_s(m))``; a
prompt holds the bottleneck stage for ``P = max_s Tpre_s(L_in)``; the rate is
``b / (steps * R(b) + P * b)`` with ``steps = L_out - 1``. TPOT ``R(b) + P * b / steps``
and TTFT ``sum_s Tpre_s(L_in) + R(b) + P`` must stay within ``slo_headroom`` times the p99
targets, and KV for ``L_in + L_out`` tokens per sequence must fit beside each stage's
weights. ``b`` is the largest integer meeting all constraints (each tightens as ``b``
grows, the rate grows with it), capped by ``max_batch``. Seconds; rates in req/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera import fields
from tessera.cost import latency
from tessera.cost.profile import Link, Profile


@dataclass(frozen=True)
class RequestClass:
    """A workload class: typical request shape and its offered rate."""

    name: str
    input_tokens: int  # prompt length
    output_tokens: int  # generated tokens (first token included)
    rate: float = 0.0  # offered requests per second (demand)

    def __post_init__(self) -> None:
        if not self.name:
            raise fields.FieldError("name", "must be a non-empty string")
        if self.input_tokens < 1:
            raise fields.FieldError("inputTokens", "must be >= 1")
        if self.output_tokens < 1:
            raise fields.FieldError("outputTokens", "must be >= 1")
        if not self.rate >= 0:
            raise fields.FieldError("rate", "must be >= 0")


@dataclass(frozen=True)
class Slo:
    """Latency targets, both p99, in seconds."""

    ttft_s: float  # time to first token
    tpot_s: float  # time per output token after the first

    def __post_init__(self) -> None:
        if not self.ttft_s > 0:
            raise fields.FieldError("ttftP99Ms", "must be > 0")
        if not self.tpot_s > 0:
            raise fields.FieldError("tpotP99Ms", "must be > 0")


@dataclass(frozen=True)
class CapacityOptions:
    """Engine settings and safety margins the capacity model assumes."""

    memory_utilization: float = 0.90  # share of HBM the engine may use (vLLM default)
    workspace_bytes: int = 2 * 2**30  # per GPU: activations, CUDA graphs, allocator slack
    max_batch: int = 256  # engine cap on sequences in flight (vLLM max_num_seqs)
    slo_headroom: float = 0.8  # modeled (steady-state) latency <= headroom * p99 target

    def __post_init__(self) -> None:
        if not 0 < self.memory_utilization <= 1:
            raise fields.FieldError("memory_utilization", "must be in (0, 1]")
        if self.workspace_bytes < 0:
            raise fields.FieldError("workspace_bytes", "must be >= 0")
        if self.max_batch < 1:
            raise fields.FieldError("max_batch", "must be >= 1")
        if not 0 < self.slo_headroom <= 1:
            raise fields.FieldError("slo_headroom", "must be in (0, 1]")


@dataclass(frozen=True)
class ReplicaLayout:
    """What the cost model needs to know about one replica."""

    tp: int  # tensor-parallel degree of every stage
    stages: tuple[latency.StageSpec, ...]  # in pipeline order; pp = len(stages)
    gpu_memory_bytes: int  # HBM per GPU
    intra: Link  # link carrying the TP all-reduce

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise fields.FieldError("tp", "must be >= 1")
        if not self.stages:
            raise fields.FieldError("stages", "must hold at least one stage")
        if self.gpu_memory_bytes < 1:
            raise fields.FieldError("gpu_memory_bytes", "must be >= 1")

    @property
    def pp(self) -> int:
        """Pipeline-parallel degree."""
        return len(self.stages)


@dataclass(frozen=True)
class Capacity:
    """Result of :func:`replica_capacity` for one (replica, class) pair."""

    rate: float  # sustainable requests per second (0 when the SLO cannot be met)
    batch: int  # sequences in flight at that rate
    round_s: float  # decode round time R(b)
    tpot_s: float  # modeled mean time per output token
    ttft_s: float  # modeled time to first token
    prefill_s: float  # bottleneck-stage prefill occupancy P per request
    limited_by: str  # "memory", "tpot", "ttft" or "max_batch"


def kv_batch_limit(
    profile: Profile, layout: ReplicaLayout, tokens_per_seq: int, options: CapacityOptions
) -> int:
    """Largest batch whose KV cache (``tokens_per_seq`` each) fits on every stage; -1 when
    a stage's weights and workspace alone do not fit."""
    limit = math.inf
    usable = layout.gpu_memory_bytes * options.memory_utilization - options.workspace_bytes
    for stage in layout.stages:
        free = usable - latency.stage_param_bytes(profile, stage) / layout.tp
        if free < 0:
            return -1
        per_seq = profile.memory.kv_bytes_per_token * stage.layers * tokens_per_seq / layout.tp
        if per_seq > 0:
            limit = min(limit, free // per_seq)
    return int(min(limit, 2**31))


def decode_round_seconds(
    profile: Profile, layout: ReplicaLayout, batch: int, context: float
) -> float:
    """Time for every one of ``batch`` sequences to gain one token (pipelined rounds)."""
    micro_batches = min(batch, layout.pp)
    size = batch / micro_batches
    times = [
        latency.stage_decode_seconds(profile, s, size, context, layout.tp, layout.intra)
        for s in layout.stages
    ]
    return max(sum(times), micro_batches * max(times))


def replica_capacity(
    profile: Profile,
    layout: ReplicaLayout,
    cls: RequestClass,
    slo: Slo,
    options: CapacityOptions | None = None,
) -> Capacity:
    """Return the sustainable rate of ``cls`` on a replica laid out as ``layout``."""
    opts = options if options is not None else CapacityOptions()
    prefill = [
        latency.stage_prefill_seconds(profile, s, cls.input_tokens, layout.tp, layout.intra)
        for s in layout.stages
    ]
    occupancy, first_token = max(prefill), sum(prefill)
    steps = cls.output_tokens - 1
    context = cls.input_tokens + steps / 2
    tpot_target = slo.tpot_s * opts.slo_headroom
    ttft_target = slo.ttft_s * opts.slo_headroom

    def measures(b: int) -> tuple[float, float, float]:
        rnd = decode_round_seconds(profile, layout, b, context)
        tpot = rnd + occupancy * b / steps if steps > 0 else 0.0
        return rnd, tpot, first_token + rnd + occupancy

    def violation(b: int) -> str:
        _, tpot, ttft = measures(b)
        if ttft > ttft_target:
            return "ttft"
        if tpot > tpot_target:
            return "tpot"
        return ""

    kv_limit = kv_batch_limit(profile, layout, cls.input_tokens + cls.output_tokens, opts)
    upper = min(kv_limit, opts.max_batch)
    if upper < 1 or violation(1):
        reason = "memory" if upper < 1 else violation(1)
        rnd, tpot, ttft = measures(1)
        return Capacity(0.0, 0, rnd, tpot, ttft, occupancy, reason)
    lo, hi = 1, upper  # violation(lo) is empty; find the largest such b
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if violation(mid):
            hi = mid - 1
        else:
            lo = mid
    batch = lo
    if batch == upper:
        reason = "memory" if kv_limit <= opts.max_batch else "max_batch"
    else:
        reason = violation(batch + 1)
    rnd, tpot, ttft = measures(batch)
    rate = batch / (steps * rnd + occupancy * batch)
    return Capacity(rate, batch, rnd, tpot, ttft, occupancy, reason)
