"""The seeds' experiments in the simulator (OServe, CoCoServe, BlockLLM): the decision
functions are imported and applied, not re-implemented, and applying them has the
effect their papers describe in small configurations."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tessera.cost import analytic
from tessera.cost.model_shape import from_hf_config
from tessera.policies.scaling import request_split
from tessera.policies.scaling import speedup as sp
from tessera.policies.serving import batching
from tessera.sim import arrivals, blockllm, cocoserve, engine, setup
from tessera.sim.replica import SimRequest

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "src" / "tessera" / "sim"


def _prof(model: str):  # type: ignore[no-untyped-def]
    import json

    cfg = json.loads((ROOT / "examples" / "models" / model / "config.json").read_text())
    return analytic.analytic_profile(from_hf_config(cfg, model), "h100-80gb")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize(
    ("module", "needed"),
    [
        (
            "oserve.py",
            {"tessera.planner.table1", "tessera.policies.routing.shares"},
        ),
        (
            "oserve_switcher.py",
            {
                "tessera.planner.table1",
                "tessera.planner.latency",
                "tessera.policies.switching.gain",
                "tessera.policies.switching.switch_plan",
                "tessera.policies.switching.step",
                "tessera.policies.routing.shares",
                "tessera.policies.routing.reroute",
            },
        ),
        (
            "cocoserve.py",
            {
                "tessera.policies.scaling.module_scaling",
                "tessera.policies.scaling.request_split",
                "tessera.policies.scaling.speedup",
            },
        ),
        ("blockllm.py", {"tessera.policies.routing.block_dispatch"}),
    ],
)
def test_the_sim_imports_the_decisions(module: str, needed: set[str]) -> None:
    assert needed <= _imports(SIM / module)


def test_the_sim_defines_no_policy_function() -> None:
    """No sim module defines a function named like the decisions it imports."""
    decisions = {
        "decide",
        "scale_up",
        "scale_down",
        "assign",
        "choose",
        "best_routing",
        "plan_drop",
        "speedup",
        "compute_time",
        "estimate_s",
    }
    for path in SIM.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                assert node.name not in decisions, f"{path.name} defines {node.name}"


def test_replication_plan_and_split_speed_up_a_compute_bound_step() -> None:
    prof = _prof("llama-2-13b")
    plan = cocoserve.plan_replication(prof, "gpu0", "gpu2", 64, 1000)
    assert plan.actions and plan.speedup_after > plan.speedup_before
    base = setup.uniform(prof, prof.comm, 1, 1, 1, 8, cocoserve.GPU_MEMORY)[0]
    rep = cocoserve.ReplicatedReplica(
        base, prof, plan.state, {"gpu0": 1.0, "gpu2": cocoserve.IDLE}, prof.comm.intra_node
    )
    plain = setup.uniform(prof, prof.comm, 1, 1, 1, 8, cocoserve.GPU_MEMORY)[0]
    for r in (rep, plain):
        for i in range(4):
            r.push(SimRequest(i, 0.0, 500, 10))
    assert rep.schedule(0.0, 1) is not None and plain.schedule(0.0, 1) is not None
    assert rep.step is not None and plain.step is not None
    assert rep.step.dt < 0.9 * plain.step.dt  # prefills split across the two GPUs
    before = dict(rep.split.assignment)
    assert set(before.values()) == {"gpu0", "gpu2"}
    rep.complete(rep.step.end)
    rep.schedule(rep.step.end if rep.step else 1.0, 2)
    assert {k: rep.split.assignment[k] for k in before} == before  # sticky


def test_request_split_is_what_the_replica_uses() -> None:
    got = request_split.assign(("a", "b"), {"a": 1.0, "b": 1.0}, {}, joined=["1", "2"])
    assert got.counts() == {"a": 1, "b": 1}


def test_replication_off_the_origin_costs_the_link() -> None:
    prof = _prof("llama-2-13b")
    L = prof.model.num_layers
    base = setup.uniform(prof, prof.comm, 1, 1, 1, 8, cocoserve.GPU_MEMORY)[0]
    slow = prof.comm.inter_node
    placed = sp.Placement("gpu0", tuple(("gpu2",) for _ in range(L)))
    fast_rep = cocoserve.ReplicatedReplica(
        base, prof, placed, {"gpu0": 1.0, "gpu2": 1.0}, prof.comm.intra_node
    )
    slow_rep = cocoserve.ReplicatedReplica(base, prof, placed, {"gpu0": 1.0, "gpu2": 1.0}, slow)
    reqs = [(SimRequest(i, 0.0, 500, 10), 500) for i in range(4)]
    for r in (fast_rep, slow_rep):
        for q, _ in reqs:
            r.by_id[str(q.rid)] = q
    t_fast = fast_rep.step_seconds(reqs, 0, 0, [(500, 0)] * 4, 4)
    t_slow = slow_rep.step_seconds(reqs, 0, 0, [(500, 0)] * 4, 4)
    assert t_slow > t_fast


def _replicated(prof, speed: float = cocoserve.IDLE):  # type: ignore[no-untyped-def]
    plan = cocoserve.plan_replication(prof, "gpu0", "gpu2", 64, 1000)
    base = setup.uniform(prof, prof.comm, 1, 1, 1, 8, cocoserve.GPU_MEMORY)[0]
    return cocoserve.ReplicatedReplica(
        base, prof, plan.state, {"gpu0": 1.0, "gpu2": speed}, prof.comm.intra_node
    )


def test_scale_down_evicts_off_a_bottleneck_helper_then_cuts_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Algorithm 2 on a violating replica whose helper is the bottleneck: the simulator
    feeds `module_scaling.scale_down` what the replica did and applies its plan
    (evictions from the helper first: no device has room to migrate to; the batch cut
    last), and the step after it is faster on the same requests."""
    from tessera.cost.capacity import Slo
    from tessera.policies.scaling import module_scaling
    from tessera.sim import cocoserve_down

    prof = _prof("llama-2-13b")
    rep = _replicated(prof)
    held = len(rep.placed.on("gpu2"))
    assert held > 0
    for i in range(12):
        rep.push(SimRequest(i, 0.0, 100, 50))
    eng = engine.Engine([rep], setup.router_for(None, []))
    first = rep.schedule(0.0, 1)  # every prefill; requests pinned to holders by speed
    assert first is not None and len(first.picks) == 12
    rep.complete(first.end)
    assert "gpu2" in rep.split.assignment.values()
    rep.speeds["gpu2"] = 0.1  # the helper's own tenant takes its compute back
    rep.observed = cocoserve.Observed()
    step = rep.schedule(first.end, 2)
    assert step is not None
    slow = step.dt
    rep.complete(step.end)
    o = rep.observed
    assert o.steps >= 1 and o.critical["gpu2"] > o.critical.get("gpu0", 0.0)  # the bottleneck
    o.finished = [(5.0, 0.5)] * 10  # every request over the SLO
    ctl = cocoserve_down.ScaleDown(prof, Slo(2.0, 0.01), {"gpu2": 0}, 1000, period_s=1.0)
    seen: list[module_scaling.ScaleDownPlan] = []
    real = module_scaling.scale_down

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr(module_scaling, "scale_down", spy)
    ctl.tick(1.0, eng)
    (plan,) = seen
    (rec,) = ctl.records
    assert rec["source"] == "gpu2" and rec["violation_rate"] == 1.0
    kinds = [type(a).__name__ for a in plan.actions]
    assert kinds[0] == "Evict" and "Migrate" not in kinds
    evicted = kinds.count("Evict")
    assert len(rep.placed.on("gpu2")) == held - evicted
    if "ReduceBatch" in kinds:
        assert rep.limits.max_num_seqs == plan.batch_size < 256
    assert any(a.startswith("scale down r0: Evict") for _, a in eng.result.actions)
    again = rep.schedule(step.end, 3)
    assert again is not None and again.dt < slow


