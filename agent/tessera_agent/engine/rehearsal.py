"""A stage's rehearsal before its load answers: the first steps real traffic will run,
run once on synthetic sequences, so that their one-time costs are paid before ready.

The compiled decode's warm-up (`decode_graph.py`) builds the graphs over a scratch pool at
two batch sizes, and `packed_linear.StagePacks.warm` builds the prompt rows' kernels; what
neither runs stayed lazy and was paid by the first requests after `/health`: oneDNN's
kernel for each new decode batch size (the graph runs every row count unpadded), the LM
head and the sampler, eager prefill attention, the mixed step's split, the compute
thread's own OpenMP team. `rehearse` runs, through `StageRunner.execute` on the thread
that runs the steps: a prefill of `PROMPT` tokens for each of `batch` sequences, then one
decode step at every batch size 1..`batch` (greedy and sampled rows), then a mixed step
(a prompt beside the decodes), and forgets every sequence. It writes only KV pages no
sequence holds (nothing is admitted before the load answers; a real sequence writes every
position it reads), and changes no result. Called by `hosting.Hosting.load`.
"""

from __future__ import annotations

import logging

import torch

from tessera_agent.engine import runner as runner_mod
from tessera_agent.engine import sampling, step

log = logging.getLogger(__name__)

PREFIX = "rehearsal-"  # the rehearsed sequences' ids

BATCH = 16  # decode batch sizes rehearsed: 1..BATCH (past that a step outweighs a kernel's JIT)
PROMPT = 16  # tokens each rehearsed sequence is prefilled with
MIXED_PROMPT = 64  # the mixed step's prompt (a served request's typical chunk)
_PARAMS = (
    sampling.SamplingParams(max_tokens=BATCH + 2, ignore_eos=True),
    sampling.SamplingParams(max_tokens=BATCH + 2, ignore_eos=True, temperature=0.8, top_p=0.9),
)


class _Interrupted(Exception):
    """A real sequence's step ran between two of the rehearsal's."""


def _pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def plan_batch(num_pages: int, page_size: int, max_num_seqs: int, max_tokens: int) -> int:
    """How many sequences the rehearsal runs: `BATCH`, fewer when the pool, the step's
    sequence bound or its token bound cannot hold them (0: no rehearsal)."""
    per_seq = _pages(PROMPT + BATCH + 1, page_size)
    mixed = _pages(MIXED_PROMPT, page_size)
    fit = (num_pages - mixed) // per_seq
    return max(0, min(BATCH, fit, max_num_seqs - 1, max_tokens // PROMPT))


def rehearse(r: runner_mod.StageRunner, max_num_seqs: int, max_tokens: int) -> int:
    """Run the rehearsal on the calling thread (the stage's compute thread); returns the
    steps it ran (0: none; the pool or the bounds too small, or the stage already saw
    traffic). Stops, forgetting its sequences, if a real step runs between two of its
    own. Raises what a step raises (the caller logs it: the stage still serves)."""
    ps = r.page_size
    batch = plan_batch(r.cache.layout.num_pages, ps, max_num_seqs, max_tokens)
    if batch == 0 or r.block_tables:  # a real sequence's pages are not ours to write
        return 0
    per_seq = _pages(PROMPT + batch + 1, ps)
    # The pool's last pages (an allocator hands out its first ones first).
    base = r.cache.layout.num_pages - batch * per_seq - _pages(MIXED_PROMPT, ps)
    ids = [f"{PREFIX}{i}" for i in range(batch)]
    tables = [tuple(range(base + i * per_seq, base + (i + 1) * per_seq)) for i in range(batch)]
    steps = 0

    def run(chunks: list[step.SeqChunk], finished: tuple[str, ...] = ()) -> None:
        nonlocal steps
        if any(not seq.startswith(PREFIX) for seq in r.block_tables):
            raise _Interrupted  # a real step came in between: stop writing pages
        n = sum(c.num_tokens for c in chunks)
        inp = step.StepInput(steps, chunks, finished=list(finished))
        if r.model.is_first:
            inp.token_ids = [(7 * i + 1) % r.model.cfg.vocab_size for i in range(n)]
        else:
            inp.hidden = torch.zeros(n, r.model.cfg.hidden_size, dtype=r.model.dtype_)
        steps += 1
        r.execute(inp)

    def decode(i: int, ctx: int) -> step.SeqChunk:
        return step.SeqChunk(ids[i], ctx, 1, tables[i], True, _PARAMS[i % 2])

    try:
        with torch.inference_mode():
            # Prefills, at most `max_tokens` tokens a step, every sequence sampled.
            per_step = max(1, max_tokens // PROMPT)
            for lo in range(0, batch, per_step):
                run(
                    [
                        step.SeqChunk(ids[i], 0, PROMPT, tables[i], True, _PARAMS[i % 2])
                        for i in range(lo, min(batch, lo + per_step))
                    ]
                )
            ctx = [PROMPT] * batch
            for b in range(1, batch + 1):  # every decode batch size once
                run([decode(i, ctx[i]) for i in range(b)])
                for i in range(b):
                    ctx[i] += 1
            # A mixed step: a prompt beside decodes, as a request arriving mid-stream.
            decodes = min(batch, 4)
            prompt = min(MIXED_PROMPT, max_tokens - decodes)
            if prompt > 0:
                start = base + batch * per_seq
                table = tuple(range(start, start + _pages(prompt, ps)))
                mixed = step.SeqChunk(f"{PREFIX}mixed", 0, prompt, table, True, _PARAMS[0])
                run([*(decode(i, ctx[i]) for i in range(decodes)), mixed])
            run([], (*ids, f"{PREFIX}mixed"))  # forget them all
    except _Interrupted:
        r.forget_finished([seq for seq in r.block_tables if seq.startswith(PREFIX)])
        log.info("rehearsal of layers [%d, %d) stopped: traffic came first", *_range(r))
    return steps


def _range(r: runner_mod.StageRunner) -> tuple[int, int]:
    return r.model.start, r.model.end
