"""Apply one overload-shift op to a hosted block (KunServe): the agent side.

Called by the servicer's `OverloadShift` (which only translates the proto); the driver
(`tessera.control.overload_driver`) sequences the ops over a group, each op checking its
preconditions. `pause` / `resume`: the leader stops scheduling (waiting for steps in flight) /
runs again, raising its allocator to `num_pages`. `drop`: keep layers [start, end)
(`memory_shift.drop_layers`) and take the new identity (a donor becomes stage i of the head's
replica). `compact`: the leader moves held pages below `num_pages` and reports the moves;
`move_pages` copies them on a stage. `resize` / `unpause` (a transition on a full device): the
paused leader resizes its allocator, stages copy the moves and resize their pools, booking
follows. `restore`: hold [start, end) again, pulling missing layers from peers
(`transfer.block_copy.fetch`); a block becoming a whole stage 0 gets a leader again.
Tensor changes run on the agent's compute thread, between steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import torch

from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import equivalence_share, hosted, hosting, leader
from tessera_agent.engine import block_zoo, errors, loader, memory_shift, replica, stage
from tessera_agent.transfer import block_copy

log = logging.getLogger(__name__)


def _reply(h: hosted.Hosted, **extra: object) -> pb.OverloadShiftReply:
    st = h.stage
    r = pb.OverloadShiftReply(
        layer_start=st.spec.start,
        layer_end=st.spec.end,
        param_bytes=st.param_bytes,
        kv_bytes=st.kv_bytes,
        kv_pages=st.num_pages,
        restored_pages=memory_shift.restored_pages(st, 0, st.cfg.num_layers),
        **extra,  # type: ignore[arg-type]
    )
    if h.leader is not None:
        alloc = h.leader.allocator
        r.allocator_pages = alloc.num_pages if alloc is not None else st.num_pages
        stats = h.leader.stats()
        r.running, r.waiting = stats.running, stats.waiting
    return r


async def apply(hs: hosting.Hosting, req: pb.OverloadShiftRequest) -> pb.OverloadShiftReply:
    h = hs.get(req.replica_id, req.stage_index)
    op = req.op
    if op == "pause":
        eng = _leader(h)
        held = await eng.pause()
        return _reply(h, held_pages=held)
    if op == "resume":
        eng = _leader(h)
        inflight = leader.dropped_in_flight(h, hs.defaults.pipeline_microbatches)
        await eng.resume(leader.connector(h, hs.defaults.tls), req.num_pages, inflight)
        return _reply(h)
    if op == "compact":
        return await _compact(hs, h, req.num_pages)
    if op == "move_pages":
        moves = dict(zip(req.moves_from, req.moves_to, strict=True))
        await _on_compute(hs, memory_shift.move_pages, h.stage, moves)
        return _reply(h)
    if op == "resize":
        return await _resize(hs, h, req)
    if op == "unpause":
        _leader(h).unpause()
        return _reply(h)
    if op == "drop":
        return await _drop(hs, h, req)
    if op == "restore":
        return await _restore(hs, h, req)
    raise errors.InvalidArgumentError(
        f"op: {op!r} is not one of pause, resume, drop, compact, move_pages, restore, "
        "resize, unpause"
    )


def _leader(h: hosted.Hosted) -> replica.ReplicaEngine:
    if h.leader is None:
        raise errors.FailedPreconditionError(f"{h.holder} leads no replica (not stage 0)")
    return h.leader


async def _on_compute(hs: hosting.Hosting, fn: object, *args: object) -> object:
    return await asyncio.get_running_loop().run_in_executor(hs.compute, fn, *args)  # type: ignore[arg-type]


def _paused_or_idle(h: hosted.Hosted) -> None:
    eng = h.leader
    if eng is not None and not eng.paused and eng.num_unfinished:
        raise errors.FailedPreconditionError(
            f"{h.holder} has {eng.num_unfinished} requests and is not paused: pause it first"
        )


def _no_layer_runs(h: hosted.Hosted) -> None:
    """A drop must not remove layers that a replicated layer run (module scaling) covers:
    the run's holders index the stage's layers and KV pages."""
    runs = h.stage.runner.runs
    if runs:
        spans = ", ".join(f"[{r.start}, {r.end})" for r in runs)
        raise errors.FailedPreconditionError(
            f"{h.holder} has replicated layer runs {spans}: evict them before an overload drop"
        )


async def _compact(hs: hosting.Hosting, h: hosted.Hosted, limit: int) -> pb.OverloadShiftReply:
    eng = _leader(h)
    if not eng.paused:
        raise errors.FailedPreconditionError(f"{h.holder}: pause the leader before compacting")
    alloc = eng.allocator
    st = h.stage
    limit = limit or memory_shift.restored_pages(st, 0, st.cfg.num_layers)
    if alloc is None:
        return _reply(h)
    try:
        moves = alloc.compact(limit)
    except ValueError as exc:
        raise errors.ResourceExhaustedError(f"{h.holder}: {exc}") from exc
    await _on_compute(hs, memory_shift.move_pages, st, moves)
    held = await eng.pause()
    return _reply(h, held_pages=held, moves_from=list(moves), moves_to=list(moves.values()))


async def _resize(
    hs: hosting.Hosting, h: hosted.Hosted, req: pb.OverloadShiftRequest
) -> pb.OverloadShiftReply:
    """Resize this stage's KV pool to `num_pages`; on the leader, its allocator first."""
    if req.num_pages < 1:
        raise errors.InvalidArgumentError(f"num_pages: must be >= 1, got {req.num_pages}")
    moves = dict(zip(req.moves_from, req.moves_to, strict=True))
    eng = h.leader
    if eng is not None:
        if not eng.paused:
            raise errors.FailedPreconditionError(f"{h.holder}: pause the leader before resizing")
        alloc = eng.allocator
        if alloc is not None:
            try:
                moves = alloc.resize(req.num_pages)
            except ValueError as exc:
                raise errors.ResourceExhaustedError(f"{h.holder}: {exc}") from exc
    await _on_compute(hs, memory_shift.resize_pool, h.stage, moves, req.num_pages)
    _book(hs, h)
    return _reply(h, moves_from=list(moves), moves_to=list(moves.values()))


