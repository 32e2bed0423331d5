"""Module-scaling operations on a running stage: replicate, migrate and evict a layer run.

Each operation prepares what is slow (a replica's weights and KV pool) off the compute
thread, then applies the change between two steps on the compute thread (the stage's
single-thread executor), so steps before it see the old holders and steps after it the
new ones, and no request stops: replicate attaches a holder (new requests join it by the
sticky split); evict hands the holder's requests and their K/V back to the run's home
and drops it; migrate attaches the target and moves the source's requests, K/V and (for
the origin) weights to it. Each returns an `OpResult` (time, bytes, the pause of the
step loop). Called by the agent's `scaling_host` (over gRPC) and in-process by tests and
`tessera bench scaling`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tessera_agent.engine import errors, layer_run, loader, run_holders, runner

HolderFactory = Callable[[], Awaitable[run_holders.Holder]]


@dataclass(frozen=True)
class OpResult:
    op: str  # "replicate" | "migrate" | "evict"
    start: int  # global layers [start, end)
    end: int
    source: str  # holder the layers or requests left ("" for replicate)
    target: str  # holder that took them
    seconds: float  # the whole operation
    pause_s: float  # how long the step loop waited for the change
    param_bytes: int  # weights copied (replicate, migrate)
    kv_bytes: int  # K/V copied (migrate, evict)
    kv_pages: int
    requests: int  # requests that changed holder


def origin_name(agent_id: str, device: str) -> str:
    return f"{agent_id}/{device}"


def find(r: runner.StageRunner, start: int, end: int) -> layer_run.ReplicatedRun | None:
    for run in r.runs:
        if (run.start, run.end) == (start, end):
            return run
    return None


def check_range(r: runner.StageRunner, start: int, end: int) -> tuple[int, int]:
    m = r.model
    if not m.start <= start < end <= m.end:
        raise errors.InvalidArgumentError(
            f"layers [{start}, {end}) are not within this stage's layers [{m.start}, {m.end})"
        )
    if m.shard.size > 1:
        raise errors.FailedPreconditionError("layer runs of a tensor-parallel stage: not built")
    if r.lora is not None:
        raise errors.FailedPreconditionError("layer runs of a stage serving LoRA: not built")
    for run in r.runs:
        if (run.start, run.end) != (start, end) and start < run.end and run.start < end:
            raise errors.FailedPreconditionError(
                f"layers [{start}, {end}) overlap the replicated run [{run.start}, {run.end})"
            )
    return start - m.start, end - m.start


def local_replica(
    r: runner.StageRunner,
    start: int,
    end: int,
    device: torch.device,
    name: str,
    model_path: str = "",
) -> run_holders.LocalHolder:
    """A copy of layers [start, end) on another device of this agent (weights copied from
    the stage, or read from `model_path` when the stage's copy migrated away; an empty KV
    pool with the stage's pages)."""
    lo, hi = check_range(r, start, end)
    lay = r.cache.layout
    if any(isinstance(x, run_holders.VacatedLayer) for x in r.model.layers[lo:hi]):
        if not model_path:  # the stage's copy migrated away: read the checkpoint
            raise errors.FailedPreconditionError(
                f"layers [{start}, {end}) migrated away from this stage; name the checkpoint"
            )
        names = [
            n
            for n in loader.checkpoint_names(r.model.cfg, start, end)
            if n.startswith("model.layers.")
        ]
        tensors = loader.read_tensors(Path(model_path), names)
    else:
        tensors = run_holders.layer_tensors(r.model, start, end)
    rm = run_holders.RunModel(
        r.model.cfg, start, end, tensors, r.model.dtype_, device, lay.num_pages, lay.page_size
    )
    return run_holders.LocalHolder(name, rm)


async def _between_steps(executor: concurrent.futures.Executor, fn: Callable[[], object]) -> float:
    """Run `fn` on the compute thread between steps; the seconds it held the thread."""
    loop = asyncio.get_running_loop()

    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return await loop.run_in_executor(executor, timed)


async def replicate(
    r: runner.StageRunner,
    executor: concurrent.futures.Executor,
    origin: str,
    start: int,
    end: int,
    make_holder: HolderFactory,
    live_pages: Callable[[], set[int]] | None = None,
) -> OpResult:
    """Add a replica of layers [start, end) (creating the run on first use)."""
    lo, hi = check_range(r, start, end)
    t0 = time.perf_counter()
    holder = await make_holder()
    run = find(r, start, end)

    def attach() -> None:
        nonlocal run
        if run is None:
            base = run_holders.OriginHolder(origin, r.model, r.cache, lo, hi)
            run = layer_run.ReplicatedRun(
                base, start, r.page_size, live_pages, r.cache.layout.num_pages,
                list(r.block_tables),
            )  # fmt: skip
            r.runs.append(run)
        run.add(holder)

    try:
        pause = await _between_steps(executor, attach)
    except Exception:
        holder.close()
        raise
    return OpResult(
        "replicate", start, end, "", holder.name, time.perf_counter() - t0, pause,
        holder.param_bytes, 0, 0, 0,
    )  # fmt: skip


async def evict(
    r: runner.StageRunner, executor: concurrent.futures.Executor, start: int, end: int, holder: str
) -> OpResult:
    """Drop the replica `holder` of layers [start, end); its requests and their K/V go
    back to the run's home. The run ends when only its origin is left."""
    run = _run(r, start, end)
    if holder == run.home:
        raise errors.FailedPreconditionError(
            f"{holder} is the home of layers [{start}, {end}), not a replica: migrate it instead"
        )
    t0 = time.perf_counter()
    moved = sum(1 for h in run.assignment.values() if h == holder)
    got: tuple[int, int] = (0, 0)

    def apply() -> None:
        nonlocal got
        got = run.move(holder, run.home)
        if len(run.holders) == 1 and run.home == run.origin:
            r.runs.remove(run)  # back to the plain layer loop

    pause = await _between_steps(executor, apply)
    return OpResult(
        "evict", start, end, holder, run.home, time.perf_counter() - t0, pause, 0, got[1],
        got[0], moved,
    )  # fmt: skip


async def migrate(
    r: runner.StageRunner,
    executor: concurrent.futures.Executor,
    start: int,
    end: int,
    source: str,
    make_holder: HolderFactory,
    origin: str = "",
    live_pages: Callable[[], set[int]] | None = None,
) -> OpResult:
    """Move layers [start, end) held by `source` (the stage itself, or a replica) to a new
    holder, with the K/V of every request `source` serves; the source's weights go."""
    lo, hi = check_range(r, start, end)
    t0 = time.perf_counter()
    holder = await make_holder()
    run = find(r, start, end)
    got: tuple[int, int] = (0, 0)
    moved = 0

    def apply() -> None:
        nonlocal run, got, moved
        if run is None:
            if source != origin:
                raise errors.NotFoundError(f"layers [{start}, {end}) have no holder {source}")
            base = run_holders.OriginHolder(origin, r.model, r.cache, lo, hi)
            run = layer_run.ReplicatedRun(
                base, start, r.page_size, live_pages, r.cache.layout.num_pages,
                list(r.block_tables),
            )  # fmt: skip
            r.runs.append(run)
        run.add(holder)
        moved = sum(1 for h in run.assignment.values() if h == source)
        got = run.move(source, holder.name)

    try:
        pause = await _between_steps(executor, apply)
    except Exception:
        holder.close()
        raise
    return OpResult(
        "migrate", start, end, source, holder.name, time.perf_counter() - t0, pause,
        holder.param_bytes, got[1], got[0], moved,
    )  # fmt: skip


def _run(r: runner.StageRunner, start: int, end: int) -> layer_run.ReplicatedRun:
    run = find(r, start, end)
    if run is None:
        have = ", ".join(f"[{x.start}, {x.end})" for x in r.runs) or "none"
        raise errors.NotFoundError(f"layers [{start}, {end}) are not replicated (runs: {have})")
    return run
