"""When a load may answer: its compiled decode warm, the heap settled, the first steps rehearsed.

`Hosting.load` (`hosting.py`) calls `until_ready` after the block is built and wired, and
`settle_when_warm` when the block's compiled decode starts warming. Ready means warm: the
one-time costs of a fresh stage (graph compilation, the collector's pass over what loading
and compiling made, the first step at each batch size) are paid before the load answers,
not by the first requests routed to it. Rationale and figures: `docs/engine.md`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

from tessera import gc_heap
from tessera_agent import hosted, load_config
from tessera_agent.engine import compile_policy, decode_graph, rehearsal

log = logging.getLogger(__name__)

Settling = dict[str, "asyncio.Task[None]"]


async def until_ready(
    h: hosted.Hosted,
    fresh: bool,
    defaults: load_config.LoadDefaults,
    compute: concurrent.futures.Executor,
    settling: Settling,
    max_num_seqs: int,
    max_batched_tokens: int,
) -> None:
    """Wait for the stage's compiled decode (`compile_policy.warm_before_ready`), rehearse
    a `fresh` (just loaded) stage, then wait for the collector's settle of its holder.
    "Already loaded" waits for the graph as well: a retried load (its first call timed
    out) must not answer before the first one would have."""
    graph = h.stage.runner.decode_graph
    if graph is not None and graph.state == "warming":
        if compile_policy.warm_before_ready(defaults.engine, graph.device):
            await asyncio.get_running_loop().run_in_executor(None, graph.wait)
            log.info(
                "%s: ready after its warm-up (compile: %s, %.1f s)",
                h.holder,
                graph.status,
                graph.warmup_s,
            )
    if fresh and (graph is None or graph.state != "warming"):
        await rehearse(h, defaults, compute, max_num_seqs, max_batched_tokens)
    # Ready means settled too: the collector's pass over what loading and compiling made
    # (hundreds of ms, holding the GIL) runs before the load answers, not under the first
    # requests routed to it (in `background` mode, while it still warms up, it stays
    # behind the warm-up).
    task = settling.get(h.holder)
    if task is not None and (graph is None or graph.state != "warming"):
        await asyncio.shield(task)


async def rehearse(
    h: hosted.Hosted,
    defaults: load_config.LoadDefaults,
    compute: concurrent.futures.Executor,
    max_num_seqs: int,
    max_tokens: int,
) -> None:
    """Run the stage's rehearsal (`engine/rehearsal.py`) on the compute thread: the first
    requests' one-time costs paid here. CPU stages of one rank (a TP rank's steps need
    its peers); a failure is logged, the stage serves."""
    r = h.stage.runner
    if h.stage.spec.tp_size > 1 or not compile_policy.rehearse(defaults.engine, r.device):
        return
    seqs = max_num_seqs or defaults.max_num_seqs
    tokens = max_tokens or defaults.max_batched_tokens
    began = time.monotonic()
    try:
        steps = await asyncio.get_running_loop().run_in_executor(
            compute, rehearsal.rehearse, r, seqs, tokens
        )
    except Exception:
        log.exception("%s: rehearsal failed; its first requests pay what it would", h.holder)
        return
    log.info("%s: rehearsed %d steps in %.2f s", h.holder, steps, time.monotonic() - began)


def settle_when_warm(
    graph: decode_graph.CompiledDecode | None,
    holder: str,
    defaults: load_config.LoadDefaults,
    settling: Settling,
) -> None:
    """Freeze the heap (`gc_heap`) once the block's compiled decode, whose compiler state
    is most of the new objects, has warmed up; at once when there is none. The task is
    kept in `settling` under `holder` until it ends, for `until_ready` to wait on."""
    if not defaults.gc_settle:
        return

    async def settle() -> None:
        if graph is not None and graph.state == "warming":
            await asyncio.get_running_loop().run_in_executor(None, graph.wait)
        gc_heap.settle(f"loaded {holder}")

    task = asyncio.get_running_loop().create_task(settle())
    settling[holder] = task

    def done(t: asyncio.Task[None]) -> None:
        if settling.get(holder) is t:
            del settling[holder]

    task.add_done_callback(done)
