"""Properties of the transition planner over random layouts, memories and interruptions.

From a converged random layout to another random layout (hypothesis), executed by the
simulated cluster with a re-plan after every change and the original plan's prefix
applied first (an executor interrupted anywhere): either the transition is blocked and
touches nothing that serves, or it converges to exactly the target with no load that
does not fit, no request lost, and a complete replica routed at every moment.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tessera.policies.transition import actions
from tessera.policies.transition import planner as transition
from tests.policies import transition_sim as sim
from tests.policies.transition_sim import block, placed, rid, with_next

MiB = 1 << 20
AGENTS = ("a", "b", "c")


@st.composite
def layouts(draw: st.DrawFn) -> list[tuple[str, tuple[tuple[str, int, int], ...]]]:
    """Replicas (name, stages as (agent, start, end)) of an 8-layer model."""
    n = draw(st.integers(1, 3))
    out = []
    for i in range(n):
        cuts = sorted(draw(st.sets(st.integers(1, 7), max_size=2)))
        bounds = [0, *cuts, 8]
        stages = tuple(
            (draw(st.sampled_from(AGENTS)), bounds[k], bounds[k + 1])
            for k in range(len(bounds) - 1)
        )
        out.append((f"r{i}", stages))
    return out


def _placed(
    layout: list[tuple[str, tuple[tuple[str, int, int], ...]]], gens: dict[str, int]
) -> list[transition.Placed]:
    out = []
    for name, stages in layout:
        g = gens[name]
        for k in reversed(range(len(stages))):
            agent, a, b = stages[k]
            p = placed(agent, block(name, g, k, len(stages), (a, b), (b - a) * MiB))
            if k + 1 < len(stages):
                p = with_next(p, f"{stages[k + 1][0]}:1")
            out.append(p)
    return out


@settings(max_examples=60, deadline=None)
@given(
    before=layouts(),
    after=layouts(),
    capacity=st.integers(12, 40),
    cut=st.integers(0, 30),
    sourcing=st.sampled_from(["block", "switch"]),
)
# Found by hypothesis: a rotation over full agents, resumed after the first new replica
# loaded (before it was routed); the re-plan must count it as able to serve.
@example(
    before=[("r0", (("a", 0, 8),)), ("r1", (("b", 0, 8),)), ("r2", (("c", 0, 8),))],
    after=[("r0", (("c", 0, 8),)), ("r1", (("a", 0, 8),)), ("r2", (("b", 0, 8),))],
    capacity=12,
    cut=0,
    sourcing="block",
)
def test_any_transition_is_safe_and_resumable(
    before: list[tuple[str, tuple[tuple[str, int, int], ...]]],
    after: list[tuple[str, tuple[tuple[str, int, int], ...]]],
    capacity: int,
    cut: int,
    sourcing: str,
) -> None:
    c = sim.Cluster({n: sim.Agent(n, capacity * MiB) for n in AGENTS}, sourcing=sourcing)
    start = _placed(before, {name: 1 for name, _ in before})
    need = {n: sum(p.block.bytes for p in start if p.agent == n) for n in AGENTS}
    if any(v > capacity * MiB for v in need.values()):
        return  # not a state a cluster could be in
    sim.load_state(c, start, [rid(name, 1) for name, _ in before], 1)
    # replicas whose layout is unchanged keep generation 1, the others get 2
    gens = {name: 1 if (name, s) in before else 2 for name, s in after}
    target = sim.target_of(_placed(after, gens), max(gens.values()))
    full = transition.plan(c.world(), target)
    if full.blocked is not None:
        for s in full.steps:  # only the cleanup of what no route names
            assert isinstance(s.action, actions.Drain | actions.UnloadBlock)
            name = getattr(s.action, "replica_id", "") or s.action.block.replica_id  # type: ignore[union-attr]
            assert c.published is not None and name not in c.published.replica_ids
        return
    for s in full.steps[:cut]:  # an executor interrupted after `cut` steps
        if not c.apply(s.action):
            break
        assert c.serving()
    c.run(target)
    assert c.lost == []
    assert c.serving() == {r.id for r in target.replicas}
    want = {(p.agent, p.block.key) for p in target.blocks}
    have = {(n, k) for n, a in c.agents.items() for k in a.blocks}
    assert have == want
    assert transition.plan(c.world(), target).converged