def test_scale_down_does_nothing_within_the_slo() -> None:
    from tessera.cost.capacity import Slo
    from tessera.sim import cocoserve_down

    prof = _prof("llama-2-13b")
    rep = _replicated(prof)
    placed = rep.placed
    eng = engine.Engine([rep], setup.router_for(None, []))
    ctl = cocoserve_down.ScaleDown(prof, Slo(2.0, 0.1), {"gpu2": 0}, 1000, period_s=5.0)
    arr = [arrivals.Arrival(0.2 * i, 300, 40) for i in range(40)]
    eng.controllers.append(ctl)
    res = eng.run(arr, until=60.0)
    assert len(res.done) == 40
    assert ctl.records and all(not r["actions"] for r in ctl.records)
    assert rep.placed == placed


def test_cocoserve_rows_run_both_directions() -> None:
    """The CoCoServe sweep's replication rows run Algorithm 1 at the start and Algorithm
    2 every period (its decisions recorded); nothing is lost."""
    prof = _prof("llama-2-13b")
    trace = str(ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv")
    from tessera.sim import cocoserve_load

    rows = cocoserve_load.load_rows(prof, trace, quick=True, rates=(12.0,), span=40.0, warm=10.0)
    by = {r["mode"]: r for r in rows}
    assert set(by) == set(cocoserve.MODES)
    rep = by["layer_replication"]
    assert rep["replicated_layers"] > 0 and rep["scale_down"]["decisions"] >= 4
    assert "scale_down" not in by["replication_up_only"]


def test_per_model_copies_hold_every_variant_within_the_slots() -> None:
    for v in (3, 6, 12, 20):
        held = blockllm.per_model_copies(v, blockllm.popularity(v))
        assert {x for h in held for x in h} == set(range(v))
        per_gpu = -(-v // blockllm.GPUS)
        assert all(len(h) == per_gpu and len(set(h)) == len(h) for h in held)


def test_shared_blocks_batch_variants_and_leave_more_kv() -> None:
    prof = _prof("llama-2-7b")
    limits = batching.BatchLimits()
    pm, _ = blockllm.build(prof, 20, "per_model", limits)
    bl, _ = blockllm.build(prof, 20, "shared_blocks", limits)
    assert bl[0].alloc.num_pages > pm[0].alloc.num_pages
    chosen = [(SimRequest(i, 0.0, 100, 10, tag=f"v{i % 2}"), 1) for i in range(32)]
    for q, _ in chosen:
        q.generated = q.computed = 100  # decodes
    t_pm = pm[0].step_seconds(chosen, 32, 32 * 101, [], 32)
    t_bl = bl[0].step_seconds(chosen, 32, 32 * 101, [], 32)
    assert t_bl < 0.7 * t_pm  # one weight read for the shared layers, not two


def test_block_dispatch_keeps_variants_on_their_hosts() -> None:
    prof = _prof("llama-2-7b")
    limits = batching.BatchLimits()
    reps, hosts = blockllm.build(prof, 20, "per_model", limits)
    arr = blockllm.tagged(5.0, 20.0, [_req(200, 20)], blockllm.popularity(20), seed=1)
    served: dict[str, set[str]] = {}
    eng = engine.Engine(reps, setup.router_for(None, []))
    inner = blockllm.dispatcher(hosts, 1000.0, prof.memory.kv_bytes_per_token)

    def spy(e: engine.Engine, a: arrivals.Arrival, ready: list[str]) -> str:
        got: str = inner(e, a, ready)
        served.setdefault(a.tag, set()).add(got)
        return got

    eng.dispatch = spy
    res = eng.run(arr, until=20.0)
    assert len(res.done) == len(arr)
    for tag, where in served.items():
        assert where <= set(hosts[tag])


def _req(i: int, o: int):  # type: ignore[no-untyped-def]
    from tessera.workload.traces import Request

    return Request(0.0, i, o)


def test_retired_replicas_drain_and_leave() -> None:
    prof = _prof("llama-2-7b")
    reps = setup.uniform(prof, prof.comm, 2, 1, 1, 8, blockllm.GPU_MEMORY)
    eng = engine.Engine(reps, setup.router_for(None, []))
    arr = [arrivals.Arrival(0.1 * i, 100, 50) for i in range(20)]

    def retire() -> None:
        eng.replicas["r0"].accepting = False
        eng.refresh_ready()

    eng.at(0.5, "retire r0", retire)
    res = eng.run(arr, until=5.0)
    assert len(res.done) == 20
    assert "r0" not in eng.replicas and "r1" in eng.replicas


# -- OServe: the planner's layouts and routing, the switching loop ------------------------


@pytest.fixture(scope="module")
def small_oserve():  # type: ignore[no-untyped-def]
    """Llama-2-13B on one node of 4 H100s (a few seconds of planning per mix)."""
    from tessera.planner import table1
    from tessera.planner.bench import SLO
    from tessera.workload import traces

    prof = _prof("llama-2-13b")
    base = table1.quadrant_classes(
        traces.read_trace(str(ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"))
    )
    picks = []
    for _, shares, _, _ in (table1.LEVELS[0], table1.LEVELS[-1]):
        problem, table = table1.mix_problem(prof, table1.mixed(base, shares), SLO, 1, 4, True)
        rate = 0.7 * table1.sustainable_rps(problem, table)
        picks.append(table1.choose(problem, table, tuple(rate * w for w in shares)))
    return prof, base, SLO, picks


def test_built_layout_routes_the_planned_rates(small_oserve) -> None:  # type: ignore[no-untyped-def]
    from tessera.sim import oserve

    _, base, _, picks = small_oserve
    for pick in picks:
        built = oserve.build(pick, pick.hetero, "x-")
        assert sum(r.model.tp * r.model.pp for r in built.replicas) <= 4
        for c, want in zip(base, pick.demand, strict=True):
            assert sum(built.shares[c.name].values()) == pytest.approx(want, rel=1e-6)


def test_switch_lands_and_loses_nothing(small_oserve) -> None:  # type: ignore[no-untyped-def]
    """A switch applied mid-run: the old replicas hand their requests (KV kept) to the
    new ones, the router takes the new shares, every request finishes."""
    from tessera.policies.switching import gain as switching
    from tessera.sim import oserve, oserve_switcher

    prof, base, slo, (a, b) = small_oserve
    start = oserve.build(a, a.hetero, "g0-")
    target = oserve.build(b, b.homo, "g1-")
    sw = oserve_switcher.Switcher(
        prof, base, slo, start, a.hetero[0], switching.SwitchingConfig(), nodes=1, gpus=4
    )
    arr = oserve.mix_arrivals(base, [(20.0, (0.25, 0.25, 0.25, 0.25))], 6.0)
    eng = engine.Engine(start.replicas, oserve.router(base, start.shares))
    eng.at(8.0, "switch", lambda: sw._apply(eng, target, b.homo[0]))
    res = eng.run(arr, until=20.0)
    assert len(res.done) == len(arr) and res.unfinished == 0
    assert set(eng.replicas) == {r.name for r in target.replicas}
    assert all(n.startswith("g1-") for s in eng.router.class_shares.values() for n in s)


def test_the_switching_loop_decides_every_span(small_oserve) -> None:  # type: ignore[no-untyped-def]
    from tessera.policies.switching import gain as switching
    from tessera.sim import oserve, oserve_switcher

    prof, base, slo, (a, _) = small_oserve
    built = oserve.build(a, a.hetero, "g0-")
    cfg = switching.SwitchingConfig(enabled=True, mode="active", span_s=10.0, hold_spans=1)
    sw = oserve_switcher.Switcher(prof, base, slo, built, a.hetero[0], cfg, nodes=1, gpus=4)
    s1, s5 = (oserve._shares(x) for x in ("S1", "S5"))
    arr = oserve.mix_arrivals(base, [(30.0, s1), (30.0, s5)], 8.0)
    eng = engine.Engine(built.replicas, oserve.router(base, built.shares), [sw], 1.0)
    res = eng.run(arr, until=60.0)
    assert sw.decisions is not None and len(sw.decisions) >= 5
    assert all(d["reason"] for d in sw.decisions)
    assert len(res.done) == len(arr)
    siso = sum(eng.router.class_shares["SISO"].values())
    assert siso > 1.5 * 8.0 * s1[2]  # the S5 phase's forecast moved the routing


def test_the_switcher_runs_the_operators_span_step(small_oserve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every span's decision is what `switching_step.step` (the operator loop's own step)
    returned, at the step's forecast: the simulator composes no decision itself."""
    from tessera.policies.switching import gain as switching
    from tessera.policies.switching import step as switching_step
    from tessera.sim import oserve, oserve_switcher

    prof, base, slo, (a, _) = small_oserve
    real = switching_step.step
    calls: list[switching_step.LoopStep] = []
    histories: list[list[list[float]]] = []

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        calls.append(out)
        histories.append([list(r) for r in args[2]])
        return out

    monkeypatch.setattr(switching_step, "step", spy)
    built = oserve.build(a, a.hetero, "g0-")
    cfg = switching.SwitchingConfig(
        enabled=True, mode="active", span_s=10.0, hold_spans=1, min_gain=0.0
    )
    sw = oserve_switcher.Switcher(prof, base, slo, built, a.hetero[0], cfg, nodes=1, gpus=4)
    s1, s5 = (oserve._shares(x) for x in ("S1", "S5"))
    arr = oserve.mix_arrivals(base, [(30.0, s1), (30.0, s5)], 8.0)
    eng = engine.Engine(built.replicas, oserve.router(base, built.shares), [sw], 1.0)
    eng.run(arr, until=60.0)
    assert sw.decisions is not None and sw.counts is not None
    decided = [d for d in sw.decisions if "candidate" in d]  # not "busy" (a transition runs)
    assert len(calls) == len(decided) >= 3
    for got, step in zip(decided, calls, strict=True):
        assert {k: got[k] for k in step.decision.to_json()} == step.decision.to_json()
    # the step saw the per-span class counts the simulator recorded (the gateway's counters)
    assert all(h == sw.counts[: len(h)] for h in histories)
    assert [len(h) for h in histories] == sorted({len(h) for h in histories})
    # the step's switch decisions are exactly the switches the simulator applied
    switches = [s for s in calls if s.decision.action == switching.SWITCH]
    planned = [a for _, a in eng.result.actions if a.startswith("switch planned")]
    assert switches and len(planned) == len(switches)


def test_trace_cv_is_the_papers() -> None:
    from tessera.sim import oserve

    for _, levels, paper_cv, _ in oserve.TRACES:
        assert oserve.trace_cv(levels) == pytest.approx(paper_cv, abs=6e-4)


def _target(pick, label: str):  # type: ignore[no-untyped-def]
    """A homogeneous layout of `pick`'s problem by label, with its best routing."""
    from tessera.planner import homogeneous
    from tessera.planner.evaluate import Evaluator
    from tessera.planner.latency import LatencyModel

    ranked = homogeneous.ranked(pick.table, Evaluator(pick.table, pick.problem.demand))
    layout = next(c.layout for c in ranked if c.layout.label() == label)
    pairs = [(s, n) for s, n in layout.shape_counts() if n > 0]
    report = LatencyModel(pick.problem, pick.table).best_routing(
        tuple(s for s, _ in pairs), tuple(n for _, n in pairs), pick.demand
    )
    return layout, report


@pytest.mark.parametrize(
    ("label", "mode"),
    [("1x[tp1pp1 tp1pp1 tp1pp1 tp1pp1]", "shrink-pools"), ("1x[tp2pp2]", "shrink-pools")],
)
def test_switches_go_through_the_transition_planner(small_oserve, label: str, mode: str) -> None:  # type: ignore[no-untyped-def]
    """Full GPUs leave no room beside the old layout: the old replicas' KV pools shrink
    (issue 34; before, the planner retired old replicas one at a time, or blocked a move
    to one replica over every GPU) and the new layout loads beside them; every request
    finishes."""
    from tessera.policies.switching import gain as switching
    from tessera.sim import oserve, oserve_switcher

    prof, base, slo, (a, _) = small_oserve
    if a.hetero[0].label() == label:
        pytest.skip("the planner already picked this layout")
    layout, report = _target(a, label)
    start = oserve.build(a, a.hetero, "g0-")
    target = oserve.build(a, (layout, report), "g1-")
    sw = oserve_switcher.Switcher(
        prof, base, slo, start, a.hetero[0], switching.SwitchingConfig(), nodes=1, gpus=4
    )
    sw._gen = 1
    arr = oserve.mix_arrivals(base, [(60.0, (0.25, 0.25, 0.25, 0.25))], 6.0)
    eng = engine.Engine(start.replicas, oserve.router(base, start.shares))
    eng.at(8.0, "switch", lambda: sw._transition(eng, target, layout))
    res = eng.run(arr, until=60.0)
    assert len(res.done) == len(arr) and res.unfinished == 0
    (record,) = sw.transitions
    assert record["mode"] == mode
    want = target if mode != "blocked" else start
    assert set(eng.replicas) == {r.name for r in want.replicas}
    if mode != "blocked":
        assert record["steps"] > 0 and record["seconds"] > 0
        assert sw.current is target


def test_one_replica_over_every_gpu_switches_by_shrinking_its_pool(small_oserve) -> None:  # type: ignore[no-untyped-def]
    """The case that used to be blocked (InsufficientMemory): one replica holds every GPU
    and its KV pool all the memory left; its pool shrinks, the new layout loads beside
    it, the routes cut over, the old is freed and the new pools grow (issue 34)."""
    from tessera.policies.switching import gain as switching
    from tessera.sim import oserve, oserve_switcher

    prof, base, slo, (a, _) = small_oserve
    layout, report = _target(a, "1x[tp2pp2]")
    if a.hetero[0].label() == layout.label():
        pytest.skip("the planner picked the one-replica layout")
    start = oserve.build(a, (layout, report), "g0-")
    target = oserve.build(a, a.hetero, "g1-")
    sw = oserve_switcher.Switcher(
        prof, base, slo, start, layout, switching.SwitchingConfig(), nodes=1, gpus=4
    )
    sw._gen = 1
    arr = oserve.mix_arrivals(base, [(60.0, (0.25, 0.25, 0.25, 0.25))], 6.0)
    eng = engine.Engine(start.replicas, oserve.router(base, start.shares))
    planned = {r.name: r.alloc.num_pages for r in target.replicas}
    eng.at(8.0, "switch", lambda: sw._transition(eng, target, a.hetero[0]))
    res = eng.run(arr, until=60.0)
    assert len(res.done) == len(arr) and res.unfinished == 0
    (record,) = sw.transitions
    assert record["mode"] == "shrink-pools" and not record["blocked"]
    assert sw.current is target
    assert set(eng.replicas) == {r.name for r in target.replicas}
    assert any("shrink the KV pool" in a for _, a in res.actions)
    assert any("grow the KV pool" in a for _, a in res.actions)
    # the old layout gone, every new pool is back at its planned size: the grow counts
    # each stage's budget against the planned pool, not the pool its most cut stage left
    assert {r.name: r.alloc.num_pages for r in target.replicas} == planned


def test_the_decisions_never_import_the_simulator_contract() -> None:
    import tomllib

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = [
        c
        for c in doc["tool"]["importlinter"]["contracts"]
        if c.get("forbidden_modules") == ["tessera.sim"]
    ]
    assert found and {"tessera.policies", "tessera.planner"} <= set(found[0]["source_modules"])


def test_bench_parts_are_checked() -> None:
    import argparse

    from tessera.sim import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--skip-scale", "--parts", "kunserve,nope"])
    with pytest.raises(SystemExit, match="nope"):
        bench.run(args)
    # the latency model's error alone (Table 2's first phase) runs only when asked for
    assert "oserve_model_error" in bench.PARTS
    assert "oserve_model_error" not in bench.DEFAULT_PARTS


def test_seed_plots_from_the_recorded_json(tmp_path: Path) -> None:
    import json

    from tessera.sim import seed_plots

    out = json.loads((ROOT / "docs" / "sim" / "seeds.json").read_text())
    paths = seed_plots.plot_tables(out, tmp_path)
    assert {p.name for p in paths} == {
        "oserve_table1.png",
        "oserve_table2.png",
        "cocoserve_load.png",
        "blockllm_variants.png",
    }
    assert all(p.stat().st_size > 10_000 for p in paths)
    assert all(r["label"] == "simulation" for r in out["oserve_table1"] + out["blockllm_variants"])


def test_the_gateway_reroutes_within_a_span_from_its_counts(small_oserve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The mix changes at 30 s, on a span boundary: the span's forecast is the old mix,
    and within the span the routing follows the counts arrived so far (robust over both
    mixes); without the within-span re-route it stays the forecast's until 40 s."""
    from tessera.policies.switching import gain as switching
    from tessera.sim import oserve, oserve_switcher

    prof, base, slo, (a, _) = small_oserve
    s1, s5 = (oserve._shares(x) for x in ("S1", "S5"))
    arr = oserve.mix_arrivals(base, [(30.0, s1), (30.0, s5)], 8.0)
    cfg = switching.SwitchingConfig(enabled=True, mode="active", span_s=10.0, hold_spans=5)

    def shares_within(reroute: bool) -> tuple[dict[str, dict[str, float]], ...]:
        if not reroute:
            monkeypatch.setattr(oserve_switcher.Switcher, "_reroute", lambda *args: None)
        built = oserve.build(a, a.hetero, "g0-")
        sw = oserve_switcher.Switcher(prof, base, slo, built, a.hetero[0], cfg, nodes=1, gpus=4)
        eng = engine.Engine(built.replicas, oserve.router(base, built.shares), [sw], 1.0)
        seen: list[dict[str, dict[str, float]]] = []
        for t in (30.5, 39.5):
            eng.at(t, "look", lambda: seen.append(eng.router.class_shares))
        eng.run(arr, until=40.0)
        return tuple(seen)

    early, late = shares_within(True)
    assert early != late
    assert sum(late["SISO"].values()) > sum(early["SISO"].values())  # S5 is SISO-heavy
    early, late = shares_within(False)
    assert early == late
