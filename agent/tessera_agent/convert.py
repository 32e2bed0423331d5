"""Conversions between the agent proto and engine objects — the only place they live.

Called by the servicer (requests in, replies out) and by the stage client (steps sent to
the next stage and results read back). Blocks convert in `tessera.rpc.blocks`, shared
with the operator; the sending side of sampling settings is `tessera.rpc.sampling`, and
`sampling_from_proto` is the only way they become the engine's `SamplingParams`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tessera.observability import tracing
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import devices
from tessera_agent.engine import errors, replica, sampling, scheduler, stage, step
from tessera_agent.transfer import group


def tensor_to_proto(t: torch.Tensor) -> pb.Tensor:
    t = t.detach().to("cpu").contiguous()
    return pb.Tensor(
        shape=list(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        data=t.view(torch.uint8).numpy().tobytes(),
    )


def tensor_from_proto(msg: pb.Tensor) -> torch.Tensor:
    dtype = getattr(torch, msg.dtype)
    raw = torch.frombuffer(bytearray(msg.data), dtype=torch.uint8)
    return raw.view(dtype).reshape(tuple(msg.shape))


def sampling_to_proto(p: sampling.SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        has_seed=p.seed is not None,
        seed=p.seed or 0,
        stop_token_ids=list(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        has_logprobs=p.logprobs is not None,
        logprobs=p.logprobs or 0,
    )


def sampling_from_proto(msg: pb.SamplingParams) -> sampling.SamplingParams:
    """Raises InvalidArgumentError naming the bad field."""
    return sampling.SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=msg.temperature,
        top_k=msg.top_k,
        top_p=msg.top_p if msg.top_p else 1.0,
        seed=msg.seed if msg.has_seed else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs if msg.has_logprobs else None,
    )


def logprobs_to_proto(lp: sampling.TokenLogprobs) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(
        logprob=lp.logprob,
        top_ids=[i for i, _ in lp.top],
        top_logprobs=[v for _, v in lp.top],
    )


def chunk_from_events(
    events: Sequence[scheduler.TokenEvent], prompt_tokens: int, completion_tokens: int
) -> pb.GenerateChunk:
    """One `GenerateChunk` for the token events of a request ready at once (several
    tokens, and the finish reason when the last one ends the request)."""
    tokens = [ev.token for ev in events if ev.token is not None]
    reason = next((ev.finish_reason for ev in events if ev.finish_reason), "")
    return pb.GenerateChunk(
        token_ids=tokens,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        logprobs=[logprobs_to_proto(ev.logprobs) for ev in events if ev.logprobs],
    )


def logprobs_from_proto(msg: pb.TokenLogprobs) -> sampling.TokenLogprobs:
    top = zip(msg.top_ids, msg.top_logprobs, strict=True)
    return sampling.TokenLogprobs(msg.logprob, tuple((int(i), float(v)) for i, v in top))


def step_to_proto(inp: step.StepInput) -> pb.StageMessage:
    chunks = [
        pb.SeqChunk(
            seq_id=c.seq_id,
            start=c.start,
            num_tokens=c.num_tokens,
            block_table=list(c.block_table),
            sample=c.sample,
            params=sampling_to_proto(c.params) if c.sample else None,
            variant=c.variant,
        )
        for c in inp.chunks
    ]
    msg = pb.StageStep(
        step_id=inp.step_id,
        chunks=chunks,
        finished=list(inp.finished),
        result_on_link=inp.result_on_link,
    )
    if inp.hidden is not None:
        msg.hidden.CopyFrom(tensor_to_proto(inp.hidden))
    tracing.stamp_step(msg)  # tracing on: each sequence's span, for the next stage's
    return pb.StageMessage(step=msg)


def step_from_proto(msg: pb.StageStep) -> step.StepInput:
    chunks = [
        step.SeqChunk(
            seq_id=c.seq_id,
            start=c.start,
            num_tokens=c.num_tokens,
            block_table=tuple(c.block_table),
            sample=c.sample,
            params=sampling_from_proto(c.params) if c.sample else sampling.SamplingParams(),
            variant=c.variant,
        )
        for c in msg.chunks
    ]
    hidden = tensor_from_proto(msg.hidden) if msg.HasField("hidden") else None
    return step.StepInput(
        step_id=msg.step_id,
        chunks=chunks,
        hidden=hidden,
        finished=list(msg.finished),
        result_on_link=msg.result_on_link,
    )


def result_to_proto(out: step.StepOutput) -> pb.StageResult:
    return pb.StageResult(
        step=pb.StageStepResult(
            step_id=out.step_id,
            tokens=[
                pb.SampledToken(
                    seq_id=s,
                    token_id=t,
                    logprobs=logprobs_to_proto(out.logprobs[s]) if s in out.logprobs else None,
                )
                for s, t in out.sampled.items()
            ],
            tokens_on_link=out.tokens_on_link,
        )
    )


def result_from_proto(msg: pb.StageStepResult) -> step.StepOutput:
    return step.StepOutput(
        step_id=msg.step_id,
        sampled={t.seq_id: int(t.token_id) for t in msg.tokens},
        logprobs={
            t.seq_id: logprobs_from_proto(t.logprobs) for t in msg.tokens if t.HasField("logprobs")
        },
        tokens_on_link=msg.tokens_on_link,
    )


def replica_kv(replica_id: str, s: replica.ReplicaStats) -> pb.ReplicaKV:
    return pb.ReplicaKV(
        replica_id=replica_id,
        pages_total=s.kv_pages_total,
        pages_used=s.kv_pages_used,
        running=s.running,
        waiting=s.waiting,
        preemptions=s.preemptions,
        prefix_hit_tokens=s.prefix_hit_tokens,
        cached_pages=s.cached_pages,
        max_num_seqs=s.max_num_seqs,
    )


def device_to_proto(d: devices.Device) -> pb.Device:
    return pb.Device(
        id=d.id,
        kind=d.kind,
        name=d.name,
        capacity_bytes=d.capacity_bytes,
        free_bytes=d.free_bytes,
    )


def group_from_proto(
    dp: pb.DataPlane | None, spec: stage.BlockSpec, device_kind: str
) -> group.GroupSpec | None:
    """The TP group a block joins (None when tp = 1); InvalidArgumentError names what is
    missing. One group per stage: its name is the plan's formation key plus the stage."""
    if spec.tp_size == 1:
        return None
    if dp is None or not dp.store_address or not dp.group:
        raise errors.InvalidArgumentError(
            "data_plane: tp_size > 1 needs a store_address and a group to form its "
            "tensor-parallel group"
        )
    backend = dp.backend or group.choose([device_kind])
    if backend == "nccl" and device_kind != "cuda":
        raise errors.InvalidArgumentError(
            f"data_plane.backend: nccl needs a CUDA device, {spec.device} is {device_kind}"
        )
    try:
        return group.GroupSpec(
            store_address=dp.store_address,
            name=f"{dp.group}/stage{spec.stage_index}",
            rank=spec.tp_rank,
            size=spec.tp_size,
            backend=backend,
            timeout_s=dp.timeout_s or group.DEFAULT_TIMEOUT_S,
        )
    except ValueError as exc:
        raise errors.InvalidArgumentError(f"data_plane: {exc}") from exc
