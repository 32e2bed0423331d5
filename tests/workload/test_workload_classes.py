"""Workload classes: deterministic k-means typing, stable ids, classify, save/load, k criterion."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tessera.workload import classes, traces


def _blobs(seed: int = 0, n: int = 150) -> list[traces.Request]:
    """Three well-separated shapes in log space: short/short, long/short, medium/long."""
    rng = np.random.default_rng(seed)
    centres = [(30, 20), (3000, 30), (400, 800)]
    requests = []
    for i in range(n):
        inp, out = centres[i % 3]
        requests.append(
            traces.Request(
                float(i),
                int(inp * rng.lognormal(0, 0.15)),
                int(out * rng.lognormal(0, 0.15)),
            )
        )
    return requests


def test_fit_is_deterministic_and_sorted_by_centroid() -> None:
    a = classes.fit_classes(_blobs(), k=3, seed=7)
    b = classes.fit_classes(_blobs(), k=3, seed=7)
    assert a == b
    assert a.k == 3
    inputs = [c.input_tokens for c in a.log_centroids]
    assert inputs == sorted(inputs)
    assert a.centroids[0].input_tokens == pytest.approx(30, rel=0.15)
    assert a.centroids[2].input_tokens == pytest.approx(3000, rel=0.15)
    assert a.centroids[1].output_tokens == pytest.approx(800, rel=0.15)
    assert sum(a.shares) == pytest.approx(1.0)
    assert a.criterion == "given" and a.silhouettes == ()


def test_token_centroids_are_expm1_of_log_centroids() -> None:
    fitted = classes.fit_classes(_blobs(), k=3)
    for tok, log in zip(fitted.centroids, fitted.log_centroids, strict=True):
        assert tok.input_tokens == pytest.approx(np.expm1(log.input_tokens))
        assert tok.output_tokens == pytest.approx(np.expm1(log.output_tokens))
    inp, out = fitted.mean_tokens[0]  # Centroid unpacks like a tuple
    assert inp == pytest.approx(30, rel=0.2) and out == pytest.approx(20, rel=0.2)


def test_classify_nearest_centroid_in_log_space() -> None:
    fitted = classes.fit_classes(_blobs(), k=3)
    assert fitted.classify(25, 18) == 0
    assert fitted.classify(500, 700) == 1
    assert fitted.classify(5000, 10) == 2
    assert fitted.classify(0, 0) == 0  # log1p types zero-token requests too
    many = fitted.classify_many([25, 500, 5000], [18, 700, 10])
    assert many.tolist() == [0, 1, 2]
    assert many.dtype == np.int64


def test_fit_labels_agree_with_classify() -> None:
    requests = _blobs()
    fitted = classes.fit_classes(requests, k=3)
    typed = classes.label(requests, fitted)
    assert [r.cls for r in typed] == [0, 2, 1] * 50
    counts = np.bincount([r.cls for r in typed if r.cls is not None], minlength=3)
    assert tuple(counts / len(requests)) == pytest.approx(fitted.shares)


def test_silhouette_criterion_finds_three_blobs() -> None:
    fitted = classes.fit_classes(_blobs(), seed=0)
    assert fitted.criterion == "silhouette"
    assert fitted.k == 3
    assert [k for k, _ in fitted.silhouettes] == list(classes.K_CANDIDATES)
    best = max(s for _, s in fitted.silhouettes)
    assert dict(fitted.silhouettes)[3] >= best - classes.SILHOUETTE_TOLERANCE


def test_criterion_with_too_few_distinct_shapes_gives_one_class() -> None:
    requests = [traces.Request(float(i), 10, 5) for i in range(4)]
    fitted = classes.fit_classes(requests)
    assert fitted.k == 1
    assert fitted.classify(10_000, 1) == 0


def test_invalid_k_and_empty_input() -> None:
    with pytest.raises(ValueError, match="between 1 and the 3 distinct"):
        classes.fit_classes(_blobs(n=3), k=4)
    with pytest.raises(ValueError, match="no requests"):
        classes.fit_classes([])
    with pytest.raises(ValueError, match="non-negative"):
        classes.features([-1], [2])


def test_json_and_file_round_trip(tmp_path: Path) -> None:
    fitted = classes.fit_classes(_blobs(), seed=3)
    assert classes.WorkloadClasses.from_json(fitted.to_json()) == fitted
    path = tmp_path / "classes.json"
    fitted.save(path)
    loaded = classes.WorkloadClasses.load(path)
    assert loaded == fitted
    assert loaded.classify(5000, 10) == fitted.classify(5000, 10)
    with pytest.raises(ValueError, match="unsupported workload classes"):
        classes.WorkloadClasses.from_json({**fitted.to_json(), "version": 99})


def test_class_rates() -> None:
    requests = _blobs()  # one request per second for 150 s, classes in turn
    fitted = classes.fit_classes(requests, k=3)
    rates = classes.class_rates(requests, fitted)
    assert sum(rates) == pytest.approx(150 / 149)
    assert rates == pytest.approx((50 / 149,) * 3)
    assert classes.class_rates(requests, fitted, duration_s=300.0) == pytest.approx((1 / 6,) * 3)
    with pytest.raises(ValueError, match="lasts no time"):
        classes.class_rates(requests[:1], fitted)
