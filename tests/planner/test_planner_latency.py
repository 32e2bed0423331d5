"""Latency-aware objective: queueing math, the latency model's behaviour, Table 1 inputs."""

from __future__ import annotations

import math

import pytest

from tessera.cost import queueing
from tessera.cost.capacity import RequestClass
from tessera.planner import capacity_table, table1
from tessera.planner.latency import LatencyModel
from tessera.workload import traces
from tests.planner import planner_helpers as helpers


def test_erlang_c_known_values() -> None:
    assert queueing.erlang_c(1, 0.6) == pytest.approx(0.6)  # M/M/1: P(wait) = rho
    assert queueing.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert queueing.erlang_c(50, 10.0) < 1e-9  # lightly loaded many servers: no wait
    with pytest.raises(ValueError):
        queueing.erlang_c(2, 2.0)


def test_mixture_quantile_closed_forms() -> None:
    one = queueing.Component(1.0, 1.0, queueing.AtomExp(1.0, 2.0))
    assert queueing.mixture_quantile([one]) == pytest.approx(1 + math.log(100) / 2, rel=1e-6)
    # half the requests never wait and are fast: the P99 sits in the slow half's tail
    fast = queueing.Component(1.0, 0.1)
    assert queueing.mixture_quantile([one, fast]) == pytest.approx(1 + math.log(50) / 2, rel=1e-6)
    # the sum of two Exp(1) waits is Erlang-2: P(> t) = (1 + t) e^-t
    w = queueing.AtomExp(1.0, 1.0)
    assert queueing.survival(2.0, w, w) == pytest.approx(3 * math.exp(-2))
    assert queueing.scaled(w, 0.5).mean == pytest.approx(0.5)
    assert queueing.mixture_quantile([queueing.Component(1.0, 3.0)]) == pytest.approx(3.0)


def test_p99_rises_with_load_and_is_infinite_past_capacity() -> None:
    problem = helpers.problem()
    table = capacity_table.build_table(problem)
    model = LatencyModel(problem, table)
    shape = table.kept[0]
    rates = table.rates(shape)
    cap = 1 / sum(w / r for w, r in zip((4, 1, 2), rates, strict=True))  # mix capacity
    p99 = []
    for load in (0.3, 0.6, 0.9):
        mix = tuple(load * cap * w for w in (4, 1, 2))
        p99.append(model.report((shape,), (1,), (mix,)).p99_latency_s)
    assert p99[0] < p99[1] < p99[2] < math.inf
    over = tuple(1.1 * cap * w for w in (4, 1, 2))
    assert model.report((shape,), (1,), (over,)).p99_latency_s == math.inf


def test_isolating_long_prompts_helps_short_requests() -> None:
    # Short chats share two replicas with long prompts, or get one replica to themselves
    # while the long prompts get the other: the chats' P99 TTFT and TPOT drop (no
    # prefill head-of-line blocking), as OServe argues. (The long prompts lose the
    # pooling of two prefill servers; whether the mix's P99 wins depends on the load.)
    classes = (RequestClass("chat", 200, 100, 1.0), RequestClass("doc", 6000, 20, 1.0))
    problem = helpers.problem(classes=classes, nodes=1, gpus=2)
    table = capacity_table.build_table(problem)
    model = LatencyModel(problem, table)
    shape = min(table.infos, key=lambda s: (s.gpus, s.sort_key()))
    rates = table.rates(shape)
    chat, doc = 0.4 * rates[0], 0.4 * rates[1]
    _, _, shared_ttft, shared_tpot = model.replica(shape, (chat / 2, doc / 2))
    _, _, alone_ttft, alone_tpot = model.replica(shape, (chat, 0.0))
    assert queueing.mixture_quantile(alone_ttft[:1]) < queueing.mixture_quantile(shared_ttft[:1])
    assert alone_tpot[0][1] < shared_tpot[0][1]
    routed = model.best_routing((shape,), (2,), (chat, doc))
    assert routed.p99_latency_s < math.inf


def test_table1_cv_reproduces_the_paper_column() -> None:
    for _, shares, paper_cv, _ in table1.LEVELS:
        assert table1.cv(shares) == pytest.approx(paper_cv, abs=6e-4)


