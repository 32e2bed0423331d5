"""Per-stage prefill and decode time of a pipeline stage, including communication.

Adds the pieces the per-layer profile leaves out: the tensor-parallel all-reduce (ring
algorithm over the intra-node link) and the pipeline hop to the next stage (intra- or
inter-node). ``stage_cost``: a stage's linear step-time coefficients, the one step model
of the simulator (``tessera.sim.steptime``) and of a prompt's stall on the decodes it
shares a step with (``stage_chunk_seconds``, ``tessera.planner.latency``). Called by
``tessera.cost.capacity`` (replica capacity) and ``tessera.cost.fit`` (to strip modeled
all-reduce time from measured samples).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera import fields
from tessera.cost.profile import Link, Profile


def allreduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``ranks`` GPUs: 2(p-1) steps of nbytes/p each."""
    if ranks <= 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * link.latency_s + steps * (nbytes / ranks) / link.bandwidth_bytes_per_s


def layer_allreduce_seconds(profile: Profile, tokens: float, tp: int, link: Link) -> float:
    """All-reduce time one decoder layer spends for ``tokens`` hidden states at degree tp."""
    nbytes = tokens * profile.memory.activation_bytes_per_token
    return profile.comm.allreduce_per_layer * allreduce_seconds(nbytes, tp, link)


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage as the cost model sees it."""

    layers: int  # number of decoder layers held
    first: bool  # holds the token embedding
    last: bool  # holds the final norm and lm_head
    hop: Link | None  # link to the next stage (None for the last stage)

    def __post_init__(self) -> None:
        if self.layers < 0:
            raise fields.FieldError("layers", "must be >= 0")
        if (self.hop is None) != self.last:
            raise fields.FieldError("hop", "the last stage and only it has no outgoing hop")


def stage_decode_seconds(
    profile: Profile, stage: StageSpec, batch: float, context: float, tp: int, intra: Link
) -> float:
    """Time of one decode step of ``batch`` sequences through one stage."""
    per_layer = profile.decode.seconds(batch, context, tp)
    per_layer += layer_allreduce_seconds(profile, batch, tp, intra)
    total = stage.layers * per_layer
    if stage.last:
        total += profile.lm_head_decode.seconds(batch, 0.0, tp)
    if stage.hop is not None:
        total += stage.hop.transfer_seconds(batch * profile.memory.activation_bytes_per_token)
    return total


def stage_prefill_seconds(
    profile: Profile, stage: StageSpec, tokens: float, tp: int, intra: Link
) -> float:
    """Time to prefill one ``tokens``-long prompt through one stage."""
    per_layer = profile.prefill.seconds(tokens, tp)
    per_layer += layer_allreduce_seconds(profile, tokens, tp, intra)
    total = stage.layers * per_layer
    if stage.last:  # logits of the last prompt position only
        total += profile.lm_head_decode.seconds(1.0, 0.0, tp)
    if stage.hop is not None:
        total += stage.hop.transfer_seconds(tokens * profile.memory.activation_bytes_per_token)
    return total


def stage_param_bytes(profile: Profile, stage: StageSpec) -> int:
    """Weight bytes of a whole stage (before dividing across its tp ranks)."""
    total = stage.layers * profile.memory.layer_param_bytes
    if stage.first:
        total += profile.memory.embedding_param_bytes
    if stage.last:
        total += profile.memory.lm_head_param_bytes
    return total


@dataclass(frozen=True)
class StageCost:
    """Linear coefficients of one stage's time for one microbatch."""

    const: float  # per step: overheads and the weight read
    per_token: float  # GEMMs, all-reduce and hop payload per query token
    per_pair: float  # attention per (query, key) token pair in prefill
    per_ctx: float  # KV read per decode sequence and context token
    per_logit: float  # LM head per sampled row (last stage only)


def stage_cost(profile: Profile, stage: StageSpec, tp: int, intra: Link) -> StageCost:
    """The stage's linear coefficients from the profile."""
    pre, dec, L = profile.prefill, profile.decode, stage.layers
    ar0 = layer_allreduce_seconds(profile, 0.0, tp, intra)
    ar1 = layer_allreduce_seconds(profile, 1.0, tp, intra) - ar0
    const = L * (max(pre.fixed, dec.fixed) + max(pre.per_tp, dec.per_tp) / tp + ar0)
    per_token = L * (max(pre.per_token, dec.per_seq) / tp + ar1)
    per_logit = 0.0
    if stage.last:
        head = profile.lm_head_decode
        const += head.fixed + head.per_tp / tp
        per_logit = head.per_seq / tp
    if stage.hop is not None:
        const += stage.hop.latency_s
        per_token += profile.memory.activation_bytes_per_token / stage.hop.bandwidth_bytes_per_s
    return StageCost(
        const, per_token, L * pre.per_token_sq / tp, L * dec.per_seq_ctx / tp, per_logit
    )


def stage_chunk_seconds(
    profile: Profile, stage: StageSpec, tokens: float, tp: int, intra: Link
) -> float:
    """Time a ``tokens``-long prompt adds to one stage's work in a continuous-batching step
    it shares with decodes (`stage_cost`: the step's per-token and attention terms; the
    weight read is the decodes' already). The stall every decoding sequence on the
    replica sees per prompt; the simulator's step (`sim.steptime`) charges exactly this."""
    c = stage_cost(profile, stage, tp, intra)
    return c.per_token * tokens + c.per_pair * tokens * tokens + c.per_logit
