"""The within-span re-route moves the split only on evidence of a different mix."""

from __future__ import annotations

import random

import pytest

from tessera.policies.routing import reroute

S3 = (0.25, 0.25, 0.25, 0.25)
S2 = (0.10, 0.30, 0.10, 0.50)


def _draw(shares: tuple[float, ...], n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out = [0.0] * len(shares)
    for i in rng.choices(range(len(shares)), weights=shares, k=n):
        out[i] += 1
    return out


def test_counts_from_the_planned_mix_keep_the_split() -> None:
    # 240 arrivals (15 s at 16 req/s) from the planned mix: at 1 % the test rejects ~1 in
    # 100 such draws; over 200 draws at most a few may move the split
    moved = sum(reroute.decide([S3], _draw(S3, 240, seed)).reroute for seed in range(200))
    assert moved <= 8


def test_counts_from_another_mix_move_it() -> None:
    d = reroute.decide([S3], _draw(S2, 240, 1))
    assert d.reroute and d.p_value < reroute.ALPHA


def test_a_mix_fitting_any_planned_mix_keeps_it() -> None:
    counts = _draw(S2, 240, 2)
    assert reroute.decide([S3], counts).reroute
    d = reroute.decide([S3, S2], counts)
    assert not d.reroute and d.p_value >= reroute.ALPHA


def test_rates_and_counts_compare_by_shares() -> None:
    rates = tuple(16.0 * s for s in S3)  # req/s, as the forecast is
    assert not reroute.decide([rates], [60, 61, 59, 60]).reroute


def test_too_few_arrivals_never_move_it() -> None:
    d = reroute.decide([S3], [0, 0, 0, 12])  # 3 expected per class: below Cochran's 5
    assert not d.reroute and "too few" in d.reason
    assert reroute.fit(S3, [0, 0, 0, 12]) is None
    assert reroute.decide([S3], [0, 0, 0, 40]).reroute


def test_a_class_the_plan_gave_no_share_is_a_new_mix() -> None:
    assert reroute.fit((0.5, 0.5, 0.0), (50, 50, 1)) == 0.0
    assert reroute.decide([(0.5, 0.5, 0.0)], (50, 50, 1)).reroute
    assert not reroute.decide([(0.5, 0.5, 0.0)], (52, 48, 0)).reroute


def test_significance_orders_decisions() -> None:
    counts = [70, 50, 60, 60]
    p = reroute.fit(S3, counts)
    assert p is not None and 0 < p < 1
    assert reroute.decide([S3], counts, alpha=min(1.0, p * 1.5)).reroute
    assert not reroute.decide([S3], counts, alpha=p / 1.5).reroute


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        reroute.fit(S3, [1, 2, 3])
    with pytest.raises(ValueError):
        reroute.decide([S3], [60, 60, 60, 60], alpha=0.0)
    assert reroute.decide([], [1, 2, 3, 4]).reroute
    assert reroute.decide([S3], [60, 60, 60, 60]).to_json()["reroute"] is False


def test_more_reads_per_span_test_each_read_harder() -> None:
    counts = [70, 50, 60, 60]
    p = reroute.fit(S3, counts)
    assert p is not None
    alpha = min(0.5, p * 3)
    assert reroute.decide([S3], counts, alpha=alpha).reroute
    assert not reroute.decide([S3], counts, alpha=alpha, reads=6).reroute
    with pytest.raises(ValueError):
        reroute.decide([S3], counts, reads=0)