def test_quadrant_classes() -> None:
    reqs = [
        traces.Request(float(i), inp, out)
        for i, (inp, out) in enumerate([(100, 500), (2000, 600), (120, 20), (3000, 30)] * 5)
    ]
    made = table1.quadrant_classes(reqs)
    assert [c.name for c in made] == ["SILO", "LILO", "SISO", "LISO"]
    assert (made[0].input_tokens, made[0].output_tokens) == (100, 500)
    assert (made[3].input_tokens, made[3].output_tokens) == (3000, 30)


def test_three_waits_and_the_decode_stretch() -> None:
    """Three Exp(1) waits sum to Erlang-3; atoms weight the subsets; the stretch keeps
    the decode's mean and matches the compound-Poisson variance (issue 34)."""
    w = queueing.AtomExp(1.0, 1.0)
    assert queueing.survival(2.0, w, w, w) == pytest.approx(5 * math.exp(-2), rel=1e-3)
    half = queueing.AtomExp(0.5, 2.0)
    both = queueing.survival(1.0, half, queueing.NO_WAIT, queueing.AtomExp(1.0, 3.0))
    assert both == pytest.approx(0.5 * math.exp(-3) + 0.5 * (3 * math.exp(-2) - 2 * math.exp(-3)))
    shift, spread = queueing.stretch(0.04, 10.0, 0.5)
    sd = math.sqrt(0.04 * 10.0) / 0.5
    assert shift == pytest.approx(-sd) and spread.mean == pytest.approx(sd)
    assert queueing.stretch(0.0, 10.0, 0.5) == (0.0, queueing.NO_WAIT)
    # a replica whose decodes are stalled by long prefills has a longer P99 than the
    # same mean without the spread
    plain = queueing.Component(1.0, 10.0)
    spread_out = queueing.Component(1.0, 10.0 + shift, queueing.NO_WAIT, queueing.NO_WAIT, spread)
    assert queueing.mixture_quantile([spread_out]) > queueing.mixture_quantile([plain]) + sd


def test_robust_routing_survives_the_other_mix() -> None:
    # Two replicas, chats and long prompts. Routed for a doc-heavy forecast, one replica is
    # set apart for the docs; when the mix turns chat-heavy, that split (a gateway's
    # per-class shares) sends every chat to the other replica. The robust routing over
    # both mixes prices each candidate split at both and keeps the best worst case.
    classes = (RequestClass("chat", 200, 100, 1.0), RequestClass("doc", 6000, 20, 1.0))
    problem = helpers.problem(classes=classes, nodes=1, gpus=2)
    table = capacity_table.build_table(problem)
    model = LatencyModel(problem, table)
    shape = min(table.infos, key=lambda s: (s.gpus, s.sort_key()))
    rates = table.rates(shape)
    docs = (0.3 * rates[0], 1.2 * rates[1])  # two replicas' worth: 0.75 each
    chats = (1.2 * rates[0], 0.3 * rates[1])
    for_docs = model.robust_routing((shape,), (2,), (docs,), dedicate=True)
    assert for_docs.worst == model.best_routing((shape,), (2,), docs, dedicate=True)
    both = model.robust_routing((shape,), (2,), (docs, chats), dedicate=True)
    stale = model.robust_routing((shape,), (2,), (docs, chats), dedicate=True)
    # the doc-planned split priced at the chat-heavy mix
    g_shapes = tuple(s for s, _ in for_docs.worst.groups)
    g_counts = tuple(n for _, n in for_docs.worst.groups)
    split = for_docs.split
    at_chats = model.report(
        g_shapes,
        g_counts,
        tuple(tuple(w * d for w, d in zip(row, chats, strict=True)) for row in split),
    )
    assert for_docs.worst.dedicated and at_chats.p99_latency_s == math.inf  # stale: overloads
    assert both.worst.p99_latency_s < math.inf
    assert both.worst.key() <= max(for_docs.worst, at_chats, key=lambda r: r.key()).key()
    assert both.worst.key() == max(both.at, key=lambda r: r.key()).key()
    assert both.at_demand(chats).p99_latency_s <= at_chats.p99_latency_s
    assert stale == both  # pure
    for row in both.split:
        assert all(0.0 <= w <= 1.0 for w in row)
    assert [sum(col) for col in zip(*both.split, strict=True)] == pytest.approx([1.0, 1.0])
    # the gateway's shares: the split at each class's highest rate of the two mixes
    routed = both.rates()
    assert [sum(col) for col in zip(*routed, strict=True)] == pytest.approx([chats[0], docs[1]])
    with pytest.raises(ValueError):
        model.robust_routing((shape,), (2,), ())
