"""`cli.up_overload`'s pure pieces: the loop's routes steps on the published routes, and
when the loop cannot run on a plan (said, not silently off)."""

from __future__ import annotations

from tessera import blocks, observed, plan, routes_doc
from tessera.cli import up_overload
from tessera.policies.overload import steps as overload_steps

R = routes_doc.RouteReplica
DOC = routes_doc.RoutesDoc((R("r0", "a:1"), R("r1", "b:1"), R("p", "a:1")), 3)
MEMBERS = {n: overload_steps.Member(n, f"{a}:1") for n, a in (("r0", "a"), ("r1", "b"))}


def test_routes_change_removes_donors_and_adds_them_back_at_their_leader() -> None:
    gone = up_overload.routes_change(DOC, overload_steps.Routes(remove=("r1",)), MEMBERS)
    assert gone.replica_ids == ("r0", "p") and gone.version == 3  # same version: a drain
    back = up_overload.routes_change(gone, overload_steps.Routes(add=("r1",)), MEMBERS)
    assert back.replicas == (R("r0", "a:1"), R("p", "a:1"), R("r1", "b:1"))
    again = up_overload.routes_change(back, overload_steps.Routes(add=("r1",)), MEMBERS)
    assert again == back


def _plan(*stages: tuple[tuple[str, int, int], ...]) -> plan.Plan:
    reps = tuple(
        plan.PlannedReplica(
            f"d.x.r{i}.g1", f"r{i}", tuple(plan.PlannedStage(a, "cpu:0", s, e) for a, s, e in st)
        )
        for i, st in enumerate(stages)
    )
    return plan.Plan("/m", "float32", reps)


def _obs(pages: int) -> observed.Observed:
    b = blocks.Block("/m", 0, 8, replica_id="d.x.r0.g1", kv_bytes=4096, kv_pages=pages)
    return observed.Observed((observed.AgentInfo("a", "a:1", blocks=(b,)),))


def test_usable_needs_two_whole_replicas_and_pages() -> None:
    two = _plan((("a", 0, 8),), (("b", 0, 8),))
    assert up_overload.UpOverload.usable(two, _obs(16)) == ""
    assert up_overload.page_bytes(_obs(16), "d.x.r0.g1") == 256
    assert "no KV pages" in up_overload.UpOverload.usable(two, _obs(0))
    piped = _plan((("a", 0, 8),), (("a", 0, 4), ("b", 4, 8)))
    assert "two whole-model replicas" in up_overload.UpOverload.usable(piped, _obs(16))
