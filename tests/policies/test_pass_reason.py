"""The reconcile pass's status ladder (pure; moved out of the operator's converge, issue 30)."""

from __future__ import annotations

from tessera.policies import pass_reason as pr


def test_precedence() -> None:
    failed = pr.Failed("RESOURCE_EXHAUSTED", "load r0", "no room")
    down = [pr.Down("agent-1", "h:1", "UNAVAILABLE")]
    assert pr.reason(pr.PassFacts(failed=failed, blocked=("NoSource", "x"), down=down)) == (
        "InsufficientCapacity",
        "load r0: RESOURCE_EXHAUSTED: no room",
    )
    assert pr.reason(pr.PassFacts(blocked=("NoSource", "x"), down=down)) == ("NoSource", "x")
    assert pr.reason(pr.PassFacts(down=down))[0] == "AgentUnreachable"
    step = pr.PassFacts(next_step="load r1", generation=2, mode="mbb", steps_left=3)
    assert pr.reason(step) == ("Loading", "generation 2 (mbb), 3 steps left; next: load r1")
    assert pr.reason(pr.PassFacts(next_step="x", serving=True))[0] == "Switching"
    assert pr.reason(pr.PassFacts(ready=1, planned=2)) == ("Loading", "1/2 replicas loaded")
    assert pr.reason(pr.PassFacts(ready=2, planned=2, source="explicit", generation=1)) == (
        "Serving",
        "2 replicas serving (explicit, generation 1)",
    )
    assert pr.failure_reason("UNAVAILABLE") == "AgentUnreachable"
    assert pr.failure_reason("INTERNAL") == "LoadFailed"
