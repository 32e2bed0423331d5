"""Live request classes: type a request on arrival, before its output length is known.

On arrival the gateway knows the prompt length and, if set, ``max_tokens``, not the output
length the planner's classes (``tessera.workload.classes``) use. The rule (docs/switching.md,
"Live classes"): the log1p(input) axis is cut into ``bins`` quantile bins; per (bin, class) the
training count and output-length quantiles are kept; a request in bin b with ``max_tokens = m``
gets ``argmax_c n[b,c] * F[b,c](m)`` (F: share of class c's outputs in bin b at most m; 1
without ``max_tokens``), counts smoothed by one prior-weighted pseudo-request. That is the
Bayes rule for 0-1 loss at the bin resolution. ``expected_output`` (the class's mean training
output, capped by ``max_tokens``) is what the cost model prices a live request with. Callers:
the gateway's router (``classify``, numpy only), the predictor benchmark
(``misclassification``) and tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tessera.workload import traces

if TYPE_CHECKING:  # scikit-learn stays out of the gateway's (control plane image's) imports
    from tessera.workload import classes

BINS = 32
LEVELS = tuple(i / 20 for i in range(21))  # output quantile levels kept per (bin, class)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True)
class LiveClassifier:
    """Arrival-time classifier fitted on a typed training trace (module docstring)."""

    edges: tuple[float, ...]  # interior log1p(input) bin edges, ascending
    counts: tuple[tuple[float, ...], ...]  # [bin][class] smoothed training counts
    quantiles: tuple[tuple[tuple[float, ...], ...], ...]  # [bin][class] output at LEVELS
    mean_output: tuple[float, ...]  # [class] mean training output tokens

    @property
    def k(self) -> int:
        """Number of classes."""
        return len(self.mean_output)

    def classify(self, input_tokens: int, max_tokens: int | None = None) -> int:
        """Class of one arriving request."""
        limits = None if max_tokens is None else [max_tokens]
        return int(self.classify_many([input_tokens], limits)[0])

    def classify_many(
        self, input_tokens: npt.ArrayLike, max_tokens: npt.ArrayLike | None = None
    ) -> IntArray:
        """Classes of many arriving requests; ``max_tokens`` entries <= 0 mean unset."""
        inp = np.asarray(input_tokens, dtype=np.float64).reshape(-1)
        bins = np.searchsorted(np.asarray(self.edges), np.log1p(inp), side="right")
        score = np.asarray(self.counts, dtype=np.float64)[bins]  # (n, k)
        if max_tokens is not None:
            limit = np.asarray(max_tokens, dtype=np.float64).reshape(-1)
            quant = np.asarray(self.quantiles, dtype=np.float64)[bins]  # (n, k, levels)
            levels = np.asarray(LEVELS)
            for i in np.flatnonzero(limit > 0):
                share = [np.interp(limit[i], quant[i, c], levels) for c in range(self.k)]
                score[i] *= np.maximum(np.asarray(share), 1e-6)
        out: IntArray = np.argmax(score, axis=1).astype(np.int64)
        return out

    def expected_output(self, cls: int, max_tokens: int | None = None) -> float:
        """The output-length estimate of class ``cls`` (capped by ``max_tokens``)."""
        mean = self.mean_output[cls]
        return mean if max_tokens is None or max_tokens <= 0 else min(mean, float(max_tokens))


def fit(
    requests: Sequence[traces.Request], workload: classes.WorkloadClasses, bins: int = BINS
) -> LiveClassifier:
    """Fit on ``requests`` typed by ``workload`` (their true classes)."""
    if not requests:
        raise ValueError("cannot fit a live classifier to no requests")
    inp = np.asarray([r.input_tokens for r in requests], dtype=np.float64)
    out = np.asarray([r.output_tokens for r in requests], dtype=np.float64)
    labels = workload.classify_many(inp, out)
    x = np.log1p(inp)
    edges = np.unique(np.quantile(x, np.linspace(0, 1, bins + 1)[1:-1]))
    index = np.searchsorted(edges, x, side="right")
    k = workload.k
    prior = np.bincount(labels, minlength=k) / len(labels)
    counts, quants = [], []
    for b in range(len(edges) + 1):
        here = index == b
        row = np.bincount(labels[here], minlength=k).astype(np.float64) + prior
        counts.append(tuple(float(v) for v in row))
        qrow = []
        for c in range(k):
            mine = out[here & (labels == c)]
            if mine.size == 0:
                mine = out[labels == c] if (labels == c).any() else np.asarray([1.0])
            qrow.append(tuple(float(v) for v in np.quantile(mine, LEVELS)))
        quants.append(tuple(qrow))
    means = tuple(float(out[labels == c].mean()) if (labels == c).any() else 0.0 for c in range(k))
    return LiveClassifier(tuple(float(e) for e in edges), tuple(counts), tuple(quants), means)


@dataclasses.dataclass(frozen=True)
class Misclassification:
    """How often the arrival-time class differs from the class the finished request has."""

    rate: float  # share of requests misclassified
    per_class: tuple[float, ...]  # [c] share of true class c typed as something else
    confusion: tuple[tuple[int, ...], ...]  # [true][predicted] counts
    requests: int


def misclassification(
    classifier: LiveClassifier,
    workload: classes.WorkloadClasses,
    requests: Sequence[traces.Request],
    max_tokens: Sequence[int] | None = None,
) -> Misclassification:
    """Compare arrival-time classes with the true (input, output) classes."""
    if not requests:
        raise ValueError("no requests to evaluate")
    inp = [r.input_tokens for r in requests]
    truth = workload.classify_many(inp, [r.output_tokens for r in requests])
    guess = classifier.classify_many(inp, max_tokens)
    k = workload.k
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (truth, guess), 1)
    totals = confusion.sum(axis=1)
    per_class = tuple(
        float(1 - confusion[c, c] / totals[c]) if totals[c] else float("nan") for c in range(k)
    )
    return Misclassification(
        rate=float((truth != guess).mean()),
        per_class=per_class,
        confusion=tuple(tuple(int(v) for v in row) for row in confusion),
        requests=len(requests),
    )


def input_nearest(workload: classes.WorkloadClasses, input_tokens: npt.ArrayLike) -> IntArray:
    """Baseline: the class whose centroid's input length is nearest (log space)."""
    x = np.log1p(np.asarray(input_tokens, dtype=np.float64).reshape(-1))
    c = np.asarray([lc.input_tokens for lc in workload.log_centroids])
    out: IntArray = np.argmin(np.abs(x[:, None] - c[None, :]), axis=1).astype(np.int64)
    return out


