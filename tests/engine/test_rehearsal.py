"""A stage's rehearsal before ready (`engine/rehearsal.py`): it runs every decode batch
size up to its bound, a prefill and a mixed step, forgets its sequences, changes no
later result, sizes itself to the pool and the step bounds, and never writes pages once
a real sequence has run on the stage."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tessera_agent.engine import rehearsal, sampling, step
from tests.engine import helpers

GREEDY = sampling.SamplingParams(max_tokens=8, ignore_eos=True)
PROMPTS = [[1, 5, 9, 13, 17, 21, 25], [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28]]


def _tokens(stages: list) -> list[list[int]]:  # type: ignore[type-arg]
    out, _ = asyncio.run(helpers.generate_many(stages, PROMPTS, GREEDY))
    return out


def test_rehearsal_runs_every_batch_size_and_changes_nothing(tiny_llama: Path) -> None:
    want = _tokens(helpers.load(tiny_llama, [(0, 8)]))
    stages = helpers.load(tiny_llama, [(0, 4), (4, 8)])  # a first and a last stage
    seen: list[list[int]] = []
    for st in stages:
        r = st.runner
        real = r.execute
        r.execute = lambda inp, real=real: (
            seen.append([c.num_tokens for c in inp.chunks]) or real(inp)
        )  # type: ignore[method-assign]
        steps = rehearsal.rehearse(r, max_num_seqs=256, max_tokens=2048)
        del r.execute
        assert steps == 1 + rehearsal.BATCH + 1 + 1  # prefill, decodes, mixed, forget
        assert r.block_tables == {}  # every rehearsed sequence forgotten
    decodes = [len(c) for c in seen[1 : 1 + rehearsal.BATCH] if all(n == 1 for n in c)]
    assert decodes == list(range(1, rehearsal.BATCH + 1))
    assert seen[1 + rehearsal.BATCH] == [1, 1, 1, 1, rehearsal.MIXED_PROMPT]
    assert _tokens(stages) == want


def test_rehearsal_fits_its_bounds_and_yields_to_traffic(tiny_llama: Path) -> None:
    b = rehearsal.BATCH
    assert rehearsal.plan_batch(1000, 16, 256, 2048) == b
    assert rehearsal.plan_batch(1000, 16, 5, 2048) == 4  # a step holds 5 sequences
    assert rehearsal.plan_batch(1000, 16, 256, 3 * rehearsal.PROMPT) == 3
    assert rehearsal.plan_batch(4, 16, 256, 2048) == 0  # no room beside the mixed prompt
    (st,) = helpers.load(tiny_llama, [(0, 8)])
    r = st.runner
    # A real sequence ran here first: its pages are not the rehearsal's to write.
    r.execute(step.StepInput(0, [step.SeqChunk("real", 0, 3, (0,), True, GREEDY)], [1, 2, 3]))
    assert rehearsal.rehearse(r, 256, 2048) == 0
    assert set(r.block_tables) == {"real"}
    r.forget_finished(["real"])

    # One arriving between two of its steps stops it, its own sequences forgotten.
    real = r.execute
    calls = 0

    def execute(inp: step.StepInput) -> step.StepOutput:
        nonlocal calls
        calls += 1
        if calls == 3:
            r.block_tables["real"] = (0,)
        return real(inp)

    r.execute = execute  # type: ignore[method-assign]
    assert rehearsal.rehearse(r, 256, 2048) == 3
    assert set(r.block_tables) == {"real"}
