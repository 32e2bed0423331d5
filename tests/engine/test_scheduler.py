"""Scheduler and page allocator as pure data: budgets, waiting, preemption, freeing."""

from __future__ import annotations

import pytest

from tessera_agent.engine import errors, page_allocator, sampling, scheduler


def _sched(
    pages: int = 8, page_size: int = 4, budget: int = 16, eos: tuple[int, ...] = (1,)
) -> scheduler.Scheduler:
    return scheduler.Scheduler(
        page_allocator.PageAllocator(pages, page_size),
        scheduler.SchedulerConfig(max_batched_tokens=budget, max_model_len=64, eos_token_ids=eos),
    )


def _complete(
    s: scheduler.Scheduler, planned: scheduler.ScheduledStep, token: int = 7
) -> list[scheduler.TokenEvent]:
    return s.postprocess(planned, {c.seq_id: token for c in planned.input.chunks if c.sample})


def test_chunked_prefill_respects_token_budget() -> None:
    s = _sched(budget=8)
    s.add("a", list(range(20)), sampling.SamplingParams(max_tokens=2))
    p1 = s.schedule()
    assert p1 is not None and p1.input.num_tokens == 8 and not p1.input.chunks[0].sample
    _complete(s, p1)
    p2 = s.schedule()
    assert p2 is not None and p2.input.chunks[0].start == 8


def test_prefill_mixes_with_decode() -> None:
    s = _sched(budget=10, pages=16)
    s.add("a", [5, 6], sampling.SamplingParams(max_tokens=5))
    _complete(s, s.schedule())  # type: ignore[arg-type]
    s.add("b", list(range(30)), sampling.SamplingParams(max_tokens=5))
    planned = s.schedule()
    assert planned is not None
    assert [(c.seq_id, c.num_tokens) for c in planned.input.chunks] == [("a", 1), ("b", 9)]


def test_pages_freed_on_finish_and_cancel() -> None:
    s = _sched()
    s.add("a", [5, 6, 7], sampling.SamplingParams(max_tokens=1))
    s.add("b", [5, 6, 7], sampling.SamplingParams(max_tokens=5))
    planned = s.schedule()
    assert s.alloc.used_pages == 2
    events = _complete(s, planned)  # type: ignore[arg-type]
    assert ("a", "length") in [(e.seq_id, e.finish_reason) for e in events]
    assert s.alloc.used_pages == 1
    s.cancel("b")
    assert s.alloc.used_pages == 0 and s.num_unfinished == 0


def test_cancel_in_flight_frees_when_step_returns() -> None:
    s = _sched()
    s.add("a", [5, 6, 7], sampling.SamplingParams(max_tokens=5))
    planned = s.schedule()
    assert s.cancel("a") == []  # in flight: deferred
    events = _complete(s, planned)  # type: ignore[arg-type]
    assert events == [scheduler.TokenEvent("a", None, "cancelled")]
    assert s.alloc.used_pages == 0


def test_eos_stops_unless_ignored() -> None:
    s = _sched()
    s.add("a", [5], sampling.SamplingParams(max_tokens=5))
    s.add("b", [5], sampling.SamplingParams(max_tokens=5, ignore_eos=True))
    events = _complete(s, s.schedule(), token=1)  # type: ignore[arg-type]
    assert scheduler.TokenEvent("a", None, "stop") in events
    assert all(e.finish_reason is None for e in events if e.seq_id == "b")


def test_full_pool_waits_then_resumes() -> None:
    s = _sched(pages=2, page_size=4)
    s.add("a", [1, 2, 3, 4, 5], sampling.SamplingParams(max_tokens=2, ignore_eos=True))
    s.add("b", [1, 2, 3], sampling.SamplingParams(max_tokens=2, ignore_eos=True))
    planned = s.schedule()
    assert planned is not None and [c.seq_id for c in planned.input.chunks] == ["a"]
    assert [q.seq_id for q in s.waiting] == ["b"]
    _complete(s, planned)
    while s.num_unfinished:
        step = s.schedule()
        assert step is not None
        _complete(s, step)
    assert s.alloc.used_pages == 0


def test_decode_growth_preempts_newest() -> None:
    s = _sched(pages=3, page_size=2, budget=64)
    s.add("old", [1, 2], sampling.SamplingParams(max_tokens=4, ignore_eos=True))
    s.add("new", [1, 2], sampling.SamplingParams(max_tokens=4, ignore_eos=True))
    for _ in range(30):
        if not s.num_unfinished:
            break
        step = s.schedule()
        assert step is not None
        _complete(s, step)
    assert s.num_unfinished == 0 and s.preemptions >= 1 and s.alloc.used_pages == 0


def test_request_larger_than_pool_is_rejected() -> None:
    s = _sched(pages=2, page_size=4)
    with pytest.raises(errors.ResourceExhaustedError, match="whole pool"):
        s.add("a", [1, 2, 3], sampling.SamplingParams(max_tokens=10))


def test_prompt_longer_than_context_is_rejected() -> None:
    s = _sched(pages=100)
    with pytest.raises(errors.InvalidArgumentError, match="context"):
        s.add("a", list(range(64)), sampling.SamplingParams(max_tokens=1))
    with pytest.raises(errors.InvalidArgumentError, match="already"):
        s.add("b", [1], sampling.SamplingParams())
        s.add("b", [1], sampling.SamplingParams())
