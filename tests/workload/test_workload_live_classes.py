"""Arrival-time classes: a synthetic trace where the answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.workload import classes, live_classes, traces


def _trace(n: int = 3000, seed: int = 0) -> list[traces.Request]:
    """Three shapes: short prompt / short answer, short prompt / long answer (same
    prompts: only the output tells them apart), long prompt / short answer."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = i % 3
        inp = int(rng.lognormal(np.log([100, 100, 3000][kind]), 0.2))
        gen = int(rng.lognormal(np.log([20, 800, 20][kind]), 0.2))
        out.append(traces.Request(float(i), inp, gen))
    return out


@pytest.fixture(scope="module")
def fitted() -> tuple[classes.WorkloadClasses, live_classes.LiveClassifier, list[traces.Request]]:
    train, test = _trace(3000, 0), _trace(1500, 1)
    workload = classes.fit_classes(train, k=3, seed=0)
    return workload, live_classes.fit(train, workload), test


def test_input_length_separates_what_it_can(fitted: tuple) -> None:  # type: ignore[type-arg]
    workload, live, test = fitted
    result = live_classes.misclassification(live, workload, test)
    long_prompt = workload.classify(3000, 20)
    # long prompts are always right; short prompts are a coin toss between the two
    # short-prompt classes, so about a third of all requests are wrong, never much more
    assert result.per_class[long_prompt] < 0.02
    assert 0.25 < result.rate < 0.40
    assert sum(map(sum, result.confusion)) == result.requests == len(test)


def test_max_tokens_resolves_the_output_ambiguity(fitted: tuple) -> None:  # type: ignore[type-arg]
    workload, live, test = fitted
    # A client asking for at most 64 tokens cannot be in the long-answer class; a limit of
    # 2048 says nothing. So short answers become certain, long answers stay a coin toss.
    limits = [64 if r.output_tokens < 100 else 2048 for r in test]
    without = live_classes.misclassification(live, workload, test)
    result = live_classes.misclassification(live, workload, test, max_tokens=limits)
    short_answer, long_answer = workload.classify(100, 20), workload.classify(100, 800)
    assert result.per_class[short_answer] < 0.02 < without.per_class[short_answer]
    assert result.rate < without.rate - 0.1
    assert live.classify(100, max_tokens=32) != long_answer
    assert live.expected_output(long_answer, max_tokens=64) == 64.0
    assert live.expected_output(long_answer) > 500


def test_baseline_and_errors(fitted: tuple) -> None:  # type: ignore[type-arg]
    workload, _, test = fitted
    nearest = live_classes.input_nearest(workload, [r.input_tokens for r in test])
    assert nearest.shape == (len(test),)
    with pytest.raises(ValueError, match="no requests"):
        live_classes.fit([], workload)