def _identity(h: hosted.Hosted, req: pb.OverloadShiftRequest) -> hosting.Key:
    """Give the block its new identity (replica, stage, stage count, next address)."""
    spec = h.stage.spec
    h.stage.spec = dataclasses.replace(
        spec,
        replica_id=req.new_replica_id or spec.replica_id,
        stage_index=req.new_stage_index if req.new_replica_id else spec.stage_index,
        num_stages=req.num_stages or spec.num_stages,
        next_address=req.next_address,
    )
    return (h.stage.spec.replica_id, h.stage.spec.stage_index)


async def _rekey(hs: hosting.Hosting, old: hosting.Key, h: hosted.Hosted) -> None:
    new = (h.stage.spec.replica_id, h.stage.spec.stage_index)
    if new == old:
        return
    if new in hs.hosted:
        raise errors.FailedPreconditionError(f"{new[0]}/{new[1]} is already hosted here")
    del hs.hosted[old]
    hs.hosted[new] = h
    dev = h.stage.spec.device
    hs.memory.release(dev, f"{old[0]}/{old[1]}")
    _book(hs, h)


def _book(hs: hosting.Hosting, h: hosted.Hosted) -> None:
    """The block's booking after a shift: its own parameters (not those held in the block
    zoo, which are booked per piece) and its grown or shrunk KV pool."""
    hs.memory.book(h.stage.spec.device, h.holder, h.stage.own_param_bytes + h.stage.kv_bytes)


def _zoo_drop_keys(h: hosted.Hosted, start: int, end: int) -> tuple[block_zoo.PieceKey, ...]:
    """The block-zoo pieces a drop to layers [start, end) lets go of. A piece another block
    shares (a variant's chain) would stay in memory, so such a drop frees nothing and is
    refused with the reason rather than growing the KV pool into memory that is not free."""
    pieces = h.stage.pieces
    if pieces is None:
        return ()
    kept = {name for name, _ in block_zoo.piece_names(h.stage.cfg, start, end)}
    gone = tuple(k for k in pieces.adopted.keys if k.piece not in kept)
    shared = [k.piece for k in gone if pieces.zoo.refs(k) > 1]
    if shared:
        raise errors.FailedPreconditionError(
            f"{h.holder}: {', '.join(shared)} shared with another block in the agent's block "
            "zoo (variants): dropping them would free no memory"
        )
    return gone


