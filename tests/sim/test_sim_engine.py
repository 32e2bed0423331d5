"""The simulator's event engine, replica model, step times and arrivals (tessera.sim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cost import analytic
from tessera.cost.latency import StageSpec
from tessera.cost.model_shape import from_hf_config
from tessera.policies.serving import batching
from tessera.sim import arrivals, engine, replica, report, setup, steptime
from tessera.workload.traces import Request

ROOT = Path(__file__).resolve().parents[2]
MEM = 80 * 2**30


def _profile(model: str = "llama-2-7b"):  # type: ignore[no-untyped-def]
    cfg = json.loads((ROOT / "examples" / "models" / model / "config.json").read_text())
    return analytic.analytic_profile(from_hf_config(cfg, model), "h100-80gb")


def _run(reps, arr, **kw):  # type: ignore[no-untyped-def]
    return engine.Engine(reps, setup.router_for(None, []), **kw).run(arr)


def test_one_request_takes_one_prefill_and_output_minus_one_decodes() -> None:
    prof = _profile()
    (rep,) = setup.uniform(prof, prof.comm, 1, 1, 1, 8, MEM)
    res = _run([rep], [arrivals.Arrival(0.0, 100, 5)])
    (d,) = res.done
    prefill = rep.model.seconds(0, 0, [(100, 0)], 1)
    assert d.first == pytest.approx(prefill)
    decode_total = sum(rep.model.seconds(1, 100 + k + 1, [], 1) for k in range(4))
    assert d.finish - d.first == pytest.approx(decode_total, rel=0.02)
    assert rep.alloc.used_pages == 0  # pages returned at the finish


def test_replicas_use_the_real_policy_and_allocator() -> None:
    from tessera.kvpages import PageAllocator

    assert replica.batching is batching
    prof = _profile()
    (rep,) = setup.uniform(prof, prof.comm, 1, 1, 1, 8, MEM)
    assert isinstance(rep.alloc, PageAllocator)


def _poisson(rate: float = 40.0, seconds: float = 20.0) -> list[arrivals.Arrival]:
    return arrivals.poisson(rate, seconds, [(1.0, 500, 120), (1.0, 1500, 40)], seed=3)


def test_macro_steps_and_memo_match_step_by_step() -> None:
    prof = _profile()
    arr = _poisson()
    slow = setup.uniform(prof, prof.comm, 2, 1, 1, 8, MEM)
    for r in slow:
        r.max_macro, r.memoize = 1, False
    fast = setup.uniform(prof, prof.comm, 2, 1, 1, 8, MEM)
    a, b = _run(slow, arr), _run(fast, arr)
    assert len(a.done) == len(b.done) == len(arr)
    sa, sb = report.summary(a), report.summary(b)
    assert sb["ttft_p50_s"] == pytest.approx(sa["ttft_p50_s"], rel=0.05)
    assert sb["e2e_p99_s"] == pytest.approx(sa["e2e_p99_s"], rel=0.05)
    assert b.events < a.events  # macro-steps are what makes it fast


def test_memo_is_exact() -> None:
    prof = _profile()
    arr = _poisson()
    plain = setup.uniform(prof, prof.comm, 2, 1, 1, 8, MEM)
    for r in plain:
        r.memoize = False
    memo = setup.uniform(prof, prof.comm, 2, 1, 1, 8, MEM)
    a, b = _run(plain, arr), _run(memo, arr)
    assert [(d.first, d.finish) for d in a.done] == [(d.first, d.finish) for d in b.done]


def test_a_small_pool_preempts_and_still_finishes_everything() -> None:
    prof = _profile()
    stages = [StageSpec(prof.model.num_layers, True, True, None)]
    model = steptime.StepModel(prof, stages, 1, prof.comm.intra_node)
    rep = replica.SimReplica("r0", model, 200, 16, 1, batching.BatchLimits())
    arr = [arrivals.Arrival(0.01 * i, 300, 200) for i in range(20)]
    res = _run([rep], arr)
    assert len(res.done) == 20 and res.unfinished == 0
    assert res.preemptions > 0
    assert rep.alloc.used_pages == 0


def test_pipeline_bubble() -> None:
    prof = _profile()
    L = prof.model.num_layers
    link = prof.comm.intra_node
    two = [StageSpec(L // 2, True, False, link), StageSpec(L - L // 2, False, True, None)]
    model = steptime.StepModel(prof, two, 1, link)
    costs = model.stages
    # one sequence: the whole trip through both stages, nothing overlaps
    one = model.seconds(1, 500, [], 1)
    trip = sum(c.const + c.per_token + c.per_ctx * 500 + c.per_logit for c in costs)
    assert one == pytest.approx(trip)
    # many sequences: two microbatches keep both stages busy; far less than 2 trips
    many = model.seconds(64, 64 * 500, [], 64)
    assert many < 2 * model.seconds(32, 32 * 500, [], 32)


def test_replay_scales_time_and_rate() -> None:
    reqs = [Request(float(t), 10, 5) for t in range(100)]
    base = arrivals.replay(reqs)
    assert len(base) == 100 and base[-1].time == pytest.approx(99.0)
    fast = arrivals.replay(reqs, time_scale=2.0)
    assert fast[-1].time == pytest.approx(49.5)
    double = arrivals.replay(reqs, rate_scale=2.0)
    assert len(double) == 200
    cut = arrivals.replay(reqs, duration=50.0)
    assert len(cut) == 50
    tiled = arrivals.tile(reqs, 250.0)
    assert 240 <= len(tiled) <= 260
    with pytest.raises(ValueError):
        arrivals.replay(reqs, rate_scale=0.0)


def test_bursty_adds_a_burst() -> None:
    mix = [(1.0, 100, 10)]
    plain = arrivals.poisson(10.0, 100.0, mix, seed=1)
    burst = arrivals.bursty(10.0, 30.0, 100.0, [(40.0, 20.0)], mix, seed=1)
    inside = [a for a in burst if 40.0 <= a.time < 60.0]
    assert len(burst) > len(plain) + 400
    assert len(inside) > 500


def test_a_one_token_request_is_counted_once() -> None:
    prof = _profile()
    (rep,) = setup.uniform(prof, prof.comm, 1, 1, 1, 8, MEM)
    res = _run([rep], [arrivals.Arrival(0.0, 50, 1), arrivals.Arrival(0.0, 50, 3)])
    assert len(res.done) == 2
    assert res.done[0].first == res.done[0].finish
