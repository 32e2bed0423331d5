"""`cpu_share.agent_threads`: one core left to the gateway, the rest split among agents."""

from __future__ import annotations

import pytest

from tessera.policies.serving import cpu_share


@pytest.mark.parametrize(
    ("cpus", "agents", "want"),
    [
        (2, 1, 1),  # the 2-core VM: one model thread, one core for the gateway
        (16, 1, 15),
        (8, 2, 3),
        (2, 2, 1),  # no more cores than agents: nothing to reserve
        (1, 1, 1),
        (3, 4, 1),  # fewer cores than agents: still one each
        (0, 1, 1),  # os.cpu_count() unknown
    ],
)
def test_the_gateway_keeps_a_core(cpus: int, agents: int, want: int) -> None:
    assert cpu_share.agent_threads(cpus, agents) == want


def test_an_explicit_count_wins() -> None:
    assert cpu_share.agent_threads(2, 1, requested=2) == 2


def test_no_agents_is_an_error() -> None:
    with pytest.raises(ValueError, match="agents"):
        cpu_share.agent_threads(4, 0)
