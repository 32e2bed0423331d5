"""A prompt's stall on the decodes it shares a step with: the planner's latency model and
the simulator's step charge the same cost (`cost.latency.stage_chunk_seconds`), and the
modelled TPOT of a replica mixing chats with long prompts matches the simulated one."""

from __future__ import annotations

import pytest

from tessera.cost import latency
from tessera.cost.capacity import RequestClass
from tessera.cost.latency import StageSpec
from tessera.planner import capacity_table
from tessera.planner.capacity_table import replica_layout
from tessera.planner.latency import LatencyModel
from tessera.planner.shapes import Shape
from tessera.policies.routing.shares import Router
from tessera.sim import arrivals, engine, setup, steptime
from tests.planner import planner_helpers as helpers


def test_the_stall_is_what_a_prompt_adds_to_the_simulators_step() -> None:
    prof = helpers.h100("llama-2-70b")
    L, link = prof.model.num_layers, prof.comm.intra_node
    one = [StageSpec(L, True, True, None)]
    model = steptime.StepModel(prof, one, 4, link)
    ctx = 64 * 800
    added = model.seconds(64, ctx, [(2000, 0)], 65) - model.seconds(64, ctx, [], 64)
    assert added == pytest.approx(latency.stage_chunk_seconds(prof, one[0], 2000, 4, link))
    # two stages: the round is the slowest stage's work on both microbatches
    two = [StageSpec(L // 2, True, False, link), StageSpec(L - L // 2, False, True, None)]
    model = steptime.StepModel(prof, two, 4, link)
    added = model.seconds(64, ctx, [(2000, 0)], 65) - model.seconds(64, ctx, [], 64)
    stall = max(latency.stage_chunk_seconds(prof, s, 2000, 4, link) for s in two)
    assert added == pytest.approx(stall, rel=0.05)
    # no second weight read: a one-token chunk costs a token, not a stand-alone prefill
    tiny = latency.stage_chunk_seconds(prof, one[0], 1, 4, link)
    assert tiny < 0.1 * latency.stage_prefill_seconds(prof, one[0], 1, 4, link)


# OServe's quadrant classes (short/long input, short/long output) without SISO
CLASSES = (
    RequestClass("silo", 402, 217, 1.0),
    RequestClass("lilo", 1106, 400, 1.0),
    RequestClass("liso", 2693, 67, 1.0),
)


def _model_and_shape() -> tuple[LatencyModel, Shape]:
    problem = helpers.problem("llama-2-70b", nodes=1, gpus=4, classes=CLASSES)
    table = capacity_table.build_table(problem)
    shape = next(s for s in table.kept if (s.tp, s.pp) == (4, 1))
    return LatencyModel(problem, table), shape


def test_the_latency_model_prices_a_prompt_by_its_stall() -> None:
    model, shape = _model_and_shape()
    lay = replica_layout(model.problem, shape, model.table.infos[shape].layer_ranges)
    for j, cls in enumerate(CLASSES):
        stall = max(
            latency.stage_chunk_seconds(
                model.problem.profile, s, cls.input_tokens, lay.tp, lay.intra
            )
            for s in lay.stages
        )
        assert model.facts(shape).occupancy[j] == pytest.approx(stall)


def test_a_shared_replicas_tpot_matches_the_simulator() -> None:
    """Long-output requests share one tp4 replica with 2,693-token prompts (over half its
    time prefilling, as OServe's S5 mix on the replicas the routing search liked): the
    modelled TPOT is within 10 % of each class's simulated mean, where pricing a prompt
    as a stand-alone prefill of the slowest stage was more than 10 % too low."""
    model, shape = _model_and_shape()
    x = (0.42, 0.42, 1.86)  # req/s per class
    _, _, _, tpots = model.replica(shape, x)
    modelled = tpots[0][1]
    prof = model.problem.profile
    lay = replica_layout(model.problem, shape, model.table.infos[shape].layer_ranges)
    old_occ = [
        max(
            latency.stage_prefill_seconds(prof, s, c.input_tokens, lay.tp, lay.intra)
            for s in lay.stages
        )
        for c in CLASSES
    ]
    u_new = sum(r * o for r, o in zip(x, model.facts(shape).occupancy, strict=True))
    u_old = sum(r * o for r, o in zip(x, old_occ, strict=True))
    assert 0.5 < u_new < 0.7
    old = modelled * (1 - u_new) / (1 - u_old)  # the same decode round, the old prefill share
    reps = setup.uniform(prof, prof.comm, 4, 4, 1, 8, 80 * 2**30)
    mix = [(r, c.input_tokens, c.output_tokens) for r, c in zip(x, CLASSES, strict=True)]
    res = engine.Engine(reps, Router(0)).run(arrivals.poisson(sum(x), 240.0, mix, seed=5), 240.0)
    for c in CLASSES:
        tpot = [
            (d.finish - d.first) / (d.output - 1)
            for d in res.done
            if d.arrival >= 30.0 and (d.prompt, d.output) == (c.input_tokens, c.output_tokens)
        ]
        simulated = sum(tpot) / len(tpot)
        assert modelled == pytest.approx(simulated, rel=0.10), c.name
        assert old < 0.9 * simulated, c.name
