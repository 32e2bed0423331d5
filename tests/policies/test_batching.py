"""The continuous-batching policy, pure and without an engine (policies.serving.batching)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.policies.serving import batching as b


def _v(i: int, pending: int) -> b.SeqView:
    return b.SeqView(f"s{i}", i, pending)


def test_running_first_oldest_first_then_fcfs_admission() -> None:
    running = [_v(3, 1), _v(1, 1), _v(2, 1)]
    waiting = [_v(4, 64), _v(5, 64), _v(6, 64)]
    plan = b.plan_batch(running, waiting, b.BatchLimits(max_num_seqs=8, max_batched_tokens=100))
    assert [p.seq_id for p in plan.running] == ["s1", "s2", "s3"]
    # 97 tokens left: the first prompt whole, the second chunked to what is left.
    assert plan.admitted == (b.Pick("s4", 64), b.Pick("s5", 33))
    assert plan.num_tokens == 100


def test_a_large_token_budget_admits_many_queued_prompts_in_one_step() -> None:
    """What keeps TTFT low at saturation: 64 decodes still leave room for 30 prompts."""
    running = [_v(i, 1) for i in range(64)]
    waiting = [_v(100 + i, 64) for i in range(40)]
    plan = b.plan_batch(running, waiting, b.BatchLimits())
    assert len(plan.running) == 64
    assert len(plan.admitted) == 31 and plan.admitted[-1].num_tokens == 2048 - 64 - 30 * 64


def test_seq_limit_and_microbatch_narrowing() -> None:
    running = [_v(i, 1) for i in range(10)]
    plan = b.plan_batch(running, [_v(99, 5)], b.BatchLimits(max_num_seqs=4), max_seqs=3)
    assert [p.seq_id for p in plan.running] == ["s0", "s1", "s2"] and not plan.admitted


def test_preemption_victim_is_the_newest_idle_sequence() -> None:
    assert b.preemption_victim([_v(2, 1), _v(7, 1), _v(5, 1)]) == "s7"
    assert b.preemption_victim([]) is None


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_batched_tokens"):
        b.BatchLimits(max_batched_tokens=0)


def test_the_policy_imports_no_torch() -> None:
    """A simulator imports it without torch (the import-linter contract says the same)."""
    code = "import sys, tessera.policies.serving.batching; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@given(
    pend_run=st.lists(st.integers(1, 40), max_size=20),
    pend_wait=st.lists(st.integers(1, 200), max_size=20),
    seqs=st.integers(1, 32),
    tokens=st.integers(1, 512),
)
def test_plans_respect_the_limits(
    pend_run: list[int], pend_wait: list[int], seqs: int, tokens: int
) -> None:
    running = [_v(i, p) for i, p in enumerate(pend_run)]
    waiting = [_v(100 + i, p) for i, p in enumerate(pend_wait)]
    plan = b.plan_batch(running, waiting, b.BatchLimits(seqs, tokens))
    picks = plan.running + plan.admitted
    assert plan.num_tokens <= tokens and len(picks) <= seqs
    assert all(p.num_tokens >= 1 for p in picks)
    # FCFS: admitted sequences are a prefix of the waiting queue.
    assert [p.seq_id for p in plan.admitted] == [w.seq_id for w in waiting[: len(plan.admitted)]]
    # Nobody is admitted while a running sequence was left out for lack of budget.
    if plan.admitted:
        assert len(plan.running) == len(running)
