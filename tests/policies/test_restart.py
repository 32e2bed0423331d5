"""The pure restart policy of supervised local agents: immediate, then growing back-off."""

from __future__ import annotations

import pytest

from tessera.policies.serving import restart

P = restart.RestartPolicy(backoff_s=1.0, max_backoff_s=4.0, stable_s=60.0)


def test_first_restart_is_immediate_then_backs_off() -> None:
    first = restart.decide(P, (), 100.0)
    assert first.restart_now and first.attempt == 1
    assert restart.decide(P, (100.0,), 100.5) == restart.RestartDecision(False, 101.0, 2)
    assert restart.decide(P, (100.0,), 101.0).restart_now
    hist = (100.0, 101.0, 103.0, 107.0)
    assert restart.decide(P, hist, 108.0).not_before == 111.0  # capped at 4 s
    assert restart.decide(P, hist, 200.0).restart_now  # stable again: history forgotten
    assert restart.decide(P, hist, 200.0).attempt == 1


def test_policy_is_validated() -> None:
    with pytest.raises(ValueError):
        restart.RestartPolicy(backoff_s=0)
    with pytest.raises(ValueError):
        restart.RestartPolicy(backoff_s=5, max_backoff_s=1)