def to_json(classifier: LiveClassifier, names: Sequence[str]) -> dict[str, object]:
    """The classifier and its class names as a JSON document (the gateway's
    ``--live-classes`` file)."""
    if len(names) != classifier.k:
        raise ValueError(f"{len(names)} class names for a classifier of {classifier.k} classes")
    return {"classes": list(names), **dataclasses.asdict(classifier)}


def from_json(doc: object) -> tuple[LiveClassifier, tuple[str, ...]]:
    """Inverse of :func:`to_json`; ValueError naming the bad field."""
    if not isinstance(doc, dict):
        raise ValueError("live classes: not a JSON object")
    try:
        names = tuple(str(n) for n in doc["classes"])
        k = len(names)
        edges = tuple(float(e) for e in doc["edges"])
        counts = tuple(tuple(float(v) for v in row) for row in doc["counts"])
        quantiles = tuple(
            tuple(tuple(float(v) for v in q) for q in row) for row in doc["quantiles"]
        )
        means = tuple(float(m) for m in doc["mean_output"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"live classes: missing or malformed field ({exc!r})") from exc
    bins = len(edges) + 1
    if k < 1 or len(means) != k:
        raise ValueError(f"live classes: mean_output has {len(means)} entries for {k} classes")
    if len(counts) != bins or any(len(r) != k for r in counts):
        raise ValueError(f"live classes: counts must be {bins} rows of {k}")
    if len(quantiles) != bins or any(
        len(r) != k or any(len(q) != len(LEVELS) for q in r) for r in quantiles
    ):
        raise ValueError(f"live classes: quantiles must be {bins} x {k} x {len(LEVELS)}")
    return LiveClassifier(edges, counts, quantiles, means), names