def _zoo_release(
    hs: hosting.Hosting, h: hosted.Hosted, gone: tuple[block_zoo.PieceKey, ...]
) -> None:
    pieces = h.stage.pieces
    if pieces is None or not gone:
        return
    for key in pieces.zoo.release(gone):
        hs.memory.release(h.stage.spec.device, key.holder)
    keys = tuple(k for k in pieces.adopted.keys if k not in gone)
    pieces.adopted = dataclasses.replace(pieces.adopted, keys=keys)


async def _drop(
    hs: hosting.Hosting, h: hosted.Hosted, req: pb.OverloadShiftRequest
) -> pb.OverloadShiftReply:
    old = (h.stage.spec.replica_id, h.stage.spec.stage_index)
    becomes_follower = bool(req.new_replica_id) and req.new_stage_index > 0
    if h.leader is not None and becomes_follower and h.leader.num_unfinished:
        raise errors.FailedPreconditionError(
            f"{h.holder} still has {h.leader.num_unfinished} requests: drain or move them "
            "before it becomes a stage of another replica"
        )
    _paused_or_idle(h)
    _no_layer_runs(h)
    gone = _zoo_drop_keys(h, req.layer_start, req.layer_end)
    shift = await _on_compute(hs, memory_shift.drop_layers, h.stage, req.layer_start, req.layer_end)
    assert isinstance(shift, memory_shift.Shift)
    _zoo_release(hs, h, gone)
    _book(hs, h)
    _identity(h, req)
    if h.leader is not None and becomes_follower:
        eng, h.leader = h.leader, None
        await eng.close()
    await _rekey(hs, old, h)
    log.info(
        "overload drop: %s keeps layers [%d, %d), KV pool %d -> %d pages",
        h.holder,
        req.layer_start,
        req.layer_end,
        shift.pages_before,
        shift.pages_after,
    )
    return _reply(h)


async def _restore(
    hs: hosting.Hosting, h: hosted.Hosted, req: pb.OverloadShiftRequest
) -> pb.OverloadShiftReply:
    _paused_or_idle(h)
    st = h.stage
    old = (st.spec.replica_id, st.spec.stage_index)
    start, end = req.layer_start, req.layer_end
    tensors: dict[str, torch.Tensor] = {}
    dev = hs.memory.device(st.spec.device)
    for src in req.sources:
        names = loader.checkpoint_names(st.cfg, src.layer_start, src.layer_end)
        names = [n for n in names if n not in _held_names(st)]
        source = pb.BlockSource(
            address=src.address,
            replica_id=src.replica_id,
            stage_index=src.stage_index,
            transport="grpc",
        )
        got, _ = await block_copy.fetch(
            source, names, hs.store_address, dev.torch_device(), tls=hs.defaults.tls
        )
        tensors.update(got)
    if st.equivalence is not None:  # issue 14: accepted layers are the foundation's
        tensors = await asyncio.get_running_loop().run_in_executor(
            hs.loader,
            equivalence_share.restore_tensors,
            st.spec,
            st.cfg,
            st.equivalence,
            start,
            end,
            tensors,
        )
    shift = await _on_compute(hs, memory_shift.restore_layers, st, start, end, tensors or None)
    assert isinstance(shift, memory_shift.Shift)
    _book(hs, h)
    _identity(h, req)
    await _rekey(hs, old, h)
    spec = h.stage.spec
    if spec.stage_index == 0 and spec.num_stages == 1 and h.leader is None:
        cfg = leader.scheduler_config(h, hs.defaults)
        h.leader = leader.make_leader(h, cfg, hs.compute, tls=hs.defaults.tls)
    log.info(
        "overload restore: %s holds layers [%d, %d) again, KV pool %d -> %d pages",
        h.holder,
        start,
        end,
        shift.pages_before,
        shift.pages_after,
    )
    return _reply(h)


def _held_names(st: stage.Stage) -> set[str]:
    return set(st.tensor_names())
